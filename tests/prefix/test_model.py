"""The prefix cache as a model of the one checker (``kvcheck.models.prefix``).

Found by name; fast and full mode give the same verdicts (every corpus entry, the
reference); the compiled and the interpreted spec report the same violation at the same
step on randomly faulty prefix caches; copies behave like the original; its traces are
the one format (schema, replay, report, pytest reproducer), and the traces verify-prefix
wrote before still load; the Hypothesis machine finds corpus bugs; a target whose cache
cannot be read, or hangs while it is read, is a violation.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.check.model import Options
from kvcheck.check.run import drive, replay
from kvcheck.check.trace import Trace, TraceError, schema
from kvcheck.cli import main
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.models.blocks import BlockScope
from kvcheck.models.prefix import MODEL, PrefixModel
from kvcheck.models.prefix import compiled as compiled_checks
from kvcheck.models.prefix.oracle import PrefixOracle
from kvcheck.spec.logic import PY
from kvcheck.spec.prefix import PREFIX_INVARIANTS
from kvcheck.verify import make_state_machine, verify

sys.path.insert(0, str(Path(__file__).parent))
from buggy_prefix import CORPUS, PartialBlockCached, UnchainedKeys  # noqa: E402
from faulty_prefix import faulty  # noqa: E402
from test_spec import corrupt, random_valid  # noqa: E402

HERE = Path(__file__).parent
LEGACY = HERE / "legacy"


def _run(factory, scope, mode, seed, ops, compiled=True):
    d = drive(MODEL, factory, scope, Options(mode=mode, compiled=compiled), seed, ops)
    return (None if d.violation is None else d.violation.to_json(),
            [MODEL.op_to_json(o) for o in d.history], d)


# -- the model -----------------------------------------------------------------------------
def test_found_by_name_in_a_fresh_process():
    code = ("from kvcheck.check.model import MODELS, model_named; assert 'prefix' not in MODELS; "
            "print(type(model_named('prefix')).__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "PrefixModel"
    assert isinstance(MODEL, PrefixModel) and MODEL.name == "prefix"


def test_operations_round_trip_through_json():
    ops = [MODEL.ops["allocate"].make("allocate", seq=0, tokens=[5, 6, 7]),
           MODEL.ops["append_slot"].make("append_slot", seq=0, token=9),
           MODEL.ops["fork"].make("fork", seq=0, child=1),
           MODEL.ops["free_seq"].make("free_seq", seq=1)]
    assert ops[0].n_tokens == 3 and ops[0].tokens == (5, 6, 7) and ops[1].token == 9
    r = replay(MODEL, PrefixCachingBlockManager, BlockScope(4, 2), ops, Options(), record=True)
    assert r.violation is None and len(r.ops) == 4 and len(r.states) == 4
    for op in r.ops:
        again = MODEL.op_from_json(json.loads(json.dumps(MODEL.op_to_json(op))))
        assert MODEL.op_to_json(again) == MODEL.op_to_json(op)
    assert MODEL.op_to_json(r.ops[0]) == {"op": "allocate", "seq": 0, "tokens": [5, 6, 7],
                                          "result": {"outcome": "ok", "hits": 0, "cached_tokens": 0}}
    state = r.states[0]
    assert set(state) == {"tables", "lens", "refs", "free", "free_list", "evictable", "cache"}
    assert sorted(state["cache"].values()) == [0] and state["evictable"] == []


def test_the_shrinker_cuts_prompts_and_renumbers_tokens():
    """A prompt longer than it needs to be is cut; tokens come out as 0, 1, 2 ..."""
    ops = [MODEL.ops["allocate"].make("allocate", seq=7, tokens=[150, 151, 152, 153, 154])]
    r = verify(PartialBlockCached, 8, 2, 50, 0, model="prefix")
    assert not r.ok and r.violation.name == "no_partial_cached"
    assert len(r.trace.ops) == 1
    (op,) = r.trace.ops
    assert op.seq == 0 and len(op.tokens) == 1 and op.tokens == (0,), op
    s = replay(MODEL, PartialBlockCached, BlockScope(8, 2), ops, Options())
    assert s.violation.name == "no_partial_cached"


# -- fast and full ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_fast_and_full_agree_on_the_corpus(name, seed):
    cls = CORPUS[name][0]
    fast = _run(cls, BlockScope(8, 2), "fast", seed, 2000)
    full = _run(cls, BlockScope(8, 2), "full", seed, 2000)
    assert fast[0] is not None, f"{name} not caught in fast mode"
    assert fast[:2] == full[:2]  # the same operations, the same violation at the same step


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_fast_and_full_end_in_the_same_trace(name):
    cls = CORPUS[name][0]
    fast = verify(cls, 8, 2, 2000, 0, mode="fast", shrink_budget=10.0, model="prefix")
    full = verify(cls, 8, 2, 2000, 0, mode="full", shrink_budget=10.0, model="prefix")
    assert fast.verdict == full.verdict == "fail"
    assert fast.trace.to_json() | {"kvcheck_version": ""} == full.trace.to_json() | {
        "kvcheck_version": ""}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("nb,bs", [(16, 4), (8, 2), (5, 1), (64, 8)])
def test_fast_and_full_agree_on_the_reference(nb, bs, seed):
    fast = _run(PrefixCachingBlockManager, BlockScope(nb, bs), "fast", seed, 1500)
    full = _run(PrefixCachingBlockManager, BlockScope(nb, bs), "full", seed, 1500)
    assert fast[0] is None and full[0] is None
    assert fast[1] == full[1]
    assert fast[2].state.stats == full[2].state.stats


def test_fast_mode_records_what_full_mode_observes():
    """On a legal target the fast mode's recorded state (from its verified ghost and the
    cache) is the allocator's state as the full mode reads it."""
    scope = BlockScope(6, 2)
    states = {}
    for mode in ("fast", "full"):
        target = MODEL.build(PrefixCachingBlockManager, scope, Options())
        state = MODEL.start(target, scope, Options(mode=mode))
        driver = MODEL.driver(5, scope, target, Options())
        seen = []
        for _ in range(300):
            op = driver.next_op(state)
            if state.valid(op):
                assert state.step(op) is None
                seen.append(state.observed_json())
        states[mode] = seen
    assert states["fast"] == states["full"]


