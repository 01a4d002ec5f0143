"""Bounded model checking of the spec from the empty pool, and the
vacuity/coverage check built on it.

``bmc_lemmas`` (what ``kvcheck prove`` uses): depth by depth on one incremental
unrolling; an invariant whose 1-induction is proved is closed at every depth (each
state at depth d - 1 satisfies every invariant, the earlier depths being clean, so its
induction step gives it at depth d) and is asserted, not asked; the others are asked of
every run, depth by depth, and every invariant is asked to a small depth besides
(``independent``), apart from the induction. Depth 10 at 4 slots x 8 blocks costs the
induction and the independent depths (about 15 s) when every invariant is inductive, as
in the spec; an invariant that is not is left to the unrolling, which reaches depth 3 at
3 x 6 or 4 x 8 in a minute or two (benchmarks/proofs.py --bmc).

``bmc_bfs`` (``kvcheck prove``'s before): breadth-first reachability in
which Z3 enumerates, from each reached state, every successor the contracts
allow; states equal up to renaming are expanded once and every new one is
checked against the invariants. The first violation is a shortest
counterexample; a clean run covers every run of up to ``depth`` operations.
Per state, each disjunct of the step relation (an operation on its slots with
an outcome) gets the state's values substituted and simplified, so a choice the
state refutes costs no query and the rest are small ones; fresh blocks are
taken in a canonical order (``_fresh_order``).

``bmc``: classic iterative deepening: unroll the step relation 1, 2, ...
``depth`` times and ask for a state breaking an invariant; the first
satisfiable depth is a shortest counterexample. Its unsat proofs grow about
7x per depth, so it is kept for comparison (benchmarks/proofs.py).

``witnesses``: for every outcome class of every operation
(``kvcheck.spec.outcomes``), the shortest run whose last step is of that
class, and (optionally) for every ordered pair of classes a run whose last
two steps are that pair. A class with no witness within the bound is
reported: a spec in which, say, copy-on-write can never happen proves
nothing about it. One without a witness is then asked ``possible``: can it
occur at all, from *any* state satisfying every invariant (reachable or not)?
When Z3 says no at this scope but yes at a larger one (``grown``), the class is
*not applicable* at this scope (copy-on-write at block size 1: every append is
at a block boundary); when it says no even at the larger scope, the spec has
made the class impossible and that is still reported.

Pruning, none of which loses a behaviour up to renaming:
  * symmetry: block ids are interchangeable, so a step that takes fresh
    blocks takes the lowest-numbered free ones (in table order; in
    ``bmc_bfs``, for every operation: ``_fresh_order``); sequence slots are
    interchangeable, so allocate and fork use the lowest dead slot;
  * canonical garbage: dead slots and table positions past a table's end
    hold 0 (nothing in the spec reads them);
  * lemmas: when depth d is searched, depths < d had no violation, so every
    earlier state satisfies the invariants; asserting that keeps the shortest
    counterexample and prunes the rest.
Unbounded-integer arithmetic is the default encoding here (measured faster
for these unrollings than bit-vectors; see benchmarks/proofs.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import pairwise, permutations, product

import z3

from kvcheck.proofs.renaming import canonical_tables
from kvcheck.spec.contracts import Op
from kvcheck.spec.outcomes import OUTCOMES
from kvcheck.spec.state import NULL
from kvcheck.spec.symbolic import SymScope

from . import effort
from .model import SCOPE_BOUND, Model, decode, decode_choice


@dataclass
class Unrolling:
    model: Model
    states: list
    choices: list  # per step: list[Choice]
    solver: z3.Solver


def _lowest_free(model: Model, s, s2, choices) -> list:
    """Symmetry breaking: fresh blocks are the lowest free ids, in table order."""
    L, out = model.L, []
    for c in choices:
        op = c.op
        if op.outcome != "ok" or op.kind not in ("allocate", "append_slot"):
            continue
        q = op.seq
        if op.kind == "allocate":
            news = [(i, s2.table(q, i)) for i in s2.positions(q)]
            for i, x in news:
                for b in s.blocks():
                    # a free block below x must already be used by an earlier entry
                    earlier = L.or_(*[s2.table(q, j) == b for j in range(i)]) if i else False
                    out.append(z3.Implies(z3.And(c.selector, i < s2.nblocks(q), b < x,
                                                 s.free_count(b) >= 1), earlier))
        else:
            x = s2.tail(q)
            taken = L.or_(L.mod(s.length(q), s.block_size) == 0, s.ref(s.tail(q)) > 1)
            for b in s.blocks():
                out.append(z3.Implies(z3.And(c.selector, taken, b < x), s.free_count(b) == 0))
    return out


def _canonical(s) -> list:
    """Dead slots and positions past a table's end hold 0."""
    out = []
    for q in s.seqs():
        for i in s.positions(q):
            out.append(z3.Implies(z3.Not(z3.And(s.live(q), i < s.nblocks(q))), s._tab[q][i] == 0))
        out.append(z3.Implies(z3.Not(s.live(q)), z3.And(s.nblocks(q) == 0, s.length(q) == 0,
                                                        s.reserved(q) == 0)))
    return out


