"""The scheduler oracle: drive a seed-shaped scheduler over a workload and check it.

A *seed-shaped* scheduler is built as ``factory(bm, watermark_blocks)`` and has
``waiting`` (a deque of ``(seq, n_tokens)``), ``running`` (a list, oldest
first) and ``step() -> decoded seq ids``; ``add(seq, n[, max_new])`` and
``finish(seq)`` are used when present (else the harness appends to
``waiting`` and retires finished sequences itself: removes them from
``running`` and frees their blocks).

The block manager it is given is the user's (``block_manager``: a factory
``(num_blocks, block_size)``), else the module-level ``BlockManager`` of the
module that defines the scheduler factory (a scheduler written against its
own block manager, catching its own ``OutOfBlocks``), else the reference. It
must be seed-shaped (``tables``, ``ref``, ``free``, ``lens``): the harness
observes it through ``SeedAdapter``, as ``kvcheck verify`` does, and names
an out-of-blocks exception escaping the scheduler as ``verify`` matches one
(``out_of_blocks``; default: any exception class named ``OutOfBlocks``).
After every step the oracle checks, with the PY logic:
  1. the policy (``kvcheck.spec.scheduler.step``) on the before/after view;
  2. the block manager's invariants (``kvcheck.spec.invariants``) on a
     snapshot (``kvcheck.observe.snapshot``), and the host pool's too when
     the scheduler swaps (``host``), with ``kvcheck.spec.scheduler.swap_state``;
and after every ``finish`` the finish contract. Liveness within a bound: every
step that has work decodes a token, so a run of fitting requests must end
within ``last arrival + sum(max_new) + len(requests)`` steps with everything
finished and every block free. A sequence preempted again before it decoded a
token since its last preemption is a *ping-pong* finding (reported, not a
violation: the policy allows it; it is the thrashing a watermark reduces).

Anything the scheduler raises, returns malformed, or a step that hangs is a
``Violation``, never a crash of kvcheck.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from kvcheck.check.shrink import budget_ran_out
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Interrupted, OperationTimeout, Watchdog
from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.scheduler.workload import Request, fits
from kvcheck.spec import scheduler as policy
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.scheduler import SchedState
from kvcheck.targets.loading import TargetError, _import_attr, location
from kvcheck.targets.observe import ObservationError, as_int, read_num_free, snapshot
from kvcheck.targets.protocol import SeedAdapter

SCHEDULERS: dict[str, tuple[str, str]] = {
    "reference": ("kvcheck.impl.scheduler:Scheduler", "the reference scheduler (recompute)"),
    "swap": ("kvcheck.impl.swap:SwapScheduler",
             "the reference policy, victims swapped to a host pool (4x the device pool)"),
}


# -- loading -------------------------------------------------------------------------
def resolve(spec) -> tuple[str, object]:
    """``(label, factory)`` for a scheduler name, ``module:attr``, ``file.py:attr`` or callable."""
    if callable(spec):
        return getattr(spec, "__qualname__", repr(spec)), spec
    if not isinstance(spec, str) or not spec:
        raise TargetError(f"scheduler must be a name or module:attr, got {spec!r}")
    if spec in SCHEDULERS:
        return spec, _import_attr(SCHEDULERS[spec][0])
    if ":" not in spec:
        names = ", ".join(sorted(SCHEDULERS))
        raise TargetError(f"unknown scheduler {spec!r}: use module:attr, file.py:attr or one of: "
                          f"{names}")
    return location(spec), _import_attr(spec)


SEED_BM = ("tables", "ref", "free", "lens")  # what the harness reads of a block manager


def resolve_block_manager(spec, scheduler=None, label: str = "") -> tuple[str, object]:
    """``(label, factory)`` of the block manager: ``spec`` (``"reference"``,
    ``module:Attr``, ``file.py:Attr`` or a callable ``(num_blocks, block_size)``), else
    (``None``) the module-level ``BlockManager`` of the module defining ``scheduler``
    (the factory, as ``resolve`` gives it, from the scheduler ``label``), else the
    reference."""
    if callable(spec):
        return getattr(spec, "__qualname__", repr(spec)), spec
    if spec is not None:
        if spec == "reference":
            return spec, BlockManager
        if not isinstance(spec, str) or ":" not in spec:
            raise TargetError(f"--block-manager must be reference, module:Attr or file.py:Attr, "
                              f"got {spec!r}")
        try:
            return spec, _import_attr(spec)
        except TargetError as exc:
            raise TargetError(f"--block-manager {spec}: {exc}") from None
    f = scheduler
    while isinstance(f, functools.partial):
        f = f.func
    module = sys.modules.get(getattr(f, "__module__", None) or "")
    own = getattr(module, "BlockManager", None)
    if own is None or own is BlockManager or not callable(own):
        return "reference", BlockManager
    where = label.rpartition(":")[0] if ":" in label else module.__name__
    return f"{where}:BlockManager", own


def build(factory, num_blocks: int, block_size: int, watermark: int, block_manager=None):
    """``(scheduler, bm)``; ``TargetError`` if either cannot be built or is not
    seed-shaped. ``block_manager``: its factory (default: see ``resolve_block_manager``)."""
    if block_manager is None:
        block_manager = resolve_block_manager(None, factory)[1]
    try:
        bm = block_manager(num_blocks, block_size)
    except Exception as exc:  # noqa: BLE001 - the block manager refused: bad input
        raise TargetError(f"cannot build the block manager with num_blocks={num_blocks}, "
                          f"block_size={block_size}: {type(exc).__name__}: {exc}") from None
    missing = [a for a in SEED_BM if not hasattr(bm, a)]
    if missing:
        raise TargetError(f"{type(bm).__name__} is not a seed-shaped block manager: missing "
                          f"attribute(s) {', '.join(missing)}")
    try:
        sched = factory(bm, watermark)
    except Exception as exc:  # noqa: BLE001 - the factory refused: bad input
        raise TargetError(f"cannot build scheduler with watermark_blocks={watermark} on "
                          f"{num_blocks} blocks of {block_size}: {type(exc).__name__}: {exc}"
                          ) from None
    missing = [a for a in ("waiting", "running") if not hasattr(sched, a)]
    if not callable(getattr(sched, "step", None)):
        missing.append("step()")
    if missing:
        raise TargetError(f"{type(sched).__name__} is not a seed-shaped scheduler: missing "
                          f"{', '.join(missing)}")
    return sched, bm


# -- results ---------------------------------------------------------------------------
@dataclass
class Finding:
    step: int
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
    # per step, when recorded
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


@dataclass
class Run:
    violation: Violation | None
    stats: Stats
    findings: list[Finding]
    log: list[dict]  # per step: what happened (for rendering a counterexample)


def _show_w(waiting) -> str:
    return "[" + ", ".join(f"{q}:{n}" for q, n in waiting) + "]"


def describe(s: SchedState) -> str:
    return (f"running {list(s.running)}, waiting {_show_w(s.waiting)}, free {s.num_free()} "
            f"of {s.num_blocks}")


class _Harness:
    def __init__(self, factory, requests: list[Request], num_blocks: int, block_size: int,
                 watermark: int, timeout: float | None, record: bool, block_manager=None,
                 out_of_blocks: type[BaseException] | None = None):
        self.sched, self.bm = build(factory, num_blocks, block_size, watermark, block_manager)
        self.view = SeedAdapter(self.bm, num_blocks, block_size, out_of_blocks)
        self.requests = sorted(requests, key=lambda r: (r.arrival, r.seq))
        self.nb, self.bs, self.wm = num_blocks, block_size, watermark
        self.timeout, self.record = timeout, record
        self.by_seq = {r.seq: r for r in requests}
        self.generated = dict.fromkeys(self.by_seq, 0)
        self.stats = Stats(requests=len(requests), peak_free=num_blocks, min_free=num_blocks,
                           final_free=num_blocks)
        self.findings: list[Finding] = []
        self.log: list[dict] = []
        self.preempted_idle: set[int] = set()  # preempted and not decoded since
        self.ever_admitted: set[int] = set()
        add = getattr(self.sched, "add", None)
        self.add = add if callable(add) else None
        self.add_takes_max = False
        if self.add is not None:
            try:
                self.add_takes_max = len(inspect.signature(self.add).parameters) >= 3
            except (TypeError, ValueError):
                self.add_takes_max = False
        fin = getattr(self.sched, "finish", None)
        self.finish = fin if callable(fin) else None
        host = getattr(self.sched, "host", None)  # a swapping scheduler's host pool
        self.host = None
        if (isinstance(host, (BlockManager, type(self.bm))) and host is not self.bm
                and all(hasattr(host, a) for a in (*SEED_BM, "num_blocks", "block_size"))):
            self.host = SeedAdapter(host, host.num_blocks, host.block_size, out_of_blocks)
        self._last_host_key = None

    # -- observation -----------------------------------------------------------------
    def capture(self) -> SchedState:
        wd = getattr(self, "wd", None)
        if wd is None:
            return self._capture()
        wd.enter()  # reading the scheduler runs its code: one guarded call
        try:
            return self._capture()
        finally:
            wd.leave()

    def _capture(self) -> SchedState:
        s = self.sched
        try:
            waiting = tuple((as_int(q, "a waiting sequence id"), as_int(n, "a waiting length"))
                            for q, n in list(s.waiting))
        except (TypeError, ValueError):
            raise ObservationError(f"waiting must hold (seq, n_tokens) pairs, got "
                                   f"{list(s.waiting)!r}") from None
        try:
            running = tuple(as_int(q, "a running sequence id") for q in list(s.running))
        except TypeError:
            raise ObservationError(f"running must be a list of ids, got {s.running!r}") from None
        bm = snapshot(self.view, _lens(self.bm))
        host = None if self.host is None else snapshot(self.host, _lens(self.host.impl))
        return SchedState(self.bs, self.nb, self.wm, waiting, running, bm, host)

    def _raised(self, what: str, exc: Exception) -> str:
        """``what`` raised ``exc``, in words (saying so when it is out-of-blocks)."""
        text = f"{what} raised {type(exc).__name__}: {exc}"
        if self.view.is_out_of_blocks(exc):
            text += (" (the block manager's out-of-blocks signal: a scheduler must preempt "
                     "the newest running sequence and retry, not let it escape)")
        return text

    # -- checks ----------------------------------------------------------------------
    def _clauses(self, step: int, clauses, pre, post, what: str, doc: str) -> Violation | None:
        for name, element, holds in clauses:
            if not holds:
                return Violation(step, "policy", name, element, witness=self._witness(
                    what, name, pre, post), doc=doc)
        return None

    def _witness(self, what, name, pre, post) -> str:
        text = f"{what}; before: {describe(pre)}; after: {describe(post)}"
        if what.startswith("step"):
            p = policy.plan(PY, pre)
            want_run = p.order[:p.m]
            want_wait = [(q, p.pre_len[q]) for q in p.order[p.m:]] + list(pre.waiting[p.k:])
            text += (f"; the policy admits {p.k} and keeps running {want_run}, waiting "
                     f"{_show_w(want_wait)}")
        return text

    def _invariants(self, step: int, snap, pool: str) -> Violation | None:
        for inv in INVARIANTS:
            if inv.domain == "global":
                elements = (None,)
            else:
                elements = snap.blocks() if inv.domain == "block" else snap.seqs()
            for x in elements:
                if not inv.holds_for(PY, snap, x):
                    noun = "block" if inv.domain == "block" else "sequence"
                    what = "" if x is None else f" for {noun} {x}"
                    return Violation(step, "invariant", f"{pool}: {inv.name}", x,
                                     witness=f"the {pool} pool breaks {inv.name}{what}",
                                     doc=inv.doc)
        return None

    def check_state(self, step: int, post: SchedState) -> Violation | None:
        v = self._invariants(step, post.bm, "device")
        if v is None and post.host is not None:
            key = (post.host.tables, post.host.num_free())
            key = (tuple(sorted(key[0].items())), key[1])
            if key != self._last_host_key:
                self._last_host_key = key
                v = self._invariants(step, post.host, "host")
            if v is None:
                v = self._clauses(step, policy.swap_state(PY, post), post, post,
                                  f"after step {step}", policy.DOCS["swap"])
        return v

    # -- the run ---------------------------------------------------------------------
    def _call(self, wd: Watchdog, fn, *args):
        wd.enter()
        try:
            return fn(*args)
        finally:
            wd.leave()

    def _arrive(self, r: Request, step: int, wd: Watchdog) -> Violation | None:
        try:
            if self.add is None:
                self.sched.waiting.append((r.seq, r.prompt))
            elif self.add_takes_max:
                self._call(wd, self.add, r.seq, r.prompt, r.max_new)
            else:
                self._call(wd, self.add, r.seq, r.prompt)
        except OperationTimeout as exc:
            return Violation(step, "hang", "add", r.seq, witness=f"add({r.seq}) hung: {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
            return Violation(step, "crash", "add refused a request that fits", r.seq, witness=(
                f"{self._raised(f'add({r.seq}, {r.prompt})', exc)}, for a request of "
                f"{r.prompt}+{r.max_new} tokens"))
        return None

    def _retire_by_hand(self, q: int) -> None:
        """Retire ``q`` for a scheduler without ``finish``: what an engine would do."""
        self.sched.running.remove(q)
        self.bm.free_seq(q)

    def _retire(self, q: int, step: int, wd: Watchdog) -> Violation | None:
        pre = self.capture()
        try:
            if self.finish is not None:
                self._call(wd, self.finish, q)
            else:
                self._call(wd, self._retire_by_hand, q)
        except OperationTimeout as exc:
            return Violation(step, "hang", "finish", q, witness=f"finish({q}) hung: {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
            return Violation(step, "crash", "finish", q,
                             witness=self._raised(f"finish({q})", exc))
        post = self.capture()
        v = self._clauses(step, policy.finish(PY, pre, post, q), pre, post,
                          f"finish({q}) after step {step}", policy.DOCS["finish"])
        self.stats.finished += 1
        return v or self.check_state(step, post)

    def run(self) -> Run:
        try:
            with Watchdog(self.timeout) as wd:
                self.wd = wd
                v = self._run(wd)
        except ObservationError as exc:
            v = Violation(self.stats.steps, "malformed", "observation", witness=str(exc))
        except OperationTimeout as exc:
            v = Violation(self.stats.steps, "hang", "observation",
                          witness=f"reading the scheduler's queues {exc}")
        return Run(v, self.stats, self.findings, self.log)

    def _run(self, wd: Watchdog) -> Violation | None:
        st = self.stats
        pending = deque(self.requests)
        last_arrival = self.requests[-1].arrival if self.requests else 0
        bound = last_arrival + sum(r.max_new for r in self.requests) + len(self.requests) + 1
        t = 0
        unfinished = len(self.requests)
        v = self.check_state(0, self.capture())
        while v is None and unfinished:
            while pending and pending[0].arrival <= t:
                v = self._arrive(pending.popleft(), st.steps, wd)
                if v is not None:
                    return v
            if not self.sched.waiting and not self.sched.running:
                if not pending:
                    break
                t = pending[0].arrival
                continue
            if st.steps >= bound:
                return Violation(st.steps, "liveness", "every fitting request finishes within "
                                 "the bound", witness=(
                                     f"{unfinished} of {len(self.requests)} requests unfinished "
                                     f"after {st.steps} steps (bound: last arrival "
                                     f"{last_arrival} + sum of max_new + requests + 1)"))
            st.steps += 1
            t += 1
            n = st.steps
            pre = self.capture()
            try:
                decoded = self._call(wd, self.sched.step)
            except OperationTimeout as exc:
                return Violation(n, "hang", "step", witness=f"step() hung: {exc}")
            except Interrupted:
                raise
            except BaseException as exc:  # noqa: BLE001 - the scheduler's fault
                return Violation(n, "crash", "step", witness=(
                    f"{self._raised('step()', exc)}; before: {describe(pre)}"))
            try:
                decoded = [as_int(q, "a decoded id") for q in decoded]
            except (TypeError, ObservationError):
                return Violation(n, "malformed", "step result", witness=(
                    f"step() returned {decoded!r}, expected a list of sequence ids"))
            post = self.capture()
            if self.record:
                self.log.append({"step": n, "before": describe(pre), "decoded": decoded,
                                 "after": describe(post)})
            v = self._clauses(n, policy.step(PY, pre, post, decoded), pre, post,
                              f"step {n} decoded {decoded}", policy.DOCS["step"])
            v = v or self.check_state(n, post)
            if v is not None:
                return v
            if not decoded:
                return Violation(n, "liveness", "a step with work decodes at least one token",
                                 witness=f"step {n} decoded nothing; before: {describe(pre)}")
            self._account(n, pre, post, decoded)
            for q in decoded:
                self.generated[q] += 1
            for q in decoded:
                if self.generated[q] >= self.by_seq[q].max_new:
                    unfinished -= 1
                    v = self._retire(q, n, wd)
                    if v is not None:
                        return v
        if v is None and unfinished:
            return Violation(st.steps, "liveness", "every fitting request finishes within "
                             "the bound", witness=(
                                 f"{unfinished} request(s) vanished: neither waiting, running "
                                 f"nor finished after step {st.steps}"))
        free = read_num_free(self.view)
        leaked = self.nb - free
        st.final_free = free
        st.leaked = leaked
        if v is None and leaked:
            v = Violation(st.steps, "invariant", "no blocks leak at the end", witness=(
                f"every request finished but {leaked} of {self.nb} blocks are not free"))
        return v

    def _account(self, n: int, pre: SchedState, post: SchedState, decoded: list[int]) -> None:
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
                self.findings.append(Finding(n, q, "ping-pong", (
                    f"sequence {q} was preempted at step {n} before it decoded a token since "
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
        if self.record:
            st.free.append(free)
            st.running.append(len(post.running))
            st.waiting.append(len(post.waiting))
            st.preempted.append(len(victims))


def _lens(bm) -> dict[int, int]:
    """A seed-shaped block manager's own token counts (``lens``), as ints."""
    try:
        items = list(bm.lens.items())
    except Exception as exc:  # noqa: BLE001 - the block manager's fault, reported
        raise ObservationError(f"lens cannot be read: {type(exc).__name__}: {exc}") from None
    return {as_int(q, "a sequence id in lens"): as_int(n, f"lens[{q!r}]") for q, n in items}


