"""vLLM v1's engine core (``vllm-v1-engine``): the release's real ``Scheduler`` with its real
``KVCacheManager``, ``Request`` and ``SamplingParams``, driven step by step by the engine
model with a generated model output (issue 34).

A fixed release passes with every rule exercised, the early releases (0.6.4.post1 .. 0.8.2,
their own scheduler with its preallocating manager) included; #10730 (0.6.4.post1: a
preallocation past the request's block-table row) and #11186 (0.6.4.post1: a prompt wholly
cached recomputes one token into a block keyed by other tokens) are caught, 0.6.5 passes
their traces; #19459 (0.9.0: resuming a preempted
request whose drafts were accepted crashes the engine step) and #43569 (0.33.0 with priority
scheduling: a block cached by ``allocate_slots`` for a request preempted in the same
``schedule()`` is never written) are caught through the real scheduler, and the releases
around them pass; a manager that does not free is caught; every stand-in is declared.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kvcheck.check.shrink import Budget
from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install, vllm_v1_engine
from kvcheck.models.engine.model import EngineOp, EngineScope
from kvcheck.verify import replay_ops, verify

TRACES = sorted((Path(__file__).resolve().parents[2] / "docs" / "traces" / "engine").glob("*.json"))


def _engine(target, blocks=6, spec=3, policy="fcfs", seed=0, requests=30, shrink=False,
            caching=True, max_model_len=0):
    scope = EngineScope(blocks, 4, spec=spec, policy=policy, caching=caching,
                        max_model_len=max_model_len)
    return verify(target, blocks, 4, 2000, seed, model="engine", scope=scope,
                  do_shrink=shrink, shrink_budget=Budget(20_000),
                  extra={"requests": requests})


def _ensure(*versions):
    """The releases a test reads (scripts/test.sh installs them; installed here if not)."""
    for v in versions:
        install.ensure(install.ENGINES[install.select("vllm-v1", v, with_family=True).key], v)


def test_the_current_release_passes_with_every_rule_exercised():
    """0.33.0, fcfs, speculation on and off: drafts, preemptions, prefix-cache hits and KV
    calls all happen, and every block-level, prefix-cache, KV-call and engine rule holds."""
    for spec in (3, 0):
        r = _engine("vllm-v1-engine", spec=spec, seed=1)
        assert r.verdict == "pass", r.violation
        st = r.state.stats
        assert st["finished"] + st["aborted"] == st["requests"] == 30, st
        assert st["preemptions"] > 0 and st["hits"] > 0 and st["kv_calls"] > 100, st
    r = _engine("vllm-v1-engine", spec=0, seed=1, caching=False)  # prefix caching off
    assert r.verdict == "pass" and r.state.stats["hits"] == 0, r.violation


def test_a_preallocating_release_passes_within_its_preallocation():
    """0.8.4's manager takes up to 16 blocks of 4 (64 tokens) beyond a request's need when it
    takes new ones: the table is checked against that bound, and the release passes."""
    _ensure("0.8.4")
    for spec in (3, 0):
        r = _engine("vllm-v1-engine@0.8.4", spec=spec, seed=1)
        assert r.verdict == "pass", r.violation
        assert r.state.target.preallocate_blocks == 16, r.state.target.preallocate_blocks


def test_the_early_scheduler_passes_on_each_of_its_code_paths():
    """0.7.0 (append_slots, the manager's own pool, the request built from token_inputs, one
    sampled token a request), 0.7.2 (one allocate_slots), 0.8.0 (BlockPool without a null
    block, drafts in the runner's output): the release's own Scheduler and preallocating
    KVCacheManager pass, with preemptions and cache hits, and with speculation on 0.8.0."""
    _ensure("0.7.0", "0.7.2", "0.8.0")
    # (0.8.0 .. 0.8.4 with drafts past max_model_len crash in allocate_slots, fixed in 0.8.5:
    # the run with speculation keeps the engine's max_model_len)
    for version, spec, row in (("0.7.0", 0, 16), ("0.7.2", 0, 16), ("0.8.0", 0, 16),
                               ("0.8.0", 3, 0)):
        r = _engine(f"vllm-v1-engine@{version}", blocks=8, spec=spec, seed=1, requests=12,
                    max_model_len=row)
        assert r.verdict == "pass", (version, spec, r.violation)
        t, st = r.state.target, r.state.stats
        assert (t.version, t.block_offset, t.preallocate_blocks) == (version, 0, 16)
        assert st["finished"] + st["aborted"] == st["requests"] == 12, st
        assert st["hits"] > 0 and st["kv_calls"] > 30, st
        mods = vllm_v1_engine.load(version)
        for name in mods.stood_in:  # every stand-in of the early load is declared
            declared = {**vllm_v1_engine.STUBS, **vllm_v1_engine.STUBS_TO_0_10}.get(name)
            assert (declared and declared.__doc__) or vllm_v1_engine._off(name), name
        assert "vllm.v1.core.scheduler" in mods.files and "vllm.v1.request" in mods.files


def test_10730_a_preallocation_past_the_block_table_row_is_caught_on_0_6_4_post1():
    """0.6.4.post1's manager takes min(needed + 64 / block_size, free) blocks: past the
    row of cdiv(max_model_len, block_size) at once; 0.6.5 caps it there and passes."""
    _ensure("0.6.4.post1", "0.6.5")
    r = _engine("vllm-v1-engine@0.6.4.post1", blocks=8, spec=0, max_model_len=8, shrink=True)
    assert r.verdict == "fail" and r.violation.name.startswith(
        "a request's blocks fit its block-table row"), r.violation
    assert len(r.trace.ops) == 2, r.trace.ops  # add, step
    r = _engine("vllm-v1-engine@0.6.5", blocks=8, spec=0, max_model_len=8)
    assert r.verdict == "pass", r.violation
    assert r.state.stats["finished"] > 0 and r.state.target.preallocate_blocks == 16


def test_11186_is_caught_on_0_6_4_post1_and_its_trace_passes_on_0_6_5():
    """A prompt wholly in the cache: 0.6.4.post1's scheduler computes its last token only,
    into a fresh block the manager keys by other tokens (key_after_write); 0.6.5 recomputes
    the block. The run finds it; its shrunk trace (seed 2, 7 operations) fails on 0.6.4.post1
    and passes on 0.6.5 (whose own #11565 shows on runs of its own, not on this trace)."""
    _ensure("0.6.4.post1", "0.6.5")
    r = _engine("vllm-v1-engine@0.6.4.post1", blocks=8, spec=0, seed=2)
    assert r.verdict == "fail" and r.violation.name == "key_after_write", r.violation
    prompt = [2, 2, 2, 4]  # one block, wholly cached once request 3 has run
    ops = [EngineOp("add", seq=3, tokens=prompt, max_new=1, priority=0),
           EngineOp("add", seq=4, tokens=prompt, max_new=4, priority=1),
           *[EngineOp("step", gen=1667407602) for _ in range(5)]]
    scope = {"num_blocks": 2, "block_size": 4, "budget": 4, "max_seqs": 4, "priority": 0,
             "caching": 1, "spec": 0}
    bad = replay_ops("engine", "vllm-v1-engine@0.6.4.post1", scope, copy.deepcopy(ops))
    assert bad.violation is not None and bad.violation.name == "key_after_write", bad.violation
    assert "block 1" in bad.violation.witness and "1 of 4 slots" in bad.violation.witness
    good = replay_ops("engine", "vllm-v1-engine@0.6.5", scope, copy.deepcopy(ops))
    assert good.violation is None, good.violation


def test_19459_is_caught_on_0_9_0_through_the_real_scheduler_and_0_9_1_passes():
    _ensure("0.9.0", "0.9.1")
    r = _engine("vllm-v1-engine@0.9.0", seed=2, shrink=True)
    v = r.violation
    assert r.verdict == "fail" and (v.kind, v.name) == ("crash", "step"), v
    assert "IndexError" in v.witness and "find_longest_cache_hit" in v.witness, v.witness
    assert len(r.trace.ops) <= 8, len(r.trace.ops)
    assert _engine("vllm-v1-engine@0.9.1", seed=2).verdict == "pass"


@pytest.mark.parametrize("target", ["vllm-v1-engine", "vllm-v1-engine@0.34.0"])
def test_43569_is_caught_on_0_33_0_and_0_34_0_with_priority_scheduling(target):
    """A lower-priority request's decode completes a block that ``allocate_slots`` caches;
    a higher-priority request then preempts it inside the same ``schedule()``: the key
    names a block whose last slot is never written. FCFS never preempts a request it has
    already scheduled in that step (the same workload passes). Still so in 0.34.0, the
    newest release (its int32 token buffers, block-id hash map and new settings read)."""
    _ensure(target.partition("@")[2] or install.ENGINES["vllm-v1"].pinned)
    r = _engine(target, seed=6, policy="priority", shrink=True)
    assert r.verdict == "fail", "expected #43569's publish-before-write"
    assert r.violation.name in ("key_after_write", "cache_content"), r.violation
    assert len(r.trace.ops) <= 6, len(r.trace.ops)
    assert _engine(target, seed=6, policy="fcfs").verdict == "pass"


def leaky(num_blocks, block_size, **kw):
    """The release's engine whose ``KVCacheManager.free`` does nothing (a finished,
    aborted or preempted request keeps its blocks)."""
    t = vllm_v1_engine.make(num_blocks, block_size, **kw)
    t.manager.free = lambda request: None
    return t


def test_a_manager_that_does_not_free_is_caught():
    r = _engine(leaky, spec=0, seed=1)
    assert r.verdict == "fail"
    assert r.violation.name in ("a request that is not running holds no block",
                                "free: the request holds no block afterwards"), r.violation


def reordering(num_blocks, block_size, **kw):
    """The release's engine whose ``allocate_slots`` then swaps a request's first two blocks
    (its table no longer keeps its blocks in place)."""
    t = vllm_v1_engine.make(num_blocks, block_size, **kw)
    recorder = t.manager.allocate_slots  # kvcheck's recorder around the release's method
    real = recorder.method

    def allocate_slots(manager, request, *a, **k):
        got = real(manager, request, *a, **k)
        blocks = manager.coordinator.single_type_managers[0].req_to_blocks[request.request_id]
        if got is not None and len(blocks) >= 2:
            blocks[0], blocks[1] = blocks[1], blocks[0]
        return got

    recorder.method = allocate_slots
    return t


def test_a_manager_that_reorders_a_table_is_caught():
    """The exception for v0's promotion (a just-filled block swapped for an identical cached
    one) does not excuse a table whose blocks move."""
    r = _engine(reordering, spec=0, seed=1, caching=False)
    assert r.verdict == "fail"
    assert r.violation.name == ("allocate_slots: the request's blocks grow by its hits and "
                                "the new blocks returned"), r.violation


ASKED: dict = {}  # request -> how often its block hashes were read after it finished


def counting(num_blocks, block_size, **kw):
    """The release's engine, counting the reads of a finished request's block hashes."""
    t = vllm_v1_engine.make(num_blocks, block_size, **kw)
    read = t.block_hashes

    def block_hashes(seq):
        if t.is_finished(seq):
            ASKED[seq] = ASKED.get(seq, 0) + 1
        return read(seq)

    t.block_hashes = block_hashes
    return t


def test_a_finished_request_s_block_hashes_are_learned_once():
    """The oracle learns what each block hash means from every request's hashes; once a
    request has finished (or was aborted) its tokens and hashes no longer change, so they
    are read once more after it ends and then no more (not at every later check: a run's
    checks x its requests)."""
    ASKED.clear()
    r = _engine(counting, spec=0, seed=1)
    assert r.verdict == "pass", r.violation
    st = r.state.stats
    assert st["finished"] + st["aborted"] == st["requests"] == len(ASKED) == 30, st
    assert set(ASKED.values()) == {1}, ASKED


def test_every_stand_in_is_declared_with_its_reason():
    """The adapter says, in one place, which objects it replaces and why: every module the
    load stood in is in ``STUBS`` (each builder documented) or under a prefix of ``OFF``
    (each with its reason); the scheduler, request, sampling parameters, KV-cache manager
    and block pool are the release's own files."""
    mods = vllm_v1_engine.load(None)
    for name in mods.stood_in:
        if name in vllm_v1_engine.STUBS:
            assert (vllm_v1_engine.STUBS[name].__doc__ or "").strip(), name
        else:
            prefix = vllm_v1_engine._off(name)
            assert prefix is not None and vllm_v1_engine.OFF[prefix], name
    for own in ("vllm.v1.core.sched.scheduler", "vllm.v1.request", "vllm.sampling_params",
                "vllm.v1.core.kv_cache_manager", "vllm.v1.core.block_pool", "vllm.v1.outputs",
                "vllm.v1.engine", "vllm.v1.core.sched.request_queue"):
        assert own in mods.files and own not in mods.stood_in, own
        assert mods.modules[own].__file__.startswith(str(mods.root)), own


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_the_documented_engine_findings_reproduce(path, capsys):
    """docs/findings.md's engine traces (E1 on 0.8.5, E2 on 0.10.2, #19459 on 0.9.0, #43569
    on 0.33.0) reproduce on their releases with ``kvcheck replay``."""
    _ensure(path.stem.split("-")[3])  # vllm-v1-engine-VERSION-...
    assert TRACES and kvcheck(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("REPRODUCED on vllm-v1-engine@"), out
