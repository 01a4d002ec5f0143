"""The fused fast-mode steps (``kvcheck.models.blocks.fused``) do exactly what the layered
path (``Oracle._step_fast``: ``After``, the compiled step check, ``_record``, the
read-back, ``Ghost.commit``) does: the same verdicts, clauses, elements and shrunk
traces on the corpus, and the same verified state, shadow and bookkeeping after every
operation of randomly faulty allocators."""

from __future__ import annotations

import pytest
from core.test_compiled import Faulty

from kvcheck.impl.block_manager import BlockManager, EagerForkBlockManager
from kvcheck.models.blocks import fused
from kvcheck.models.blocks import oracle as oracle_mod
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import OK, Op
from kvcheck.targets.loading import build
from kvcheck.verify import verify

from corpus.buggy import CORPUS
from corpus.cyclic import BEYOND_BFS
from corpus.cyclic import LEGAL as CYCLIC_LEGAL
from corpus.engine import LEGAL as ENGINE_LEGAL
from corpus.window import LEGAL as WINDOW_LEGAL

LEGAL = {**ENGINE_LEGAL, **WINDOW_LEGAL, **CYCLIC_LEGAL}


def test_every_one_sequence_operation_is_fused():
    """Each fused kind has its step (a generation failure would quietly fall back to the
    layered path), and its post-state terms are all locals: no call into an ``After``."""
    assert set(oracle_mod._FUSED) == {(k, OK) for k in fused.KINDS}
    for kind in fused.KINDS:
        src = fused.source(kind)
        assert "post." not in src and "post_" not in src, kind


def test_only_the_oracle_itself_takes_the_fused_path():
    target = build(BlockManager, 8, 2)
    assert Oracle(target, timeout=None)._fused
    assert not Oracle(build(BlockManager, 8, 2), timeout=None, fused=False)._fused
    assert not Oracle(build(BlockManager, 8, 2), timeout=None, compiled=False)._fused

    class Own(Oracle):
        def _record(self, op, delta, post):
            super()._record(op, delta, post)

    assert not Own(build(BlockManager, 8, 2), timeout=None)._fused


def _state(o: Oracle):
    """Everything a step leaves behind, comparable between two oracles of two targets."""
    g, sh = o.ghost, o.shadow
    idents = {q: i is not None for q, i in g.identities.items()}
    return (g.tables, g.lengths, g.reservations, g.impl_lengths, idents,
            sorted(g.ident_count.values()), {b: c for b, c in g.holders_count.items() if c},
            g.refs, g.zero, g.free_len, o.lengths, o.reserved, o._order, o._pos,
            sh.expected, sh.slots, sh._next, sh._own_start, sh._own_seq)


def _lockstep(factory, nb, bs, ops, seed, counts, seen=None):
    """The same operations on two targets, checked fused and layered: the same verdict
    and the same state after every step. ``counts``: fused steps passed / failed; the
    kinds fused are taken out of ``seen``."""
    a = Oracle(build(factory, nb, bs), mode="fast", timeout=None, sweep_every=50)
    b = Oracle(build(factory, nb, bs), mode="fast", timeout=None, sweep_every=50, fused=False)
    assert a._fused and not b._fused
    calls = {}
    for key, step in a._fused.items():
        def counted(o, op, step=step):
            got = step(o, op)
            counts["failed" if type(got) is tuple else "passed"] += 1
            if seen is not None:
                seen.discard(op.kind)
            return got
        calls[key] = counted
    a._fused = calls
    driver = RandomDriver(seed, nb, bs, a.target.capabilities)
    for _ in range(ops):
        op = driver.next_op(a.live_seqs(), a.ghost.num_free(), a)
        if not a.valid(op):
            assert not b.valid(op)
            continue
        assert b.valid(twin := Op(op.kind, op.seq, op.child, op.n_tokens, lookahead=op.lookahead))
        va, vb = a.step(op), b.step(twin)
        assert (va is None) == (vb is None), (va, vb)
        if va is not None:
            assert (va.step, va.kind, va.name, va.element, va.witness) == \
                (vb.step, vb.kind, vb.name, vb.element, vb.witness)
            return va
        assert _state(a) == _state(b), op
    return None


