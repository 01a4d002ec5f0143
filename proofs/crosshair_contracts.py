"""CrossHair contracts for an allocator's four operations, derived from the spec.

``crosshair check kvcheck.proofs.crosshair_contracts`` searches, symbolically,
for an input that breaks one of the contracts below. Nothing here restates the
spec: every condition calls it.

    pre:   the spec's state invariants hold on a ``Snapshot`` of the manager
           (``kvcheck.spec.invariants.INVARIANTS`` under ``PY``) and the
           operation's precondition holds (``spec.contracts.precondition``);
    post:  the operation's contract holds between the before and after
           ``Snapshot`` (``spec.contracts.clauses`` under ``PY``, with the
           ``Domain`` being the whole state), the state invariants hold
           after it, and it raised nothing but out-of-blocks.

That is an inductive step: from *any* state satisfying the invariants that
the allocator can reach, one operation preserves them and meets its contract.

CrossHair cannot be handed an arbitrary ``BlockManager`` (it would invent
states no sequence of operations reaches), so the manager is *built*: the
first argument of every contract function is a ``Reached`` — CrossHair
constructs it by calling ``Reached(prefix)`` with a symbolic list of small
symbolic integers, and ``Reached`` replays that list (decoded into at most
``PREFIX`` operations) on a fresh allocator. The analysis therefore explores
operation *sequences*; every id and size is reduced modulo the scope so that
each branch has finitely many values and the path tree can be exhausted.

The allocator is generic: ``ALLOCATOR`` is the reference ``BlockManager``
unless the environment variable ``KVCHECK_CROSSHAIR_TARGET`` names another
seed-shaped class (``module:Class`` or ``path/file.py:Class``, any factory
called as ``factory(num_blocks, block_size)``). ``KVCHECK_CROSSHAIR_SCOPE``
overrides the scope as ``num_blocks,block_size,seqs,max_tokens,prefix``.
``kvcheck.proofs.crosshair_run.run_crosshair`` sets both for a subprocess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvcheck.models.blocks.model import call
from kvcheck.models.blocks.oracle import COPYING, decode_append, decode_copies, length_delta, reserve_after
from kvcheck.models.blocks.witness import describe_op
from kvcheck.spec import contracts
from kvcheck.spec.contracts import OK, OOB, Domain, Op
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.targets.loading import build, resolve
from kvcheck.targets.observe import ObservationError, snapshot


def _crosshair_module_walk_guard() -> None:
    """Let CrossHair walk from a function up to its packages.

    CrossHair's option lookup (``crosshair.codeconfig.collect_options``)
    follows ``getattr(thing, "__module__")`` to ``sys.modules``; the
    ``kvcheck`` package object is an instance of a ``ModuleType`` subclass
    defined in ``kvcheck`` itself, so that attribute names ``kvcheck`` and the
    walk recurses forever (RecursionError before any analysis). An instance
    value shadows the class attribute, for this process only.
    """
    import sys

    pkg = sys.modules.get("kvcheck")
    if pkg is not None and getattr(pkg, "__module__", None) == pkg.__name__:
        pkg.__dict__["__module__"] = None


_crosshair_module_walk_guard()

TARGET_ENV = "KVCHECK_CROSSHAIR_TARGET"
SCOPE_ENV = "KVCHECK_CROSSHAIR_SCOPE"


@dataclass(frozen=True)
class Scope:
    num_blocks: int = 3
    block_size: int = 2
    seqs: int = 3  # sequence ids 0 .. seqs-1
    max_tokens: int = 3  # prompts of 1 .. max_tokens tokens
    prefix: int = 2  # operations replayed before the one under check

    @classmethod
    def parse(cls, text: str) -> Scope:
        values = [int(v) for v in text.split(",")]
        if len(values) != 5 or min(values[:4]) < 1 or values[4] < 0:
            raise ValueError(f"{SCOPE_ENV} must be num_blocks,block_size,seqs,max_tokens,prefix "
                             f"(positive; prefix >= 0), got {text!r}")
        return cls(*values)

    def text(self) -> str:
        return ",".join(str(v) for v in (self.num_blocks, self.block_size, self.seqs,
                                         self.max_tokens, self.prefix))


def _load_allocator():
    spec = os.environ.get(TARGET_ENV)
    if not spec:
        from kvcheck.impl.block_manager import BlockManager

        return BlockManager
    return resolve(spec)[1]


ALLOCATOR = _load_allocator()
SCOPE = Scope.parse(os.environ[SCOPE_ENV]) if os.environ.get(SCOPE_ENV) else Scope()
KINDS = tuple(contracts.CONTRACTS)  # of which a prefix uses those the allocator offers


def offered_by(allocator) -> tuple[str, ...]:
    """The operations ``allocator`` (a class or factory) offers, in the spec's order."""
    return tuple(k for k in KINDS if callable(getattr(allocator, k, None)))


