"""vLLM v1's engine core (``vllm-v1-engine``): the release's real ``Scheduler`` with its real
``KVCacheManager``, ``Request`` and ``SamplingParams``, driven step by step by the engine
model with a generated model output (issue 34).

A fixed release passes with every rule exercised; #19459 (0.9.0: resuming a preempted
request whose drafts were accepted crashes the engine step) and #43569 (0.33.0 with priority
scheduling: a block cached by ``allocate_slots`` for a request preempted in the same
``schedule()`` is never written) are caught through the real scheduler, and the releases
around them pass; a manager that does not free is caught; every stand-in is declared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.check.shrink import Budget
from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install, vllm_v1_engine
from kvcheck.models.engine.model import EngineScope
from kvcheck.verify import verify

TRACES = sorted((Path(__file__).resolve().parents[2] / "docs" / "traces" / "engine").glob("*.json"))


def _engine(target, blocks=6, spec=3, policy="fcfs", seed=0, requests=30, shrink=False,
            caching=True):
    scope = EngineScope(blocks, 4, spec=spec, policy=policy, caching=caching)
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


def test_19459_is_caught_on_0_9_0_through_the_real_scheduler_and_0_9_1_passes():
    _ensure("0.9.0", "0.9.1")
    r = _engine("vllm-v1-engine@0.9.0", seed=2, shrink=True)
    v = r.violation
    assert r.verdict == "fail" and (v.kind, v.name) == ("crash", "step"), v
    assert "IndexError" in v.witness and "find_longest_cache_hit" in v.witness, v.witness
    assert len(r.trace.ops) <= 8, len(r.trace.ops)
    assert _engine("vllm-v1-engine@0.9.1", seed=2).verdict == "pass"


def test_43569_is_caught_on_0_33_0_with_priority_scheduling():
    """A lower-priority request's decode completes a block that ``allocate_slots`` caches;
    a higher-priority request then preempts it inside the same ``schedule()``: the key
    names a block whose last slot is never written. FCFS never preempts a request it has
    already scheduled in that step (the same workload passes)."""
    r = _engine("vllm-v1-engine", seed=6, policy="priority", shrink=True)
    assert r.verdict == "fail", "expected #43569's publish-before-write"
    assert r.violation.name in ("key_after_write", "cache_content"), r.violation
    assert len(r.trace.ops) <= 6, len(r.trace.ops)
    assert _engine("vllm-v1-engine", seed=6, policy="fcfs").verdict == "pass"


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
