"""The runtime oracle: drive an allocator one operation at a time and check it.

After every operation the oracle checks, against ``kvcheck.spec``:
  1. the operation's contract (``spec.contracts``), including the step
     invariants isolation and exception safety;
  2. every state invariant (``spec.invariants``);
  3. the data: each sequence it touched reads back exactly its own tokens
     through its block table (``kvcheck.shadow``).

Two modes share that spec text:
  ``full``  snapshot the whole allocator before and after each operation and
            quantify over everything (exact; used for shrinking and replay).
  ``fast``  observe only what the operation touched (O(touched) per
            operation) and audit everything in a full *sweep* every
            ``sweep_every`` operations and at the end (amortised O(1)). The
            common successful operations take one generated function each
            (``kvcheck.models.blocks.fused``: observe, check, record, commit in
            one pass; ``fused=False``: the layered path, ``_step_fast``).

The oracle never trusts the implementation: an exception it did not expect,
a result of the wrong shape, garbage in its state or a hang is reported as a
``Violation``, never raised.
"""

from __future__ import annotations

import copy
from operator import index

from kvcheck.check import evidence
from kvcheck.check.copies import deep_copy
from kvcheck.check.model import recorded
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, Watchdog, active_watchdog, record_phase
from kvcheck.compile.tracer import Untraceable
from kvcheck.errors import what_it_did
from kvcheck.models.blocks import compiled as compiled_checks
from kvcheck.models.blocks import fused as fused_steps
from kvcheck.models.blocks import witness
from kvcheck.models.blocks.ghost import After, Ghost
from kvcheck.models.blocks.model import OPS, call
from kvcheck.models.blocks.shadow import ShadowMemory
from kvcheck.spec import contracts
from kvcheck.spec.contracts import OK, OOB, REFUSED, Domain, Op
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.state import Snapshot
from kvcheck.targets.observe import ObservationError, snapshot


def ambient_watchdog(timeout: float | None) -> Watchdog:
    """A watchdog session: within it, ``Oracle.step(op)`` without a watchdog uses this one."""
    return Watchdog(timeout)


# The spec compiled for the fast mode's states (kvcheck.compile), once, at import: a
# lazy first compile inside a caller's run (e.g. under CrossHair) would make that run
# take different paths from the next.
def _compiled(build, *args):
    """``build(*args)``, or None where the tracer cannot represent the spec text
    (then that check is evaluated from the spec itself, as in full mode)."""
    try:
        return build(*args)
    except Untraceable:
        return None


def _steps_of(kind: str) -> dict | None:
    """``kind``'s compiled step check for each outcome (each traced with its outcome
    known, so it reads only what that outcome's clauses read); None where the tracer
    cannot represent the spec text."""
    out = {o: _compiled(compiled_checks.step_for, kind, o, Ghost, After) for o in (OK, OOB, REFUSED)}
    return None if None in out.values() else out


_STEPS = {k: _steps_of(k) for k in contracts.CONTRACTS}
# The fused steps (``kvcheck.models.blocks.fused``): observe, check, record and commit in
# one generated function, for the one-sequence operations, by (kind, outcome).
_FUSED = fused_steps.steps()
_PRECONDITIONS = {k: _compiled(compiled_checks.precondition, k, Ghost) for k in contracts.CONTRACTS}
_STATE_INVARIANTS = _compiled(compiled_checks.state_invariants, Snapshot)
# The full mode's contracts, compiled over every block and the operation's own sequences,
# by (kind, outcome) where the tracer can represent them (``Oracle._passes_compiled``).
_CONTRACTS = {(k, o): f for k in contracts.CONTRACTS for o in (OK, OOB, REFUSED)
              if (f := _compiled(compiled_checks.contract_for, k, o, Snapshot, Snapshot))}
# The fast mode's per-operation invariants, (invariant, predicate, domain) in spec
# order, for naming the one the compiled check found broken.
_FAST_PREDS = [(i, i.predicate, i.domain) for i in compiled_checks.FAST_INVARIANTS]


class Unsupported(Exception):
    """The target does not offer this operation (see ``Target.capabilities``)."""


