"""aphrodite-engine 0.6.x's v0 engine core (``aphrodite-v0-engine``,
``aphrodite-v0-engine-chunked``): ``vllm_v0_engine``'s target on aphrodite's own
``Scheduler``, ``BlockSpaceManagerV2``, ``Sequence`` and ``SequenceGroup`` files, loaded
under aphrodite's module names (issue 34 §2).

aphrodite #679 (catalogue ``aphrodite-679``): 0.6.0.post1 carries vLLM #7380 (chunked
prefill: ``append_slots`` after a later prompt chunk with no unseen tokens raises
``IndexError`` in ``BlockTable.append_token_ids`` at a full last block); 0.6.1 has the fix.
0.6.5 passes at the defaults (chunked prefill off, prefix caching on).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty import aphrodite_v0_engine as ae
from kvcheck.impl.thirdparty import vllm_v0_engine as ve
from kvcheck.models.engine.model import EngineScope
from kvcheck.targets.registry import ENGINE_TARGETS
from kvcheck.verify import verify

KEY = "aphrodite-v0"


def _have(version):
    install.ensure(install.ENGINES[KEY], version)


def _run(factory, seed=0, caching=True, requests=30):
    scope = EngineScope(8, 4, budget=16, max_seqs=8, caching=caching)
    return verify(factory, 8, 4, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": requests})


def _at(version, chunked=False):
    make = ae.make_chunked if chunked else ae.make

    def factory(*a, **k):
        return make(*a, version=version, **k)
    return factory


@pytest.mark.parametrize("version", ["0.6.0.post1", "0.6.5"])
def test_the_target_runs_aphrodites_own_scheduler_files(version):
    _have(version)
    t = ae.make(8, 4, version=version)
    assert t.version == version
    where = _loader.install_dir(install.ENGINES[KEY].dist_for(version)) / "aphrodite"
    for obj, name in ((t.scheduler, "processing.scheduler"),
                      (t.manager, "processing.block_manager_v2"),
                      (t.gpu, "processing.block.prefix_caching_block")):
        mod = type(obj).__module__
        assert mod.endswith(f".aphrodite.{name}"), mod
        assert Path(sys.modules[mod].__file__).is_relative_to(where)
    t.add(0, [2, 3, 4, 5, 6], 3)
    r = t.step(0)
    assert r.scheduled == {0: 5} and type(t.requests[0]).__module__.endswith(
        ".aphrodite.common.sequence")
    # vLLM's engine target is unchanged: its names, its files
    v = ve.make(8, 4, version="0.8.5")
    assert type(v.scheduler).__module__.endswith(".vllm.core.scheduler")


def test_both_targets_are_registered():
    for name, fn in (("aphrodite-v0-engine", "make"), ("aphrodite-v0-engine-chunked",
                                                        "make_chunked")):
        assert ENGINE_TARGETS[name][0] == f"kvcheck.impl.thirdparty.aphrodite_v0_engine:{fn}"


def test_679_chunked_prefill_index_error_through_the_scheduler():
    """aphrodite #679 = vLLM #7380 in aphrodite's BlockTable: 0.6.0.post1's engine step
    dies with IndexError in append_token_ids; 0.6.1 (the fix) passes the same run."""
    for version in ("0.6.0.post1", "0.6.1"):
        _have(version)
    r = _run(_at("0.6.0.post1", chunked=True), caching=False)
    assert r.verdict == "fail" and r.violation.kind == "crash", r.violation
    w = r.violation.witness
    assert "IndexError" in w and "append_token_ids" in w and "aphrodite/processing" in w, w
    r = _run(_at("0.6.1", chunked=True), caching=False)
    assert r.verdict == "pass", r.violation
    assert r.state.stats["preemptions"] > 0


def test_0_6_5_passes_at_the_defaults_with_preemptions_and_hits():
    _have("0.6.5")
    r = _run(_at("0.6.5"))
    assert r.verdict == "pass", r.violation
    st = r.state.stats
    assert st["preemptions"] > 0 and st["hits"] > 0 and st["finished"] > 10
