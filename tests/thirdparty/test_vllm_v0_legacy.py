"""vLLM BlockSpaceManager v1 (0.3.3 / 0.4.0) loaded from the releases' own files
(``impl/thirdparty/vllm_v0_legacy.py``) and the raw replays of vLLM #1556 / PR #3347
(``benchmarks/historical/hist_replays.py``). Skips when a release is not installed
(``kvcheck install vllm-v0-legacy==VERSION``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader, install, vllm_v0_legacy
from kvcheck.spec.contracts import Op
from kvcheck.spec.state import NULL
from kvcheck.verify import replay_ops, verify

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "kvcheck_historical_replays_legacy", ROOT / "benchmarks" / "historical" / "hist_replays.py")
replays = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replays)


def _need(version: str) -> None:
    if not _loader.is_installed(install.select(vllm_v0_legacy.ENGINE_KEY, version)):
        pytest.skip(f"vLLM {version} sources not installed "
                    f"(kvcheck install vllm-v0-legacy=={version})")


@pytest.mark.parametrize("version,module,cls", [
    ("0.3.3", "vllm.core.block_manager", "BlockSpaceManager"),
    ("0.4.0", "vllm.core.block_manager_v1", "BlockSpaceManagerV1"),
])
def test_each_release_loads_its_own_block_manager(version, module, cls):
    _need(version)
    mods = vllm_v0_legacy.load(version)
    assert mods.dist.version == version
    assert vllm_v0_legacy.manager_class(mods).__name__ == cls
    assert vllm_v0_legacy.manager_module(mods.root) == module
    m = vllm_v0_legacy.build(version, num_blocks=4, block_size=2, sliding_window=4)
    assert m.block_sliding_window == 2 and m.get_num_free_gpu_blocks() == 4


def test_a_version_outside_the_range_is_refused():
    with pytest.raises(install.InstallError, match="0.3.3 .. 0.6.2"):
        vllm_v0_legacy.load("0.6.3.post1")  # (block manager v1 was removed in 0.6.3)


def test_1556_double_free_on_0_3_3_not_on_0_4_0():
    _need("0.3.3")
    _need("0.4.0")
    buggy, evidence = replays.replay_vllm_1556("0.3.3")
    assert buggy and "Double free!" in evidence, evidence
    fixed, evidence = replays.replay_vllm_1556("0.4.0")
    assert not fixed and "4 of 4 blocks free" in evidence, evidence


def test_a_wrapped_table_keeps_one_reference_per_sequence():
    """The semantics the catalogue's spec design rests on: a table naming one block at
    positions i and i + W holds one reference to it (allocate sets ref_count once)."""
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        m = vllm_v0_legacy.build(version, num_blocks=4, block_size=1, sliding_window=1)
        a = vllm_v0_legacy.Seq(0, 3, 1)
        m.allocate(vllm_v0_legacy.Group(a))
        (only,) = set(m.get_block_table(a))
        assert m.get_block_table(a) == [only] * 3
        assert m.block_tables[0][0].ref_count == 1 and m.get_num_free_gpu_blocks() == 3


def test_fork_of_a_wrapped_table_counts_each_entry_on_0_3_3_only():
    refs = {}
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        m = vllm_v0_legacy.build(version, num_blocks=4, block_size=1, sliding_window=1)
        a, c = vllm_v0_legacy.Seq(0, 2, 1), vllm_v0_legacy.Seq(1, 2, 1)
        m.allocate(vllm_v0_legacy.Group(a))
        m.fork(a, c)
        refs[version] = m.block_tables[0][0].ref_count
    assert refs == {"0.3.3": 3, "0.4.0": 2}  # two sequences hold it


def test_stale_entry_after_copy_on_write_is_written_into_on_both_releases():
    """docs/findings.md F10: what PR #3347 did not fix."""
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        crossed, evidence = replays.replay_v1_window_stale_entry(version)
        assert crossed, (version, evidence)


# -- the Target: vllm-v0-legacy@VERSION ---------------------------------------------------
FORK_CLAUSE = "fork: refcount +1 per entry of the child's table, -1 per entry it had"
F10 = {"append_slot: a new block was free",
       "append_slot: refcounts change only as the operation says", "append_slot",
       "fork: a block the child's table does not name keeps its refcount"}


def _ops(*spec):
    out = []
    for kind, *args in spec:
        if kind == "fork":
            out.append(Op("fork", seq=args[0], child=args[1]))
        elif kind == "allocate":
            out.append(Op("allocate", seq=args[0], n_tokens=args[1]))
        else:
            out.append(Op(kind, seq=args[0]))
    return out


def _scope(blocks, bs):
    return {"num_blocks": blocks, "block_size": bs}


