"""Every prefix invariant builds a Z3 formula that agrees with its concrete
evaluation, on random valid states and on random corruptions of them."""

import random

import pytest
import z3

from kvcheck.spec.logic import PY, Z3Logic
from kvcheck.spec.prefix import (
    PREFIX_INVARIANTS,
    PrefixScope,
    PrefixSnapshot,
    PrefixSymState,
    by_name,
)


def random_valid(rng: random.Random, n: int, bs: int) -> PrefixSnapshot:
    refs, free, evict, entries = [], [], [], []
    meanings, filled, content, partial = {}, {}, {}, set()
    next_prefix = 0
    for b in range(n):
        place = rng.choice(("free", "evict", "used", "used_keyed", "used_partial"))
        refs.append(rng.randint(1, 3) if place.startswith("used") else 0)
        if place == "free":
            free.append(b)
            filled[b] = rng.randint(0, bs)
            continue
        if place == "used_partial":
            partial.add(b)
            filled[b] = rng.randint(1, bs - 1) if bs > 1 else 1
            if bs == 1:
                partial.discard(b)
            continue
        filled[b], content[b] = bs, next_prefix
        next_prefix += 1
        if place in ("evict", "used_keyed"):
            key = ("k", b)
            entries.append((key, b))
            meanings[key] = content[b]
        if place == "evict":
            evict.append(b)
    return PrefixSnapshot(n, bs, refs, free, evict, entries, meanings, partial, filled, content)


def corrupt(rng: random.Random, s: PrefixSnapshot) -> PrefixSnapshot:
    refs, free, evict = list(s.refs), list(s.free_list.elements()), list(s.evictable.elements())
    entries, meanings = list(s.entries), dict(s.meanings)
    partial, filled, content = set(s._partial), dict(s.filled_map), dict(s.content_map)
    free_len, evict_len = None, None
    b = rng.randrange(s.num_blocks)
    what = rng.randrange(10)
    if what == 0:
        refs[b] += 1
    elif what == 1:
        free.append(b)
    elif what == 2:
        evict.append(b)
    elif what == 3:
        key = ("x", b)
        entries.append((key, b))
        meanings[key] = rng.choice([-1, content.get(b, -1), 99])
    elif what == 4:
        partial.add(b)
    elif what == 5:
        filled[b] = rng.randint(0, s.block_size)
    elif what == 6:
        content[b] = rng.choice([-1, 0, 1, 7])
    elif what == 7:
        evict_len = len(evict) + rng.choice([1, -1])
    elif what == 8:
        free_len = len(free) + rng.choice([1, 2])
    elif entries:
        entries.pop(rng.randrange(len(entries)))
    return PrefixSnapshot(s.num_blocks, s.block_size, refs, free, evict, entries, meanings,
                          partial, filled, content, free_len, evict_len)


def z3_value(formula, binding) -> bool:
    solver = z3.Solver()
    solver.add(*binding)
    assert solver.check() == z3.sat
    value = solver.model().eval(formula, model_completion=True)
    assert z3.is_true(value) or z3.is_false(value), value
    return z3.is_true(value)


@pytest.mark.parametrize("inv", PREFIX_INVARIANTS, ids=lambda i: i.name)
def test_formula_builds_and_agrees(inv):
    rng = random.Random(inv.name)
    scope = PrefixScope(5, 3)
    L = Z3Logic(scope.width)
    sym = PrefixSymState(L, scope, "s")
    whole = inv.formula(L, sym)
    assert z3.is_bool(whole)
    assert z3.is_bool(L._b(sym.domain()))
    seen = {True: 0, False: 0}
    for _ in range(60):
        snap = random_valid(rng, scope.num_blocks, scope.block_size)
        if rng.random() < 0.6:
            snap = corrupt(rng, snap)
        binding = sym.bind(snap)
        concrete = bool(inv.formula(PY, snap))
        assert z3_value(whole, binding) == concrete, inv.name
        seen[concrete] += 1
        if inv.domain == "block":
            for b in snap.blocks():
                assert z3_value(L._b(inv.holds_for(L, sym, b)), binding) == bool(
                    inv.holds_for(PY, snap, b))
    assert seen[True] and seen[False], (inv.name, seen)


def test_valid_states_satisfy_every_invariant():
    rng = random.Random(1)
    for _ in range(200):
        snap = random_valid(rng, 6, rng.randint(1, 4))
        for inv in PREFIX_INVARIANTS:
            assert inv.formula(PY, snap), inv.name


def test_symbolic_invariants_are_satisfiable_and_refutable():
    scope = PrefixScope(3, 2)
    L = Z3Logic(scope.width)
    s = PrefixSymState(L, scope, "s")
    every = L.and_(s.domain(), *[inv.formula(L, s) for inv in PREFIX_INVARIANTS])
    solver = z3.Solver()
    solver.add(every)
    assert solver.check() == z3.sat
    # an evictable block that is also in use is impossible under the invariants
    solver.add(s.on_evictable(0) >= 1, s.ref(0) >= 1)
    assert solver.check() == z3.unsat


def test_by_name():
    assert by_name("cache_content").domain == "block"
    with pytest.raises(KeyError):
        by_name("nope")