# -- compiled and interpreted ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fast", "full"])
def test_compiled_and_interpreted_checks_in_lockstep_on_faulty_caches(mode):
    caught = set()
    for seed in range(40):
        a = _run(faulty(seed), BlockScope(8, 2), mode, seed, 600, compiled=True)
        b = _run(faulty(seed), BlockScope(8, 2), mode, seed, 600, compiled=False)
        assert a[:2] == b[:2], (seed, a[0], b[0])
        if a[0] is not None:
            caught.add(a[0]["name"])
    assert len(caught) >= 5, caught  # many different rules broke, and both saw each alike


def test_compiled_prefix_invariants_mean_what_the_spec_says():
    """On random valid and corrupted cache states the compiled check (inline terms, and
    every term a call) is True exactly when every invariant holds."""
    plain = compiled_checks.compile_invariants(inline=False)
    rng = random.Random(13)
    seen = {True: 0, False: 0}
    for _ in range(400):
        snap = random_valid(rng, rng.randint(1, 7), rng.randint(1, 4))
        if rng.random() < 0.6:
            snap = corrupt(rng, snap)
        want = all(inv.formula(PY, snap) for inv in PREFIX_INVARIANTS)
        assert compiled_checks.invariants(snap) == plain(snap) == want
        seen[want] += 1
    assert seen[True] and seen[False]


# -- copies --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fast", "full"])
def test_clone_is_faithful_and_independent(mode):
    scope = BlockScope(6, 2)
    target = MODEL.build(PrefixCachingBlockManager, scope, Options())
    state = MODEL.start(target, scope, Options(mode=mode))
    driver = MODEL.driver(11, scope, target, Options())

    def next_valid():
        while True:
            op = driver.next_op(state)
            if state.valid(op):
                return op

    for _ in range(60):
        assert state.step(next_valid()) is None
    copy = state.clone().clone()  # a copy of a copy, as exploration makes them
    assert copy.target is not state.target and copy.s.target is copy.target
    before = state.observed_json()
    for _ in range(120):
        op = next_valid()
        mine = MODEL.request(op)
        assert state.step(op) is None and copy.step(mine) is None
        assert MODEL.op_to_json(mine) == MODEL.op_to_json(op)
        assert copy.observed_json() == state.observed_json()
    assert copy.stats == state.stats
    # the copy's steps did not touch the original: one more on the copy alone
    live = copy.live_seqs()[0]
    now = state.observed_json()
    assert copy.step(MODEL.ops["free_seq"].make("free_seq", seq=live)) is None
    assert state.observed_json() == now != before
    assert live in state.live_seqs() and live not in copy.live_seqs()


