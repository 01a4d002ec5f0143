"""The scheduler's run state: one run of a scheduler target, observed and checked whole.

Operations (``kvcheck.models.scheduler.model``): ``add(seq, prompt, max_new)`` (a
request arrives: the scheduler's ``add``, else appended to ``waiting``) and
``step()`` (one scheduler step; its result the decoded ids). After a step every
sequence that has now generated its ``max_new`` tokens is retired (the
scheduler's ``finish``, else taken out of ``running`` and freed, as an engine
would): that is part of the step, as are the checks after it.

After every operation the whole scheduler is observed (its queues, the device
pool through ``kvcheck.targets.observe.snapshot``, the host pool when it swaps)
and checked, with the spec's text:
  1. after a step, the policy (``kvcheck.spec.scheduler.step``) on the
     before/after view, and after each retirement the finish contract;
  2. the pools' invariants (``kvcheck.spec.invariants``): in fast mode with the
     spec compiled to one whole-state check (``kvcheck.models.blocks.compiled``),
     in full mode (and with ``compiled=False``) the spec evaluated clause by
     clause; the compiled check failing is always named by the evaluated one,
     so both modes give the same violation at the same step;
  3. with a host pool, ``kvcheck.spec.scheduler.swap_state``.

Liveness within a bound: every step that has work decodes a token, so the
requests added so far finish within ``last arrival + sum(max_new) + requests +
1`` steps (the arrival counted in steps run before the last ``add``). The
run's ``sweep`` drains what is left (steps while the scheduler has work,
recorded as ``implied`` operations so that traces and replays contain them),
then every request must have finished and every block be free. A sequence
preempted again before it decoded a token since its last preemption is a
*ping-pong* finding (reported, not a violation: the policy allows it; it is the
thrashing a watermark reduces).

Anything the scheduler raises, returns malformed, or a call that hangs is a
``Violation``, never a crash of kvcheck.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcheck.check import evidence
from kvcheck.check.copies import deep_copy
from kvcheck.check.model import recorded_step
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, Watchdog, active_watchdog
from kvcheck.compile.tracer import Untraceable
from kvcheck.errors import what_it_did
from kvcheck.models.blocks import compiled as compiled_checks
from kvcheck.models.blocks import witness
from kvcheck.models.scheduler.workload import Request, fits
from kvcheck.spec import scheduler as policy
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.scheduler import SchedState
from kvcheck.spec.state import Snapshot
from kvcheck.targets.observe import ObservationError, as_int, read_num_free, snapshot

try:  # compiled once, at import (see kvcheck.models.blocks.oracle)
    _STATE_INVARIANTS = compiled_checks.state_invariants(Snapshot)
except Untraceable:  # pragma: no cover - the spec's text is traceable today
    _STATE_INVARIANTS = None

MAX_SEQ = 2**31 - 1  # the largest sequence id a trace records


# -- results ---------------------------------------------------------------------------
@dataclass
class Finding:
    step: int  # the scheduler step (steps run so far), not the operation
    seq: int
    kind: str
    text: str

    def to_json(self) -> dict:
        return {"step": self.step, "seq": self.seq, "kind": self.kind, "text": self.text}


@dataclass
class Stats:
    requests: int = 0
    finished: int = 0
    steps: int = 0
    decoded: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_out_tokens: int = 0
    swapped_in_tokens: int = 0
    pingpongs: int = 0
    peak_free: int = 0
    min_free: int = 0
    final_free: int = 0
    leaked: int = 0
    peak_running: int = 0
    # per step, when recorded (``Options.extra["series"]``)
    free: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)

    def to_json(self, series: bool = False) -> dict:
        d = {k: v for k, v in self.__dict__.items() if not isinstance(v, list)}
        if series:
            d.update(free_series=self.free, running_series=self.running,
                     waiting_series=self.waiting, preempted_series=self.preempted)
        return d


def show_waiting(waiting) -> str:
    return "[" + ", ".join(f"{q}:{n}" for q, n in waiting) + "]"


def describe(s: SchedState) -> str:
    return (f"running {list(s.running)}, waiting {show_waiting(s.waiting)}, free {s.num_free()} "
            f"of {s.num_blocks}")


def describe_json(state: dict | None) -> str:
    """``describe`` of a state as a trace records it."""
    if state is None:
        return "(not observed)"
    free, refs = state.get("free", []), state.get("refs", [])
    return (f"running {state.get('running', [])}, waiting "
            f"{show_waiting(state.get('waiting', []))}, free {len(free)} of {len(refs)}")


def pool_json(snap: Snapshot) -> dict:
    """A pool as a trace records it (as the block-manager model does)."""
    return {"tables": {str(q): list(t) for q, t in snap.tables.items()},
            "lens": {str(q): snap.length(q) for q in snap.tables},
            "refs": list(snap.refs), "free": sorted(snap.free.elements())}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _lens(bm) -> dict[int, int]:
    """A seed-shaped block manager's own token counts (``lens``), as ints."""
    try:
        items = list(bm.lens.items())
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001 - the block manager's fault, reported
        raise ObservationError(f"lens cannot be read: {what_it_did(exc)}") from None
    return {as_int(q, "a sequence id in lens"): as_int(n, f"lens[{q!r}]") for q, n in items}