def _lowest_slot(s, choices) -> list:
    out = []
    for c in choices:
        if c.op.kind in ("allocate", "fork") and c.op.outcome == "ok":
            target = c.op.seq if c.op.kind == "allocate" else c.op.child
            out += [z3.Implies(c.selector, s.live(r)) for r in range(target)]
    return out


def unroll(scope: SymScope, contracts=None, invariants=None, encoding: str = "int") -> Unrolling:
    model = Model(scope, contracts, invariants, encoding=encoding)
    s0 = model.state("s0")
    solver = z3.Solver()
    solver.add(model.init(s0), *_canonical(s0))
    return Unrolling(model, [s0], [], solver)


def extend(u: Unrolling, symmetry: bool = True, lemmas: bool = True) -> None:
    d = len(u.states)
    s, s2 = u.states[-1], u.model.state(f"s{d}")
    if lemmas:
        u.solver.add(u.model.invariant(s))
    step, choices = u.model.step(s, s2, f"k{d}")
    u.solver.add(step, *_canonical(s2))
    if symmetry:
        u.solver.add(*_lowest_free(u.model, s, s2, choices), *_lowest_slot(s, choices))
    u.states.append(s2)
    u.choices.append(choices)


def trace_of(u: Unrolling, m: z3.ModelRef, upto: int | None = None) -> list[Op]:
    return [decode(m, ch) for ch in u.choices[:upto]]


@dataclass
class BmcResult:
    scope: str
    depth: int  # deepest depth checked
    seconds: float
    violated: str | None = None  # name of a broken invariant
    ops: list[Op] = field(default_factory=list)
    complete: bool = True
    undecided: str = ""  # not complete: which limit stopped it (effort.TIME or effort.EFFORT)


def _ms_left(budget: float | None, t0: float) -> int | None:
    """What is left of the wall-clock ``budget`` started at ``t0``, in ms (None: none)."""
    return None if budget is None else max(1, int(1000 * (budget - (time.perf_counter() - t0))))


def bmc(scope: SymScope, depth: int, contracts=None, invariants=None, encoding: str = "int",
        budget: float | None = None, symmetry: bool = True) -> BmcResult:
    """Shortest run from the empty pool to a state breaking an invariant, if any within ``depth``."""
    t0 = time.perf_counter()
    u = unroll(scope, contracts, invariants, encoding)
    invs = [*u.model.invariants, SCOPE_BOUND]
    res = BmcResult(scope.describe(), 0, 0.0)
    for d in range(1, depth + 1):
        if budget is not None and time.perf_counter() - t0 > budget:
            res.complete, res.undecided = False, effort.TIME
            break
        extend(u, symmetry)
        s = u.states[-1]
        L = u.model.L
        u.solver.push()
        u.solver.add(z3.Not(L.and_(*[inv.formula(L, s) for inv in invs])))
        effort.limit(u.solver, effort.units(effort.QUERY_UNITS), _ms_left(budget, t0))
        r = effort.check(u.solver)
        if r == effort.SAT:
            m = u.solver.model()
            res.ops = trace_of(u, m)
            res.violated = next(inv.name for inv in invs
                                if not z3.is_true(m.eval(inv.formula(L, s), model_completion=True)))
            res.depth = d
            u.solver.pop()
            break
        u.solver.pop()
        if r != effort.UNSAT:
            res.complete, res.undecided = False, r
            break
        res.depth = d
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class LemmaResult(BmcResult):
    """``bmc_lemmas``' verdict: ``depth`` is the deepest depth every invariant is known to
    hold at (every run of at most that many operations checked)."""

    closed: list[str] = field(default_factory=list)  # invariants closed by their 1-induction
    unrolled: list[str] = field(default_factory=list)  # invariants checked by the unrolling
    induction_seconds: float = 0.0  # (0 when the proofs were handed in)
    asked_all: int = 0  # every invariant, closed or not, asked of every run to this depth