# -- traces --------------------------------------------------------------------------------
def _trace(tmp_path, cls="UnchainedKeys"):
    out = tmp_path / "t.json"
    target = f"{HERE / 'buggy_prefix.py'}:{cls}"
    assert main(["verify-prefix", target, "--blocks", "8", "--block-size", "2", "--ops", "2000",
                 "--trace-out", str(out)]) == 1
    return out, target


def test_a_prefix_trace_matches_the_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out, _ = _trace(tmp_path)
    data = json.loads(out.read_text())
    assert (data["format"], data["version"], data["model"]) == ("kvcheck.trace", 2, "prefix")
    assert len(data["states"]) == len(data["ops"])
    jsonschema.Draft202012Validator(schema()).validate(data)
    trace = Trace.load(out)
    assert trace.model == "prefix" and trace.ops[0].tokens
    assert trace.to_json() == data


def test_replay_report_and_pytest_out_of_a_prefix_trace(tmp_path, capsys):
    out, target = _trace(tmp_path)
    capsys.readouterr()
    assert main(["replay", str(out)]) == 1
    text = capsys.readouterr().out
    assert text.startswith("REPRODUCED") and "cache_content" in text and "tokens=[" in text
    assert main(["replay", str(out), "--target", "prefix"]) == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "reproduced"
    page = tmp_path / "t.html"
    assert main(["report", str(out), "-o", str(page)]) == 0
    html = page.read_text()
    assert 'data-violation="true"' in html and "allocate(seq=0, tokens=[" in html
    assert 'class="hl" data-block=' in html  # the block the invariant is about
    test = tmp_path / "test_repro.py"
    assert main(["replay", str(out), "--pytest-out", str(test)]) == 1
    env = {k: v for k, v in os.environ.items() if k != "KVCHECK_TARGET"}
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)]
    failing = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "cache_content" in failing.stdout
    fixed = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path,
                           env={**env, "KVCHECK_TARGET": "prefix"})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_a_bad_prefix_state_in_a_trace_is_refused(tmp_path):
    out, _ = _trace(tmp_path)
    data = json.loads(out.read_text())
    data["states"][0]["refs"].append(0)
    with pytest.raises(TraceError, match="refcounts for a pool of"):
        Trace.from_json(data)
    data = json.loads(out.read_text())
    data["ops"][0]["tokens"] = []
    with pytest.raises(TraceError, match="at least one token"):
        Trace.from_json(data)
    # an append's token is a token id like a prompt's: no larger than an allocator can hold
    ops = [MODEL.ops["allocate"].make("allocate", seq=0, tokens=[1]),
           MODEL.ops["append_slot"].make("append_slot", seq=0, token=2)]
    data = Trace("prefix", 4, 2, ops, model="prefix").to_json()
    for bad in (2**63, True, "2", None):
        data["ops"][1]["token"] = bad
        with pytest.raises(TraceError, match=r"trace.ops\[1\].token: expected a token id"):
            Trace.from_json(data)
    data["ops"][1]["token"] = -(2**63)
    assert Trace.from_json(data).ops[1].token == -(2**63)


@pytest.mark.parametrize("name,cls,rule", [
    ("unchained-keys", "UnchainedKeys", "cache_content"),
    ("evicted-left-in-map", "EvictedLeftInMap", "no_partial_cached")])