class Oracle:
    # Each operation's compiled step check, per outcome (a subclass judging an operation
    # by its own contract may stand in its own compiled form: the prefix oracle's
    # allocate with cache hits).
    _steps = _STEPS

    def __init__(self, target, mode: str = "fast", sweep_every: int | None = None,
                 timeout: float | None = 10.0, compiled: bool = True, fused: bool = True):
        if mode not in ("fast", "full"):
            raise ValueError(f"mode must be 'fast' or 'full', not {mode!r}")
        self.target = target
        self.mode = mode
        self.block_size = target.block_size
        self.sweep_every = sweep_every or max(1024, 2 * target.num_blocks)
        self.timeout = timeout
        self.steps = 0
        self.lengths: dict[int, int] = {}
        self.reserved: dict[int, int] = {}  # seq -> slots reserved beyond its tokens (if any)
        self._order: list[int] = []  # live sequences, in no particular order (O(1) pick)
        self._pos: dict[int, int] = {}  # seq -> its index in _order
        self.shadow = ShadowMemory(target.block_size)
        self.violation: Violation | None = None
        # The operation ``valid`` last found to meet its precondition in the current state
        # (``step`` need not evaluate it again); any change of state forgets it.
        self._approved: Op | None = None
        # A target may narrow an operation's precondition to the calls its engine can
        # express (``Target.admits``): an operation it does not admit is never issued.
        self._admits = getattr(target, "admits", None)
        # A cyclic sliding window the target declares (``Target.cyclic_window``, tokens):
        # stamped on every operation as ``Op.cycle`` (blocks), which allocate's and
        # append_slot's contracts read.
        self.cycle = cyclic_blocks(target)
        # The compiled spec stands in for the spec's own contracts only where a
        # subclass does not judge operations its own way.
        self.compiled = compiled and type(self)._check_op is Oracle._check_op
        # The fused steps stand in for the layers of ``_step_fast`` (observe, check with the
        # compiled spec, record, read back, commit) only on this class's own: a subclass
        # calling, recording or judging its own way takes the general path.
        self._fused = _FUSED if fused and self.compiled and type(self) is Oracle else {}
        # What the last passed fused step touched: its blocks and sequences (``fused.source``;
        # a model checking more on top, the prefix oracle, reads it)
        self.touched = None
        wd = active_watchdog()
        record_phase("the first observation")
        if wd is not None:
            wd.enter()
        try:
            self.snap = snapshot(target, {})
        except (ObservationError, OperationTimeout) as exc:
            self.snap = None
            kind = "hang" if isinstance(exc, OperationTimeout) else "malformed"
            text = f"reading the fresh allocator's state {exc}" if kind == "hang" else str(exc)
            self.violation = Violation(0, kind, "observation", witness=text)
            return
        finally:
            if wd is not None:
                wd.leave()
        self.observed = self.snap
        self.violation = self._check_state(self.snap, 0)
        if self.violation is None and self.snap.zero_refs() != target.num_blocks:
            self.violation = Violation(
                0, "invariant", "empty_start", witness=(
                    f"a fresh allocator must start with every block free; "
                    f"{target.num_blocks - self.snap.zero_refs()} of {target.num_blocks} "
                    f"have a refcount"
                ))
        self.ghost = Ghost.from_snapshot(self.snap)

    # -- public ------------------------------------------------------------------
    def clone(self) -> Oracle:
        """An independent copy, target included (for exploring alternatives).

        Raises whatever ``copy.deepcopy`` raises for targets that cannot be copied
        (``deep_copy``: its result, faster).
        """
        new = copy.copy(self)
        new.target = deep_copy(self.target)
        new._admits = getattr(new.target, "admits", None)  # the copy's own, not the original's
        new.lengths = dict(self.lengths)
        new.reserved = dict(self.reserved)
        new._order = list(self._order)
        new._pos = dict(self._pos)
        new.shadow = self.shadow.clone()
        if self.mode == "fast":
            new.ghost = deep_copy(self.ghost)
        return new

    def live(self) -> list[int]:
        return list(self.lengths)

    def observed_json(self) -> dict:
        """The state observed after the last step, as a trace records it."""
        from kvcheck.models.blocks.runs import state_json

        return state_json(self.observed)

    def live_seqs(self) -> list[int]:
        """The live sequences as a list owned by the oracle (do not modify; O(1))."""
        return self._order

    def valid(self, op: Op) -> bool:
        """Whether ``op`` meets its precondition now and the target supports it (and,
        where the target narrows what it accepts, admits it: ``Target.admits``)."""
        if op.kind not in self.target.capabilities or not self._precondition(op):
            return False
        admits = self._admits
        if admits is None or admits(op):
            self._approved = op
            return True
        return False

    def _precondition(self, op: Op) -> bool:
        if self.mode == "fast":
            check = _PRECONDITIONS[op.kind]
            if check is not None:
                return check(self.ghost, op)
        return bool(contracts.precondition(PY, self._state(), op))

    def _state(self):
        return self.snap if self.mode == "full" else self.ghost

    def step(self, op: Op, watchdog: Watchdog | None = None) -> Violation | None:
        """Run ``op`` on the target and check it; returns the violation, if any.

        ``op`` is filled in with the outcome and result. Raises ``ValueError``
        for an op that breaks its precondition (the driver's mistake, not the
        allocator's) and ``Unsupported`` for an operation the target lacks.
        """
        if self.violation is not None:
            return self.violation
        if op is not self._approved:
            if op.kind not in self.target.capabilities:
                raise Unsupported(op.kind)
            if not self._precondition(op):
                raise ValueError(f"precondition of {op.kind} fails: {op}")
        self._approved = None
        op.cycle = self.cycle
        return recorded(self, op, watchdog, self._checked)

    def _checked(self, op: Op, watchdog: Watchdog | None) -> Violation | None:
        try:
            v = self._step(op, watchdog)
            if v is None and self.mode == "fast" and self.steps % self.sweep_every == 0:
                v = self.sweep()
        except OperationTimeout as exc:  # while observing or checking: the call itself is judged in _invoke
            v = Violation(self.steps, "hang", op.kind, witness=(
                f"observing the allocator after {op.kind} {exc}"))
        return v

    def resync(self, op: Op) -> bool:
        """After a violation by ``op`` that the user allows (a documented deviation), take
        what the target did as the state to check on from: its whole state observed, the
        caller's bookkeeping (lengths, reservations, shadow writes) done as for a passing
        step. False (the run must stop) if the state cannot be observed or ``op`` did not
        end as an operation can (it crashed, hung or returned something malformed)."""
        v = self.violation
        if v is None or v.kind not in ("contract", "invariant") or op.outcome is None:
            return False
        self._approved = None
        try:
            delta = length_delta(self.lengths, op)
            lengths = {q: m for q, m in {**self.lengths, **delta}.items() if m is not None}
            post = snapshot(self.target, lengths, tuple(delta), self.reserved)
            reserve_after(op, self._state(), post, post.reservations)
            self._record(op, delta, post)
        except (ObservationError, KeyError, TypeError, ValueError, IndexError):
            return False
        self.snap = self.observed = post
        if self.mode == "fast":
            self.ghost = Ghost.from_snapshot(post)
        self.violation = None
        return True

    def sweep(self, watchdog: Watchdog | None = None) -> Violation | None:
        """Audit the whole allocator: every invariant, the frame, every sequence's data."""
        if self.violation is not None:
            return self.violation
        self._approved = None
        if watchdog is None:
            watchdog = active_watchdog()
        if watchdog is not None:
            watchdog.enter()
        try:
            snap = snapshot(self.target, dict(self.lengths), (), self.reserved)
        except ObservationError as exc:
            return self._malformed(exc)
        except OperationTimeout as exc:
            self.violation = Violation(self.steps, "hang", "observation", witness=(
                f"reading the whole allocator's state {exc}"))
            return self.violation
        finally:
            if watchdog is not None:
                watchdog.leave()
        v = self._check_state(snap, self.steps)
        if v is None and self.mode == "fast":
            v = self._check_frame(snap)
        v = v or self._check_data(snap.tables, self.lengths, self.steps)
        if v is None:
            self.ghost = Ghost.from_snapshot(snap)
            self.snap = snap
        self.violation = v
        return v

    # -- one operation -------------------------------------------------------------
    def _call(self, op: Op):
        """Run ``op`` on the target (subclasses may call it differently). A target that
        defers its prompt's write to ``commit(seq)`` (a prefix cache publishing its keys
        after the write: ``prefix-commit``, ``vllm-v1-lifecycle``) is committed right after
        each allocate: in the block model, allocate writes the prompt."""
        result = call(self.target, op)
        if op.kind == "allocate":
            for obj in (self.target, getattr(self.target, "impl", None)):
                commit = getattr(obj, "commit", None)
                if callable(commit):
                    commit(op.seq)
                    break
        return result

    def _invoke(self, op: Op, watchdog: Watchdog | None) -> Violation | None:
        """Call the target under the watchdog; fill in ``op``'s outcome (and
        append_slot's result). A hang, a foreign exception or a malformed
        result is the violation returned."""
        kind = op.kind
        try:
            result = self._call(op)
            op.outcome = OK
        except OperationTimeout as exc:
            return Violation(self.steps, "hang", kind, witness=f"{kind} {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - judged here: the target's exception
            if self._out_of_blocks(exc):
                op.outcome = OOB
                return None
            if self._refusal(exc):
                op.outcome = REFUSED
                return None
            return Violation(self.steps, "crash", kind, witness=f"{kind} {what_it_did(exc)}")
        if kind == "append_slot":
            bad = decode_append(op, result)
            if bad:
                return Violation(self.steps, "malformed", "append_slot result", op.seq, witness=bad)
        elif kind in COPYING:
            bad = decode_copies(op, result)
            if bad:
                return Violation(self.steps, "malformed", f"{kind} result", op.seq, witness=bad)
        return None

    def _refusal(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a deliberate refusal the target declares (``is_refusal``)."""
        test = getattr(self.target, "is_refusal", None)
        if test is None:
            return False
        try:
            return bool(test(exc))
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - a broken is_refusal: not a refusal
            return False

    def _out_of_blocks(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the target's out-of-blocks signal (its own test may fail too)."""
        try:
            return bool(self.target.is_out_of_blocks(exc))
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - a broken is_out_of_blocks: not out-of-blocks
            return False

    def _step(self, op: Op, watchdog: Watchdog | None) -> Violation | None:
        v = self._invoke(op, watchdog)
        if v is not None:
            return v
        if self.mode == "fast":
            step = self._fused.get((op.kind, op.outcome)) if not op.cycle else None
            seen = None
            if step is not None:
                try:
                    seen = step(self, op)
                except ObservationError as exc:
                    return self._malformed(exc)
                if type(seen) is not tuple:  # passed, or the read-back's violation
                    return seen
            # (a fused check that failed: the general path names the clause, on what the
            # fused step observed)
            return self._step_fast(op, self._length_delta(op), seen)
        delta = self._length_delta(op)  # touched seq -> length after (None: gone)
        n, seqs = self.steps, tuple(delta)
        lengths = {**self.lengths, **delta}
        lengths = {q: m for q, m in lengths.items() if m is not None}
        try:
            post = snapshot(self.target, lengths, seqs, self.reserved)
        except ObservationError as exc:
            return self._malformed(exc)
        pre = self.snap
        self._reserve(op, pre, post, post.reservations)
        self.observed = post
        dom = Domain(range(self.target.num_blocks), sorted(set(pre.seqs()) | set(post.seqs())))
        v = self._check_op(pre, post, op, dom, n) or self._check_state(post, n)
        if v is not None:
            return v
        self._record(op, delta, post)
        self.snap = post
        return self._check_data({q: post.table_tuple(q) for q in self.lengths}, self.lengths, n)

    def _step_fast(self, op: Op, delta: dict, seen: tuple | None = None) -> Violation | None:
        """Check ``op`` on what it touched (its sequences, every block their tables
        name before or after, the blocks it returned): the compiled spec first;
        only when that fails, the spec itself, to name and explain the clause.

        ``seen``: what a fused step observed before its check failed (``After``'s
        ``seen``): then the step must fail here too."""
        n, g, seqs = self.steps, self.ghost, tuple(delta)
        kind = op.kind
        try:
            if kind == "append_slot":
                extra = (op.block, op.cow_src)
            elif op.copies:
                extra = [b for pair in op.copies for b in pair]
            else:
                extra = ()
            if len(seqs) == 1:  # (the usual step: one sequence, no comprehensions)
                q = seqs[0]
                m = delta[q]
                after = {} if m is None else {q: m}
            else:
                after = {q: m for q, m in delta.items() if m is not None}
            post = After(self.target, g, seqs, after, extra, seen)
            if kind not in _SINGLE or op.seq in self.reserved:
                self._reserve(op, g, post, post.reservations)
            blocks = post.blocks
            tables = post.tables
            if len(seqs) == 1:
                live = [] if tables[q] is None else [q]
            else:
                live = [q for q in seqs if tables[q] is not None]
            # (under a cyclic window, the spec itself: compiled without one)
            steps = self._steps[kind] if self.compiled and not op.cycle else None
            check = steps[op.outcome] if steps is not None else None
            if check is None or not check(g, post, op, blocks, live):
                dom = Domain(sorted(blocks), seqs)
                v = self._check_op(g, post, op, dom, n) or self._check_touched(post, dom, n)
                assert v is not None or check is None, f"compiled spec disagrees on {op}"
                if v is not None:
                    return v
            elif seen is not None:
                raise AssertionError(f"fused step disagrees with the compiled spec on {op}")
        except ObservationError as exc:
            return self._malformed(exc)
        first = self.lengths.get(op.seq, 0) if kind == "append_slots" else 0
        self._record(op, delta, post)
        lengths = self.lengths
        mismatch, v = self.shadow.mismatch, None
        # (the common case, every read-back right, tested directly; a mismatch is
        # reported by ``_check_data`` as before)
        if kind == "append_slot" and op.outcome == OK:  # only the written block changed
            q = op.seq
            if mismatch(q, tables[q], lengths[q] - 1) is not None:
                v = self._check_data({q: tables[q]}, lengths, n, lengths[q] - 1)
        elif first:  # a reservation wrote from the old length on
            q = op.seq
            if mismatch(q, tables[q], first) is not None:
                v = self._check_data({q: tables[q]}, lengths, n, first)
        else:
            for q in live:
                if mismatch(q, tables[q]) is not None:
                    v = self._check_data({q: tables[q] for q in live}, lengths, n)
                    break
        g.commit(post)
        return v

    def _reserve(self, op: Op, pre, post, into: dict) -> None:
        reserve_after(op, pre, post, into)

    def _record(self, op: Op, delta: dict, post) -> None:
        """Play the caller (make the copies the target asks for, write the tokens into the
        shadow) and track lengths and reservations."""
        if op.outcome == OK:
            sh, kind = self.shadow, op.kind
            if kind == "append_slot":
                if op.cycle:  # the engine's own drop first: the positions left behind
                    skip = contracts.cyclic_skip(PY, self._state(), op)
                    if skip:
                        sh.drop(op.seq, skip)
                sh.append(op.seq, op.block, op.offset, op.cow_src)
            elif kind == "allocate":
                sh.allocate(op.seq, op.n_tokens, post.table_tuple(op.seq))
            elif kind in ("free_seq", "preempt"):
                sh.free(op.seq)
            elif kind == "drop_behind_window":  # null positions are never read again
                sh.drop(op.seq, contracts.behind_window(PY, self._state(), op))
            else:
                for src, dst in op.copies or ():
                    sh.copy(src, dst)
                if kind == "append_slots":
                    sh.extend(op.seq, op.n_tokens, post.table_tuple(op.seq))
                elif kind == "rollback":
                    sh.truncate(op.seq, self.lengths[op.seq] - op.n_tokens)
                else:  # fork, rebase: the child reads what the source reads
                    sh.free(op.child)
                    sh.fork(op.seq, op.child)
            if kind not in _SINGLE or op.seq in self.reserved:
                # (a single-slot append on a sequence reserving nothing reserves nothing)
                reserved = post.reservations
                for q in delta:
                    r = reserved.get(q, 0)
                    if r:
                        self.reserved[q] = r
                    else:
                        self.reserved.pop(q, None)
        lengths, order, pos = self.lengths, self._order, self._pos
        for q, m in delta.items():
            if m is None:
                if lengths.pop(q, None) is not None:
                    i = pos.pop(q)
                    last = order.pop()
                    if last != q:
                        order[i] = last
                        pos[last] = i
            else:
                if q not in lengths:
                    pos[q] = len(order)
                    order.append(q)
                lengths[q] = m

    def _length_delta(self, op: Op) -> dict[int, int | None]:
        return length_delta(self.lengths, op)

    # -- checks ------------------------------------------------------------------
    def _check_op(self, pre, post, op: Op, dom: Domain, n: int) -> Violation | None:
        if self._passes_compiled(pre, post, op, dom):
            return None
        for name, element, holds in contracts.clauses(PY, pre, post, op, dom):
            if not holds:
                ev = self._evidence(pre, post, op, dom) or evidence.Evidence(name, element, None, [])
                return Violation(n, "contract", f"{op.kind}: {name}", element,
                                 witness=witness.for_step(ev, pre, post, op),
                                 doc=witness.rule_for(_rule(op).__doc__, op),
                                 subject=ev.subject, terms=ev.terms)
        return None

    def _passes_compiled(self, pre, post, op: Op, dom: Domain) -> bool:
        """The full mode's contract check, fast where it passes. A contract quantifies over
        blocks and over sequences in separate loops (never one inside the other), and what
        it says of one sequence reads no block it quantifies over. So two parts read every
        clause the spec yields over the whole of ``dom``: the contract compiled from the
        spec's text over ``dom``'s blocks (every block) and the operation's own sequences;
        then the spec itself over the other sequences and no block, the clauses about
        those sequences (its other clauses, the same ones over no block, are the first
        part's). False: the spec judges the step clause by clause (and names the one that
        fails), as where the tracer cannot represent it, under a cyclic window, or for
        states other than whole snapshots."""
        if not self.compiled or op.cycle or type(pre) is not Snapshot or type(post) is not Snapshot:
            return False
        check = _CONTRACTS.get((op.kind, op.outcome))
        if check is None or not check(pre, post, op, dom.blocks):
            return False
        own = compiled_checks._op_seqs(op)
        others = [q for q in dom.seqs if q not in own]
        if not others:
            return True
        named = set(others)
        return all(holds for _, element, holds in
                   contracts.clauses(PY, pre, post, op, Domain((), others))
                   if type(element) is int and element in named)

    def _evidence(self, pre, post, op: Op, dom: Domain):
        """The first failing clause of ``op``'s contract, re-run over recording states:
        its element's kind and the terms it read (``kvcheck.check.evidence``)."""
        log: list = []
        rpre, rpost = evidence.Recorder(pre, "pre", log), evidence.Recorder(post, "post", log)
        tagged = evidence.tagged_op(op, OPS[op.kind])
        clauses = contracts.clauses(PY, rpre, rpost, tagged, evidence.tagged_domain(dom))
        return evidence.for_clauses(clauses, {"pre": pre, "post": post}, log)

    def _check_touched(self, post: After, dom: Domain, n: int) -> Violation | None:
        """Every invariant not needing the free list's membership, on what ``op`` touched."""
        L = PY
        live = [q for q in dom.seqs if post.live(q)]
        for inv, pred, domain in _FAST_PREDS:
            if domain == "global":
                if not pred(L, post):
                    return self._invariant_violation(inv, None, post, n)
                continue
            for x in (dom.blocks if domain == "block" else live):
                if not pred(L, post, x):
                    return self._invariant_violation(inv, x, post, n)
        return None

    def _check_state(self, s, n: int) -> Violation | None:
        check = _STATE_INVARIANTS if self.compiled and type(s) is Snapshot else None
        if check is not None and check(s):
            return None
        for inv in INVARIANTS:
            if inv.domain == "global":
                if not inv.holds_for(PY, s):
                    return self._invariant_violation(inv, None, s, n)
                continue
            elements = s.blocks() if inv.domain == "block" else s.seqs()
            for x in elements:
                if not inv.holds_for(PY, s, x):
                    return self._invariant_violation(inv, x, s, n)
        return None

    def _invariant_violation(self, inv, x, s, n: int) -> Violation:
        ev = evidence.for_invariant(inv, PY, s, x)
        return Violation(n, "invariant", inv.name, x, witness=witness.for_state(ev, s),
                         doc=inv.doc, subject=ev.subject, terms=ev.terms)

    def _check_frame(self, snap) -> Violation | None:
        """Fast mode: what no operation touched must not have changed."""
        g = self.ghost
        if snap.tables != g.tables or snap.refs != g.refs:  # (equal, the usual case, at C speed)
            v = self._frame_difference(snap)
            if v is not None:
                return v
        if snap.num_free() != g.num_free():
            return Violation(self.steps, "contract", "frame: free list length changed",
                             witness="the free list's length changed outside any operation")
        return None

    def _frame_difference(self, snap) -> Violation | None:
        g = self.ghost
        for q in {**g.tables, **snap.tables}:
            now, was = snap.tables.get(q), g.tables.get(q)
            if now != was:
                return Violation(self.steps, "contract", "frame: untouched table changed", q,
                                 witness=(f"sequence {q}'s table is now {_show(now)} (was "
                                          f"{_show(was)}) though no operation named it"))
        for b in snap.blocks():
            if snap.ref(b) != g.ref(b):
                return Violation(self.steps, "contract", "frame: untouched refcount changed", b,
                                 witness=(f"block {b}'s refcount changed to {snap.ref(b)} (was "
                                          f"{g.ref(b)}) though no operation touched it"))
        return None

    def _check_data(self, tables, lengths, n: int, first: int = 0) -> Violation | None:
        for q, table in tables.items():
            bad = self.shadow.mismatch(q, table, first)
            if bad is not None:
                pos, read, want = bad
                b = table[pos // self.block_size] if pos // self.block_size < len(table) else None
                return Violation(n, "data", "read-back", q, witness=witness.for_data(
                    q, pos, b, self.block_size, read, want, self.shadow, tables))
        return None

    def _malformed(self, exc: Exception) -> Violation:
        return Violation(self.steps, "malformed", "observation", witness=str(exc))


def _show(table) -> str:
    return "missing" if table is None else witness._shown(table)


# Operations whose result is the list of copies the caller must make first.
COPYING = frozenset({"append_slots", "fork", "rebase"})
# Operations that reserve nothing: a sequence reserving nothing before reserves nothing
# after (one that did has a slot fewer reserved).
_SINGLE = frozenset({"append_slot"})


def cyclic_blocks(target) -> int:
    """The cyclic window ``target`` declares, in blocks (``cyclic_window`` tokens, a
    positive multiple of its block size; 0: none). A malformed declaration is a
    ``TargetError`` (bad input: the adapter's)."""
    window = getattr(target, "cyclic_window", None)
    if window is None or window == 0:
        return 0
    B = target.block_size
    if type(window) is not int or window < 0 or window % B:
        from kvcheck.targets.loading import TargetError

        raise TargetError(f"{type(target).__name__}.cyclic_window must be a positive multiple "
                          f"of the block size {B} (tokens), not {window!r}")
    return window // B


def decode_copies(op: Op, result) -> str | None:
    """Fill ``op.copies`` from a result that lists ``(src, dst)`` block copies (None: none);
    a message if it has the wrong shape."""
    if result is None:
        op.copies = []
        return None
    try:
        op.copies = [(index(src), index(dst)) for src, dst in result]
    except (TypeError, ValueError):
        op.copies = None
        return f"{op.kind} returned {result!r:.80}, expected a list of (src, dst) block copies"
    return None


def decode_append(op: Op, result) -> str | None:
    """Fill ``op`` from append_slot's result; a message if it has the wrong shape."""
    try:
        block, offset, cow_src = result
        op.block, op.offset = index(block), index(offset)
        op.cow_src = None if cow_src is None else index(cow_src)
    except (TypeError, ValueError):
        return f"append_slot returned {result!r}, expected (block, offset, cow_src)"
    op.has_cow = op.cow_src is not None
    return None


def reserve_after(op: Op, pre, post, into: dict) -> None:
    """Set ``into`` (the post state's reservations) for the sequences ``op`` touched,
    as ``spec.contracts.reserved_after`` says, from the tables observed."""
    if op.outcome != OK:
        return
    kind = op.kind
    q = op.child if kind in ("fork", "rebase") else op.seq
    if kind in ("free_seq", "preempt"):
        into.pop(q, None)
        return
    r = contracts.reserved_after(PY, pre, op, post.nblocks(q))
    if r:
        into[q] = r
    else:
        into.pop(q, None)


def length_delta(lengths: dict, op: Op) -> dict[int, int | None]:
    """The sequences ``op`` touched and their token counts after it (None: gone), given
    ``lengths`` before it: what a caller of the allocator knows without looking."""
    kind = op.kind
    if kind == "fork":
        p = lengths[op.seq]
        return {op.seq: p, op.child: p if op.outcome == OK else None}
    if kind == "rebase":
        p = lengths[op.seq]
        return {op.seq: p, op.child: p if op.outcome == OK else lengths[op.child]}
    now = lengths.get(op.seq)
    if op.outcome != OK:
        return {op.seq: now}
    if kind == "append_slot":
        return {op.seq: now + 1}
    if kind == "allocate":
        return {op.seq: op.n_tokens}
    if kind == "append_slots":
        return {op.seq: now + op.n_tokens}
    if kind == "rollback":
        return {op.seq: now - op.n_tokens}
    if kind == "drop_behind_window":
        return {op.seq: now}
    return {op.seq: None}


def _rule(op: Op):
    """The contract that judged ``op``: a refusal's, or its operation's."""
    return contracts.refused if op.outcome == REFUSED else contracts.CONTRACTS[op.kind]
