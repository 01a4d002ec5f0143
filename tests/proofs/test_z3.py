"""The Z3 engines: induction proves the spec, and each engine fails on a planted bug."""

from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.blocks.runs import replay
from kvcheck.proofs.bmc import bmc, witnesses
from kvcheck.proofs.induction import prove_invariants
from kvcheck.spec import contracts
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.outcomes import OUTCOMES
from kvcheck.spec.symbolic import SymScope

from corpus.buggy import ForkWithoutRefcount

SMALL = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=4)


def _fork_forgets_refcount(L, pre, post, op, dom):
    """A spec mutation: fork leaves refcounts unchanged."""
    for name, element, formula in contracts.fork(L, pre, post, op, dom):
        if name.startswith("refcount +1"):
            formula = post.ref(element) == pre.ref(element)
        yield name, element, formula


def _append_never_copies(L, pre, post, op, dom):
    """A spec mutation: append_slot may only succeed when no copy is needed."""
    yield from contracts.append_slot(L, pre, post, op, dom)
    if op.outcome == "ok":
        yield "no copy-on-write", op.seq, L.not_(op.has_cow)


MUTANT = {**contracts.CONTRACTS, "fork": _fork_forgets_refcount}


def test_induction_proves_every_invariant():
    rows = prove_invariants(SMALL)
    names = {r.property for r in rows}
    assert {i.name for i in INVARIANTS} <= names and "isolation" in names
    assert all(r.result == "proved" for r in rows), [(r.property, r.result, r.detail) for r in rows]


def test_induction_fails_on_a_spec_mutation():
    rows = {r.property: r for r in prove_invariants(SMALL, contracts=MUTANT)}
    assert rows["refcount_conservation"].result == "violated"
    assert "fork" in rows["refcount_conservation"].detail


def test_bmc_finds_the_shortest_counterexample_and_it_replays():
    found = bmc(SMALL, 4, contracts=MUTANT)
    assert found.violated == "refcount_conservation"
    assert found.depth == 2
    assert [op.kind for op in found.ops] == ["allocate", "fork"]
    # the decoded trace runs on the reference (which is right) and catches the buggy allocator
    assert replay(BlockManager, 4, 2, found.ops).violation is None
    assert replay(ForkWithoutRefcount, 4, 2, found.ops).violation is not None


def test_bmc_on_the_spec_finds_nothing():
    result = bmc(SMALL, 3)
    assert result.violated is None and result.depth == 3 and result.complete


def test_every_outcome_class_is_reachable():
    ws = {w.name: w for w in witnesses(SymScope(6, 2, 3, 6), 5)}
    assert set(ws) == set(OUTCOMES)
    assert all(w.depth for w in ws.values()), [n for n, w in ws.items() if not w.depth]
    assert ws["append/copy-on-write"].depth == 3
    for w in ws.values():  # every witness replays on the reference
        assert replay(BlockManager, 6, 2, w.ops).violation is None


def test_vacuity_is_reported():
    mutant = {**contracts.CONTRACTS, "append_slot": _append_never_copies}
    ws = {w.name: w for w in witnesses(SMALL, 4, contracts=mutant)}
    assert ws["append/copy-on-write"].depth is None
    assert ws["append/in-place"].depth is not None


def test_breadth_first_bmc_clean_and_finds_the_mutant_shortest():
    from kvcheck.proofs.bmc import bmc_bfs

    clean = bmc_bfs(SMALL, 5)
    assert clean.violated is None and clean.complete and clean.depth == 5
    assert clean.states > 20 and clean.transitions > clean.states
    found = bmc_bfs(SMALL, 5, contracts=MUTANT)
    assert found.violated == "refcount_conservation" and found.depth == 2
    assert [op.kind for op in found.ops] == ["allocate", "fork"]
    assert replay(BlockManager, 4, 2, found.ops).violation is None
    assert replay(ForkWithoutRefcount, 4, 2, found.ops).violation is not None


# at one token per block no tail is partial: no copy-on-write append, no copy at fork or
# rebase time, and so no fork or rebase out of blocks either (an in-place append only
# into a reserved block: a rollback's or a lookahead's)
NA = {"append/copy-on-write", "append/out-of-blocks-in-copy-on-write",
      "fork/copies-partial-tail", "fork/out-of-blocks", "rebase/copies-partial-tail",
      "rebase/out-of-blocks"}


def test_classes_that_cannot_occur_at_block_size_1_are_not_applicable():
    """At one token per block every append starts a block: Z3 shows no state that
    satisfies every invariant has a copy-on-write append, though a larger scope has them;
    an append in place only into a block the sequence reserved, so with the seed's four
    operations alone none. Every other class has a witness."""
    ws = {w.name: w for w in witnesses(SymScope(3, 1, 2, 3), 4)}
    assert {n for n, w in ws.items() if w.not_applicable} == NA
    assert all(ws[n].depth for n in set(OUTCOMES) - NA)
    assert all(not ws[n].depth and ws[n].possible_at for n in NA)
    seed = {k: contracts.CONTRACTS[k] for k in ("allocate", "append_slot", "fork", "free_seq")}
    ws = {w.name: w for w in witnesses(SymScope(3, 1, 2, 3), 4, contracts=seed)}
    assert not ws["append/in-place"].depth


def test_every_class_can_occur_at_the_grown_scope():
    """The premise of "not applicable": at ``grown`` of even the smallest scope each class can
    occur from some state satisfying every invariant."""
    from kvcheck.proofs.bmc import grown, possible

    got = possible(grown(SymScope(1, 1, 1, 1)), [(n, (n,)) for n in OUTCOMES])
    assert got == {n: True for n in OUTCOMES}


def test_a_spec_that_makes_a_class_impossible_is_still_reported(monkeypatch):
    """Vacuity stays meaningful: a class the spec itself rules out (a contract or an outcome
    predicate mutated) cannot occur at the larger scope either, so it is never 'not
    applicable', at a scope where it should occur or at block size 1."""
    mutant = {**contracts.CONTRACTS, "append_slot": _append_never_copies}
    for scope in (SMALL, SymScope(3, 1, 2, 3)):
        ws = {w.name: w for w in witnesses(scope, 4, contracts=mutant)}
        cow = ws["append/copy-on-write"]
        assert cow.depth is None and cow.impossible and not cow.not_applicable
    kind, outcome, _ = OUTCOMES["append/in-place"]
    monkeypatch.setitem(OUTCOMES, "append/in-place", (kind, outcome, lambda L, pre, post, op: False))
    for scope in (SMALL, SymScope(3, 1, 2, 3)):
        ws = {w.name: w for w in witnesses(scope, 4)}
        assert not ws["append/in-place"].depth and not ws["append/in-place"].not_applicable