def test_traces_verify_prefix_wrote_before_still_load(name, cls, rule, capsys):
    path = LEGACY / f"{name}.json"
    assert json.loads(path.read_text())["format"] == "kvcheck.prefix-trace"
    trace = Trace.load(path)
    assert trace.model == "prefix" and trace.violation.name == rule and trace.states == []
    assert all(len(op.tokens) == op.n_tokens for op in trace.ops if op.kind == "allocate")
    assert main(["replay", str(path), "--target", f"{HERE / 'buggy_prefix.py'}:{cls}"]) == 1
    assert "REPRODUCED" in capsys.readouterr().out
    assert main(["replay", str(path), "--target", "prefix"]) == 0


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(version=3), "unsupported kvcheck.prefix-trace version 3"),
    (lambda d: d.update(format="kvcheck.nosuch-trace"), "not a kvcheck trace"),
    (lambda d: d.update(ops=5), "trace.ops: expected a list"),
    (lambda d: d.update(extra=1), "unexpected key 'extra'"),
    (lambda d: d["ops"][3].update(tokens=[1, 2]), "writes exactly one token"),
    (lambda d: d["ops"][0].update(tokens="x"), "trace.ops[0].tokens: expected array"),
    (lambda d: d["ops"][2].update(tokens=[1]), "trace.ops[2]: unexpected key 'tokens'"),
    (lambda d: d["ops"][1].pop("seq"), "missing 'seq'"),
])
def test_a_bad_old_trace_is_one_line_exit_2(tmp_path, change, message):
    data = json.loads((LEGACY / "evicted-left-in-map.json").read_text())
    change(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(TraceError) as info:
        Trace.load(bad)
    assert message in str(info.value) and "\n" not in str(info.value)
    p = subprocess.run([sys.executable, "-c", "import sys; from kvcheck.cli import main; "
                        "sys.exit(main())", "replay", str(bad)], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


# -- the Hypothesis machine --------------------------------------------------------------------
@pytest.mark.parametrize("cls,rules", [
    (PartialBlockCached, {"no_partial_cached"}),
    (UnchainedKeys, {"cache_content", "allocate: cache hit returns a block holding the requested "
                                      "prefix"})])
def test_the_state_machine_finds_a_corpus_bug(cls, rules):
    machine = make_state_machine(cls, num_blocks=4, block_size=2, model="prefix")
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=settings(
            machine.TestCase.settings, max_examples=300, stateful_step_count=20, database=None,
            suppress_health_check=list(HealthCheck)))
    head = str(info.value).splitlines()[0]
    assert any(rule in head for rule in rules), head
    assert "tokens=[" in str(info.value)  # the run explained with its prompts


def test_the_state_machine_passes_the_reference():
    machine = make_state_machine(PrefixCachingBlockManager, num_blocks=4, block_size=2,
                                 model="prefix")
    run_state_machine_as_test(machine, settings=settings(machine.TestCase.settings,
                                                         max_examples=60, database=None))


# -- targets that misbehave while their cache is read -----------------------------------------
class CacheReadRaises(PrefixCachingBlockManager):
    def cache_entries(self):
        if len(self.tables) >= 2:
            raise RuntimeError("cache corrupted")
        return super().cache_entries()


class CacheReadHangs(PrefixCachingBlockManager):
    def evictable_blocks(self):
        if self.evictable:
            time.sleep(30)
        return super().evictable_blocks()


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_cache_that_cannot_be_read_is_malformed(mode):
    r = verify(CacheReadRaises, 8, 2, 500, 0, mode=mode, model="prefix")
    assert (r.violation.kind, r.violation.name) == ("malformed", "prefix observation")
    assert "RuntimeError" in r.violation.witness and len(r.trace.ops) == 2


def test_a_cache_read_that_hangs_is_a_hang():
    r = verify(CacheReadHangs, 8, 2, 500, 0, timeout=0.5, do_shrink=False, model="prefix")
    assert (r.violation.kind, r.violation.name) == ("hang", "prefix observation")


def test_read_back_witness_names_no_writer():
    """Token ids are shared between sequences: the data witness names no single writer
    (it used to call the oracle itself there)."""
    state = PrefixOracle(MODEL.build(PrefixCachingBlockManager, BlockScope(4, 2), Options()))
    assert state.s.shadow.owner(3) is None and state.s.shadow.oracle is state


class HangsOnItsThirdSequence(PrefixCachingBlockManager):
    """Its cache read never returns once three sequences are live: every shrinking
    candidate that still hangs does so at about the same call."""

    def cache_entries(self):
        if len(self.tables) > 2:
            while True:
                pass
        return super().cache_entries()


def test_a_hang_is_shrunk_under_the_supervisor():
    """The hang is interrupted each time; the supervisor must not take one hanging
    candidate after another, each at the same call number of its own replay, for one call
    that never returns (the heartbeat counts calls over every session)."""
    p = subprocess.run([sys.executable, "-c", "import sys; from kvcheck.cli import main; "
                        "sys.exit(main())", "verify-prefix", f"{__file__}:HangsOnItsThirdSequence",
                        "--ops", "200", "--timeout", "1", "--shrink-seconds", "12"],
                       capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "could not be interrupted" not in p.stdout and "shrunk to" in p.stdout, p.stdout
    assert "(hang): allocate" in p.stdout or "(hang): prefix observation" in p.stdout, p.stdout
