"""The scheduler as one model of the one checker: the registry, fast and full modes agreeing,
the compiled spec against the evaluated one in lockstep on faulty schedulers and block
managers, the sweep's implied steps, counterexamples as traces (replay, report, pytest-out),
and the Hypothesis machine."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.check.model import Model, Options, model_named
from kvcheck.check.run import replay
from kvcheck.check.trace import Trace
from kvcheck.check.watchdog import Watchdog
from kvcheck.cli import main
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import OutOfBlocks
from kvcheck.impl.scheduler import Scheduler
from kvcheck.impl.swap import SwapScheduler
from kvcheck.models.scheduler import MODEL, SchedOp, SchedScope
from kvcheck.models.scheduler.model import ops_of, requests_of
from kvcheck.models.scheduler.runs import run_workload
from kvcheck.models.scheduler.workload import generate
from kvcheck.targets.loading import _import_attr
from kvcheck.verify import make_state_machine

from .buggy import CORPUS
from .test_scheduler import SeedShaped

HERE = __file__.rsplit("/", 1)[0]
SEED = f"{HERE}/seed_shaped.py"


def test_model_named_finds_the_scheduler_by_importing_its_package():
    code = ("from kvcheck.check.model import MODELS, model_named\n"
            "assert 'scheduler' not in MODELS\n"
            "m = model_named('scheduler')\n"
            "print(type(m).__module__, sorted(m.ops))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1) == ["kvcheck.models.scheduler.model", "['add', 'step']\n"]
    assert model_named("scheduler") is MODEL and isinstance(MODEL, Model)


def test_a_workload_is_an_operation_stream():
    reqs = generate(3, 6, 16, 4, 1, arrival_steps=8)
    ops = ops_of(reqs, 10)
    assert sum(o.kind == "step" for o in ops) == 10
    assert set(requests_of(ops)) == set(reqs)


# -- fast and full: the same verdict, the same run --------------------------------------------
def _seed():
    return _import_attr(f"{SEED}:Scheduler"), _import_attr(f"{SEED}:BlockManager")


TARGETS = {name: (cls, None) for name, (cls, _, _) in CORPUS.items()}
TARGETS.update({"reference": (Scheduler, None), "swap": (SwapScheduler, None),
                "seed-shaped": (_seed()[0], _seed()[1]),
                "seed-shaped-on-the-reference": (_seed()[0], BlockManager),
                "no-add-or-finish": (SeedShaped, None)})


def _verdict(v):
    return None if v is None else (v.kind, v.name, v.step, v.element, v.witness)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fast_and_full_agree(name):
    factory, bm = TARGETS[name]
    failed = 0
    for seed in range(3):
        for watermark in (0, 1):
            reqs = generate(seed, 12, 16, 4, watermark, arrival_steps=24)
            fast, full = (run_workload(factory, reqs, 16, 4, watermark, block_manager=bm,
                                       mode=mode, series=True) for mode in ("fast", "full"))
            assert _verdict(fast.violation) == _verdict(full.violation)
            assert fast.stats == full.stats and fast.findings == full.findings
            assert ([MODEL.op_to_json(o) for o in fast.history]
                    == [MODEL.op_to_json(o) for o in full.history])
            failed += fast.violation is not None
    if name in CORPUS or name == "seed-shaped-on-the-reference":
        assert failed
    else:
        assert not failed


# -- the compiled spec and the evaluated spec, in lockstep, on faulty targets -------------------
class FaultyBlockManager(BlockManager):
    """The reference, wrong once: at a seeded random call (of its ``kind``)."""

    def __init__(self, num_blocks, block_size, kind="refcount", seed=0):
        super().__init__(num_blocks, block_size)
        calls = {"lose-block": 6, "leak": 20, "double-free": 20}.get(kind, 40)  # in a run
        self.kind, self.at, self.calls = kind, random.Random(seed).randint(1, calls), 0

    def _now(self) -> bool:
        self.calls += 1
        return self.calls == self.at

    def append_slot(self, seq):
        out = super().append_slot(seq)
        if self.kind in ("refcount", "length") and self._now():
            if self.kind == "refcount":
                self.ref[self.tables[seq][0]] += 1
            else:
                self.lens[seq] -= 1
        return out

    def _release(self, block):
        super()._release(block)
        if self.kind in ("leak", "double-free") and self.ref[block] == 0 and self._now():
            if self.kind == "leak":
                self.free.remove(block)
            else:
                self.free.append(block)

    def free_seq(self, seq):
        if self.kind == "lose-block" and len(self.tables[seq]) > 1 and self._now():
            self.tables[seq].pop()
        super().free_seq(seq)


class FaultyScheduler(Scheduler):
    """The reference policy, wrong from a seeded random step on (or at one ``finish``)."""

    def __init__(self, bm, watermark_blocks=1, kind="skip-preempt", seed=0):
        super().__init__(bm, watermark_blocks)
        self.kind, self.at = kind, random.Random(seed).randint(1, 30)
        self.steps = self.finishes = 0

    def step(self):
        self.steps += 1
        wrong = self.steps >= self.at
        bm = self.bm
        while self.waiting and not (wrong and self.kind == "no-admit"):
            seq, n = self.waiting[0]
            if len(bm.free) - -(-n // bm.block_size) < self.watermark:
                break
            self.waiting.popleft()
            self._admit(seq, n)
            self.running.append(seq)
        decoded, i = [], 0
        while i < len(self.running):
            seq = self.running[i]
            try:
                bm.append_slot(seq)
            except OutOfBlocks:
                if wrong and self.kind == "skip-preempt":  # nobody preempted, seq not decoded
                    i += 1
                    continue
                victim = self.running.pop()
                n = bm.lens[victim]
                self._evict(victim)
                short = wrong and self.kind == "requeue-short" and n > 1
                self.waiting.appendleft((victim, n - 1 if short else n))
                continue
            decoded.append(seq)
            i += 1
        if wrong and self.kind == "decode-twice" and decoded:
            decoded.append(decoded[0])
        return decoded

    def finish(self, seq):
        self.finishes += 1
        if self.kind == "finish-keeps-blocks" and self.finishes == self.at % 5 + 1:
            self.running.remove(seq)
            return
        super().finish(seq)


BM_FAULTS = ("refcount", "length", "leak", "double-free", "lose-block")
SCHED_FAULTS = ("skip-preempt", "no-admit", "requeue-short", "decode-twice", "finish-keeps-blocks")


def _key(v):
    return None if v is None else (v.kind, v.name, v.step, v.element)


SMALL = SchedScope(8, 2, 1)  # a pool small enough to preempt often


def _lockstep(factory, bm, seed: int, scope=SMALL):
    """One workload through two oracles at once, one with the compiled spec (fast mode), one
    with the spec evaluated (full mode): the same verdict after every operation."""
    reqs = generate(seed, 10, scope.num_blocks, scope.block_size, scope.watermark,
                    arrival_steps=10)
    runs = [Options(mode="fast", compiled=True, extra={"block_manager": bm}),
            Options(mode="full", compiled=False, extra={"block_manager": bm})]
    with Watchdog(10.0) as wd:
        a, b = (MODEL.start(MODEL.build(factory, scope, o), scope, o) for o in runs)
        assert a.check is not None and b.check is None  # compiled, and not
        driver = MODEL.driver(seed, scope, None, Options(extra={"workload": reqs}))
        while a.violation is None:
            op = driver.next_op(a)
            if op is None:
                assert _key(a.sweep(wd)) == _key(b.sweep(wd))
                break
            assert a.valid(op) == b.valid(op)
            if not a.valid(op):
                continue
            va, vb = a.step(op, wd), b.step(MODEL.request(op), wd)
            assert _key(va) == _key(vb), (op, va, vb)
            assert a.observed_json() == b.observed_json()
            for pool in ("bm", "host"):  # the compiled check alone against the spec's text
                snap = getattr(a.post, pool) if a.post is not None else None
                if snap is not None:
                    assert a.check(snap) == (b._invariants(0, snap, pool) is None), (op, pool)
        assert _key(a.violation) == _key(b.violation)
        return a.violation


@pytest.mark.parametrize("kind", BM_FAULTS + SCHED_FAULTS)
def test_compiled_and_interpreted_in_lockstep_on_faulty_targets(kind):
    caught = 0
    for seed in range(12):
        if kind in BM_FAULTS:
            v = _lockstep(Scheduler, lambda nb, bs, s=seed: FaultyBlockManager(nb, bs, kind, s),
                          seed)
        else:
            v = _lockstep(lambda bm, wm, s=seed: FaultyScheduler(bm, wm, kind, s), None, seed)
        caught += v is not None
    assert caught >= 3, f"the fault {kind} fired in only {caught} of 12 runs"


def test_lockstep_on_the_corpus_and_the_reference():
    for name, (cls, rule, _) in CORPUS.items():  # at the corpus test's scope
        found = [_lockstep(cls, None, seed, SchedScope(16, 4, 1)) for seed in range(3)]
        assert any(v is not None and v.name == rule for v in found), name
    for seed in range(5):
        assert _lockstep(Scheduler, None, seed) is None
        assert _lockstep(SwapScheduler, None, seed) is None


# -- the sweep drains the workload --------------------------------------------------------------
def test_the_sweep_drains_the_workload_as_implied_steps():
    ops = [SchedOp("add", seq=0, prompt=1, max_new=2)]
    scope = SchedScope(4, 4, 1)
    r = replay(MODEL, CORPUS["finish-keeps-blocks"][0], scope, ops, Options(), record=True)
    assert [o.kind for o in r.ops] == ["add", "step", "step"] and r.implied == 2
    assert len(r.states) == 3 and r.states[-1]["running"] == []
    assert r.violation.step == 3 and r.violation.name == CORPUS["finish-keeps-blocks"][1]
    r = replay(MODEL, Scheduler, scope, ops, Options(), record=True)
    assert r.violation is None and r.implied == 2 and r.ops[-1].finished == [0]


# -- counterexamples are traces ---------------------------------------------------------------
def _pytest(path, target: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVCHECK_TARGET"}
    if target is not None:
        env["KVCHECK_TARGET"] = target
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(path)], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_counterexample_is_a_trace_to_replay_report_and_reproduce(tmp_path, capsys):
    out = tmp_path / "cex.json"
    target = f"{HERE}/buggy.py:RequeuePromptOnly"
    rule = CORPUS["requeue-prompt-only"][1]
    assert main(["verify-scheduler", target, "--trace-out", str(out)]) == 1
    capsys.readouterr()
    trace = Trace.load(out)
    assert trace.model == "scheduler" and trace.extra == {"watermark": 1}
    assert trace.violation.name == rule and len(trace.states) == len(trace.ops)
    assert trace.scope == SchedScope(trace.num_blocks, 4, 1)
    jsonschema = pytest.importorskip("jsonschema")
    from kvcheck.check.trace import schema

    jsonschema.Draft202012Validator(schema()).validate(json.loads(out.read_text()))
    # replayed: reproduced on the buggy scheduler, held on the reference (named as the model
    # names its targets)
    assert main(["replay", str(out)]) == 1
    assert f"REPRODUCED on {target}: step {trace.violation.step} (policy) {rule}" in \
        capsys.readouterr().out
    assert main(["replay", str(out), "--target", "reference", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "pass" and data["skipped"] == 0 and data["ran"] >= len(trace.ops)
    # drawn
    page = tmp_path / "cex.html"
    assert main(["report", str(out), "-o", str(page)]) == 0
    capsys.readouterr()
    html = page.read_text()
    assert "add(seq=0, prompt=" in html and 'data-violation="true"' in html and rule in html
    # reproduced by a standalone test: failing on the bug, passing on the reference
    repro = tmp_path / "test_repro_sched.py"
    assert main(["replay", str(out), "--pytest-out", str(repro)]) == 1
    capsys.readouterr()
    src = repro.read_text()
    assert "MODEL = 'scheduler'" in src and "pickle" not in src
    buggy = _pytest(repro)
    assert buggy.returncode == 1 and "full length" in buggy.stdout, buggy.stdout
    fixed = _pytest(repro, "reference")
    assert fixed.returncode == 0, fixed.stdout


def test_the_block_manager_given_travels_with_the_trace(tmp_path, capsys):
    out = tmp_path / "cex.json"
    assert main(["verify-scheduler", f"{SEED}:Scheduler", "--block-manager", "reference",
                 "--trace-out", str(out)]) == 1
    capsys.readouterr()
    trace = Trace.load(out)
    assert trace.settings == {"block_manager": "reference"} and trace.violation.kind == "crash"
    assert main(["replay", str(out)]) == 1
    assert "REPRODUCED" in capsys.readouterr().out
    trace.settings = {}  # on the scheduler's own block manager the same requests pass
    trace.write(out)
    assert main(["replay", str(out)]) == 0
    capsys.readouterr()


def test_a_swapping_schedulers_trace_records_its_host_pool(tmp_path, capsys):
    class KeepsHostCopy(SwapScheduler):
        """Re-admission forgets to free the host copy."""

        def _admit(self, seq, n_tokens):
            self.bm.allocate(seq, n_tokens)
            self._admitted.add(seq)

    r = run_workload(KeepsHostCopy, generate(0, 12, 16, 4, 1, arrival_steps=24), 16, 4, 1)
    assert r.violation is not None and r.violation.name.startswith("swap: ")
    from kvcheck.check.shrink import counterexample
    from kvcheck.check.trace import schema

    trace = counterexample(MODEL, "KeepsHostCopy", KeepsHostCopy, SchedScope(16, 4, 1), r.history,
                           r.violation, 0, Options(), budget=20)
    assert trace.violation.key == r.violation.key and "host" in trace.states[-1]
    again = Trace.loads(trace.dumps())
    assert again.to_json() == trace.to_json()
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(schema()).validate(trace.to_json())


def test_json_keeps_its_keys_and_adds_the_trace(capsys):
    assert main(["verify-scheduler", f"{HERE}/buggy.py:SkipAhead", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {"verdict", "target", "workloads", "steps", "violation", "workload", "num_blocks",
            "minimal", "original_requests", "steps_log", "pingpongs", "findings"} <= set(data)
    trace = Trace.from_json(data["trace"])
    assert data["workload"] == [r.to_json() for r in requests_of(trace.ops)]
    assert data["num_blocks"] == trace.num_blocks and data["minimal"] == trace.minimality
    assert data["violation"] == trace.violation.to_json()
    assert [e["step"] for e in data["steps_log"]] == [i + 1 for i, o in enumerate(trace.ops)
                                                     if o.kind == "step"]


# -- the Hypothesis machine --------------------------------------------------------------------
def machine_settings(machine, **more):
    """The machine's own settings (Hypothesis does not shrink: kvcheck's shrinker does, in
    the failure's message) with this file's counts."""
    return settings(machine.TestCase.settings, **{
        "max_examples": 300, "stateful_step_count": 20, "database": None, "derandomize": True,
        "suppress_health_check": list(HealthCheck), **more})


@pytest.mark.parametrize("name", ["decode-twice", "finish-keeps-blocks"])
def test_the_hypothesis_machine_finds_a_corpus_bug(name):
    cls, rule, _ = CORPUS[name]
    machine = make_state_machine(cls, num_blocks=4, block_size=2, model="scheduler")
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=machine_settings(machine))
    text = str(info.value)
    assert "policy violation at step" in text and rule in text, text
    assert "Counterexample" in text and "VIOLATION" in text


def test_the_hypothesis_machine_passes_the_reference():
    for cls in (Scheduler, SwapScheduler):
        machine = make_state_machine(cls, num_blocks=4, block_size=2, model="scheduler")
        run_state_machine_as_test(machine, settings=machine_settings(machine, max_examples=60))
