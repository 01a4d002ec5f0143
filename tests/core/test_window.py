"""Sliding-window tables and null blocks (issue 15, section 2): drop_behind_window on the
reference, null entries in every invariant, the shadow never reading a null position,
and a table naming a block twice freed as the spec says (vLLM #42571)."""

from __future__ import annotations

import pytest

from kvcheck.impl.block_manager import NULL_BLOCK, WindowBlockManager
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.blocks.runs import Scope, explore, replay
from kvcheck.models.blocks.shadow import ShadowMemory
from kvcheck.spec import contracts
from kvcheck.spec.contracts import Domain, Op
from kvcheck.spec.invariants import INVARIANTS, by_name
from kvcheck.spec.logic import PY
from kvcheck.spec.outcomes import classify
from kvcheck.spec.state import NULL, Snapshot
from kvcheck.targets.loading import build
from kvcheck.verify import verify


@pytest.mark.parametrize("nb,bs,seed", [(32, 4, 0), (16, 4, 1), (8, 2, 2), (4, 1, 0), (12, 3, 1)])
@pytest.mark.parametrize("mode", ["fast", "full"])
def test_the_window_reference_passes(nb, bs, seed, mode):
    r = verify(WindowBlockManager, nb, bs, 3000, seed, timeout=5.0, mode=mode)
    assert r.ok, r.violation


def test_the_window_reference_passes_bounded_exploration():
    r = explore(WindowBlockManager, Scope(4, 2, 3, 6, 5))
    assert r.violation is None, r.violation


def _run(ops, nb=8, bs=2):
    target = build(WindowBlockManager, nb, bs, None)
    oracle = Oracle(target, mode="full")
    for op in ops:
        assert oracle.step(op) is None, oracle.violation
    return oracle


def test_a_drop_nulls_exactly_the_blocks_behind_the_window_and_releases_them():
    o = _run([Op("allocate", 0, n_tokens=7), Op("drop_behind_window", 0, n_tokens=3)])
    # 7 tokens at 2 per block: tokens 0..3 (blocks 0, 1) lie wholly before the last 3
    assert o.snap.table_tuple(0) == (NULL, NULL, 2, 3)
    assert o.snap.ref(0) == o.snap.ref(1) == 0 and o.snap.free_count(0) == 1
    assert o.target.impl.tables[0][:2] == [NULL_BLOCK, NULL_BLOCK]


def test_the_outcome_classes_of_a_drop():
    o = _run([Op("allocate", 0, n_tokens=5), Op("fork", 0, 1)])
    pre = o.snap
    o.step(Op("drop_behind_window", 1, n_tokens=1))
    op = Op("drop_behind_window", 1, n_tokens=1)
    op.outcome = "ok"
    assert classify(PY, pre, o.snap, op) == "window/only-drops-shared-references"
    pre = o.snap
    o.step(Op("drop_behind_window", 0, n_tokens=1))
    op = Op("drop_behind_window", 0, n_tokens=1)
    op.outcome = "ok"
    assert classify(PY, pre, o.snap, op) == "window/releases-blocks"
    pre = o.snap
    o.step(Op("drop_behind_window", 0, n_tokens=5))
    op = Op("drop_behind_window", 0, n_tokens=5)
    op.outcome = "ok"
    assert classify(PY, pre, o.snap, op) == "window/nothing-behind"


def test_every_operation_goes_on_after_a_drop():
    _run([Op("allocate", 0, n_tokens=6), Op("drop_behind_window", 0, n_tokens=2),
          Op("fork", 0, 1), Op("append_slot", 1), Op("append_slots", 0, n_tokens=3, lookahead=2),
          Op("rebase", 0, 1), Op("drop_behind_window", 1, n_tokens=3), Op("rollback", 1, n_tokens=1),
          Op("free_seq", 1), Op("preempt", 0), Op("allocate", 0, n_tokens=3)])


def test_a_rollback_may_not_reach_behind_the_window():
    o = _run([Op("allocate", 0, n_tokens=6), Op("drop_behind_window", 0, n_tokens=2)])
    assert not o.valid(Op("rollback", 0, n_tokens=3))  # its last token would sit in a null block
    assert o.valid(Op("rollback", 0, n_tokens=1))