class SchedOracle:
    """A run of a scheduler target (``kvcheck.models.scheduler.loading.SchedTarget``); speaks
    ``kvcheck.check.model.RunState``."""

    def __init__(self, target, scope, mode: str = "fast", compiled: bool = True,
                 series: bool = False):
        if mode not in ("fast", "full"):
            raise ValueError(f"mode must be 'fast' or 'full', not {mode!r}")
        self.target, self.scope, self.mode = target, scope, mode
        self.nb, self.bs, self.wm = target.num_blocks, target.block_size, target.watermark
        self.check = _STATE_INVARIANTS if compiled and mode == "fast" else None
        self.series = series
        self.steps = 0  # operations checked
        self.violation: Violation | None = None
        self.requests: dict[int, Request] = {}  # every request added, by id
        self.generated: dict[int, int] = {}
        self.unfinished: dict[int, None] = {}  # added, not yet retired (in order)
        self.last_arrival = 0  # scheduler steps run before the last add
        self.sum_new = 0
        self.stats = Stats(peak_free=self.nb, min_free=self.nb, final_free=self.nb)
        self.findings: list[Finding] = []
        self.preempted_idle: set[int] = set()  # preempted and not decoded since
        self.ever_admitted: set[int] = set()
        self.implied: list = []  # steps the sweep ran to drain the workload
        self.implied_states: list[dict] = []
        self.post: SchedState | None = None  # the last state observed
        wd = active_watchdog()
        if wd is not None:
            wd.enter()
        try:
            self.post = self._capture()
            self.violation = self.check_state(0, self.post)
        except ObservationError as exc:
            self.violation = Violation(0, "malformed", "observation", witness=str(exc))
        except OperationTimeout as exc:
            self.violation = Violation(0, "hang", "observation",
                                       witness=f"reading the fresh scheduler's queues {exc}")
        finally:
            if wd is not None:
                wd.leave()

    # -- the run state's interface ------------------------------------------------------
    def clone(self) -> SchedOracle:
        """An independent copy: the scheduler and its block manager copied together."""
        return deep_copy(self)

    def has_work(self) -> bool:
        """Whether the scheduler holds anything to step (as last observed)."""
        s = self.post
        return s is not None and bool(s.waiting or s.running)

    def live_seqs(self) -> list[int]:
        """The requests added and not yet finished."""
        return list(self.unfinished)

    def valid(self, op) -> bool:
        if op.kind == "step":
            return self.has_work()
        if op.kind == "add":
            q, p, m = op.seq, op.prompt, op.max_new
            return (all(type(x) is int for x in (q, p, m)) and 0 <= q <= MAX_SEQ
                    and q not in self.requests
                    and fits(Request(q, p, m), self.nb, self.bs, self.wm))
        return False

    def step(self, op, watchdog: Watchdog | None = None) -> Violation | None:
        """Run ``op`` and check it (``ValueError`` for one that is not valid now)."""
        return recorded_step(self, op, watchdog, self._checked)

    def _checked(self, op, _watchdog) -> Violation | None:
        n = self.steps
        try:
            return self._add(op, n) if op.kind == "add" else self._step(op, n)
        except ObservationError as exc:
            return Violation(n, "malformed", "observation", witness=str(exc))
        except OperationTimeout as exc:
            return Violation(n, "hang", "observation",
                             witness=f"reading the scheduler's queues {exc}")

    def sweep(self, watchdog: Watchdog | None = None) -> Violation | None:
        """Drain the workload (steps while there is work, each recorded in ``implied``), then:
        every request finished, every block free."""
        from kvcheck.models.scheduler.model import SchedOp

        while self.violation is None and self.has_work():
            op = SchedOp("step")
            self.implied.append(op)
            self.step(op, watchdog)
            self.implied_states.append(self.observed_json())
        if self.violation is not None:
            return self.violation
        n = self.steps
        if self.unfinished:
            self.violation = Violation(n, "liveness", "every fitting request finishes within "
                                       "the bound", witness=(
                                           f"{len(self.unfinished)} request(s) vanished: neither "
                                           f"waiting, running nor finished after "
                                           f"{self.stats.steps} steps"))
            return self.violation
        if watchdog is None:
            watchdog = active_watchdog()
        if watchdog is not None:
            watchdog.enter()
        try:
            free = read_num_free(self.target.view)
        except ObservationError as exc:
            self.violation = Violation(n, "malformed", "observation", witness=str(exc))
            return self.violation
        except OperationTimeout as exc:
            self.violation = Violation(n, "hang", "observation",
                                       witness=f"reading the free blocks {exc}")
            return self.violation
        finally:
            if watchdog is not None:
                watchdog.leave()
        st = self.stats
        st.final_free, st.leaked = free, self.nb - free
        if st.leaked:
            self.violation = Violation(n, "invariant", "no blocks leak at the end", witness=(
                f"every request finished but {st.leaked} of {self.nb} blocks are not free"))
        return self.violation

    def observed_json(self) -> dict:
        """The scheduler as last observed: its queues, the device pool, the host pool."""
        s = self.post
        if s is None:
            return {"running": [], "waiting": [], "tables": {}, "lens": {},
                    "refs": [0] * self.nb, "free": []}
        d = {"running": list(s.running), "waiting": [list(w) for w in s.waiting],
             **pool_json(s.bm)}
        if s.host is not None:
            d["host"] = pool_json(s.host)
        return d

    # -- observation -----------------------------------------------------------------------
    def _capture(self) -> SchedState:
        s, t = self.target.sched, self.target
        try:
            raw = list(s.waiting)
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault, reported
            raise ObservationError(f"waiting cannot be read: {what_it_did(exc)}") from None
        waiting = []
        for item in raw:
            try:
                q, n = item
            except CONTROL:
                raise
            except BaseException:  # noqa: BLE001 - not a pair
                raise ObservationError(f"waiting must hold (seq, n_tokens) pairs, got "
                                       f"{_short(raw)}") from None
            waiting.append((as_int(q, "a waiting sequence id"), as_int(n, "a waiting length")))
        try:
            raw = list(s.running)
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - the scheduler's fault, reported
            raise ObservationError(f"running must be a list of ids, got "
                                   f"{_short(getattr(s, 'running', None))}") from None
        running = tuple(as_int(q, "a running sequence id") for q in raw)
        bm = snapshot(t.view, _lens(t.bm))
        host = None if t.host is None else snapshot(t.host, _lens(t.host.impl))
        return SchedState(self.bs, self.nb, self.wm, tuple(waiting), running, bm, host)

    def _raised(self, what: str, exc: BaseException) -> str:
        """``what`` raised ``exc``, in words (saying so when it is out-of-blocks)."""
        text = f"{what} {what_it_did(exc)}"
        try:
            oob = bool(self.target.is_out_of_blocks(exc))
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - only the wording depends on it
            oob = False
        if oob:
            text += (" (the block manager's out-of-blocks signal: a scheduler must preempt "
                     "the newest running sequence and retry, not let it escape)")
        return text

    # -- checks ------------------------------------------------------------------------------
    def _clauses(self, n: int, clauses, pre, post, what: str, doc: str,
                 decoded=None) -> Violation | None:
        for name, element, holds in clauses:
            if not holds:
                ev = self._evidence(name, element, pre, post, decoded)
                return Violation(n, "policy", name, element,
                                 witness=self._witness(what, pre, post, decoded is not None),
                                 doc=doc, subject=None if element is None else "seq",
                                 terms=ev.terms if ev is not None else [])
        return None

    def _evidence(self, name, element, pre, post, decoded):
        """The terms the policy's failing clause read (re-run over recording states)."""
        log: list = []
        rpre, rpost = evidence.Recorder(pre, "pre", log), evidence.Recorder(post, "post", log)
        if decoded is not None:
            clauses = policy.step(PY, rpre, rpost, decoded)
        elif element is not None and name.startswith("finish"):
            clauses = policy.finish(PY, rpre, rpost, element)
        else:
            return None
        try:
            return evidence.for_clauses(clauses, {"pre": pre, "post": post}, log)
        except Exception:  # noqa: BLE001 - evidence is a help, the violation stands without it
            return None

    def _witness(self, what: str, pre, post, a_step: bool) -> str:
        text = f"{what}; before: {describe(pre)}; after: {describe(post)}"
        if a_step:
            p = policy.plan(PY, pre)
            want_run = p.order[:p.m]
            want_wait = [(q, p.pre_len[q]) for q in p.order[p.m:]] + list(pre.waiting[p.k:])
            text += (f"; the policy admits {p.k} and keeps running {want_run}, waiting "
                     f"{show_waiting(want_wait)}")
        return text

    def _invariants(self, n: int, snap: Snapshot, pool: str) -> Violation | None:
        """Every invariant of ``snap``: the compiled check in fast mode, the spec's text
        naming the first broken one (and deciding, in full mode)."""
        if self.check is not None and self.check(snap):
            return None
        for inv in INVARIANTS:
            if inv.domain == "global":
                elements = (None,)
            else:
                elements = snap.blocks() if inv.domain == "block" else snap.seqs()
            for x in elements:
                if not inv.holds_for(PY, snap, x):
                    ev = evidence.for_invariant(inv, PY, snap, x)
                    return Violation(n, "invariant", f"{pool}: {inv.name}", x,
                                     witness=f"the {pool} pool: {witness.for_state(ev, snap)}",
                                     doc=inv.doc, subject=ev.subject, terms=ev.terms)
        return None

    def check_state(self, n: int, post: SchedState, what: str = "") -> Violation | None:
        v = self._invariants(n, post.bm, "device")
        if v is None and post.host is not None:
            v = self._invariants(n, post.host, "host") or self._clauses(
                n, policy.swap_state(PY, post), post, post, what or "the state",
                policy.DOCS["swap"])
        return v

    def _bound(self) -> int:
        return self.last_arrival + self.sum_new + len(self.requests) + 1

    # -- the operations ------------------------------------------------------------------------
    def _add(self, op, n: int) -> Violation | None:
        q, p, m = op.seq, op.prompt, op.max_new
        try:
            self.target.add(q, p, m)
        except OperationTimeout as exc:
            return Violation(n, "hang", "add", q, witness=f"add({q}) hung: {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
            return Violation(n, "crash", "add refused a request that fits", q, witness=(
                f"{self._raised(f'add({q}, {p})', exc)}, for a request of {p}+{m} tokens"))
        self.requests[q] = Request(q, p, m, self.stats.steps)
        self.generated[q] = 0
        self.unfinished[q] = None
        self.last_arrival = self.stats.steps
        self.sum_new += m
        self.stats.requests += 1
        self.post = self._capture()
        return self.check_state(n, self.post, f"add({q})")

    def _step(self, op, n: int) -> Violation | None:
        st = self.stats
        if st.steps >= self._bound():
            return Violation(n, "liveness", "every fitting request finishes within the bound",
                             witness=(f"{len(self.unfinished)} of {len(self.requests)} requests "
                                      f"unfinished after {st.steps} steps (bound: last arrival "
                                      f"{self.last_arrival} + sum of max_new + requests + 1)"))
        st.steps += 1
        k = st.steps
        pre = self.post
        try:
            result = self.target.step()
        except OperationTimeout as exc:
            return Violation(n, "hang", "step", witness=f"step() hung: {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
            return Violation(n, "crash", "step", witness=(
                f"{self._raised('step()', exc)}; before: {describe(pre)}"))
        try:
            decoded = [as_int(q, "a decoded id") for q in result]
        except OperationTimeout as exc:  # iterating over what it returned is its code too
            return Violation(n, "hang", "step result", witness=f"step()'s result hung: {exc}")
        except Interrupted:
            raise
        except BaseException:  # noqa: BLE001 - not a list of ids
            return Violation(n, "malformed", "step result", witness=(
                f"step() returned {_short(result)}, expected a list of sequence ids"))
        if all(0 <= q <= MAX_SEQ for q in decoded):  # else only the witness can say it
            op.decoded, op.finished = decoded, []
        post = self._capture()
        self.post = post
        v = self._clauses(n, policy.step(PY, pre, post, decoded), pre, post,
                          f"step() decoded {decoded}", policy.DOCS["step"], decoded)
        v = v or self.check_state(n, post, f"step() decoded {decoded}")
        if v is not None:
            return v
        if not decoded:
            return Violation(n, "liveness", "a step with work decodes at least one token",
                             witness=f"step() decoded nothing; before: {describe(pre)}")
        self._account(k, pre, post, decoded)
        finished = op.finished if op.finished is not None else []
        for q in decoded:
            if q in self.generated:
                self.generated[q] += 1
        for q in decoded:
            r = self.requests.get(q)
            if r is not None and q in self.unfinished and self.generated[q] >= r.max_new:
                del self.unfinished[q]
                finished.append(q)
                v = self._retire(q, n)
                if v is not None:
                    break
        return v

    def _retire(self, q: int, n: int) -> Violation | None:
        pre = self.post
        try:
            self.target.finish(q)
        except OperationTimeout as exc:
            return Violation(n, "hang", "finish", q, witness=f"finish({q}) hung: {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
            return Violation(n, "crash", "finish", q, witness=self._raised(f"finish({q})", exc))
        post = self._capture()
        self.post = post
        what = f"finish({q}) after the step"
        v = self._clauses(n, policy.finish(PY, pre, post, q), pre, post, what,
                          policy.DOCS["finish"])
        self.stats.finished += 1
        return v or self.check_state(n, post, what)

    def _account(self, k: int, pre: SchedState, post: SchedState, decoded: list[int]) -> None:
        st = self.stats
        p = policy.plan(PY, pre)
        admitted = p.order[len(pre.running):]
        for q in admitted:
            if q in self.ever_admitted:
                if pre.host is not None and pre.host.live(q):
                    st.swapped_in_tokens += p.pre_len[q]
                else:
                    st.recomputed_tokens += p.pre_len[q]
            self.ever_admitted.add(q)
        running = set(post.running)
        victims = [q for q in p.order if q not in running]
        for q in victims:
            if post.host is not None and post.host.live(q):
                st.swapped_out_tokens += p.pre_len[q]
            if q in self.preempted_idle:
                st.pingpongs += 1
                self.findings.append(Finding(k, q, "ping-pong", (
                    f"sequence {q} was preempted at step {k} before it decoded a token since "
                    f"its previous preemption (re-admitted with {p.pre_len[q]} tokens, "
                    f"recomputed for nothing)")))
            self.preempted_idle.add(q)
        self.preempted_idle.difference_update(decoded)
        st.preemptions += len(victims)
        st.decoded += len(decoded)
        free = post.num_free()
        st.peak_free = max(st.peak_free, free)
        st.min_free = min(st.min_free, free)
        st.peak_running = max(st.peak_running, len(post.running))
        if self.series:
            st.free.append(free)
            st.running.append(len(post.running))
            st.waiting.append(len(post.waiting))
            st.preempted.append(len(victims))