def bmc_lemmas(scope: SymScope, depth: int, contracts=None, invariants=None,
               encoding: str = "int", budget: float | None = None, progress=None,
               proofs=None, induction: bool = True, independent: int = 2) -> LemmaResult:
    """Breadth-first BMC from the empty pool, depth by depth, every invariant (and the scope
    bound) at every depth, on one incremental unrolling (``unroll``/``extend``: symmetry,
    canonical garbage, and every invariant asserted at every state before the last: depths
    < d were clean when depth d is searched).

    An invariant whose 1-induction is proved at this scope with these contracts and
    invariants (``proofs``: ``prove_invariants``' rows for the very same scope, contracts and
    invariants; computed here when None) is *closed*: every state at depth d - 1 satisfies
    every invariant (the earlier depths were clean), so by its induction step it holds at
    depth d, for every d. It is asserted at every state of the unrolling and asked no
    query. The others are asked on the unrolling, one query per depth (can the last state
    break one of them?), depth by depth, so the first violation found is a shortest one; an
    invariant that is not inductive may still hold, and is then checked by the unrolling
    alone. With every invariant closed, every depth is done once the empty pool is checked.
    A clean result covers every run of up to ``depth`` operations. ``independent``: to this
    depth every invariant, closed or not, is asked of every run as well, a check of the
    induction's proofs that does not rest on them (depth 2 costs about 4 s at 4 slots x 8
    blocks, depth 3 about 110 s). ``induction=False``: no invariant is closed (the plain
    unrolling with lemmas, for comparison)."""
    t0 = time.perf_counter()
    res = LemmaResult(scope.describe(), 0, 0.0)

    def left_ms() -> int | None:
        return _ms_left(budget, t0)

    if proofs is None and induction:
        from .induction import prove_invariants

        proofs = prove_invariants(scope, contracts, invariants, timeout_ms=left_ms())
        res.induction_seconds = time.perf_counter() - t0
    u = unroll(scope, contracts, invariants, encoding)
    L = u.model.L
    invs = [*u.model.invariants, SCOPE_BOUND]
    proved = {p.property for p in proofs or () if induction and p.result == "proved"
              and p.scope == scope.describe()}
    closed = [inv for inv in invs if inv.name in proved]
    unclosed = [inv for inv in invs if inv.name not in proved]
    res.closed, res.unrolled = [i.name for i in closed], [i.name for i in unclosed]

    def ask(s, asked) -> z3.CheckSatResult:
        """Can state ``s`` break one of ``asked``? (One disjunction: measured faster than a
        query per invariant, 28 s against 42 s to depth 4 at 3 x 4 with none closed.)"""
        u.solver.push()
        u.solver.add(z3.Not(L.and_(*[inv.formula(L, s) for inv in asked])))
        effort.limit(u.solver, effort.units(effort.QUERY_UNITS), left_ms())
        r = effort.check(u.solver)
        if r == effort.SAT:
            m = u.solver.model()
            res.ops = trace_of(u, m)
            res.violated = next(inv.name for inv in asked if not z3.is_true(
                m.eval(inv.formula(L, s), model_completion=True)))
        u.solver.pop()
        return r

    for d in range(depth + 1):
        if d:
            if not unclosed and d > independent:  # every invariant closed: every depth is done
                res.depth = depth
                if progress is not None:
                    progress(depth, len(closed), len(invs))
                break
            if budget is not None and time.perf_counter() - t0 > budget:
                res.complete, res.undecided = False, effort.TIME
                break
            extend(u)
        s = u.states[-1]
        if d > independent:
            u.solver.add(*[inv.formula(L, s) for inv in closed])  # they hold at depth d
        r = ask(s, invs if d <= independent else unclosed)  # (the empty pool: every one)
        if r == effort.SAT:
            res.depth, res.seconds = d, time.perf_counter() - t0
            return res
        if r != effort.UNSAT:  # (the solver gave up: this depth is not proved)
            res.complete, res.undecided = False, r
            res.seconds = time.perf_counter() - t0
            return res
        if d <= independent:
            res.asked_all = d
        res.depth = d
        if progress is not None:
            progress(d, len(closed), len(invs))
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class Witness:
    name: str  # outcome class, or "A -> B" for a pair
    depth: int | None  # None: no witness found
    ops: list[Op] = field(default_factory=list)
    seconds: float = 0.0
    searched: bool = True  # False: the budget ran out before every depth was tried
    impossible: bool = False  # no witness, and Z3 shows none exists from any valid state here
    possible_at: str = ""  # (a class) a larger scope at which it can occur: not applicable here
    undecided: str = ""  # not searched: which limit stopped it (effort.TIME or effort.EFFORT)
    reached_at: int | None = None  # (no witness within the depth) a deeper one (``reach``)

    @property
    def not_applicable(self) -> bool:
        return self.impossible and bool(self.possible_at)