class FaultyEngine(Faulty, EagerForkBlockManager):
    """``Faulty`` with the engines' operations (reservations with lookahead, rollbacks,
    rebases, preemptions, eager copies at fork), each followed by a random fault too."""

    def append_slots(self, seq, n_tokens, lookahead=0):
        copies = super().append_slots(seq, n_tokens, lookahead)
        self._fault()
        return copies

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        self._fault()

    def rebase(self, source, child):
        copies = super().rebase(source, child)
        self._fault()
        return copies

    def preempt(self, seq):
        super().preempt(seq)
        self._fault()


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("faulty", [Faulty, FaultyEngine], ids=["seed-ops", "engine-ops"])
def test_fused_and_layered_agree_on_faulty_allocators(faulty, seed):
    nb, bs = [(3, 1), (6, 1), (10, 2), (16, 4), (24, 3), (40, 5)][seed % 6]
    rate = (0.01, 0.03, 0.1)[seed % 3]
    _lockstep(faulty.factory(seed, rate), nb, bs, 600, seed, {"passed": 0, "failed": 0})


@pytest.mark.parametrize("faulty", [Faulty, FaultyEngine], ids=["seed-ops", "engine-ops"])
def test_the_lockstep_is_not_vacuous(faulty):
    """The comparison above runs every fused step, sees them pass and fail (then the
    layered path names the clause on what they observed), and most faulty runs fail."""
    counts = {"passed": 0, "failed": 0}
    kinds = set()
    found = 0
    for s in range(20):
        a = Oracle(build(faulty.factory(s, 0.03), 10, 2), timeout=None)
        kinds |= {k for k, _ in a._fused} & set(a.target.capabilities)
        found += _lockstep(faulty.factory(s, 0.03), 10, 2, 400, s, counts, seen=kinds) is not None
    assert found >= 15 and counts["passed"] >= 300 and counts["failed"] >= 5, counts
    assert not kinds, f"never fused: {kinds}"


def _outcome(target, seed, nb=16, bs=4):
    r = verify(target, nb, bs, 3000, seed, timeout=5.0, shrink_budget=30)
    v = r.violation
    return (r.verdict, r.ops, r.original_length,
            None if v is None else (v.step, v.kind, v.name, v.element),
            None if r.trace is None else len(r.trace.ops))


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("name", sorted(CORPUS) + sorted(f"legal:{n}" for n in LEGAL))
def test_fused_and_layered_agree_on_the_corpus(name, seed, monkeypatch):
    """Every corpus entry: the same verdict, operations run, violation (step, kind,
    clause, element) and shrunk length with the fused steps as without them; every
    legal variant passes both ways."""
    target = LEGAL[name[6:]] if name.startswith("legal:") else CORPUS[name][0]
    ran = []
    steps = {k: (lambda o, op, s=s: ran.append(op.kind) or s(o, op))
             for k, s in oracle_mod._FUSED.items()}
    monkeypatch.setattr(oracle_mod, "_FUSED", steps)
    with_fused = _outcome(target, seed)
    # (under a cyclic window every operation takes the spec itself: nothing is fused)
    cyclic = getattr(build(target, 16, 4), "cyclic_window", None)
    assert ran or cyclic or with_fused[1] == 0, "the fused steps did not run"
    monkeypatch.setattr(oracle_mod, "_FUSED", {})
    layered = _outcome(target, seed)
    if name in BEYOND_BFS:  # (its shrinking ends at the BFS's time limit: its length varies)
        bound = CORPUS[name][2]
        assert with_fused[:3] == layered[:3] and with_fused[3][1:] == layered[3][1:]
        assert with_fused[4] <= bound and layered[4] <= bound
        return
    assert with_fused == layered
    assert (layered[0] == "pass") == name.startswith("legal:"), layered
