"""aphrodite-engine's v1 engine core (``aphrodite-v1-engine``): the fork's own ``Scheduler``,
``KVCacheManager``, ``Request`` and ``SamplingParams`` (aphrodite/v1/..., loaded under
aphrodite's names), driven by the engine model as ``vllm-v1-engine`` is (issue 34).

The releases scripts/test.sh installs (0.21.0, 0.22.0, 0.24.1) pass with every rule
exercised; vLLM's #43569 (L1 in docs/findings.md: with priority scheduling a block cached by
``allocate_slots`` for a request preempted in the same ``schedule()`` is never written) is
caught in the fork's own scheduler on 0.24.1, the newest on PyPI, and the same workload
passes under fcfs; a manager that does not free is caught; every stand-in is declared."""

from __future__ import annotations

import inspect

import pytest

from kvcheck.impl.thirdparty import aphrodite_v1_engine, install, vllm_v1_engine
from kvcheck.models.engine.model import EngineScope
from kvcheck.verify import verify

RELEASES = ("0.21.0", "0.22.0", "0.24.1")


def _engine(target, blocks=6, spec=3, policy="fcfs", seed=0, caching=True, shrink=False):
    scope = EngineScope(blocks, 4, spec=spec, policy=policy, caching=caching)
    return verify(target, blocks, 4, 2000, seed, model="engine", scope=scope, do_shrink=shrink,
                  extra={"requests": 30})


@pytest.fixture(scope="module", autouse=True)
def _installed():
    for v in RELEASES:
        install.ensure(install.ENGINES[aphrodite_v1_engine.ENGINE_KEY], v)


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_passes_with_every_rule_exercised(version):
    r = _engine(f"aphrodite-v1-engine@{version}", seed=1)
    assert r.verdict == "pass", r.violation
    st = r.state.stats
    assert st["finished"] + st["aborted"] == st["requests"] == 30, st
    assert st["preemptions"] > 0 and st["hits"] > 0 and st["kv_calls"] > 100, st
    r = _engine(f"aphrodite-v1-engine@{version}", spec=0, seed=2, caching=False)
    assert r.verdict == "pass" and r.state.stats["hits"] == 0, r.violation


def test_the_fork_runs_its_own_files():
    t = aphrodite_v1_engine.make(6, 4)
    root = str(t._mods.root)
    assert t._mods.root.name.startswith("aphrodite-engine-")
    t.add(0, [2, 3, 4], 2)
    for obj in (type(t.scheduler), type(t.manager), type(t.requests[0])):
        assert inspect.getsourcefile(obj).startswith(root + "/aphrodite/v1/"), obj


def test_43569_is_in_the_forks_scheduler_with_priority_scheduling():
    r = _engine("aphrodite-v1-engine", seed=6, policy="priority", shrink=True)
    assert r.verdict == "fail", "expected #43569's publish-before-write (L1)"
    assert r.violation.name in ("key_after_write", "cache_content"), r.violation
    assert len(r.trace.ops) <= 6, len(r.trace.ops)
    assert _engine("aphrodite-v1-engine", seed=6, policy="fcfs").verdict == "pass"


def test_a_manager_that_does_not_free_is_caught():
    def leaky(num_blocks, block_size, **kw):
        t = aphrodite_v1_engine.make(num_blocks, block_size, **kw)
        t.manager.free = lambda request: None
        return t

    r = _engine(leaky, spec=0, seed=1)
    assert r.verdict == "fail"
    assert r.violation.name in ("a request that is not running holds no block",
                                "free: the request holds no block afterwards"), r.violation


def test_the_fork_is_known_to_vllm_v1_engine_before_its_adapter_is_imported():
    """``vllm_v1_engine.FORKS`` holds aphrodite itself: in a fresh interpreter that never
    imports ``aphrodite_v1_engine``, a load of the fork's key gets the fork's package and
    stand-ins (it was registered only by that import: a load asked first read aphrodite's
    files under vLLM's names)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from kvcheck.impl.thirdparty import vllm_v1_engine as e\n"
            "top, extra = e.FORKS['aphrodite']\n"
            "assert 'kvcheck.impl.thirdparty.aphrodite_v1_engine' not in sys.modules\n"
            "print(top, sorted(extra))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == f"aphrodite {sorted(aphrodite_v1_engine.EXTRA)}"
    assert vllm_v1_engine.FORKS[aphrodite_v1_engine.ENGINE_KEY] == ("aphrodite",
                                                                    aphrodite_v1_engine.EXTRA)


def test_every_stand_in_is_declared_with_its_reason():
    mods = vllm_v1_engine.load(None, aphrodite_v1_engine.ENGINE_KEY)
    stubs = {**vllm_v1_engine.STUBS, **aphrodite_v1_engine.EXTRA}
    for name in mods.stood_in:
        as_vllm = mods.vllm(name)
        if as_vllm in stubs:
            assert (stubs[as_vllm].__doc__ or "").strip(), name
        elif name in ("msgspec", "cbor2"):
            assert name in vllm_v1_engine.STUBS, name
        else:
            prefix = vllm_v1_engine._off(as_vllm)
            assert prefix is not None and vllm_v1_engine.OFF[prefix], name
    for own in ("aphrodite.v1.core.sched.scheduler", "aphrodite.v1.request",
                "aphrodite.sampling_params", "aphrodite.v1.core.kv_cache_manager",
                "aphrodite.v1.core.block_pool", "aphrodite.v1.outputs", "aphrodite.envs"):
        assert own in mods.files and own not in mods.stood_in, own
        assert mods.modules[own].__file__.startswith(str(mods.root)), own
