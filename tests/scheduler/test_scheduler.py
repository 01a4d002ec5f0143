"""The scheduler: reference, policy spec, oracle, corpus, swap, cost model, simulation, CLI."""

from __future__ import annotations

import json
from collections import deque

import pytest

from kvcheck.check.trace import Trace
from kvcheck.cli import main
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import MisuseError, OutOfBlocks
from kvcheck.impl.scheduler import Scheduler, UnservableRequest
from kvcheck.impl.swap import SwapScheduler
from kvcheck.models.scheduler.model import requests_of
from kvcheck.models.scheduler.runs import run_workload, verify
from kvcheck.models.scheduler.workload import Request, generate
from kvcheck.spec import scheduler as policy
from kvcheck.spec.logic import PY
from kvcheck.spec.scheduler import SchedState
from kvcheck.spec.state import Snapshot
from kvcheck.tools.costmodel import LLAMA_3_3_70B, CostModel, default, scenarios
from kvcheck.tools.simulate import simulate

from .buggy import CORPUS

HERE = __file__.rsplit("/", 1)[0]


# -- reference ----------------------------------------------------------------------
@pytest.mark.parametrize("watermark", [0, 1, 2])
def test_reference_passes(watermark):
    r = verify("reference", num_blocks=16, block_size=4, watermark=watermark, workloads=10)
    assert r.ok, r.violation


def test_swap_passes_and_checks_host_pool():
    r = verify("swap", num_blocks=16, block_size=4, watermark=1, workloads=10)
    assert r.ok, r.violation


def test_add_refuses_what_can_never_fit():
    s = Scheduler(BlockManager(4, 4), watermark_blocks=1)
    with pytest.raises(UnservableRequest, match="can never be admitted"):
        s.add(0, 13)  # 4 blocks > 4 - 1
    with pytest.raises(UnservableRequest):
        s.add(1, 10, max_new_tokens=4)  # re-queued at 13 tokens: 4 blocks
    s.add(2, 12)
    with pytest.raises(MisuseError, match="already"):
        s.add(2, 1)
    for bad in (0, -3, True, 1.5):
        with pytest.raises(MisuseError):
            s.add(3, bad)
    assert list(s.waiting) == [(2, 12)]
    assert s.step() == [2]  # the queue is not blocked


def test_constructor_refuses_bad_watermark():
    for bad in (-1, 4, True):
        with pytest.raises(MisuseError):
            Scheduler(BlockManager(4, 4), watermark_blocks=bad)


def test_preempts_newest_and_requeues_full_length():
    bm = BlockManager(4, 2)
    s = Scheduler(bm, watermark_blocks=0)
    s.add(0, 1)
    s.add(1, 1)
    assert [s.step() for _ in range(3)] == [[0, 1]] * 3  # each now 4 tokens in 2 blocks
    assert s.step() == [0]  # 0 needs a third block, none free: 1 (the newest) goes
    assert s.running == [0] and list(s.waiting) == [(1, 4)]  # prompt 1 + 3 generated
    assert 1 not in bm.tables and len(bm.free) == 1


def test_spec_names_a_short_requeue():
    """The step contract, evaluated directly on a hand-built before/after view."""

    def state(waiting, running, tables, lens, free):
        refs = [0] * 4
        for t in tables.values():
            for b in t:
                refs[b] += 1
        snap = Snapshot(4, 2, tables, lens, refs, free)
        return SchedState(2, 4, 0, tuple(waiting), tuple(running), snap)

    pre = state([], [0, 1], {0: [0, 1], 1: [2, 3]}, {0: 4, 1: 4}, [])
    good = state([(1, 4)], [0], {0: [0, 1, 2]}, {0: 5}, [3])
    assert all(h for _, _, h in policy.step(PY, pre, good, [0]))
    short = state([(1, 2)], [0], {0: [0, 1, 2]}, {0: 5}, [3])
    broken = [n for n, _, h in policy.step(PY, pre, short, [0]) if not h]
    assert broken[0] == ("a preempted sequence is re-queued with its full length "
                         "(prompt + generated)")


# -- corpus -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_caught_with_minimal_workload(name):
    cls, rule, most = CORPUS[name]
    r = verify(cls, num_blocks=16, block_size=4, watermark=1, workloads=20, shrink_budget=20)
    assert not r.ok
    assert r.violation.name == rule, r.violation
    assert 1 <= len(r.workload) <= most
    assert r.minimal.startswith("1-minimal")


