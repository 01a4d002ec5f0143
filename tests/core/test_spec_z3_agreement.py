"""Every invariant builds a Z3 formula, and that formula agrees with the
concrete evaluation of the very same spec text on random states."""

import random

import pytest
import z3

from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY, Z3Logic
from kvcheck.spec.symbolic import SymScope, SymState

from .states import corrupt, reachable

SCOPE = SymScope(num_blocks=6, block_size=2, seqs=4, max_tokens=10)


def _symbolic_truth(inv, snap) -> bool:
    L = Z3Logic(SCOPE.width)
    s = SymState(L, SCOPE, "s", observed=True)
    slots = {q: i for i, q in enumerate(sorted(snap.tables))}
    # identities as small ints, equal exactly when the objects are the same
    names: dict[int, int] = {}
    solver = z3.Solver()
    for c in s.equals_snapshot(snap, slots):
        solver.add(c)
    for q, slot in slots.items():
        solver.add(s._ident[slot] == names.setdefault(id(snap.identities[q]), len(names)))
    assert solver.check() == z3.sat, "the binding itself must be satisfiable"
    formula = inv.formula(L, s)
    assert isinstance(formula, z3.BoolRef), f"{inv.name} did not build a Z3 formula"
    solver.add(z3.Not(formula))
    return solver.check() == z3.unsat


def _states(seed: int, count: int):
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        snap = reachable(rng, SCOPE.num_blocks, SCOPE.block_size, rng.randint(0, 25),
                         SCOPE.max_tokens)
        if rng.random() < 0.6:
            snap = corrupt(rng, snap)
        if any(len(t) > SCOPE.table_slots for t in snap.tables.values()):
            continue
        if any(not 0 <= b < SCOPE.num_blocks for b in snap.free):
            continue
        if any(n > SCOPE.max_tokens for n in snap.lengths.values()):
            continue
        out.append(snap)
    return out


@pytest.mark.parametrize("inv", INVARIANTS, ids=lambda i: i.name)
def test_invariant_agrees_with_z3(inv):
    seen = set()
    for snap in _states(sum(map(ord, inv.name)), 80):
        concrete = inv.formula(PY, snap)
        assert _symbolic_truth(inv, snap) == concrete, (inv.name, snap.tables, snap.refs)
        seen.add(concrete)
    assert seen == {True, False}, f"{inv.name}: random states never made it {'false' if True in seen else 'true'}"


def test_every_invariant_has_a_docstring():
    for inv in INVARIANTS:
        assert len(inv.doc) > 20, inv.name
