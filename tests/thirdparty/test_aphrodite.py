"""aphrodite-engine 0.6.x's v0 block manager v2 (``aphrodite_v0``: ``vllm_v0``'s adapter on
aphrodite's own files, ``vllm_v0.LAYOUTS``), and chunked prefill (``make_chunked``).

The ends of the aphrodite-v0 range (0.6.0, 0.6.5) are driven by the oracle; the two
historical entries it adds (benchmarks/historical: aphrodite-679, aphrodite-11168) and
vLLM's own #7371 / PR #7380 (vllm-7380) are checked on both sides of their fix. A release
not installed is installed here (py files from a 232 MB wheel), or the test skips when the
index cannot be reached.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader, aphrodite_v0, install, vllm_v0, vllm_v0_sliding
from kvcheck.verify import verify

ROOT = Path(__file__).resolve().parents[2]
ALLOW = frozenset({"append_slot: the sole holder of a partial block writes in place",
                   "append_slot: a new block was free"})  # D8 / F5, as for vLLM v0


def _have(key: str, version: str) -> None:
    try:
        install.ensure(install.ENGINES[key], version)
    except install.InstallError as exc:
        pytest.skip(f"{key}=={version} not installed and cannot be fetched: {exc}")


def _replays():
    path = ROOT / "benchmarks" / "historical" / "hist_replays.py"
    spec = importlib.util.spec_from_file_location("kvcheck_hist_replays_aphrodite", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_install_maps_aphrodite_releases_to_their_generation():
    assert install.parse("aphrodite-engine==0.6.5") == (install.ENGINES["aphrodite-v0"], "0.6.5")
    assert install.parse("aphrodite-engine==0.6.0.post1")[0].key == "aphrodite-v0"
    assert install.parse("aphrodite-engine==0.24.1") == (install.ENGINES["aphrodite"], "0.24.1")
    assert install.parse("aphrodite-v0") == (install.ENGINES["aphrodite-v0"], "0.6.5")
    for bad, words in (("aphrodite-engine", "names several engine generations"),
                       ("aphrodite-engine==0.6.4", "not supported"),
                       ("aphrodite-engine==0.4.9", "not supported")):
        with pytest.raises(install.InstallError, match=words):
            install.parse(bad)


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="no v0 module layout"):
        vllm_v0.load(None, "sglang")


@pytest.mark.parametrize("version", ["0.6.0", "0.6.5"])
def test_the_adapter_runs_aphrodites_own_files(version):
    _have("aphrodite-v0", version)
    t = aphrodite_v0.make_prefix(4, 2, version=version)
    assert t.version == version and t.engine == "aphrodite-v0"
    gpu = type(t.gpu)
    assert gpu.__module__ == (f"kvcheck_tp_aphrodite_v0_{version.replace('.', '_')}"
                              ".aphrodite.processing.block.prefix_caching_block")
    where = _loader.install_dir(install.ENGINES["aphrodite-v0"].dist_for(version))
    assert Path(sys.modules[gpu.__module__].__file__).is_relative_to(where / "aphrodite")
    # vLLM's loader is unchanged: its names, its files
    v = vllm_v0.make_prefix(4, 2)
    assert type(v.gpu).__module__.startswith("kvcheck_tp_vllm_v0_")


@pytest.mark.parametrize("version", ["0.6.0", "0.6.5"])
@pytest.mark.parametrize("bs", [1, 2])
def test_the_range_ends_pass_behind_the_engine_guard(version, bs):
    _have("aphrodite-v0", version)
    for factory, model, allow in (("make_guarded", "blocks", frozenset()),
                                  ("make_prefix_guarded", "prefix", ALLOW)):
        r = verify(f"kvcheck.impl.thirdparty.aphrodite_v0:{factory}@{version}", 8, bs, 1500,
                   seed=0, model=model, allow=allow)
        assert r.ok, (factory, r.violation)


def _chunked(spec: str):
    return verify(spec, 8, 2, 2000, seed=0)


def test_chunked_prefill_crashes_on_0_6_0_post1_not_on_0_6_1():
    """aphrodite PR #679 (vLLM PR #7380's port): the later chunk's empty append indexes
    past the table when the prompt fills its last block; kvcheck shrinks it to one
    allocation of two one-slot blocks."""
    for v in ("0.6.0.post1", "0.6.1"):
        _have("aphrodite-v0", v)
    bad = _chunked("kvcheck.impl.thirdparty.aphrodite_v0:make_chunked@0.6.0.post1")
    assert not bad.ok and bad.violation.kind == "crash" and bad.violation.name == "allocate"
    assert "IndexError" in bad.violation.witness + str(bad.violation.details)
    assert [o.kind for o in bad.trace.ops] == ["allocate"]
    good = _chunked("kvcheck.impl.thirdparty.aphrodite_v0:make_chunked@0.6.1")
    assert good.ok, good.violation


def test_chunked_prefill_on_vllm_separates_0_5_4_from_0_5_5_and_0_5_0():
    """vLLM #7371 / PR #7380: 0.5.1 (BlockList's indexed append) .. 0.5.4 crash, 0.5.5
    returns early on no tokens, and 0.5.0.post1 (zip over the blocks) never indexed."""
    for v in ("0.5.0.post1", "0.5.4", "0.5.5"):
        _have("vllm-v0", v)
    bad = _chunked("kvcheck.impl.thirdparty.vllm_v0:make_chunked@0.5.4")
    assert not bad.ok and (bad.violation.kind, bad.violation.name) == ("crash", "allocate")
    for v in ("0.5.0.post1", "0.5.5"):
        r = _chunked(f"kvcheck.impl.thirdparty.vllm_v0:make_chunked@{v}")
        assert r.ok, (v, r.violation)


def test_a_prompt_within_one_chunk_makes_no_chunk_call():
    """``prefill_chunk``: only a prompt longer than a chunk has later chunks (a one-block
    prompt on 0.5.4 allocates as the plain target does)."""
    _have("vllm-v0", "0.5.4")
    t = vllm_v0.make_chunked(4, 2, version="0.5.4")
    assert t.prefill_chunk == 2
    t.allocate(0, 2)  # one chunk: no append_slots call, so no crash
    assert t.block_table(0) and t.seq_len(0) == 2
    with pytest.raises(IndexError):
        t.allocate(1, 4)  # two chunks, the prompt fills its last block


def test_the_window_cap_is_caught_on_aphrodite_0_6_5():
    """vLLM #11168 as aphrodite 0.6.5 ships it (aphrodite-11168)."""
    _have("aphrodite-v0", "0.6.5")
    t = aphrodite_v0.make_sliding_guarded(4, 2, version="0.6.5")
    assert isinstance(t, vllm_v0_sliding.VllmV0SlidingTarget) and t.engine == "aphrodite-v0"
    r = verify("kvcheck.impl.thirdparty.aphrodite_v0:make_sliding_guarded@0.6.5", 8, 2, 3000,
               seed=0)
    assert not r.ok and r.violation.name == "allocate: exception_safety: free list length unchanged"


