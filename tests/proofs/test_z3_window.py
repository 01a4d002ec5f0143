"""The Z3 engines over drop_behind_window (issue 15, section 2): the induction rows cover
it with null entries in the invariants, a weakened drop contract is caught, and each of
its outcome classes has a witness the window reference runs."""

import pytest

from kvcheck.impl.block_manager import WindowBlockManager
from kvcheck.models.blocks.runs import replay
from kvcheck.proofs.bmc import witnesses
from kvcheck.proofs.induction import prove_invariants
from kvcheck.spec import contracts
from kvcheck.spec.outcomes import OUTCOMES
from kvcheck.spec.symbolic import SymScope

SMALL = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=6)


def test_the_induction_covers_the_drop_and_null_entries():
    rows = {r.property: r for r in prove_invariants(SMALL)}
    assert all(r.result == "proved" for r in rows.values()), rows
    assert "drop_behind_window" in rows["null_entries"].detail
    assert "drop_behind_window" in rows["refcount_conservation"].detail


def _without(kind: str, clause: str):
    rule = contracts.CONTRACTS[kind]

    def weaker(L, pre, post, op, dom):
        for name, element, formula in rule(L, pre, post, op, dom):
            if not name.startswith(clause):
                yield name, element, formula
    return {**contracts.CONTRACTS, kind: weaker}


def _weaker_precondition(kind):
    """The spec with ``kind``'s precondition back to what it was before null entries."""
    def precondition(L, s, op):
        if op.kind == kind:
            return L.and_(s.live(op.seq), op.n_tokens >= 1, op.n_tokens < s.length(op.seq))
        return original(L, s, op)
    original = contracts.precondition
    return precondition


WEAKENED = [
    ("drop_behind_window", "refcount -1 per entry replaced", "refcount_conservation"),
    ("drop_behind_window", "a block inside the window stays", "null_entries"),
    ("drop_behind_window", "a block wholly behind the window", "valid_block_ids"),
]


@pytest.mark.parametrize("kind,clause,broken", WEAKENED)
def test_a_weakened_drop_contract_is_caught_by_the_induction(kind, clause, broken):
    rows = {r.property: r for r in prove_invariants(SMALL, contracts=_without(kind, clause))}
    assert rows[broken].result == "violated", rows[broken]
    assert kind in rows[broken].detail


def test_a_rollback_into_the_null_entries_breaks_the_induction(monkeypatch):
    monkeypatch.setattr(contracts, "precondition", _weaker_precondition("rollback"))
    rows = {r.property: r for r in prove_invariants(SMALL)}
    assert rows["null_entries"].result == "violated"
    assert "rollback" in rows["null_entries"].detail


def test_every_window_class_has_a_witness_the_reference_runs():
    ws = {w.name: w for w in witnesses(SymScope(6, 2, 3, 6), 4)}
    window = [n for n, (kind, _, _) in OUTCOMES.items() if kind == "drop_behind_window"]
    assert len(window) == 3
    for n in window:
        assert ws[n].depth, n
        assert replay(WindowBlockManager, 6, 2, ws[n].ops).violation is None, n
    assert ws["window/only-drops-shared-references"].depth == 3  # allocate, fork, drop
