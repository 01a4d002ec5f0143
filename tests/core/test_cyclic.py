"""Cyclic sliding windows (vLLM's BlockSpaceManager v1, #1556): the spec's reading of a
table that reuses its blocks cyclically. ``Op.cycle`` (stamped from
``Target.cyclic_window``); allocate of more than W blocks takes W, the rest null; an
append at a boundary past the window is the drop behind it, then the append, from the
derived state ``spec.state.Dropped``, which must itself meet the drop's contract."""

from __future__ import annotations

import random

import pytest

from kvcheck.impl.block_manager import BlockManager, CyclicBlockManager, WindowBlockManager
from kvcheck.models.blocks.ghost import Ghost
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.blocks.runs import Scope, explore
from kvcheck.spec import contracts
from kvcheck.spec.contracts import Domain, Op
from kvcheck.spec.logic import PY
from kvcheck.spec.state import NULL, Dropped
from kvcheck.targets.loading import TargetError, build
from kvcheck.targets.observe import snapshot
from kvcheck.verify import replay_ops, verify

from corpus.cyclic import CYCLIC, LEGAL


def _states(seed: int, n: int = 60):
    """Observed states of the window reference (null entries, shared blocks, forks)."""
    rng = random.Random(seed)
    target = build(WindowBlockManager, 8, 2, None)
    oracle = Oracle(target, mode="full")
    nxt = 0
    for _ in range(n):
        live = oracle.live()
        r = rng.random()
        if not live or r < 0.2:
            op = Op("allocate", seq=nxt, n_tokens=rng.randint(1, 7))
            nxt += 1
        elif r < 0.35:
            op = Op("fork", seq=rng.choice(live), child=nxt)
            nxt += 1
        elif r < 0.5:
            op = Op("drop_behind_window", seq=rng.choice(live), n_tokens=rng.randint(1, 4))
        elif r < 0.6:
            op = Op("free_seq", seq=rng.choice(live))
        else:
            op = Op("append_slot", seq=rng.choice(live))
        if oracle.valid(op):
            assert oracle.step(op) is None, oracle.violation
            yield oracle.snap


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_derived_state_meets_the_drops_contract(seed):
    """Dropped(pre, q, skip) is exactly what drop_behind_window's contract allows after
    pre, for every window: the derivation is the spec's drop, not a second text of it."""
    checked = 0
    for snap in _states(seed):
        dom = Domain(range(snap.num_blocks), snap.seqs())
        for pre in (snap, Ghost.from_snapshot(snap)):
            for q in snap.seqs():
                for window in range(1, snap.length(q) + 2):
                    op = Op("drop_behind_window", seq=q, n_tokens=window)
                    skip = contracts.behind_window(PY, pre, op)
                    mid = Dropped(pre, q, skip)
                    bad = [(n, e) for n, e, ok in
                           contracts.drop_behind_window(PY, pre, mid, op, dom) if not ok]
                    assert not bad, (snap.tables, q, window, bad)
                    checked += 1
    assert checked > 100


def test_an_append_past_the_window_reads_as_drop_then_append():
    t = build(CyclicBlockManager, 4, 1, None)
    t.allocate(0, 2)
    pre = snapshot(t, {0: 2})
    op = Op("append_slot", seq=0, cycle=2)
    assert contracts.cyclic_skip(PY, pre, op) == 1  # the entry leaving the window
    mid = contracts.cyclic_pre(PY, pre, op)
    assert mid.table_tuple(0) == (NULL, pre.table(0, 1)) and mid.num_free() == 3
    op.cycle = 0
    assert contracts.cyclic_pre(PY, pre, op) is pre


def test_mid_block_appends_and_short_tables_do_not_wrap():
    t = build(CyclicBlockManager, 6, 2, None)
    t.allocate(0, 3)  # two blocks, the second partial
    pre = snapshot(t, {0: 3})
    assert contracts.cyclic_skip(PY, pre, Op("append_slot", seq=0, cycle=2)) == 0
    assert contracts.cyclic_skip(PY, pre, Op("append_slot", seq=0, cycle=3)) == 0


def test_the_new_clause_is_listed_for_allow():
    names = contracts.clause_names()
    assert names["allocate: an entry behind a cyclic window is null"] == "allocate"


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("nb,bs,seed", [(8, 2, 0), (5, 1, 1), (16, 4, 2)])
@pytest.mark.parametrize("mode", ["fast", "full"])
def test_the_cyclic_reference_passes(window, nb, bs, seed, mode):
    cls = type(f"Cyclic{window}", (CyclicBlockManager,),
               {"__init__": lambda self, n, b: CyclicBlockManager.__init__(self, n, b, window)})
    r = verify(cls, nb, bs, 3000, seed, timeout=5.0, mode=mode)
    assert r.ok, r.violation


def test_the_cyclic_reference_passes_bounded_exploration():
    r = explore(CyclicBlockManager, Scope(4, 1, 3, 4, 5))
    assert r.violation is None, r.violation