def test_the_raw_replays_separate_the_releases():
    h = _replays()
    for key, v in (("aphrodite-v0", "0.6.0.post1"), ("aphrodite-v0", "0.6.1"),
                   ("aphrodite-v0", "0.6.5"), ("vllm-v0", "0.5.4"), ("vllm-v0", "0.5.5")):
        _have(key, v)
    assert h.replay_aphrodite_679("0.6.0.post1")[0] is True
    assert h.replay_aphrodite_679("0.6.1")[0] is False
    assert h.replay_vllm_7380("0.5.4")[0] is True
    assert h.replay_vllm_7380("0.5.5")[0] is False
    reproduced, detail = h.replay_aphrodite_11168("0.6.5")
    assert reproduced and "can_allocate -> OK, allocate raised NoFreeBlocksError" in detail


# -- the v1 line: aphrodite@0.20.0 .. 0.24.1 --------------------------------------------
@pytest.mark.parametrize("version", ["0.20.0", "0.24.1"])
def test_the_v1_range_ends_pass(version):
    from kvcheck.impl.thirdparty import aphrodite

    _have("aphrodite", version)
    t = aphrodite.make(4, 2, version=version)
    assert t.version == version
    assert type(t.manager).__module__.startswith(
        f"kvcheck_tp_aphrodite_{version.replace('.', '_')}.aphrodite.v1.core")
    for model in ("blocks", "prefix"):
        r = verify(f"aphrodite@{version}", 8, 2, 1500, seed=0, model=model)
        assert r.ok, (model, r.violation)


