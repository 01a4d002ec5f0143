"""k-induction (k = 1) over the spec's transition system.

For each invariant I and each operation kind: if every invariant (and the
scope bound) holds in a state s and s -> s2 is a step of that kind allowed by
its contract, then I holds in s2. With the base case (the empty pool
satisfies every invariant) this proves I for every reachable state, at any
depth, within the scope. The invariants are proved together, each an
auxiliary of the others, and each is itself proved.

Symmetry keeps this fast and independent of the pool size: the spec never
names a particular block or sequence slot, so
  * the operation may act on slot 0 (and fork into slot 1);
  * a per-block invariant need only be shown for block 0, assuming the
    per-block invariants of block 0 alone (any block is "block 0" after a
    renaming); every other hypothesis is kept whole;
  * global invariants are then shown from the per-block ones, which hold for
    every block of s2 (lemmas proved in the previous step).

The step invariant *isolation* is proved as a consequence: with its clause
removed from append_slot's contract, the remaining clauses and the state
invariants imply that the block written is held by the writer alone.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass

import z3

from kvcheck.spec import contracts as spec_contracts
from kvcheck.spec.symbolic import SymScope

from . import effort
from .model import SCOPE_BOUND, Model


@dataclass
class Proof:
    engine: str
    property: str
    scope: str
    result: str  # "proved" | "violated" | "unknown"
    seconds: float
    detail: str = ""
    counterexample: object = None
    undecided: str = ""  # "unknown": which limit stopped it (effort.TIME or effort.EFFORT)


ENGINE = "z3 k-induction"


def _verdict(r) -> str:
    """A proof's result for a query's answer (a Z3 result or its name)."""
    if str(r) == "unsat":
        return "proved"
    return "violated" if str(r) == "sat" else "unknown"


def _solve(parts, timeout_ms, rlimit: int):
    """The query's answer (``effort.check``) within ``rlimit`` of Z3's resource units (work
    done, not time: the same on a busy machine) and, as the outer limit, ``timeout_ms``
    (None: no limit)."""
    solver = z3.Solver()
    effort.limit(solver, rlimit, timeout_ms)
    solver.add(*parts)
    return effort.check(solver)


class _Encoding:
    """One encoding of the whole induction problem (states, hypotheses, steps)."""

    def __init__(self, scope, contracts, invariants, encoding, kinds_wanted):
        self.model = model = Model(scope, contracts, invariants, encoding=encoding)
        self.L = L = model.L
        self.s, self.s2 = s, s2 = model.state("s"), model.state("s2")
        every = [*model.invariants, SCOPE_BOUND]
        self.blocks = [i for i in every if i.domain == "block"]
        self.others = [i for i in every if i.domain == "seq"]
        self.globals = [i for i in every if i.domain == "global"]
        self.hyp = [inv.formula(L, s) for inv in self.others + self.globals]
        self.hyp += [inv.holds_for(L, s, FOCUS) for inv in self.blocks]
        self.kinds = [k for k in kinds_wanted if k in model.contracts]
        self.steps, self.choices = {}, {}
        for k in self.kinds:
            self.steps[k], self.choices[k] = model.step(s, s2, f"t.{k}", kinds=(k,), symmetric=True)

    def cases(self, kind: str):
        """The step of ``kind`` split by outcome: (outcome, the step with that disjunct
        selected). The step relation requires some disjunct, so a property holding in
        every case holds for the kind; one query per outcome is far easier for Z3 than
        the disjunction (refcount_conservation x rebase: ~0.4 s per case, over 8 s whole)."""
        return [(c.op.outcome, z3.And(self.steps[kind], c.selector)) for c in self.choices[kind]]


FOCUS = 0  # by symmetry, "any block"
# Each encoding gets a short slice, then longer ones, then the whole budget: which
# encoding is fast differs per query by orders of magnitude (free_list x allocate: 0.03 s
# with integers, over 60 s with bit-vectors; refcount_conservation x append_slot the other
# way round), so the short slice bounds what a wrong first guess costs. The slices are
# Z3 resource units, not milliseconds, so that a loaded machine (or a worker beside
# another) does not cut a query short that an idle one answers: on this project's 2-core
# machine about 0.2-0.3 s, 0.7-1 s and 2-3 s of an idle core.
PORTFOLIO_SLICES_RLIMIT = (1_500_000, 5_000_000, 15_000_000)


_PREFERRED: dict = {}  # query key -> the encoding that answered it last


class _SharedChoices:
    """``_PREFERRED`` for a fixed set of keys, in memory the forked workers share (one
    byte per key: 0 none yet, else 1 + the encoding's index), so that what one worker
    learns the others use next, as one process asking them all in turn would."""

    def __init__(self, keys, encodings: tuple):
        self.index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        self.encodings = encodings
        self.memory = mmap.mmap(-1, max(1, len(self.index)))

    def get(self, key):
        i = self.index.get(key)
        v = self.memory[i] if i is not None else 0
        return self.encodings[v - 1] if v else None

    def __setitem__(self, key, encoding) -> None:
        i = self.index.get(key)
        if i is not None:
            self.memory[i] = 1 + self.encodings.index(encoding)


def _portfolio(encodings, build, timeout_ms, key=None, preferred=None) -> str:
    """Try the query in each encoding for each slice in turn, the last slice the query's
    whole allowance (``effort.QUERY_UNITS`` at the run's effort): ``effort.SAT``, ``UNSAT``,
    ``EFFORT`` (no encoding decided it within its units) or ``TIME`` (``timeout_ms``, the
    outer wall-clock limit, stopped it).

    The encoding that last answered a query of the same ``key`` goes first (as
    ``preferred`` remembers it: default, this process's ``_PREFERRED``): that changes how
    long an answer takes, never the answer, since every encoding gets every slice.
    """
    if preferred is None:
        preferred = _PREFERRED
    first = preferred.get(key)
    if first is not None:
        encodings = sorted(encodings, key=lambda e: e.model.encoding != first)
    r = effort.EFFORT
    for units in (*PORTFOLIO_SLICES_RLIMIT, effort.units(effort.QUERY_UNITS)):  # in order
        for enc in encodings:
            r = _solve(build(enc), timeout_ms, units)
            if effort.decided(r):
                preferred[key] = enc.model.encoding
                return r
            if r == effort.TIME:
                return r
    return r


KINDS = tuple(spec_contracts.CONTRACTS)  # every operation the spec has a contract for


class _Queries:
    """Every query of the induction, named by a task tuple (so that a forked worker, which
    has the encodings in memory, can rebuild it): ``verdict(task)`` is "sat", "unsat" or
    "unknown".

    * ``("base",)``: the empty pool breaks an invariant;
    * ``("step", group, i, kind, j)``: invariant ``i`` of ``group`` ("others": per
      sequence and global ones; "blocks": per block, for block FOCUS) broken by the ``j``-th
      outcome of ``kind`` from a state satisfying every invariant;
    * ``("global", i)``: global invariant ``i`` broken where every per-block one holds;
    * ``("isolation",)``: append_slot writing a block another holds."""

    def __init__(self, encs, scope, contracts, invariants, timeout_ms):
        self.encs, self.scope, self.timeout_ms = encs, scope, timeout_ms
        self.contracts, self.invariants = contracts, invariants
        e = encs[0]
        self.preferred = _SharedChoices([None, "isolation", *(i.name for i in e.others + e.blocks)],
                                        tuple(x.model.encoding for x in encs))

    def verdict(self, task: tuple) -> str:
        what = task[0]
        if what == "base":
            build, key = (lambda e: [e.model.init(e.s), z3.Not(e.model.invariant(e.s))]), None
        elif what == "step":
            _, group, i, kind, j = task
            build, key = (lambda e: [*e.hyp, e.cases(kind)[j][1], z3.Not(_goal(e, group, i))],
                          getattr(self.encs[0], group)[i].name)  # an invariant's queries
            # tend to favour one encoding
        elif what == "global":
            i = task[1]
            build, key = (lambda e: [*(b.formula(e.L, e.s2) for b in e.blocks),
                                     z3.Not(e.globals[i].formula(e.L, e.s2))]), None
        else:
            build, key = self._isolation, "isolation"
        return _portfolio(self.encs, build, self.timeout_ms, key, self.preferred)

    def _isolation(self, e):
        bare = Model(self.scope, self.contracts, self.invariants, omit_clauses=("isolation",),
                     encoding=e.model.encoding)
        bare.L = e.L
        step, choices = bare.step(e.s, e.s2, "iso", kinds=("append_slot",), symmetric=True)
        claims = []
        for c in choices:
            if c.op.outcome == "ok":
                (_, _, f), = spec_contracts.isolation(e.L, e.s, e.s2, c.op)
                claims.append(z3.Implies(z3.And(c.selector, c.op.block == FOCUS), f))
        return [*e.hyp, step, z3.Not(z3.And(claims))]


def _goal(e, group: str, i: int):
    """Invariant ``i`` of ``group`` in the step's after-state ``e.s2``."""
    if group == "others":
        return e.others[i].formula(e.L, e.s2)
    return e.blocks[i].holds_for(e.L, e.s2, FOCUS)


def prove_invariants(scope: SymScope, contracts=None, invariants=None,
                     timeout_ms: int | None = 60_000, encoding: str = "auto",
                     progress=None, workers: int | None = None) -> list[Proof]:
    """Every invariant, per operation kind. ``encoding``: "bv", "int" or "auto"
    (a portfolio: each query is tried in both, integers first: over every step query at 4
    slots x 16 blocks, 7.3 s with integers alone against 10.3 s with bit-vectors, and at 3 x 6
    the rows take 1.7 s instead of 3.1 s). ``progress(name)`` is
    told of each property as its proof starts. ``workers``: processes answering one
    property's queries at once (``kvcheck.proofs.parallel``; default: one per core, 1:
    this process alone); the verdicts do not depend on it."""
    from .parallel import Workers

    tell = progress or (lambda name: None)
    names = ("int", "bv") if encoding == "auto" else (encoding,)
    encs = [_Encoding(scope, contracts, invariants, e, KINDS) for e in names]
    first = encs[0]
    kinds = first.kinds
    out: list[Proof] = []
    queries = _Queries(encs, scope, contracts, invariants, timeout_ms)
    with Workers(queries.verdict, workers) as pool:
        t0 = time.perf_counter()
        base, = pool.map([("base",)])
        out.append(_proof("base case: the empty pool satisfies every invariant", scope,
                          _verdict(base), time.perf_counter() - t0, "", [base]))

        def per_kind(group: str, i: int) -> None:
            name = getattr(first, group)[i].name
            tell(name)
            t0 = time.perf_counter()
            tasks = [("step", group, i, kind, j) for kind in kinds
                     for j in range(len(first.cases(kind)))]
            results = dict.fromkeys(kinds, ())
            for task, r in zip(tasks, pool.map(tasks), strict=True):
                results[task[3]] += (r,)
            failing = [k for k in kinds if "sat" in results[k]]
            unknown = [k for k in kinds if k not in failing
                       and any(r != "unsat" for r in results[k])]
            result = "violated" if failing else ("unknown" if unknown else "proved")
            detail = (f"not preserved by {', '.join(failing)}" if failing else
                      f"undecided for {', '.join(unknown)}" if unknown else
                      f"preserved by {', '.join(kinds)}")
            out.append(_proof(name, scope, result, time.perf_counter() - t0, detail,
                              [r for k in unknown for r in results[k]]))

        for i in range(len(first.others)):
            per_kind("others", i)
        for i in range(len(first.blocks)):
            per_kind("blocks", i)

        # global invariants from the per-block lemmas on s2
        block_names = {i.name for i in first.blocks}
        proved_blocks = all(p.result == "proved" for p in out if p.property in block_names)
        for i, inv in enumerate(first.globals):
            tell(inv.name)
            t0 = time.perf_counter()
            r, = pool.map([("global", i)])
            result = _verdict(r) if proved_blocks or r != "unsat" else "unknown"
            out.append(_proof(inv.name, scope, result, time.perf_counter() - t0,
                              "follows from the per-block invariants",
                              [r] + [p.undecided for p in out if p.property in block_names]))

        if "append_slot" in kinds:
            tell("isolation")
            t0 = time.perf_counter()
            r, = pool.map([("isolation",)])
            out.append(_proof("isolation", scope, _verdict(r), time.perf_counter() - t0,
                              "implied by append_slot's copy-on-write and boundary clauses", [r]))
    return out


def _proof(name: str, scope, result: str, seconds: float, detail: str, answers,
           engine: str = ENGINE) -> Proof:
    """A row; an undecided one says which limit stopped it and what decides it."""
    why = effort.undecided_by(a for a in answers if a) if result == "unknown" else ""
    if why:
        detail = f"{detail}; {effort.hint(why)}" if detail else effort.hint(why)
    where = scope if isinstance(scope, str) else scope.describe()
    return Proof(engine, name, where, result, seconds, detail, undecided=why)


def cyclic_contracts(window_blocks: int, kinds=None) -> dict:
    """The contracts of ``kinds`` (default: every one) under a cyclic sliding window of
    ``window_blocks`` blocks: each operation carries ``Op.cycle``, as the oracle stamps it
    for a target declaring ``cyclic_window`` (allocate takes at most W blocks, an append
    past the window is the drop behind it, then the append: ``spec.contracts.cyclic_pre``,
    symbolically ``SymState.dropped``). For ``prove_invariants(contracts=...)``."""
    def under(fn):
        def contract(L, pre, post, op, dom):
            op.cycle = window_blocks
            return fn(L, pre, post, op, dom)

        contract.__doc__ = fn.__doc__
        return contract

    return {k: under(fn) for k, fn in spec_contracts.CONTRACTS.items()
            if kinds is None or k in kinds}
