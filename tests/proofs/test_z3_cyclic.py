"""The Z3 induction under a cyclic sliding window (vLLM's BlockSpaceManager v1): every
invariant is preserved by the seed's four contracts with ``Op.cycle`` set (allocate of at
most W blocks, an append past the window as the drop, then the append, over
``SymState.dropped``); a derived state that forgets the drop's release is caught; a
wrapped append is satisfiable (the rows are not vacuous); ``kvcheck prove`` adds the rows
for a target declaring a window."""

import pytest
import z3

from kvcheck.proofs.induction import cyclic_contracts, prove_invariants
from kvcheck.proofs.model import Model
from kvcheck.spec.contracts import SEED_OPERATIONS
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.symbolic import SymScope, SymState

SCOPES = [SymScope(num_blocks=3, block_size=1, seqs=2, max_tokens=4),
          SymScope(num_blocks=4, block_size=2, seqs=2, max_tokens=6)]


@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: s.describe())
@pytest.mark.parametrize("window", [1, 2])
def test_every_invariant_is_preserved_under_a_cyclic_window(scope, window):
    rows = prove_invariants(scope, contracts=cyclic_contracts(window, SEED_OPERATIONS))
    bad = [(r.property, r.result, r.detail) for r in rows if r.result != "proved"]
    assert not bad, bad
    assert any(r.property == "refcount_conservation" for r in rows)


def test_a_drop_that_forgets_to_release_is_caught(monkeypatch):
    original = SymState.dropped

    def leaky(self, q, skip):  # the entries go null, their references stay
        out = original(self, q, skip)
        out._ref, out._free, out._nfree = self._ref, self._free, self._nfree
        return out

    monkeypatch.setattr(SymState, "dropped", leaky)
    rows = {r.property: r for r in prove_invariants(
        SCOPES[0], contracts=cyclic_contracts(2, SEED_OPERATIONS))}
    assert rows["refcount_conservation"].result == "violated"
    assert "append_slot" in rows["refcount_conservation"].detail


@pytest.mark.parametrize("window", [1, 2])
def test_a_wrapped_append_is_possible(window):
    """From a state satisfying every invariant, an append at a boundary past the window
    succeeds: the cyclic clauses are satisfiable where they matter."""
    scope = SCOPES[0]
    m = Model(scope, cyclic_contracts(window, ("append_slot",)), INVARIANTS)
    s, s2 = m.state("s"), m.state("s2")
    step, choices = m.step(s, s2, "t", kinds=("append_slot",), symmetric=True)
    ok = [c.selector for c in choices if c.op.outcome == "ok"]
    solver = z3.Solver()
    solver.add(m.invariant(s), step, z3.Or(ok), s.live(0), s.length(0) == window,
               s.nblocks(0) == window)
    assert solver.check() == z3.sat


def test_prove_adds_the_cyclic_rows_for_a_target_declaring_a_window():
    from kvcheck.prove import Settings, prove

    report = prove("reference-cyclic", Settings(num_blocks=3, block_size=1, seqs=2, depth=2,
                                                budget=120, crosshair=False, pairs=False))
    rows = [r for r in report.rows if "under a cyclic window of 2 block(s)" in r.property]
    assert len(rows) >= 10 and all(r.result == "holds" for r in rows), rows
    plain = prove("reference", Settings(num_blocks=3, block_size=1, seqs=2, depth=2,
                                        budget=120, crosshair=False, pairs=False))
    assert not any("cyclic" in r.property for r in plain.rows)