def _offered() -> tuple[str, ...]:
    return offered_by(ALLOCATOR)


def decode(code: int, live: list[int], scope: Scope = SCOPE) -> Op | None:
    """One integer as one prefix operation in a state whose live sequences are
    ``live`` (sorted); None if no operation is possible (never in a scope).

    ``code % (number of possible kinds)`` picks the kind among those possible
    now, ``code // that`` its arguments. Sequence ids are canonical: a new
    sequence (allocate's, fork's child) is the smallest id not live, an
    existing one ``live[i % len(live)]``. The reference does not depend on id
    values, so this loses no state up to renaming of sequences and spares
    CrossHair symmetric paths. Each choice is realized at once (CrossHair
    branches over its few values): the prefix only has to *reach* states, and
    concrete prefixes keep the solver's path condition small.
    """
    fresh = next((q for q in range(scope.seqs) if q not in live), None)
    possible = {"allocate": fresh is not None, "fork": bool(live) and fresh is not None,
                "rebase": len(live) >= 2}
    kinds = [k for k in _offered() if possible.get(k, bool(live))]
    if not kinds:
        return None
    k = kinds[_realize(code % len(kinds))]
    rest = code // len(kinds)
    if k == "allocate":
        return Op(k, seq=fresh, n_tokens=1 + _realize(rest % scope.max_tokens))
    seq = live[_realize(rest % len(live))]
    rest //= len(live)
    if k == "fork":
        return Op(k, seq=seq, child=fresh)
    if k == "rebase":
        others = [q for q in live if q != seq]
        return Op(k, seq=seq, child=others[_realize(rest % len(others))])
    if k == "append_slots":
        return Op(k, seq=seq, n_tokens=1 + _realize(rest % scope.max_tokens),
                  lookahead=_realize((rest // scope.max_tokens) % (scope.max_tokens + 1)))
    if k in ("rollback", "drop_behind_window"):  # (a drop's n_tokens: its window)
        return Op(k, seq=seq, n_tokens=1 + _realize(rest % scope.max_tokens))
    return Op(k, seq=seq)


def _realize(value: int) -> int:
    """``value`` made concrete under CrossHair (a branch per possible value)."""
    try:
        from crosshair import realize
    except ImportError:  # pragma: no cover - crosshair is optional at run time
        return value
    return realize(value)


class Reached:
    """An allocator in a state reached by replaying ``prefix`` on a fresh one.

    Each integer of ``prefix`` (the first ``SCOPE.prefix`` of them) is decoded
    into an operation (``decode``); one whose precondition fails in the spec
    (none, by construction of ``decode``) would be skipped.
    Construction never raises: an operation that crashes, or a state that
    cannot be observed, marks the state ``broken`` (the invariants are then
    false, so the contracts' preconditions exclude it — the step that broke
    it is a shorter prefix plus that operation, checked on its own).
    """

    def __init__(self, prefix: list[int]):
        self.target = build(ALLOCATOR, SCOPE.num_blocks, SCOPE.block_size)
        self.lengths: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        self.ops: list[Op] = []
        self.broken: str | None = None
        self.snap = self._observe()
        for code in prefix[: SCOPE.prefix]:
            if self.broken is not None:
                break
            op = decode(code, sorted(self.lengths))
            if op is None or not self.allows(op):
                continue
            self.ops.append(op)
            step = Step(self, op, judge=False)
            if step.crash is not None:
                self.broken = step.crash

    def _observe(self, also: tuple = ()):
        try:
            return _concretely(snapshot, self.target, dict(self.lengths), also,
                               dict(self.reserved))
        except ObservationError as exc:
            self.broken = f"cannot observe: {exc}"
            return None

    def fresh(self) -> int:
        """The smallest sequence id not live (the scope's last one if every id is)."""
        return next((q for q in range(SCOPE.seqs) if q not in self.lengths), SCOPE.seqs - 1)

    def allows(self, op: Op) -> bool:
        """The spec's precondition of ``op`` in this state."""
        return self.snap is not None and bool(contracts.precondition(PY, self.snap, op))

    def invariants_hold(self) -> bool:
        """The spec's state invariants hold on a snapshot of the manager."""
        return self.broken is None and not _concretely(failed_invariants, self.snap)

    def __repr__(self) -> str:
        ops = ", ".join(_show_op(op) for op in self.ops) or "nothing"
        return f"<{ALLOCATOR.__name__} after {ops}>"


class Step:
    """Run ``op`` on ``state`` (mutating it) and record the spec's verdict
    (``judge=False``: only run it, as for the operations of a prefix)."""

    def __init__(self, state: Reached, op: Op, judge: bool = True):
        self.op = op
        self.crash: str | None = None
        self.pre = pre = state.snap
        try:
            result = call(state.target, op)
            op.outcome = OK
        except Exception as exc:  # noqa: BLE001 - judged here
            result = None
            if state.target.is_out_of_blocks(exc):
                op.outcome = OOB
            else:
                self.crash = f"{op.kind} raised {type(exc).__name__}: {exc}"
        if self.crash is None and op.outcome == OK and op.kind == "append_slot":
            self.crash = decode_append(op, result)
        elif self.crash is None and op.outcome == OK and op.kind in COPYING:
            self.crash = decode_copies(op, result)
        self.post = post = None
        if self.crash is None:
            delta = length_delta(state.lengths, op)
            for q, m in delta.items():
                if m is None:
                    state.lengths.pop(q, None)
                else:
                    state.lengths[q] = m
            also = tuple(delta)
            state.snap = self.post = post = state._observe(also)
            if post is None:
                self.crash = state.broken
            else:
                reserve_after(op, pre, post, post.reservations)
                state.reserved = dict(post.reservations)
        self.contract: list[str] = []
        self.invariants: list[str] = []
        if judge and post is not None:
            self.contract, self.invariants = _concretely(_judge, pre, post, op)

    def holds(self) -> bool:
        """No crash, every contract clause and every state invariant holds."""
        return self.crash is None and not self.contract and not self.invariants

    def __repr__(self) -> str:
        verdict = [f"crash: {self.crash}"] if self.crash else []
        verdict += [f"contract: {c}" for c in self.contract]
        verdict += [f"invariant: {i}" for i in self.invariants]
        return f"<{_show_op(self.op)} -> {op_result(self.op)}; {'; '.join(verdict) or 'holds'}>"


def _judge(pre, post, op: Op) -> tuple[list[str], list[str]]:
    return failed_clauses(pre, post, op), failed_invariants(post)


def _concretely(fn, *args):
    """``fn(*args)`` on concrete values.

    Under CrossHair the arguments are first realized (each symbolic value
    gets the one value this path's constraints allow or, if several remain,
    CrossHair branches on it), then ``fn`` runs untraced, as plain Python:
    the spec is then evaluated exactly, on this path's concrete state, without
    paying CrossHair's per-bytecode tracing for it. Outside CrossHair it is
    just a call.
    """
    try:
        from crosshair import NoTracing, deep_realize
        from crosshair.tracers import is_tracing
    except ImportError:  # pragma: no cover - crosshair is optional at run time
        return fn(*args)
    if not is_tracing():
        return fn(*args)
    args = deep_realize(args)
    with NoTracing():
        return fn(*args)


def failed_invariants(snap) -> list[str]:
    """The spec's state invariants that ``snap`` breaks (names; empty = all hold)."""
    if snap is None:
        return ["unobservable state"]
    return [inv.name for inv in INVARIANTS if not inv.formula(PY, snap)]


def failed_clauses(pre, post, op: Op) -> list[str]:
    """The spec's contract clauses of ``op`` that (pre, post) breaks, over the whole state."""
    dom = Domain(pre.blocks(), sorted(set(pre.seqs()) | set(post.seqs())))
    out = []
    for name, element, holds in contracts.clauses(PY, pre, post, op, dom):
        if not holds:
            out.append(name if element is None else f"{name} [{element}]")
    return out


def _show_op(op: Op) -> str:
    return describe_op(Op(op.kind, seq=op.seq, child=op.child, n_tokens=op.n_tokens,
                          lookahead=op.lookahead)).split(" -> ")[0]


def op_result(op: Op) -> str:
    if op.outcome == OOB:
        return "out-of-blocks"
    if op.kind == "append_slot" and op.block is not None:
        return f"({op.block}, {op.offset}, {op.cow_src})"
    if op.copies:
        return f"copies {[list(c) for c in op.copies]}"
    return "ok"


# -- the contracts CrossHair checks -----------------------------------------------
# The symbolic integers are reduced into the scope: every value is an operation.
def allocate_op(seq: int, n_tokens: int) -> Op:
    return Op("allocate", seq=seq % SCOPE.seqs, n_tokens=1 + n_tokens % SCOPE.max_tokens)


def append_slot_op(seq: int) -> Op:
    return Op("append_slot", seq=seq % SCOPE.seqs)


def fork_op(parent: int, child: int) -> Op:
    return Op("fork", seq=parent % SCOPE.seqs, child=child % SCOPE.seqs)


def free_seq_op(seq: int) -> Op:
    return Op("free_seq", seq=seq % SCOPE.seqs)


def allocate(state: Reached, seq: int, n_tokens: int) -> Step:
    """allocate(seq, n_tokens) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(allocate_op(seq, n_tokens))
    post: __return__.holds()
    """
    return Step(state, allocate_op(seq, n_tokens))


def append_slot(state: Reached, seq: int) -> Step:
    """append_slot(seq) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(append_slot_op(seq))
    post: __return__.holds()
    """
    return Step(state, append_slot_op(seq))


def fork(state: Reached, parent: int, child: int) -> Step:
    """fork(parent, child) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(fork_op(parent, child))
    post: __return__.holds()
    """
    return Step(state, fork_op(parent, child))


def free_seq(state: Reached, seq: int) -> Step:
    """free_seq(seq) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(free_seq_op(seq))
    post: __return__.holds()
    """
    return Step(state, free_seq_op(seq))


def append_slots_op(seq: int, n_tokens: int, lookahead: int) -> Op:
    return Op("append_slots", seq=seq % SCOPE.seqs, n_tokens=1 + n_tokens % SCOPE.max_tokens,
              lookahead=lookahead % (SCOPE.max_tokens + 1))


def rollback_op(seq: int, n_tokens: int) -> Op:
    return Op("rollback", seq=seq % SCOPE.seqs, n_tokens=1 + n_tokens % SCOPE.max_tokens)


def rebase_op(source: int, child: int) -> Op:
    return Op("rebase", seq=source % SCOPE.seqs, child=child % SCOPE.seqs)


def preempt_op(seq: int) -> Op:
    return Op("preempt", seq=seq % SCOPE.seqs)


def append_slots(state: Reached, seq: int, n_tokens: int, lookahead: int) -> Step:
    """append_slots(seq, n_tokens, lookahead) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(append_slots_op(seq, n_tokens, lookahead))
    post: __return__.holds()
    """
    return Step(state, append_slots_op(seq, n_tokens, lookahead))


def rollback(state: Reached, seq: int, n_tokens: int) -> Step:
    """rollback(seq, n_tokens) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(rollback_op(seq, n_tokens))
    post: __return__.holds()
    """
    return Step(state, rollback_op(seq, n_tokens))


class Skipped:
    """A rebase whose setup could not make its child (the pool ran out): nothing to check."""

    contract: list = []
    invariants: list = []

    def holds(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<rebase not reached: its child could not be made>"


def rebase(state: Reached, source: int, how: int) -> Step | Skipped:
    """rebase(source, child) from any reached state satisfying the invariants, onto a child
    made just before: allocated with its own blocks (``how`` even, 1 + how // 2 tokens) or
    forked from the source (``how`` odd), the two ways a beam's sibling exists. (A prefix
    of two arbitrary operations would reach the same states; CrossHair's paths grow too
    fast with it.)

    pre: state.invariants_hold()
    pre: state.allows(fork_op(source, state.fresh()))
    post: __return__.holds()
    """
    src = source % SCOPE.seqs
    child = state.fresh()
    if _realize(how % 2) == 0:
        make = Op("allocate", seq=child, n_tokens=1 + _realize((how // 2) % SCOPE.max_tokens))
    else:
        make = Op("fork", seq=src, child=child)
    state.ops.append(make)
    setup = Step(state, make, judge=False)
    if setup.crash is not None or make.outcome != OK or not setup.post:
        return Skipped() if setup.crash is None else setup
    return Step(state, Op("rebase", seq=src, child=child))


def preempt(state: Reached, seq: int) -> Step:
    """preempt(seq) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(preempt_op(seq))
    post: __return__.holds()
    """
    return Step(state, preempt_op(seq))


def drop_behind_window_op(seq: int, window: int) -> Op:
    return Op("drop_behind_window", seq=seq % SCOPE.seqs, n_tokens=1 + window % SCOPE.max_tokens)


def drop_behind_window(state: Reached, seq: int, window: int) -> Step:
    """drop_behind_window(seq, window) from any reached state satisfying the invariants.

    pre: state.invariants_hold()
    pre: state.allows(drop_behind_window_op(seq, window))
    post: __return__.holds()
    """
    return Step(state, drop_behind_window_op(seq, window))


# The operations the allocator under check offers (the seed's four at the least).
PROPERTIES = _offered()