def grown(scope: SymScope) -> SymScope:
    """The scope made large enough for every outcome class: two blocks of two tokens, three
    sequence slots (a fork out of blocks needs two sequences holding the pool and a slot
    for the child), three blocks' worth of tokens, and enough that all sequences but one
    can hold the whole pool between them (a pool of 8 blocks with 3 slots of at most 3
    blocks each never runs out on a fork); never smaller than ``scope``."""
    bs = max(scope.block_size, 2)
    blocks, seqs = max(scope.num_blocks, 2), max(scope.seqs, 3)
    fill = -(-blocks // (seqs - 1)) * bs  # tokens per sequence for seqs - 1 to fill the pool
    return SymScope(blocks, bs, seqs, max(scope.max_tokens, 3 * bs, fill))


def possible(scope: SymScope, goals: list[tuple[str, tuple[str, ...]]], contracts=None,
             invariants=None, encoding: str = "int", budget: float | None = None,
             allowance: int | None = None) -> dict[str, bool | None]:
    """Whether each goal (a label and its classes: one, or an ordered pair) can occur at all
    at ``scope``: from some state satisfying every invariant, reachable or not, steps allowed
    by the contracts whose classes are those. False: Z3 shows it cannot (unsat); None:
    undecided (its effort, the resource units of ``allowance`` for them all, or the
    wall-clock ``budget`` ran out). Nothing is pruned (no symmetry, no canonical garbage):
    "cannot" is only ever said of the whole step relation."""
    t0 = time.perf_counter()
    model = Model(scope, contracts, invariants, encoding=encoding)
    solver = z3.Solver()
    s0 = model.state("v0")
    solver.add(model.invariant(s0))
    u = Unrolling(model, [s0], [], solver)
    out: dict[str, bool | None] = {}
    for d in range(1, max([len(c) for _, c in goals] or [0]) + 1):
        s, s2 = u.states[-1], model.state(f"v{d}")
        step, choices = model.step(s, s2, f"vk{d}")
        solver.add(step)
        u.states.append(s2)
        u.choices.append(choices)
        for label, classes in goals:
            if len(classes) != d:
                continue
            if (budget is not None and time.perf_counter() - t0 > budget) or (
                    allowance is not None and allowance <= 0):
                out[label] = None
                continue
            solver.push()
            for k, name in enumerate(classes):
                solver.add(_class_at(u, k + 1, name))
            units = effort.units(effort.QUERY_UNITS)
            effort.limit(solver, units if allowance is None else min(units, allowance),
                         _ms_left(budget, t0))
            before = effort.used()
            r = effort.check(solver)
            if allowance is not None:
                allowance -= effort.used() - before
            out[label] = True if r == effort.SAT else False if r == effort.UNSAT else None
            solver.pop()
    return out


def _class_at(u: Unrolling, step: int, name: str):
    """The last step ``step`` (1-based) is of outcome class ``name``."""
    kind, outcome, pred = OUTCOMES[name]
    L = u.model.L
    pre, post = u.states[step - 1], u.states[step]
    return L.or_(*[L.and_(c.selector, pred(L, pre, post, c.op)) for c in u.choices[step - 1]
                   if c.op.kind == kind and c.op.outcome == outcome])


PAIR_UNITS = 100_000_000
"""The ordered pairs' allowance, in all, at ``--effort 1`` (Z3 resource units; with the
queries' own overhead, about 30 s of an idle core at 3 slots x 6 blocks x 2, depth 5).
Each class gets its own query's units whatever the pairs used; a pair asked once the
allowance is spent is not searched (``Witness.undecided``: ``EFFORT``), the same on
every machine."""


def witnesses(scope: SymScope, depth: int, pairs: bool = False, contracts=None,
              encoding: str = "int", budget: float | None = None,
              progress=None) -> list[Witness]:
    """Shortest witness of every outcome class (and, with ``pairs``, of every ordered pair);
    ``progress(depth, found, goals)`` is told as the search goes. Each query is bounded in
    Z3's resource units (``effort``); ``budget`` (seconds) is only the outer limit, and a
    goal it leaves unasked says so (``undecided``: ``effort.TIME``)."""
    t0 = time.perf_counter()
    u = unroll(scope, contracts, None, encoding)
    names = list(OUTCOMES)
    goals = [(n, (n,)) for n in names]
    if pairs:
        goals += [(f"{a} -> {b}", (a, b)) for a in names for b in names]
    found: dict[str, Witness] = {}
    undecided: dict[str, str] = {}  # goals with a depth not (fully) tried, and why
    pair_units = effort.units(PAIR_UNITS)
    for d in range(1, depth + 1):
        if len(found) == len(goals):
            break
        extend(u, lemmas=False)
        for label, classes in goals:
            if progress is not None:
                progress(d, len(found), len(goals))
            if label in found or len(classes) > d:
                continue
            if budget is not None and time.perf_counter() - t0 > budget:
                undecided[label] = effort.TIME
                continue
            pair = len(classes) > 1
            if pair and pair_units <= 0:
                undecided[label] = effort.EFFORT
                continue
            g0 = time.perf_counter()
            u.solver.push()
            for k, name in enumerate(reversed(classes)):
                u.solver.add(_class_at(u, d - k, name))
            units = effort.units(effort.QUERY_UNITS)
            before = effort.used() if pair else 0
            effort.limit(u.solver, min(units, pair_units) if pair else units,
                         _ms_left(budget, t0))
            r = effort.check(u.solver)
            if pair:
                pair_units -= effort.used() - before
            if r == effort.SAT:
                found[label] = Witness(label, d, trace_of(u, u.solver.model()),
                                       time.perf_counter() - g0)
            elif r != effort.UNSAT:
                undecided[label] = r
            u.solver.pop()
    out = [found.get(label, Witness(label, None, searched=label not in undecided,
                                    undecided=undecided.get(label, "")))
           for label, _ in goals]
    _applicability(scope, goals, out, contracts, encoding,
                   None if budget is None else max(0.001, budget - (time.perf_counter() - t0)),
                   max(0, pair_units))
    return out


def reach(scope: SymScope, names: list[str], depth: int, deepest: int, contracts=None,
          encoding: str = "int", budget: float | None = None) -> dict[str, int]:
    """The shortest depth in ``depth + 1 .. deepest`` of a run whose last step is of each
    class in ``names`` (classes without a witness within ``depth``); a class not reached
    there (or left undecided by its effort or ``budget``) is absent."""
    t0 = time.perf_counter()
    u = unroll(scope, contracts, None, encoding)
    out: dict[str, int] = {}
    for d in range(1, deepest + 1):
        extend(u, lemmas=False)
        if d <= depth:
            continue
        for name in names:
            if name in out or (budget is not None and time.perf_counter() - t0 > budget):
                continue
            u.solver.push()
            u.solver.add(_class_at(u, d, name))
            effort.limit(u.solver, effort.units(effort.QUERY_UNITS), _ms_left(budget, t0))
            if effort.check(u.solver) == effort.SAT:
                out[name] = d
            u.solver.pop()
        if len(out) == len(names):
            break
    return out


def _applicability(scope, goals, ws: list[Witness], contracts, encoding, budget,
                   pair_units: int | None = None) -> None:
    """Mark the goals without a witness that cannot occur from any valid state at ``scope``,
    and for classes say whether they can at ``grown(scope)`` (then: not applicable here).
    A pair is asked only when its search ran to the depth (one the search left unasked stays
    so), within what is left of the pairs' allowance (``pair_units``)."""
    t0 = time.perf_counter()
    missing = {w.name for w in ws if not w.depth}
    if not missing:
        return
    searched = {w.name for w in ws if w.searched}
    classes = dict(goals)
    singles = [(n, c) for n, c in goals if n in missing and len(c) == 1]
    here = possible(scope, singles, contracts, encoding=encoding, budget=budget)
    cannot = {classes[n][0] for n, ok in here.items() if ok is False}
    # a pair with a class that cannot occur cannot either; ask Z3 about the others
    pairs = [(n, c) for n, c in goals if n in missing and n in searched and len(c) == 2
             and not set(c) & cannot]
    left = None if budget is None else max(0.001, budget - (time.perf_counter() - t0))
    here.update(possible(scope, pairs, contracts, encoding=encoding, budget=left,
                         allowance=pair_units))
    bigger = grown(scope)
    larger = {}
    if cannot and bigger != scope:
        left = None if budget is None else max(0.001, budget - (time.perf_counter() - t0))
        larger = possible(bigger, [(n, c) for n, c in singles if c[0] in cannot], contracts,
                          encoding=encoding, budget=left)
    for w in ws:
        if w.name not in missing:
            continue
        w.impossible = here.get(w.name) is False or bool(set(classes[w.name]) & cannot)
        if w.impossible and len(classes[w.name]) == 1 and larger.get(w.name) is True:
            w.possible_at = bigger.describe()


# -- breadth-first BMC ------------------------------------------------------------------
def _state_vars(s) -> list:
    out = [*s._ref, *s._free, *s._live, *s._len, *s._nb]
    for row in s._tab:
        out += row
    return out + [*s._res]


def _value(x) -> int | bool:
    return bool(z3.is_true(x)) if z3.is_bool(x) else x.as_long()


def _abstract_key(vals: list, scope: SymScope) -> tuple:
    """A state's values with blocks and slots renamed canonically (equal keys: isomorphic)."""
    N, S = scope.num_blocks, scope.seqs
    ref, free, live, length, nb, tab, res = _unpack(vals, scope)
    rows, label = canonical_tables({q: ((length[q], res[q]), tab[q][:nb[q]]) for q in range(S)
                                    if live[q]}, ref.__getitem__)
    named = tuple(sorted((label[b], ref[b], free[b]) for b in label))
    rest = tuple(sorted((ref[b], free[b]) for b in range(N) if b not in label))
    return rows, named, rest


@dataclass
class ReachResult:
    scope: str
    depth: int  # deepest level completed
    seconds: float
    states: int = 0  # distinct states up to renaming
    transitions: int = 0
    violated: str | None = None
    ops: list[Op] = field(default_factory=list)
    complete: bool = True
    per_depth: list[int] = field(default_factory=list)  # new distinct states at each depth


def _unpack(vals: list, scope: SymScope):
    """A state's values (in ``_state_vars`` order): ref, free, live, length, nb, tables, reserved."""
    N, S, T = scope.num_blocks, scope.seqs, scope.table_slots
    ref, free = vals[:N], vals[N:2 * N]
    live, length = vals[2 * N:2 * N + S], vals[2 * N + S:2 * N + 2 * S]
    nb = vals[2 * N + 2 * S:2 * N + 3 * S]
    tab = [vals[2 * N + 3 * S + q * T:2 * N + 3 * S + (q + 1) * T] for q in range(S)]
    res = vals[2 * N + 3 * S + S * T:2 * N + 4 * S + S * T]
    return ref, free, live, length, nb, tab, res


def _fresh_blocks(vals: list, scope: SymScope) -> tuple[int, ...]:
    """The blocks a concrete state holds as the empty pool does: refcount 0, on the free list
    once, named by no live table entry. Any permutation of them leaves the state as it is."""
    ref, free, live, _, nb, tab, _ = _unpack(vals, scope)
    named = {tab[q][i] for q in range(scope.seqs) if live[q] for i in range(nb[q])}
    return tuple(b for b in range(scope.num_blocks)
                 if ref[b] == 0 and free[b] == 1 and b not in named)


def _fresh_order(s2, fresh: tuple[int, ...]) -> list:
    """Symmetry breaking among the fresh blocks of the state before: a permutation of them
    maps every successor to a successor (the contracts name no block), so it suffices that
    the fresh blocks a successor uses (changed, or named by a live table entry) are the
    lowest ones, in order of first appearance along the tables (slot by slot, position by
    position), those no table names last. Every successor has exactly one such renaming
    up to the order among the unnamed ones."""
    entries = [(q, i) for q in s2.seqs() for i in s2.positions(q)]

    def names(q, i, b):
        return z3.And(s2.live(q), i < s2.nblocks(q), s2._tab[q][i] == b)

    def used(b):
        return z3.Or(s2._ref[b] != 0, s2._free[b] != 1, *[names(q, i, b) for q, i in entries])

    out = []
    for a, b in pairwise(fresh):
        out.append(z3.Implies(used(b), used(a)))
        seen = z3.BoolVal(False)
        for q, i in entries:
            seen = z3.Or(seen, names(q, i, a))
            out.append(z3.Implies(names(q, i, b), seen))
    return out


class _Raw:
    """The enumeration's inner loop through Z3's C API: substituting a state's values into a
    formula, reading a model's values, blocking a valuation. (The Python API's argument
    checks cost several times the queries here.) Every term handed to Z3 is held by an
    ``ExprRef``, so reference counting stays Z3's."""

    def __init__(self, vs: list, vs2: list):
        from z3 import z3core

        self.C, self.ctx = z3core, z3.main_ctx()
        self.ref = self.ctx.ref()
        self.vs2, self.n = vs2, len(vs)
        self.frm = (z3.Ast * len(vs))(*[v.as_ast() for v in vs])
        self.frm2 = (z3.Ast * len(vs2))(*[v.as_ast() for v in vs2])
        self.bools = [z3.is_bool(v) for v in vs2]
        self.consts: dict = {}
        self.ne: dict = {}

    def const(self, x):
        key = (type(x), x)
        if key not in self.consts:
            self.consts[key] = z3.BoolVal(x) if isinstance(x, bool) else z3.IntVal(x)
        return self.consts[key]

    def values(self, vals: list):
        """A C array of the constants for ``vals`` (kept alive by the cache)."""
        return (z3.Ast * len(vals))(*[self.const(x).as_ast() for x in vals])

    def subst(self, f, frm, to):
        """``f`` with ``frm`` replaced by ``to``, simplified."""
        t = z3.BoolRef(self.C.Z3_substitute(self.ref, f.as_ast(), len(to), frm, to), self.ctx)
        return z3.BoolRef(self.C.Z3_simplify(self.ref, t.as_ast()), self.ctx)

    def truth(self, f) -> int:
        """1 (true), -1 (false) or 0 (neither) for a simplified formula."""
        return self.C.Z3_get_bool_value(self.ref, f.as_ast())

    def read(self, model) -> list:
        """The values ``model`` gives the successor's variables (completed)."""
        import ctypes

        out, r, num = [], (z3.Ast * 1)(), ctypes.c_int64()
        for v, is_b in zip(self.vs2, self.bools, strict=True):
            if not self.C.Z3_model_eval(self.ref, model.model, v.as_ast(), True, r):
                raise RuntimeError("Z3 could not evaluate a model")
            if is_b:
                out.append(self.C.Z3_get_bool_value(self.ref, r[0]) == 1)
            else:
                self.C.Z3_get_numeral_int64(self.ref, r[0], ctypes.byref(num))
                out.append(num.value)
        return out

    def block(self, solver, vals: list) -> None:
        """Exclude the successor valuation ``vals`` from ``solver``."""
        terms = []
        for i, x in enumerate(vals):
            key = (i, type(x), x)
            if key not in self.ne:
                self.ne[key] = z3.Not(self.vs2[i] == self.const(x))
            terms.append(self.ne[key].as_ast())
        arr = (z3.Ast * len(terms))(*terms)
        solver.add(z3.BoolRef(self.C.Z3_mk_or(self.ref, len(terms), arr), self.ctx))


def bmc_bfs(scope: SymScope, depth: int, contracts=None, invariants=None, encoding: str = "int",
            budget: float | None = None, progress=None, enumeration: str = "choice",
            record=None) -> ReachResult:
    """BMC as breadth-first reachability: Z3 enumerates every successor the contracts allow
    (modulo the symmetry breaking and canonical garbage above), states equal up to renaming
    of blocks and slots are expanded once, and each new one is checked against the
    invariants (a successor equal to one seen is equal to one checked). BFS order makes the
    first violation a shortest one; a clean run covers every run of at most ``depth``
    operations from the empty pool. ``progress(depth, states, transitions)`` is told of each
    state expanded; ``record``, a list, gets ``(depth, values)`` of every new state.

    Enumeration (``"choice"``): per frontier state and per disjunct of the step relation,
    the state's values are substituted into that disjunct alone (its precondition, scope
    bound and clauses) and the result simplified: a disjunct whose precondition the state
    refutes is gone without a query, and the others are small queries over the successor's
    variables, enumerated by blocking clauses on them. Fresh blocks are taken in a canonical
    order (``_fresh_order``: this covers every operation that takes blocks, allocation,
    appends, eager forks and rebases), new sequences take the lowest dead slot, and states
    are compared by ``exact_key`` (equal exactly when equal up to renaming).
    ``"step"``: the first enumeration (one query over the whole step relation per state,
    with the symmetry breaking of allocate and append_slot only), kept to compare."""
    if enumeration == "step":
        return _bmc_bfs_step(scope, depth, contracts, invariants, encoding, budget, progress,
                             record)
    if enumeration != "choice":
        raise ValueError(f"enumeration must be 'choice' or 'step', not {enumeration!r}")
    t0 = time.perf_counter()
    m = Model(scope, contracts, invariants, encoding=encoding)
    s, s2 = m.state("s"), m.state("s2")
    vs, vs2 = _state_vars(s), _state_vars(s2)
    bodies = []
    for c, pre, body in m.choice_bodies(s, s2, "x"):
        f = z3.And(body, *_lowest_slot(s, [c]))
        bodies.append((c, pre, z3.substitute(f, (c.selector, z3.BoolVal(True)))))
    invs = [*m.invariants, SCOPE_BOUND]
    inv_of = [(inv.name, inv.formula(m.L, s2)) for inv in invs]
    inv2 = m.L.and_(*[f for _, f in inv_of])
    solver = z3.Solver()
    solver.add(*_canonical(s2))
    start = z3.Solver()
    start.add(m.init(s), *_canonical(s))
    start.check()
    first = [_value(start.model().eval(v, model_completion=True)) for v in vs]
    raw = _Raw(vs, vs2)
    res = ReachResult(scope.describe(), 0, 0.0, states=1, per_depth=[1])
    seen = {exact_key(first, scope)}
    if record is not None:
        record.append((0, first))
    frontier = [(first, [])]
    order_cache: dict[tuple, list] = {}

    def out_of_time() -> bool:
        if budget is not None and time.perf_counter() - t0 > budget:
            res.complete = False
            res.seconds = time.perf_counter() - t0
            return True
        return False

    for d in range(1, depth + 1):
        nxt = []
        for vals, path in frontier:
            if progress is not None:
                progress(d, res.states, res.transitions)
            if out_of_time():
                return res
            to = raw.values(vals)
            fresh = _fresh_blocks(vals, scope)
            if fresh not in order_cache:
                order_cache[fresh] = _fresh_order(s2, fresh)
            solver.push()
            solver.add(*order_cache[fresh])
            # the disjuncts the state does not refute (-1: simplified to false), the
            # precondition tried alone first (a much smaller term)
            live = [(c, g) for c, pre, body in bodies
                    if raw.truth(raw.subst(pre, raw.frm, to)) != -1
                    and raw.truth(g := raw.subst(body, raw.frm, to)) != -1]
            for c, g in live:  # (one query per disjunct: measured faster than one per state)
                if out_of_time():
                    return res
                solver.push()
                solver.add(g)
                while (r := solver.check()) == z3.sat:
                    model = solver.model()
                    res.transitions += 1
                    after = raw.read(model)
                    raw.block(solver, after)
                    try:
                        k = exact_key(after, scope)
                    except IndexError:  # a block id outside the pool: the invariants say so
                        k = tuple(after)
                    if k in seen:
                        continue
                    to2 = raw.values(after)
                    if raw.truth(raw.subst(inv2, raw.frm2, to2)) != 1:
                        res.ops = [*path, decode_choice(model, c)]
                        res.violated = next(name for name, f in inv_of
                                            if raw.truth(raw.subst(f, raw.frm2, to2)) != 1)
                        res.depth, res.seconds = d, time.perf_counter() - t0
                        return res
                    seen.add(k)
                    res.states += 1
                    if record is not None:
                        record.append((d, after))
                    nxt.append((after, [*path, decode_choice(model, c)]))
                solver.pop()
                if r != z3.unsat:  # (the solver gave up: nothing here is proved)
                    res.complete = False
                    res.seconds = time.perf_counter() - t0
                    return res
            solver.pop()
        res.depth = d
        res.per_depth.append(len(nxt))
        frontier = nxt
        if not frontier:
            break
    res.seconds = time.perf_counter() - t0
    return res


def _bmc_bfs_step(scope: SymScope, depth: int, contracts=None, invariants=None,
                  encoding: str = "int", budget: float | None = None, progress=None,
                  record=None) -> ReachResult:
    """The first breadth-first enumeration (``bmc_bfs(..., enumeration="step")``): one query
    over the whole step relation per frontier state, each successor blocked by its exact
    valuation. Kept to compare with (tests/proofs, benchmarks/proofs.py)."""
    t0 = time.perf_counter()
    m = Model(scope, contracts, invariants, encoding=encoding)
    s, s2 = m.state("s"), m.state("s2")
    step, choices = m.step(s, s2, "x")
    solver = z3.Solver()
    solver.add(step, *_canonical(s2), *_lowest_free(m, s, s2, choices), *_lowest_slot(s, choices))
    invs = [*m.invariants, SCOPE_BOUND]
    inv2 = m.L.and_(*[inv.formula(m.L, s2) for inv in invs])
    vs, vs2 = _state_vars(s), _state_vars(s2)
    start = z3.Solver()
    start.add(m.init(s), *_canonical(s))
    start.check()
    first = [start.model().eval(v, model_completion=True) for v in vs]
    res = ReachResult(scope.describe(), 0, 0.0, states=1, per_depth=[1])
    seen = {_abstract_key([_value(x) for x in first], scope)}
    if record is not None:
        record.append((0, [_value(x) for x in first]))
    frontier = [(first, [])]
    for d in range(1, depth + 1):
        nxt = []
        for vals, path in frontier:
            if progress is not None:
                progress(d, res.states, res.transitions)
            if budget is not None and time.perf_counter() - t0 > budget:
                res.complete = False
                res.seconds = time.perf_counter() - t0
                return res
            solver.push()
            solver.add(*[a == b for a, b in zip(vs, vals, strict=True)])
            while solver.check() == z3.sat:
                model = solver.model()
                res.transitions += 1
                after = [model.eval(v, model_completion=True) for v in vs2]
                if z3.is_false(model.eval(inv2, model_completion=True)):
                    res.ops = [*path, decode(model, choices)]
                    res.violated = next(inv.name for inv in invs if z3.is_false(
                        model.eval(inv.formula(m.L, s2), model_completion=True)))
                    res.depth, res.seconds = d, time.perf_counter() - t0
                    solver.pop()
                    return res
                solver.add(z3.Or([a != b for a, b in zip(vs2, after, strict=True)]))
                k = _abstract_key([_value(x) for x in after], scope)
                if k not in seen:
                    seen.add(k)
                    res.states += 1
                    if record is not None:
                        record.append((d, [_value(x) for x in after]))
                    nxt.append((after, [*path, decode(model, choices)]))
            solver.pop()
        res.depth = d
        res.per_depth.append(len(nxt))
        frontier = nxt
        if not frontier:
            break
    res.seconds = time.perf_counter() - t0
    return res


def exact_key(vals: list, scope: SymScope) -> tuple:
    """A complete canonical form of a state's values: two states have equal exact keys iff
    they are equal up to renaming of blocks and slots. Live slots are sorted by a
    renaming-invariant signature (length, reservation, the refcounts along the table);
    among slots of equal signature every order is tried, and the least key wins (blocks
    numbered by first appearance along the tables in that order, the others as a
    multiset). Raises IndexError on a block id outside the pool."""
    ref, free, live, length, nb, tab, res = _unpack(vals, scope)
    N = scope.num_blocks
    sig = {q: (length[q], res[q], tuple(-1 if b == NULL else ref[b] for b in tab[q][:nb[q]]))
           for q in range(scope.seqs) if live[q]}
    groups: dict[tuple, list[int]] = {}
    for q in sorted(sig, key=sig.__getitem__):
        groups.setdefault(sig[q], []).append(q)
    best = None
    for parts in product(*[permutations(g) for g in groups.values()]):
        label: dict[int, int] = {}
        rows = []
        for q in (q for part in parts for q in part):
            if any(not (0 <= b < N or b == NULL) for b in tab[q][:nb[q]]):
                raise IndexError("a block id outside the pool")
            rows.append((length[q], res[q], tuple(
                b if b == NULL else label.setdefault(b, len(label)) for b in tab[q][:nb[q]])))
        named = tuple(sorted((label[b], ref[b], free[b]) for b in label))
        rest = tuple(sorted((ref[b], free[b]) for b in range(N) if b not in label))
        key = (tuple(rows), named, rest)
        best = key if best is None or key < best else best
    return best