def _snap(tables, lengths, refs, free, nb=6, bs=2):
    return Snapshot(nb, bs, tables, lengths, refs, free)


def test_null_entries_in_the_invariants():
    ok = _snap({0: (NULL, NULL, 2)}, {0: 5}, [0, 0, 1, 0, 0, 0], [0, 1, 3, 4, 5])
    assert all(inv.holds_for(PY, ok, x) for inv in INVARIANTS if inv.domain == "seq"
               for x in ok.seqs())
    assert all(inv.holds_for(PY, ok, b) for inv in INVARIANTS if inv.domain == "block"
               for b in ok.blocks())
    gap = _snap({0: (NULL, 1, NULL)}, {0: 5}, [0, 1, 0, 0, 0, 0], [0, 2, 3, 4, 5])
    assert not by_name("null_entries").holds_for(PY, gap, 0)  # a null tail: written into
    hole = _snap({0: (1, NULL, 2)}, {0: 5}, [0, 1, 1, 0, 0, 0], [0, 3, 4, 5])
    assert not by_name("null_entries").holds_for(PY, hole, 0)  # not a prefix
    bad = _snap({0: (-2, 2)}, {0: 3}, [0, 0, 1, 0, 0, 0], [0, 1, 3, 4, 5])
    assert not by_name("valid_block_ids").holds_for(PY, bad, 0)
    on_free = _snap({0: (NULL, 2)}, {0: 3}, [0, 0, 1, 0, 0, 0], [0, 1, 3, 4, 5, NULL])
    assert not by_name("free_list_in_pool").holds_for(PY, on_free)


def test_the_shadow_never_reads_a_null_position():
    sh = ShadowMemory(2)
    sh.allocate(0, 5, (0, 1, 2))
    sh.drop(0, 2)
    sh.write(0, 0, 999)  # the released blocks are reused by someone else
    assert sh.mismatch(0, (NULL, NULL, 2)) is None
    assert sh.mismatch(0, (NULL, NULL, 0)) is not None  # the window's block still is read


def test_a_null_entry_reads_as_none_or_null():
    class Nones(WindowBlockManager):
        pass

    t = build(Nones, 4, 2, None)
    t.allocate(0, 5)
    t.drop_behind_window(0, 1)
    from kvcheck.targets.observe import read_table
    assert read_table(t, 0) == (NULL, NULL, 2)


# -- a table naming a block twice (vLLM #42571) ----------------------------------------
def _free_step(post_free, post_refs):
    pre = _snap({0: (3, 3, 1)}, {0: 6}, [0, 1, 0, 2, 0, 0], [0, 2, 4, 5])
    post = _snap({}, {}, post_refs, post_free)
    op = Op("free_seq", 0)
    return [name for name, _, ok in contracts.free_seq(PY, pre, post, op,
                                                         Domain(range(6), [0])) if not ok]


def test_freeing_a_table_that_names_a_block_twice_drops_exactly_its_references():
    """free_seq's 'refcount -1 per entry' and 'free list grows by the blocks released'
    count a block named twice once into the free list, with both its references gone."""
    assert _free_step([0, 2, 4, 5, 3, 1], [0] * 6) == []
    # vLLM #42571: each entry whose block is now unreferenced put on the free list
    broken = _free_step([0, 2, 4, 5, 3, 3, 1], [0] * 6)
    assert "free list grows by the blocks released" in broken
    # and one reference dropped per block, not per entry
    assert "refcount -1 per entry of the freed table" in _free_step([0, 2, 4, 5, 1], [0, 0, 0, 1, 0, 0])


def test_replay_of_the_window_corpus_traces_on_the_reference():
    ops = [Op("allocate", 0, n_tokens=2), Op("fork", 0, 1), Op("drop_behind_window", 0, n_tokens=1),
           Op("free_seq", 1), Op("free_seq", 0)]
    assert replay(WindowBlockManager, 2, 1, ops).violation is None