@pytest.mark.parametrize("version", ["0.3.3", "0.4.0"])
def test_the_observation_reads_entries_behind_the_window_as_null(version):
    _need(version)
    t = vllm_v0_legacy.make(4, 1, version=version)
    assert t.cyclic_window == 2 and t.version == version
    t.allocate(0, 3)  # [x0, x1, x0]: the first entry is a stale name of x0
    table = t.block_table(0)
    assert table[0] == NULL and len(table) == 3 and len(set(table[1:])) == 2
    assert [t.refcount(b) for b in table[1:]] == [1, 1] and t.num_free() == 2


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_verify_fails_on_0_3_3_with_the_1556_fork_in_two_operations(mode):
    _need("0.3.3")
    r = verify("vllm-v0-legacy@0.3.3", 6, 1, 3000, 0, mode=mode)
    assert r.verdict == "fail" and r.violation.name == FORK_CLAUSE, r.violation
    ops = r.trace.ops
    assert [o.kind for o in ops] == ["allocate", "fork"] and ops[0].n_tokens == 3, ops


def test_the_1556_counterexample_passes_on_0_4_0():
    _need("0.4.0")
    rep = replay_ops("blocks", "vllm-v0-legacy@0.4.0", _scope(2, 1),
                     _ops(("allocate", 0, 3), ("fork", 0, 1)))
    assert rep.violation is None


def test_the_engine_double_free_is_a_violation_not_a_traceback():
    """#1556's own symptom on 0.3.3 (window of one block, as the raw replay): two
    sequences share [x]; the first one's boundary append reuses x and copies it away
    (free(x)), the stale entry still names x, so freeing the first sequence after the
    second raises "Double free!": reported as the call's crash."""
    _need("0.3.3")
    ops = _ops(("allocate", 0, 2), ("fork", 0, 1), ("append_slot", 0), ("free_seq", 1),
               ("free_seq", 0))
    target = "kvcheck.impl.thirdparty.vllm_v0_legacy:make_one_block@0.3.3"
    rep = replay_ops("blocks", target, _scope(4, 2), ops)
    v = rep.violation
    assert v is not None and v.kind == "crash" and v.name == "free_seq", v
    assert "Double free!" in v.witness and v.step == 5
    fixed = replay_ops("blocks", target.replace("0.3.3", "0.4.0"), _scope(4, 2), ops)
    assert fixed.violation is None


def test_the_1556_free_frees_a_block_another_sequence_holds_on_0_3_3():
    """Window of two blocks: the copy of a shared reused block leaves the stale entry
    naming it; 0.3.3's free walks set(block_table) and releases it while the other
    sequence still holds it (0.4.0 frees the last W entries only)."""
    _need("0.3.3")
    _need("0.4.0")
    ops = _ops(("allocate", 0, 2), ("fork", 0, 1), ("append_slot", 0), ("free_seq", 0))
    v = replay_ops("blocks", "vllm-v0-legacy@0.3.3", _scope(4, 1), ops).violation
    assert v is not None and v.name == "free_seq: refcount -1 per entry of the freed table", v
    assert replay_ops("blocks", "vllm-v0-legacy@0.4.0", _scope(4, 1), ops).violation is None


def test_f10_on_0_4_0_the_cycle_reuses_a_block_the_other_sequence_holds():
    """replay_v1_window_stale_entry as kvcheck sees it: the sixth token's append takes the
    stale entry's block (another sequence's), not the one leaving the window."""
    _need("0.4.0")
    ops = _ops(("allocate", 0, 3), ("fork", 0, 1), ("append_slot", 0), ("append_slot", 0),
               ("append_slot", 0))
    v = replay_ops("blocks", "vllm-v0-legacy@0.4.0", _scope(6, 1), ops).violation
    assert v is not None and v.step == 5 and v.name == "append_slot: a new block was free", v


@pytest.mark.parametrize("seed", [0, 1, 2, 6, 9])
def test_0_4_0_fails_only_with_f10(seed):
    """0.4.0 is not clean (F10): every counterexample kvcheck finds there is one of F10's
    clauses, never #1556's fork clause (the catalogue's fixed_findings)."""
    _need("0.4.0")
    r = verify("vllm-v0-legacy@0.4.0", 6, 1, 3000, seed)
    assert r.verdict == "fail" and r.violation.name in F10, r.violation


def test_runs_are_deterministic_across_replays():
    """set(block_table)'s order follows the blocks' hash (made their number), so a
    replay takes the blocks the run took."""
    _need("0.4.0")
    r = verify("vllm-v0-legacy@0.4.0", 6, 1, 3000, 0, do_shrink=False)
    rep = replay_ops("blocks", "vllm-v0-legacy@0.4.0", _scope(6, 1), r.trace.ops)
    assert rep.violation is not None and rep.violation.name == r.violation.name
    assert rep.violation.step == r.violation.step


RANGE = ["0.4.1", "0.4.2", "0.4.3", "0.5.0.post1", "0.5.1", "0.5.2", "0.5.3.post1", "0.5.4",
         "0.5.5", "0.6.0", "0.6.1.post2", "0.6.2"]