class SeedShaped:
    """A scheduler without add/finish (the harness queues and retires)."""

    def __init__(self, bm, watermark_blocks=1):
        self.bm, self.wm = bm, watermark_blocks
        self.waiting, self.running = deque(), []

    def step(self):
        bs = self.bm.block_size
        while self.waiting and len(self.bm.free) - -(-self.waiting[0][1] // bs) >= self.wm:
            q, n = self.waiting.popleft()
            self.bm.allocate(q, n)
            self.running.append(q)
        out = []
        for q in list(self.running):
            while q in self.running:
                try:
                    self.bm.append_slot(q)
                except OutOfBlocks:
                    v = self.running.pop()
                    n = self.bm.lens[v]
                    self.bm.free_seq(v)
                    self.waiting.appendleft((v, n))
                    continue
                out.append(q)
                break
        return out


def test_harness_drives_seed_shaped_scheduler_without_add_or_finish():
    assert verify(SeedShaped, workloads=10).ok


class Crashes(Scheduler):
    def step(self):
        raise RuntimeError("boom")


class Hangs(Scheduler):
    def step(self):
        while True:
            pass


class BadReturn(Scheduler):
    def step(self):
        return "abc"


@pytest.mark.parametrize("cls, kind", [(Crashes, "crash"), (Hangs, "hang"),
                                       (BadReturn, "malformed")])
def test_misbehaving_scheduler_is_a_finding(cls, kind):
    r = verify(cls, workloads=1, timeout=0.2, do_shrink=False)
    assert r.violation.kind == kind


# -- liveness and the watermark --------------------------------------------------------
def test_pingpong_reported_without_watermark_only():
    zero = verify("reference", watermark=0, workloads=30)
    two = verify("reference", watermark=2, workloads=30)
    assert zero.ok and two.ok
    assert zero.findings and not two.findings
    assert "before it decoded a token" in zero.findings[0].text


def test_every_fitting_workload_finishes_without_leaks():
    for seed in range(5):
        reqs = generate(seed, 10, 8, 2, 1, arrival_steps=5)
        run = run_workload(Scheduler, reqs, 8, 2, 1)
        assert run.violation is None
        assert run.stats.finished == 10 and run.stats.leaked == 0


def test_simulation_seed_scale():
    one = simulate(120, 200, 16, watermark=1, seed=0)
    zero = simulate(120, 200, 16, watermark=0, seed=0)
    for sim in (one, zero):
        s = sim.stats
        assert sim.run.violation is None
        assert s.finished == 120 and s.leaked == 0 and s.final_free == 200
        assert s.preemptions > 0 and s.recomputed_tokens > 0
    assert zero.stats.preemptions > one.stats.preemptions
    assert zero.stats.pingpongs > one.stats.pingpongs == 0


def test_swap_mode_recomputes_nothing_with_room_on_host():
    sim = simulate(40, 60, 8, watermark=1, seed=1, mode="swap")
    s = sim.stats
    assert sim.run.violation is None and s.preemptions > 0
    assert s.recomputed_tokens == 0 and s.swapped_in_tokens == s.swapped_out_tokens > 0


def test_auto_mode_follows_the_cost_model():
    always_recompute = CostModel(LLAMA_3_3_70B.kv_bytes_per_token, 1e9, 1e9, 1.0)
    sim = simulate(40, 60, 8, watermark=1, seed=1, mode="auto", cost=always_recompute)
    assert sim.run.violation is None
    assert sim.stats.swapped_out_tokens == 0 and sim.stats.recomputed_tokens > 0


def test_tiny_host_pool_falls_back_to_recompute():
    reqs = generate(3, 20, 8, 2, 1)
    run = run_workload(lambda bm, wm: SwapScheduler(bm, wm, host_blocks=1), reqs, 8, 2, 1)
    assert run.violation is None and run.stats.preemptions > 0
    assert run.stats.recomputed_tokens > 0  # victims of more than 2 tokens do not fit on host


# -- cost model -------------------------------------------------------------------------
def test_cost_model_figures():
    assert LLAMA_3_3_70B.kv_bytes_per_token == 327_680
    cm = default()
    x = cm.crossover()
    assert 40 < x < 60
    assert cm.decide(16) == "recompute" and cm.decide(1024) == "swap"
    assert scenarios()[-1][1].crossover() is None  # 7B MHA on PCIe 4: recompute always


# -- CLI --------------------------------------------------------------------------------
def _one_line_error(capsys):
    err = capsys.readouterr().err
    assert err.startswith("kvcheck: error:") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv", [
    ["verify-scheduler", "--blocks", "4", "--watermark", "4"],
    ["verify-scheduler", "no-such-scheduler"],
    ["verify-scheduler", "kvcheck.impl.scheduler:Nope"],
    ["verify-scheduler", "kvcheck.impl.block_manager:BlockManager"],
    ["verify-scheduler", f"{HERE}/missing.py:X"],
    ["verify-scheduler", "--blocks", "0"],
    ["verify-scheduler", "--watermark", "-1"],
    ["verify-scheduler", "--trace-out", HERE],
    ["verify-scheduler", "--block-manager", "nope"],
    ["verify-scheduler", "--block-manager", "kvcheck.impl.block_manager:Nope"],
    ["verify-scheduler", "--block-manager", f"{HERE}/missing.py:X"],
    ["verify-scheduler", "--block-manager", "kvcheck.impl.errors:OutOfBlocks"],
    ["verify-scheduler", "--block-manager", f"{HERE}/../core/oob_named_otherwise.py:refuses"],
    ["verify-scheduler", "--out-of-blocks", "nope"],
    ["verify-scheduler", "--out-of-blocks", "kvcheck.impl.block_manager:BlockManager"],
    ["simulate", "--blocks", "1", "--block-size", "1"],
    ["simulate", "--compare-watermarks", "a,b"],
    ["simulate", "--mode", "teleport"],
    ["simulate", "--plot", "/nonexistent-dir/x.png"],
    ["simulate", "--link-gbps", "0"],
])
def test_bad_input_exits_2_with_one_line(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own one-line errors
        code = exc.code
    assert code == 2
    _one_line_error(capsys)


def test_cli_verify_scheduler_pass_and_fail(tmp_path, capsys):
    assert main(["verify-scheduler", "--workloads", "5"]) == 0
    assert "PASS reference" in capsys.readouterr().out
    out = tmp_path / "cex.json"
    target = f"{HERE}/buggy.py:RequeuePromptOnly"
    assert main(["verify-scheduler", target, "--trace-out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "VIOLATION" in text and "full length" in text
    trace = Trace.load(out)  # the counterexample, as a trace (kvcheck replay, report)
    assert trace.violation is not None and requests_of(trace.ops)
    assert main(["verify-scheduler", target, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["violation"]["kind"] == "policy"


def test_cli_simulate_with_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    assert main(["simulate", "--requests", "20", "--blocks", "30", "--block-size", "8",
                 "--max-prompt", "40", "--max-new", "40",
                 "--plot", str(png), "--compare-watermarks", "0"]) == 0
    text = capsys.readouterr().out
    assert "leaked blocks     0" in text and "swapping wins above" in text
    assert "watermark comparison" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "--requests", "10", "--blocks", "30", "--mode", "swap",
                 "--max-prompt", "40", "--max-new", "40", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["leaked"] == 0 and data["cost_model"]["kv_bytes_per_token"] == 327_680


def test_request_json_round_trip():
    r = Request(3, 5, 7, 2)
    assert Request(**r.to_json()) == r


# -- a scheduler with its own block manager -------------------------------------------------
SEED = f"{HERE}/seed_shaped.py"


def test_the_seeds_scheduler_on_the_seeds_block_manager_passes(capsys):
    """The module's own BlockManager is used: the scheduler catches its own OutOfBlocks."""
    assert main(["verify-scheduler", f"{SEED}:Scheduler"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"PASS {SEED}:Scheduler") and f"{SEED}:BlockManager block manager" in out
    assert main(["verify-scheduler", f"{SEED}:Scheduler", "--block-manager",
                 f"{SEED}:BlockManager", "--json", "--workloads", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "pass" and data["block_manager"] == f"{SEED}:BlockManager"


def test_on_another_block_manager_its_out_of_blocks_escapes(capsys):
    """Given kvcheck's reference instead, the seed's scheduler cannot catch its OutOfBlocks;
    the report says that is what escaped."""
    assert main(["verify-scheduler", f"{SEED}:Scheduler", "--block-manager", "reference"]) == 1
    text = capsys.readouterr().out
    assert "(crash): step" in text and "the block manager's out-of-blocks signal" in text
    assert main(["verify-scheduler", f"{SEED}:Scheduler", "--block-manager", "reference",
                 "--out-of-blocks", "kvcheck.impl.errors:MisuseError"]) == 1
    assert "out-of-blocks signal" not in capsys.readouterr().out


def _seed():
    from kvcheck.targets.loading import _import_attr

    return _import_attr(f"{SEED}:Scheduler"), _import_attr(f"{SEED}:BlockManager")


def test_the_harness_observes_the_users_block_manager():
    sched, bm = _seed()

    class LosesBlocks(bm):
        """free_seq forgets to return a sequence's last block."""

        def free_seq(self, seq):
            self.tables[seq] = self.tables[seq][:-1]
            super().free_seq(seq)

    r = verify(sched, block_manager=LosesBlocks, workloads=5, shrink_budget=10)
    assert not r.ok and r.block_manager.endswith("LosesBlocks")
    assert r.violation.kind in ("invariant", "policy"), r.violation
    assert verify(sched, block_manager=bm, workloads=5).ok


def test_garbage_lens_in_the_users_block_manager_is_a_violation():
    sched, bm = _seed()

    class FloatLens(bm):
        def allocate(self, seq, n_tokens):
            super().allocate(seq, n_tokens)
            self.lens[seq] = float(n_tokens)

    r = verify(sched, block_manager=FloatLens, workloads=2, do_shrink=False)
    assert r.violation.kind == "malformed", r.violation
    assert r.violation.witness == "lens[0] is 14.0, expected an integer", r.violation  # (13 + 1)