def test_aphrodite_0_22_reads_its_own_env_names():
    """0.22.0's coordinator reads ``envs.APHRODITE_PREFIX_CACHE_RETENTION_INTERVAL``: the
    stand-in names it (unset: None), so the target builds."""
    from kvcheck.impl.thirdparty import aphrodite

    _have("aphrodite", "0.22.0")
    envs = aphrodite.load("0.22.0")["aphrodite.envs"]
    assert envs.APHRODITE_PREFIX_CACHE_RETENTION_INTERVAL is None
    assert aphrodite.make(4, 2, version="0.22.0").version == "0.22.0"


def test_the_42571_replay_separates_aphrodite_0_21_from_0_22():
    h = _replays()
    for v in ("0.21.0", "0.22.0"):
        _have("aphrodite", v)
    assert h.replay_aphrodite_42571("0.21.0")[0] is True
    assert h.replay_aphrodite_42571("0.22.0")[0] is False


# -- the BlockSpaceManager v1 of 0.5.x / 0.6.x (raw replays only) ------------------------
def test_the_1556_fork_leak_separates_aphrodite_0_5_1_from_0_6_0():
    """aphrodite 0.5.1's fork increments every entry of a cyclic window table (the
    reused block twice), 0.6.0's forks the set (vLLM PR #3347): the leak on one, none on
    the other, on aphrodite's own managers (``vllm_v0_legacy`` with its layout)."""
    from kvcheck.impl.thirdparty import vllm_v0_legacy

    assert install.parse("aphrodite-engine==0.5.1")[0].key == "aphrodite-legacy"
    for v in ("0.5.1", "0.6.0"):
        _have("aphrodite-legacy", v)
    names = {v: type(vllm_v0_legacy.build(v, 4, 2, 2, engine="aphrodite-legacy")).__name__
             for v in ("0.5.1", "0.6.0")}
    assert names == {"0.5.1": "BlockSpaceManager", "0.6.0": "BlockSpaceManagerV1"}
    h = _replays()
    leaked, detail = h.replay_aphrodite_1556("0.5.1")
    assert leaked and "3 of 4 blocks free" in detail, detail
    assert h.replay_aphrodite_1556("0.6.0")[0] is False


def test_the_sliding_adapter_admits_the_window_drop_only_where_the_engine_makes_it():
    """The window drop is a chunked-prefill step's ``append_token_ids([])``: vLLM 0.8.5
    runs chunked prefill with a window, aphrodite 0.6.x refuses it (its engine
    arguments), so its drops are not admitted; a release with no windowed block table is
    a one-line error, not a verdict."""
    from kvcheck.impl.errors import MisuseError
    from kvcheck.spec.contracts import Op

    _have("aphrodite-v0", "0.6.5")
    _have("vllm-v0", "0.4.3")
    v = vllm_v0_sliding.make_guarded(4, 2)
    a = aphrodite_v0.make_sliding_guarded(4, 2, version="0.6.5")
    assert v.chunked_with_window and not a.chunked_with_window
    drop = Op("drop_behind_window", seq=0, n_tokens=a.drop_window)
    assert v.admits(drop) and not a.admits(drop)
    with pytest.raises(MisuseError, match="no windowed BlockTable"):
        vllm_v0_sliding.make_guarded(4, 2, version="0.4.3")
