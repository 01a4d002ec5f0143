"""The Z3 engines over the engines' operations (reservations, rollback, eager forks,
rebase, preemption, refusals): the induction covers every operation, a weakened contract
of each is caught, and every outcome class of each has a witness the references run."""

import pytest

from kvcheck.impl.block_manager import EagerForkBlockManager, EngineBlockManager
from kvcheck.models.blocks.runs import replay
from kvcheck.proofs.bmc import bmc_bfs, witnesses
from kvcheck.proofs.induction import prove_invariants
from kvcheck.spec import contracts
from kvcheck.spec.outcomes import OUTCOMES
from kvcheck.spec.symbolic import SymScope

SMALL = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=4)
ENGINE_OPS = ("append_slots", "rollback", "rebase", "preempt")


def test_the_induction_covers_every_operation():
    rows = prove_invariants(SMALL)
    assert all(r.result == "proved" for r in rows), [(r.property, r.detail) for r in rows
                                                     if r.result != "proved"]
    per_kind = [r for r in rows if r.detail.startswith("preserved by")]
    assert per_kind and all(set(contracts.CONTRACTS) <= set(r.detail[13:].split(", "))
                            for r in per_kind)


def _without(kind: str, clause: str):
    """``kind``'s contract with one clause dropped (a weaker spec)."""
    rule = contracts.CONTRACTS[kind]

    def weaker(L, pre, post, op, dom):
        for name, element, formula in rule(L, pre, post, op, dom):
            if not name.startswith(clause):
                yield name, element, formula
    return {**contracts.CONTRACTS, kind: weaker}


# (operation, clause dropped, an invariant that then breaks)
WEAKENED = [
    ("append_slots", "new blocks exactly", "table_length"),
    ("append_slots", "refcounts change only", "refcount_conservation"),
    ("rollback", "the table still holds every token left", "table_length"),
    ("rollback", "refcount -1 per entry dropped", "refcount_conservation"),
    ("rebase", "refcount +1 per entry of the child's table", "refcount_conservation"),
    ("fork", "a block copied at fork time was free", "valid_block_ids"),
    ("rebase", "a block copied at fork time was free or the child's alone", "valid_block_ids"),
    ("preempt", "refcount -1 per entry", "refcount_conservation"),
]


@pytest.mark.parametrize("kind,clause,broken", WEAKENED)
def test_a_weakened_contract_is_caught_by_the_induction(kind, clause, broken):
    rows = {r.property: r for r in prove_invariants(SMALL, contracts=_without(kind, clause))}
    assert rows[broken].result == "violated", rows[broken]
    assert kind in rows[broken].detail


def test_breadth_first_bmc_finds_a_weakened_rollback_shortest():
    found = bmc_bfs(SMALL, 3, contracts=_without("rollback", "the table still holds"))
    assert found.violated == "table_length" and found.depth == 2
    assert [op.kind for op in found.ops] == ["allocate", "rollback"]


def test_every_engine_class_has_a_witness_the_references_run():
    ws = {w.name: w for w in witnesses(SymScope(6, 2, 3, 6), 4)}
    engine = {n for n, (kind, _, _) in OUTCOMES.items()
              if kind in ENGINE_OPS or n.startswith("fork/") or n.endswith("/refused")}
    missing = [n for n in engine if not ws[n].depth]
    assert not missing, missing
    for w in ws.values():  # contracts are allowed outcomes: both references take them
        for ref in (EngineBlockManager, EagerForkBlockManager):
            assert replay(ref, 6, 2, w.ops).violation is None, (w.name, ref.__name__)


def test_lazy_and_eager_forks_are_both_witnessed():
    ws = {w.name: w for w in witnesses(SymScope(4, 2, 3, 4), 3)}
    assert ws["fork/ok"].depth == 2 and ws["fork/copies-partial-tail"].depth == 2
    assert ws["fork/out-of-blocks"].depth == 3  # two sequences hold the pool, then a fork
