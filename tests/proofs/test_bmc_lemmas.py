"""``bmc_lemmas``, breadth-first BMC on one incremental unrolling with the invariants their
1-induction proves closed at every depth: clean on the spec to any depth, and a mutated
contract, or an invariant no induction closes, still checked run by run and caught at its
shortest depth with a trace the reference runs."""

from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.blocks.runs import replay
from kvcheck.proofs.bmc import bmc_bfs, bmc_lemmas
from kvcheck.proofs.induction import ENGINE, Proof
from kvcheck.spec import contracts
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.symbolic import SymScope

from corpus.buggy import ForkWithoutRefcount

SMALL = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=4)


def _fork_forgets_refcount(L, pre, post, op, dom):
    """A spec mutation: fork leaves refcounts unchanged."""
    for name, element, formula in contracts.fork(L, pre, post, op, dom):
        if name.startswith("refcount +1"):
            formula = post.ref(element) == pre.ref(element)
        yield name, element, formula


MUTANT = {**contracts.CONTRACTS, "fork": _fork_forgets_refcount}

CONSERVATION = [i for i in INVARIANTS if i.name == "refcount_conservation"]


def test_the_spec_is_clean_to_depth_10_every_invariant_closed():
    r = bmc_lemmas(SMALL, 10)
    assert r.violated is None and r.complete and r.depth == 10
    assert set(r.closed) == {i.name for i in INVARIANTS} | {"scope_bound"} and not r.unrolled
    assert r.asked_all == 2  # (every invariant also asked of every run to depth 2)


def test_a_mutated_contract_is_caught_shortest_on_the_unrolling():
    r = bmc_lemmas(SMALL, 6, contracts=MUTANT)
    assert "refcount_conservation" in r.unrolled  # its induction fails: asked run by run
    assert r.violated == "refcount_conservation" and r.depth == 2 == len(r.ops)
    assert [op.kind for op in r.ops] == ["allocate", "fork"]
    assert bmc_bfs(SMALL, 4, contracts=MUTANT).depth == r.depth  # the explicit BFS agrees
    assert replay(BlockManager, 4, 2, r.ops).violation is None
    assert replay(ForkWithoutRefcount, 4, 2, r.ops).violation is not None


def test_an_invariant_no_induction_closes_is_checked_by_the_unrolling():
    """refcount_conservation alone is not 1-inductive (its induction needs the others), yet
    holds on every run: the unrolling shows it, and still finds it broken under the mutant."""
    clean = bmc_lemmas(SMALL, 3, invariants=CONSERVATION)
    assert clean.unrolled[0] == "refcount_conservation"
    assert clean.violated is None and clean.complete and clean.depth == 3
    found = bmc_lemmas(SMALL, 3, contracts=MUTANT, invariants=CONSERVATION)
    assert found.violated == "refcount_conservation" and found.depth == 2


def test_proofs_of_another_scope_close_nothing():
    wrong = [Proof(ENGINE, i.name, SymScope(5, 2, 3, 4).describe(), "proved", 0.0)
             for i in INVARIANTS]
    r = bmc_lemmas(SMALL, 3, contracts=MUTANT, proofs=wrong)
    assert not r.closed and r.violated == "refcount_conservation" and r.depth == 2


def test_the_independent_depths_catch_a_wrong_proof():
    """Proofs claiming every invariant of the mutant inductive (they are not): the depths
    asked apart from the induction still find its depth-2 violation; with none, the claim
    is trusted and the run is clean (the closure rests on the proofs it is handed)."""
    lying = [Proof(ENGINE, name, SMALL.describe(), "proved", 0.0)
             for name in [*(i.name for i in INVARIANTS), "scope_bound"]]
    caught = bmc_lemmas(SMALL, 4, contracts=MUTANT, proofs=lying)
    assert caught.violated == "refcount_conservation" and caught.depth == 2
    trusted = bmc_lemmas(SMALL, 4, contracts=MUTANT, proofs=lying, independent=0)
    assert trusted.violated is None and trusted.depth == 4 and not trusted.unrolled