def test_the_driver_reaches_wrapped_appends_and_prompts():
    """The checks above are not vacuous: runs append past the window and allocate
    prompts longer than it."""
    seen = {"wrap": 0, "long": 0}

    class Counting(CyclicBlockManager):
        def allocate(self, seq, n):
            seen["long"] += -(-n // self.block_size) > self.window_blocks
            super().allocate(seq, n)

        def append_slot(self, seq):
            k, off = divmod(self.lens[seq], self.block_size)
            seen["wrap"] += off == 0 and k >= self.window_blocks
            return super().append_slot(seq)

    assert verify(Counting, 8, 2, 3000, 0).ok
    assert seen["wrap"] > 50 and seen["long"] > 10, seen


def test_the_plain_spec_rejects_a_cyclic_table():
    """Without the declaration, a cyclic allocator breaks the plain contracts (the window
    is the target's to declare, never guessed)."""
    class Undeclared(CyclicBlockManager):
        def __init__(self, n, b):
            super().__init__(n, b)
            del self.cyclic_window

    assert not verify(Undeclared, 8, 2, 3000, 0).ok


def test_a_non_cyclic_allocator_declaring_a_window_fails():
    class Declared(BlockManager):
        def __init__(self, n, b):
            super().__init__(n, b)
            self.cyclic_window = 2 * b

    r = verify(Declared, 8, 2, 3000, 0)
    assert not r.ok and r.violation.name.startswith(("allocate", "append_slot")), r.violation


@pytest.mark.parametrize("window", [3, -2, 2.0])
def test_a_malformed_declaration_is_a_target_error(window):
    class Bad(CyclicBlockManager):
        def __init__(self, n, b):
            super().__init__(n, b)
            self.cyclic_window = window

    with pytest.raises(TargetError, match="cyclic_window"):
        Oracle(build(Bad, 8, 2, None))


@pytest.mark.parametrize("name", sorted(CYCLIC))
def test_fast_and_full_agree_on_the_corpus(name):
    cls, _, _ = CYCLIC[name]
    fast = verify(cls, 16, 4, 3000, 0, timeout=5.0, mode="fast", do_shrink=False)
    full = verify(cls, 16, 4, 3000, 0, timeout=5.0, mode="full", do_shrink=False)
    assert not fast.ok and not full.ok
    assert fast.violation.name == full.violation.name
    assert fast.violation.step == full.violation.step


def test_a_cyclic_trace_replays_on_its_target_and_passes_on_the_reference():
    cls = CYCLIC["cyclic-fork-counts-stale"][0]
    r = verify(cls, 16, 4, 3000, 0, timeout=5.0)
    scope = {"num_blocks": r.trace.scope.num_blocks, "block_size": r.trace.scope.block_size}
    again = replay_ops("blocks", cls, scope, r.trace.ops)
    assert again.violation is not None and again.violation.name == r.violation.name
    assert replay_ops("blocks", LEGAL["cyclic"], scope, r.trace.ops).violation is None


def test_the_witness_says_how_the_spec_reads_a_wrapped_append():
    cls = CYCLIC["cyclic-reuses-stale-entry"][0]
    ops = [Op("allocate", seq=0, n_tokens=2), Op("fork", seq=0, child=1),
           Op("append_slot", seq=0), Op("append_slot", seq=0), Op("append_slot", seq=0)]
    v = replay_ops("blocks", cls, {"num_blocks": 6, "block_size": 1}, ops).violation
    assert v is not None and v.step == 5, v
    assert "under the cyclic window of 2 block(s) this append past it is the drop of " \
           "position 2" in v.witness, v.witness
    assert "was not free: sequence 1" in v.witness, v.witness


def test_the_narration_names_a_block_reused_in_place():
    from kvcheck.models.blocks.witness import narrate

    op = Op("append_slot", seq=0, block=3, offset=0)
    before = {"tables": {"0": [3, 4]}, "lens": {"0": 2}, "refs": [], "free": []}
    after = {"tables": {"0": [NULL, 4, 3]}, "lens": {"0": 3}, "refs": [], "free": []}
    assert "(the block that left the window at position 0, reused in place)" in narrate(
        op, before, after, 1)
    after["tables"]["0"] = [NULL, 4, 5]
    assert "(a fresh block)" in narrate(Op("append_slot", seq=0, block=5, offset=0),
                                        before, after, 1)


def test_exploration_keys_states_by_the_hidden_table_too():
    """A seed-shaped allocator's ``hidden_table`` (forwarded by SeedAdapter) enters the
    exploration key, so two states that read alike but hold different stale names are
    both expanded; bounded exploration then finds the stale reuse."""
    from kvcheck.models.blocks.model import MODEL

    cls = CYCLIC["cyclic-reuses-stale-entry"][0]
    target = build(cls, 6, 1, None)
    assert callable(target.hidden_table)
    oracle = Oracle(target, mode="full")
    for op in (Op("allocate", seq=0, n_tokens=3),):
        assert oracle.step(op) is None
    oracle.observed = oracle.snap

    class State:
        pass

    st = State()
    st.target, st.observed, st.lengths = target, oracle.snap, dict(oracle.lengths)
    key = MODEL.canonical(st)
    assert len(key) == 4 and key[3]  # the hidden tables are part of it
    r = explore(cls, Scope(6, 1, 2, 3, 5))
    assert r.violation is not None, "the stale reuse was merged away"

    class Unseen(cls):  # the same allocator keeping its stale names to itself
        hidden_table = None

    assert explore(Unseen, Scope(6, 1, 2, 3, 5)).violation is None  # (why the key needs it)
