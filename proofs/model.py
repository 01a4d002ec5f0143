"""The spec as a symbolic transition system, for Z3.

Nothing here restates the spec: the initial state is "every block free, no
sequence", and one step is the disjunction, over every operation on every
sequence slot and every outcome, of its precondition and its contract
(``kvcheck.spec.contracts``) relating two ``SymState``s. Each disjunct has a
selector variable, so a model names the operation taken.

The scope bounds lengths (``max_tokens``): the model does not append to a
sequence that already holds that many tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from kvcheck.spec import contracts as spec_contracts
from kvcheck.spec.contracts import OK, OOB, REFUSED, Domain, Op
from kvcheck.spec.invariants import INVARIANTS, Invariant
from kvcheck.spec.logic import Z3Logic
from kvcheck.spec.symbolic import SymScope, SymState


def scope_bound(L, s, q):
    """(Scope) a live sequence holds at most max_tokens tokens and reserved slots together
    (each bounded on its own too, so the sum cannot wrap in a bit-vector encoding)."""
    mt = s.scope.max_tokens
    return L.and_(s.length(q) <= mt, s.reserved(q) <= mt, s.length(q) + s.reserved(q) <= mt)


SCOPE_BOUND = Invariant("scope_bound", "seq", scope_bound)


@dataclass
class Choice:
    """One disjunct of the step relation."""

    selector: z3.BoolRef
    op: Op
    n_var: z3.ExprRef | None
    lookahead_var: z3.ExprRef | None = None


# What each operation may end in, in the symbolic model: out-of-blocks wherever a
# contract allows it, and a deliberate refusal (which leaves everything unchanged)
# where engines refuse: an admission (a watermark) and a reservation (a lookahead cap).
OUTCOMES_OF = {"allocate": (OK, OOB, REFUSED), "append_slot": (OK, OOB), "fork": (OK, OOB),
               "free_seq": (OK,), "append_slots": (OK, OOB, REFUSED), "rollback": (OK,),
               "rebase": (OK, OOB), "preempt": (OK,), "drop_behind_window": (OK,)}
_TWO_SEQS = ("fork", "rebase")  # operations naming a second sequence (the child)


class Model:
    def __init__(self, scope: SymScope, contracts=None, invariants=None,
                 omit_clauses: tuple[str, ...] = (), encoding: str = "bv"):
        if encoding not in ("int", "bv"):
            raise ValueError(f"encoding must be 'int' or 'bv', not {encoding!r}")
        self.scope = scope
        self.encoding = encoding
        self.L = Z3Logic(None if encoding == "int" else scope.width,
                         max_quotient=scope.table_slots + 1)
        self.contracts = contracts or spec_contracts.CONTRACTS
        self.invariants = list(invariants or INVARIANTS)
        self.omit = omit_clauses
        self._count = 0

    def state(self, name: str) -> SymState:
        return SymState(self.L, self.scope, name)

    def init(self, s: SymState):
        """Every block free with refcount 0, no live sequence."""
        L = self.L
        return L.and_(*[L.and_(s.ref(b) == 0, s.free_count(b) == 1) for b in s.blocks()],
                      *[L.not_(s.live(q)) for q in s.seqs()])

    def invariant(self, s: SymState, only: list[Invariant] | None = None):
        L = self.L
        return L.and_(*[inv.formula(L, s) for inv in (only or self.invariants)],
                      SCOPE_BOUND.formula(L, s))

    def ops(self, tag: str, symmetric: bool = False):
        """Every (operation, slot(s), outcome) with fresh argument and result variables.

        ``symmetric``: sequence slots are interchangeable (the spec never names
        a slot), so when the state before is arbitrary it suffices to let the
        operation act on slot 0 (and fork or rebase into slot 1).
        """
        L, sc = self.L, self.scope
        for kind in (k for k in spec_contracts.CONTRACTS if k in self.contracts):
            for q in ([0] if symmetric else range(sc.seqs)):
                children = [0]
                if kind in _TWO_SEQS:
                    children = [1] if symmetric else [c for c in range(sc.seqs) if c != q]
                for c in children:
                    for outcome in OUTCOMES_OF[kind]:
                        t = f"{tag}.{kind}.{q}.{c}.{outcome}"
                        op = Op(kind, seq=q, child=c, outcome=outcome)
                        n_var = la_var = None
                        if kind in ("allocate", "append_slots", "rollback",
                                    "drop_behind_window"):  # (the window, for a drop)
                            n_var = op.n_tokens = L.var(f"{t}.n")
                        if kind == "append_slots":
                            la_var = op.lookahead = L.var(f"{t}.la")
                        if kind == "append_slot":
                            op.block, op.offset = L.var(f"{t}.blk"), L.var(f"{t}.off")
                            op.cow_src, op.has_cow = L.var(f"{t}.cow"), z3.Bool(f"{t}.hascow")
                        yield op, n_var, la_var

    def _in_scope(self, s: SymState, op: Op) -> list:
        """The scope's bound on what an operation asks for: no sequence grows past
        max_tokens tokens and reserved slots together."""
        mt = self.scope.max_tokens
        if op.kind == "allocate":
            return [op.n_tokens >= 1, op.n_tokens <= mt]
        if op.kind == "append_slot":
            return [s.length(op.seq) < mt]
        if op.kind == "append_slots":
            return [op.n_tokens >= 1, op.n_tokens <= mt, op.lookahead >= 0, op.lookahead <= mt,
                    s.length(op.seq) + op.n_tokens + op.lookahead <= mt]
        if op.kind in ("rollback", "drop_behind_window"):
            return [op.n_tokens >= 1, op.n_tokens <= mt]
        return []

    def choice_bodies(self, s: SymState, s2: SymState, tag: str, kinds=None,
                      symmetric: bool = False) -> list[tuple[Choice, z3.BoolRef, z3.BoolRef]]:
        """Every disjunct of the step relation s -> s2 (restricted to ``kinds`` if given):
        its choice, its precondition and its body (the precondition, the scope's bound
        and every contract clause)."""
        L, sc = self.L, self.scope
        dom = Domain(range(sc.num_blocks), range(sc.seqs))
        out = []
        for op, n_var, la_var in self.ops(tag, symmetric):
            if kinds is not None and op.kind not in kinds:
                continue
            sel = z3.Bool(f"{tag}.sel.{op.kind}.{op.seq}.{op.child}.{op.outcome}")
            pre = spec_contracts.precondition(L, s, op)
            parts = [pre, *self._in_scope(s, op)]
            parts += [f for name, _, f in spec_contracts.clauses(L, s, s2, op, dom,
                                                                  self.contracts)
                      if not any(name.startswith(o) for o in self.omit)]
            out.append((Choice(sel, op, n_var, la_var), L._b(pre), L.and_(*parts)))
        return out

    def step(self, s: SymState, s2: SymState, tag: str, kinds=None,
             symmetric: bool = False) -> tuple[z3.BoolRef, list[Choice]]:
        """The step relation s -> s2 and its choices (restricted to ``kinds`` if given)."""
        parts = self.choice_bodies(s, s2, tag, kinds, symmetric)
        choices = [c for c, _, _ in parts]
        return (z3.And(*[z3.Implies(c.selector, body) for c, _, body in parts],
                       z3.Or([c.selector for c in choices])), choices)


def decode(model: z3.ModelRef, choices: list[Choice]) -> Op:
    """The concrete operation a model took at one step."""
    for c in choices:
        if z3.is_true(model.eval(c.selector, model_completion=True)):
            return decode_choice(model, c)
    raise ValueError("no operation selected in the model")


def decode_choice(model: z3.ModelRef, c: Choice) -> Op:
    """The concrete operation of choice ``c`` with its arguments as ``model`` gives them."""
    op = Op(c.op.kind, seq=c.op.seq, child=c.op.child, outcome=c.op.outcome)
    if c.n_var is not None:
        op.n_tokens = _number(model, c.n_var)
    if c.lookahead_var is not None:
        op.lookahead = _number(model, c.lookahead_var)
    return op


def _number(model: z3.ModelRef, var) -> int:
    v = model.eval(var, model_completion=True)
    return v.as_long() if z3.is_int_value(v) else v.as_signed_long()