@pytest.mark.parametrize("version", RANGE)
def test_every_later_v1_release_has_the_fix_and_f10(version):
    """0.4.1 .. 0.6.2 (``append_slots``, ``BlockTable`` a class from 0.5.5): #1556's
    counterexamples pass, F10's stale-entry cycle fails as on 0.4.0."""
    _need(version)
    target = f"vllm-v0-legacy@{version}"
    assert replay_ops("blocks", target, _scope(2, 1),
                      _ops(("allocate", 0, 3), ("fork", 0, 1))).violation is None
    free_half = _ops(("allocate", 0, 2), ("fork", 0, 1), ("append_slot", 0), ("free_seq", 0))
    assert replay_ops("blocks", target, _scope(4, 1), free_half).violation is None
    ops = _ops(("allocate", 0, 3), ("fork", 0, 1), ("append_slot", 0), ("append_slot", 0),
               ("append_slot", 0))
    v = replay_ops("blocks", target, _scope(6, 1), ops).violation
    assert v is not None and v.step == 5 and v.name == "append_slot: a new block was free", v


def test_f10_on_0_4_0_a_fork_counts_a_block_only_a_stale_entry_names():
    """After a copy-on-write at a wrapped position the parent's stale entry still names
    the block the copy replaced; 0.4.0's fork (``set(src_block_table)``) adds a reference
    to it, a block the child's table does not name. On 0.3.3 the same."""
    ops = _ops(("allocate", 0, 2), ("fork", 0, 1), ("append_slot", 0), ("fork", 0, 2))
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        v = replay_ops("blocks", f"vllm-v0-legacy@{version}", _scope(4, 1), ops).violation
        assert v is not None and v.step == 4, (version, v)
        assert v.name == "fork: a block the child's table does not name keeps its refcount", v


def test_bounded_exploration_reaches_f10_through_the_hidden_stale_names():
    """Exploration keys states by the engine's own tables too (``hidden_table``): the
    observed tables read stale names as null, and merging states that differ only there
    missed F10 within depth 5."""
    from kvcheck.models.blocks.runs import Scope, explore
    from kvcheck.targets.loading import resolve

    _need("0.4.0")
    r = explore(resolve("vllm-v0-legacy@0.4.0")[1], Scope(6, 1, 2, 3, 5))
    assert r.violation is not None and r.violation.name in F10, r.violation
    _need("0.3.3")
    r = explore(resolve("vllm-v0-legacy@0.3.3")[1], Scope(4, 1, 2, 3, 3))
    assert r.violation is not None and r.violation.name == FORK_CLAUSE and len(r.ops) == 2


# -- aphrodite-engine's copy (kvcheck.impl.thirdparty.aphrodite_legacy) -------------------
def _need_aphrodite(version: str) -> None:
    if not _loader.is_installed(install.select(vllm_v0_legacy.APHRODITE_KEY, version)):
        pytest.skip(f"aphrodite-engine {version} sources not installed "
                    f"(kvcheck install aphrodite-legacy=={version})")


def test_aphrodite_0_5_1_has_1556_and_0_6_0_f10():
    _need_aphrodite("0.5.1")
    _need_aphrodite("0.6.0")
    bad = verify("kvcheck.impl.thirdparty.aphrodite_legacy:make@0.5.1", 4, 1, 3000, 0)
    assert not bad.ok and bad.violation.name == FORK_CLAUSE and len(bad.trace.ops) == 2
    target = "kvcheck.impl.thirdparty.aphrodite_legacy:make@0.6.0"
    assert replay_ops("blocks", target, _scope(2, 1), bad.trace.ops).violation is None
    fixed = verify(target, 4, 1, 3000, 0)
    assert not fixed.ok and fixed.violation.name in F10, fixed.violation


@pytest.mark.parametrize("engine,version", [
    ("vllm-v0-legacy", "0.3.3"), ("vllm-v0-legacy", "0.4.0"), ("vllm-v0-legacy", "0.6.2"),
    ("aphrodite-legacy", "0.5.1"), ("aphrodite-legacy", "0.6.0")])
@pytest.mark.parametrize("mode", ["fast", "full"])
def test_without_a_wrap_every_release_passes(engine, version, mode):
    """A window wider than the pool can fill (64 blocks) never wraps: the block managers
    are then plain copy-on-write managers, and pass, observation included (aphrodite
    0.5.x's lazily made blocks among them)."""
    (_need if engine == "vllm-v0-legacy" else _need_aphrodite)(version)

    def wide(n, b):
        return vllm_v0_legacy.VllmV0LegacyTarget(n, b, 64, version, engine=engine)

    for nb, bs in ((8, 1), (16, 4)):
        r = verify(wide, nb, bs, 3000, 1, mode=mode)
        assert r.ok, (engine, version, nb, bs, r.violation)