def run_workload(factory, requests: list[Request], num_blocks: int, block_size: int,
                 watermark: int, timeout: float | None = 10.0, record: bool = False,
                 block_manager=None, out_of_blocks: type[BaseException] | None = None) -> Run:
    """One checked run. Raises ``TargetError`` when the scheduler or its block manager
    (``block_manager``, see ``resolve_block_manager``) cannot be built."""
    return _Harness(factory, requests, num_blocks, block_size, watermark, timeout, record,
                    block_manager, out_of_blocks).run()



# -- shrinking -------------------------------------------------------------------------
@dataclass
class Shrunk:
    requests: list[Request]
    num_blocks: int
    run: Run
    tries: int
    complete: bool  # False if the budget ran out before a fixpoint


def shrink(factory, requests: list[Request], num_blocks: int, block_size: int, watermark: int,
           key: tuple[str, str], timeout: float | None = 10.0, budget: float = 30.0,
           progress=None, block_manager=None,
           out_of_blocks: type[BaseException] | None = None) -> Shrunk:
    """A smaller workload failing the same way (same violation kind and rule).

    Greedy to a fixpoint: drop chunks of requests (halving down to one), lower
    each ``max_new`` and ``prompt`` (halving, then by one), move arrivals
    earlier, lower the pool size, renumber ids from 0. 1-minimal when
    ``complete``: no single such change still fails the same way.
    """
    deadline = time.monotonic() + budget
    tries = 0
    best = list(requests)
    nb = num_blocks
    best_run: Run | None = None
    run = functools.partial(run_workload, block_manager=block_manager, out_of_blocks=out_of_blocks)

    def fails(reqs, blocks) -> Run | None:
        nonlocal tries
        tries += 1
        if progress is not None:  # candidates tried, requests in the smallest failing workload
            progress(tries, len(best))
        if not reqs or any(not fits(r, blocks, block_size, watermark) for r in reqs) \
                or watermark >= blocks:
            return None
        try:
            r = run(factory, reqs, blocks, block_size, watermark, timeout)
        except TargetError:
            return None
        return r if r.violation is not None and r.violation.key == key else None

    best_run = fails(best, nb)
    if best_run is None:  # not reproducible: keep as found
        r = run(factory, best, nb, block_size, watermark, timeout)
        return Shrunk(best, nb, r, tries, False)

    def candidates(reqs, blocks):
        n = len(reqs)
        size = n // 2 or 1
        while size >= 1:
            for i in range(0, n, size):
                cut = reqs[:i] + reqs[i + size:]
                if cut:
                    yield cut, blocks
            if size == 1:
                break
            size //= 2
        for i, r in enumerate(reqs):
            for field_ in ("max_new", "prompt", "arrival"):
                val = getattr(r, field_)
                low = 0 if field_ == "arrival" else 1
                for new in dict.fromkeys((low, val // 2, val - 1)):
                    if low <= new < val:
                        yield reqs[:i] + [_replace(r, field_, new)] + reqs[i + 1:], blocks
        first = min(r.arrival for r in reqs)
        for shift in dict.fromkeys((first, 1)):
            if shift and first >= shift:
                yield [_replace(r, "arrival", r.arrival - shift) for r in reqs], blocks
        if any(r.arrival > 1 for r in reqs):
            yield [_replace(r, "arrival", r.arrival // 2) for r in reqs], blocks
        half = max(watermark + 1, blocks // 2)
        if half < blocks:  # the whole scope at half scale
            yield [Request(r.seq, -(-r.prompt // 2), -(-r.max_new // 2), r.arrival // 2)
                   for r in reqs], half
        for new in dict.fromkeys((blocks // 2, blocks - 1)):
            if watermark < new < blocks:
                yield reqs, new
        ids = {r.seq: i for i, r in enumerate(sorted(reqs, key=lambda r: (r.arrival, r.seq)))}
        renumbered = [Request(ids[r.seq], r.prompt, r.max_new, r.arrival) for r in reqs]
        if renumbered != reqs:
            yield renumbered, blocks

    complete = False
    while time.monotonic() < deadline:
        for reqs, blocks in candidates(best, nb):
            if time.monotonic() >= deadline:
                break
            r = fails(reqs, blocks)
            if r is not None:
                best, nb, best_run = reqs, blocks, r
                break
        else:
            complete = True
            break
    final = run(factory, best, nb, block_size, watermark, timeout, record=True)
    return Shrunk(best, nb, final, tries, complete)


def _replace(r: Request, name: str, value: int) -> Request:
    d = r.to_json()
    d[name] = value
    return Request(**d)


# -- verify ----------------------------------------------------------------------------
@dataclass
class Result:
    verdict: str  # "pass" | "fail"
    label: str
    workloads: int  # workloads run
    steps: int
    seconds: float
    violation: Violation | None = None
    workload: list[Request] | None = None  # the (shrunk) failing workload
    num_blocks: int = 0
    log: list[dict] = field(default_factory=list)
    minimal: str = ""
    original_requests: int = 0
    findings: list[Finding] = field(default_factory=list)
    stats: Stats | None = None
    block_manager: str = "reference"  # the block manager driven (its label)

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "target": self.label,
            "block_manager": self.block_manager,
            "workloads": self.workloads,
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "violation": None if self.violation is None else self.violation.to_json(),
            "workload": None if self.workload is None else [r.to_json() for r in self.workload],
            "num_blocks": self.num_blocks,
            "minimal": self.minimal,
            "original_requests": self.original_requests,
            "steps_log": self.log,
            "pingpongs": len(self.findings),
            "findings": [f.to_json() for f in self.findings[:20]],
        }


def verify(target="reference", num_blocks: int = 16, block_size: int = 4, watermark: int = 1,
           requests: int = 12, seed: int = 0, workloads: int = 20, timeout: float | None = 10.0,
           do_shrink: bool = True, shrink_budget: float = 30.0, progress=None,
           shrink_progress=None, block_manager=None,
           out_of_blocks: type[BaseException] | None = None) -> Result:
    """Check ``target`` on ``workloads`` seeded workloads (seeds ``seed``, ``seed + 1``...),
    driving the block manager ``block_manager`` (see ``resolve_block_manager``);
    ``progress(done)`` told of the workloads run, ``shrink_progress(tries, requests)`` of the
    shrinking."""
    from kvcheck.models.scheduler.workload import generate

    label, factory = resolve(target)
    bm_label, bm = resolve_block_manager(block_manager, factory, label)
    check = functools.partial(run_workload, block_manager=bm, out_of_blocks=out_of_blocks)
    start = time.perf_counter()
    steps = 0
    findings: list[Finding] = []
    for i in range(workloads):
        reqs = generate(seed + i, requests, num_blocks, block_size, watermark,
                        arrival_steps=2 * requests)
        run = check(factory, reqs, num_blocks, block_size, watermark, timeout)
        if progress is not None:
            progress(i + 1)
        steps += run.stats.steps
        findings.extend(run.findings)
        if run.violation is None:
            continue
        if do_shrink:
            s = shrink(factory, reqs, num_blocks, block_size, watermark, run.violation.key,
                       timeout, shrink_budget, shrink_progress, bm, out_of_blocks)
            how = ("1-minimal: dropping any request, shortening any prompt or output, moving any "
                   "arrival earlier, shrinking the pool by a block or halving the whole scope "
                   "stops it failing this way"
                   if s.complete else budget_ran_out(shrink_budget, len(s.requests), "request"))
            return Result("fail", label, i + 1, steps, time.perf_counter() - start,
                          s.run.violation, s.requests, s.num_blocks, s.run.log, how, len(reqs),
                          findings, s.run.stats, bm_label)
        rec = check(factory, reqs, num_blocks, block_size, watermark, timeout, record=True)
        return Result("fail", label, i + 1, steps, time.perf_counter() - start, rec.violation,
                      reqs, num_blocks, rec.log, "not shrunk", len(reqs), findings, rec.stats,
                      bm_label)
    return Result("pass", label, workloads, steps, time.perf_counter() - start, findings=findings,
                  block_manager=bm_label)


def render(result: Result, block_size: int, watermark: int) -> str:
    """A failing result as plain English: the workload, each step, the broken rule."""
    v = result.violation
    lines = [f"Counterexample: {result.label} on {result.num_blocks} blocks of {block_size} "
             f"slots, watermark {watermark}, {len(result.workload or [])} request(s):"]
    for r in result.workload or []:
        lines.append(f"  request {r.seq}: prompt {r.prompt}, {r.max_new} new token(s), "
                     f"arrives before step {r.arrival + 1}")
    for e in result.log:
        mark = ">>" if v is not None and e["step"] == v.step else "  "
        lines.append(f"{mark} step {e['step']}: {e['before']}  -> decoded {e['decoded']} -> "
                     f"{e['after']}")
    if v is not None:
        lines.append(f"VIOLATION at step {v.step} ({v.kind}): {v.name}"
                     + ("" if v.element is None else f" [{v.element}]"))
        if v.witness:
            lines.append(f"  what happened: {v.witness}")
        if v.doc:
            lines.append(f"  the rule: {v.doc}")
    if result.minimal:
        lines.append(f"  minimal: {result.minimal}")
    return "\n".join(lines)
