"""One run of a campaign: checked in a process of its own, watched from outside.

``execute(spec)`` is the run itself, in this process: ``kvcheck.verify.verify`` (the
scheduler: its own ``verify`` of one workload) with the drawn scope and mix, outcome
classes counted (``kvcheck.campaign.coverage``), the shrunk counterexample as a trace of
the one format. It returns a small JSON result.

A target can end the process it runs in (``os._exit`` from a thread, a segfault, the OOM
killer) or wedge it (a loop in C that holds the interpreter lock). So every run runs in a
forked child (``Watched``): the child's watchdog reports its calls on a shared page
(``kvcheck.check.watchdog.HEARTBEAT``), and a call in flight for longer than twice the
timeout plus ``GRACE`` gets the child killed. A child that ends without sending its result
ended because of the target: the same run is re-run in a second child that reports every
phase and operation as it happens (``watchdog.RECORDER``), and the result is that run's
finding: a crash or a hang, with the operations up to it as a trace (not shrunk: every
replay would need a process of its own). The process that watches (the campaign's, a Ray
worker's) never runs target code.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
import time
from multiprocessing.connection import wait as wait_for

from kvcheck.campaign.coverage import Counter
from kvcheck.campaign.plan import RunSpec
from kvcheck.check import recording, watchdog
from kvcheck.check.clock import OwnClock
from kvcheck.check.processes import die_with_parent
from kvcheck.check.recording import Recorder

GRACE = 5.0  # seconds beyond twice the timeout before a stuck call's process is killed
POLL = 0.25  # seconds between looks at a child's heartbeat
BEHIND = 19  # the niceness added to a run started beside the campaign's first run


def renice(pid: int, added: int) -> bool:
    """Set process ``pid``'s niceness to this process's plus ``added`` (at most 19); whether
    the system allowed it (raising a priority back needs CAP_SYS_NICE or RLIMIT_NICE)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + added))
    except (OSError, AttributeError):
        return False
    return True


def can_restore() -> bool:
    """Whether this process may raise a child's priority back to its own (Linux: the
    CAP_SYS_NICE capability, or an RLIMIT_NICE that allows its niceness)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft == resource.RLIM_INFINITY or 20 - soft <= os.getpriority(os.PRIO_PROCESS, 0):
            return True
        with open("/proc/self/status", encoding="ascii") as f:
            caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
        return bool(int(caps, 16) >> 23 & 1)  # CAP_SYS_NICE
    except (OSError, ValueError, AttributeError, ImportError):
        return False


PRELOAD = {  # kvcheck's own modules a run of each model needs (never the target's)
    "blocks": ("kvcheck.verify", "kvcheck.models.blocks.oracle"),
    "prefix": ("kvcheck.verify", "kvcheck.models.prefix.model", "kvcheck.models.prefix.oracle"),
    "device": ("kvcheck.verify", "kvcheck.models.device.model", "kvcheck.models.device.oracle"),
    "scheduler": ("kvcheck.models.scheduler.runs", "kvcheck.models.scheduler.oracle"),
    "hybrid": ("kvcheck.verify", "kvcheck.models.hybrid.model", "kvcheck.models.hybrid.oracle"),
    "engine": ("kvcheck.verify", "kvcheck.models.engine.model", "kvcheck.models.engine.oracle",
               "kvcheck.models.engine.loading"),
}
_COMMON = ("kvcheck.check.shrink", "kvcheck.check.explore", "kvcheck.check.trace",
           "kvcheck.campaign.coverage")


def preload(model: str) -> None:
    """Import what a run of ``model`` needs once, in the process that forks the runs, so that
    no run pays for it (the spec is compiled at import)."""
    import importlib

    for name in (*PRELOAD.get(model, ()), *_COMMON):
        importlib.import_module(name)


def execute(spec: RunSpec) -> dict:
    """Check one run in this process: its result (``verdict`` pass, fail, refused: the
    target refused the drawn shape, or bad-target: it cannot be imported at all)."""
    from kvcheck.check.model import model_named
    from kvcheck.check.watchdog import Watchdog
    from kvcheck.impl.errors import StandInGap
    from kvcheck.targets.loading import TargetError, load_exception, resolve

    start = time.perf_counter()
    out = {"run": spec.run, "verdict": "pass", "ops": 0, "seconds": 0.0, "coverage": None,
           "capabilities": None, "violation": None, "trace": None, "original_length": 0}
    model = model_named(spec.model)
    try:  # importing the target (target code too): a failure here is the campaign's bad input
        with Watchdog(spec.timeout):
            if spec.model == "scheduler":
                from kvcheck.models.scheduler.loading import resolve as resolve_scheduler
                from kvcheck.models.scheduler.loading import resolve_block_manager

                label, factory = resolve_scheduler(spec.target)
                resolve_block_manager(spec.block_manager, factory, label)
            else:
                model.resolve(spec.target) or resolve(spec.target)
            if spec.out_of_blocks:
                load_exception(spec.out_of_blocks)
    except TargetError as exc:
        return {**out, "verdict": "bad-target", "error": str(exc)}
    counter = Counter(spec.model)
    try:
        if spec.model == "scheduler":
            r = _scheduler(spec)
            ops, trace, original = r.steps, r.trace, r.original_requests
        else:
            r = _verify(spec, model, counter)
            ops, trace, original = r.ops, r.trace, r.original_length
    except (TargetError, StandInGap) as exc:  # this shape, or nothing ran: not a verdict
        return {**out, "verdict": "refused", "error": str(exc),
                "seconds": time.perf_counter() - start}
    counter.counterexample(trace)
    out.update(verdict="pass" if r.ok else "fail", ops=ops, original_length=original,
               seconds=time.perf_counter() - start,
               coverage=counter.result(getattr(r, "state", None)),
               coverage_notes=counter.notes(),
               capabilities=counter.capabilities, vacuous=_vacuous(r))
    if trace is not None:
        v = trace.violation
        out["violation"] = {"kind": v.kind, "name": v.name, "witness": v.witness}
        out["trace"] = trace.to_json()
    return out


def _vacuous(result) -> dict | None:
    """The checks this run's target made vacuous (``kvcheck.targets.vacuity``), as
    ``kvcheck verify`` lists them; None where there are none or no target to ask."""
    from kvcheck.targets import vacuity

    try:
        return vacuity.of_result(result) or None
    except Exception:  # noqa: BLE001 - a bad declaration failed the run already, at its start
        return None


# Set in a watched child: told once, when the run found a violation and starts shrinking it
# (the campaign may then pause the runs beside it: see ``pools.LocalPool.shrinking``).
_TELL_SHRINKING = None


def _shrinking(attempts: int, length: int) -> None:
    """``shrink_progress``: the first call tells the watching process that shrinking began."""
    global _TELL_SHRINKING
    tell, _TELL_SHRINKING = _TELL_SHRINKING, None
    if tell is not None:
        tell()


def _verify(spec: RunSpec, model, counter: Counter):
    from kvcheck.targets.loading import load_exception
    from kvcheck.verify import verify

    oob = load_exception(spec.out_of_blocks) if spec.out_of_blocks and spec.model != "device" \
        else None
    s = spec.scope
    return verify(spec.target, s["num_blocks"], s["block_size"], spec.ops, spec.seed, oob,
                  spec.timeout, shrink_budget=spec.shrink_budget(), shrink_progress=_shrinking,
                  model=spec.model, scope=model.scope_from_json(s),
                  extra={**spec.extra, "watch": counter.watch})


def _scheduler(spec: RunSpec):
    from kvcheck.models.scheduler.runs import verify

    s = spec.scope
    return verify(spec.target, s["num_blocks"], s["block_size"], s["watermark"], spec.ops,
                  spec.seed, spec.extra.get("workloads", 1), spec.timeout,
                  shrink_budget=spec.shrink_budget(), shrink_progress=_shrinking,
                  block_manager=spec.block_manager, out_of_blocks=spec.out_of_blocks)


# -- the child process ----------------------------------------------------------------------
class _Recorder(Recorder):
    """Sends every phase and operation of the run to the watching process as it happens."""

    def __init__(self, conn, model):
        super().__init__(model)
        self.conn = conn

    def send(self, record: dict) -> None:
        self.conn.send(("record", record))


def _child(conn, spec_json: dict, record: bool, beat, log: str | None) -> None:
    """The child: run the spec, send its result, end without running anything else."""
    global _TELL_SHRINKING
    code = 0
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the campaign's Ctrl-C is the parent's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd = os.open(log or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)  # the target's output, at any level, goes to the log
        os.dup2(fd, 2)
        from kvcheck.check.model import model_named

        watchdog.supervised_child(beat)
        spec = RunSpec.from_json(spec_json)
        if record:
            watchdog.RECORDER = _Recorder(conn, model_named(spec.model))
        _TELL_SHRINKING = lambda: conn.send(("shrinking", None))  # noqa: E731
        if "torch" in sys.modules:  # one core per run: the campaign runs one per core
            sys.modules["torch"].set_num_threads(1)
        try:
            result = execute(spec)
        except Exception as exc:  # noqa: BLE001 - a bug in kvcheck: reported, never a traceback
            from kvcheck.errors import describe_exception

            result = {"run": spec.run, "verdict": "error",
                      "error": f"internal error: {describe_exception(exc)}"}
        import platform

        result["worker"] = f"{platform.node()}:{os.getppid()}"  # the process that watched it
        conn.send(("result", result))
        conn.close()
    except BaseException:  # noqa: BLE001 - nothing more to say: the parent sees no result
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def _context():
    import multiprocessing

    return multiprocessing.get_context("fork")


class _Child:
    """One forked child running one spec, with its heartbeat and messages."""

    def __init__(self, spec: RunSpec, record: bool, log: str | None, kill_at: int | None = None,
                 nice: int = 0):
        self.beat = mmap.mmap(-1, mmap.PAGESIZE)
        ctx = _context()
        self.conn, w = ctx.Pipe(duplex=False)
        sys.stdout.flush()
        sys.stderr.flush()
        self.proc = ctx.Process(target=_child, args=(w, spec.to_json(), record, self.beat, log),
                                daemon=True)
        self.proc.start()
        if nice:
            renice(self.proc.pid, nice)
        w.close()
        self.records: list[dict] = []
        self.result: dict | None = None
        self.shrinking_since: float | None = None  # when it told it shrinks what it found
        self.paused = False  # stopped (SIGSTOP) while a run beside it shrinks
        self.ended = False
        self.hung = False
        self.kill_at = kill_at
        # a stuck call is timed in the child's own time (kvcheck.check.clock): a niced run
        # beside others waits for a core, and that wait is never a hang
        self.own = OwnClock(self.proc.pid)
        self.seen, self.since = None, self.own()
        self.kill_after = 2 * (spec.timeout or 10.0) + GRACE

    def pump(self) -> None:
        """Read what the child sent; notice its end; kill it if a call is stuck. A stopped
        child is not read (a message it was stopped in the middle of would never end)."""
        from kvcheck.check.watchdog import read_heartbeat

        if self.paused:  # nor is its call in flight stuck
            self.since = self.own()
            return
        try:
            while not self.ended and self.conn.poll():
                kind, data = self.conn.recv()
                if kind == "record":
                    self.records.append(data)
                elif kind == "shrinking":
                    self.shrinking_since = time.monotonic()
                else:
                    self.result = data
        except (EOFError, OSError):
            self.ended = True
        if self.ended:
            self.proc.join()
            return
        now = self.own()
        state = read_heartbeat(self.beat)
        if state != self.seen:
            self.seen, self.since = state, now
        elif state[1] and (now - self.since > self.kill_after or state[0] == self.kill_at):
            self.hung = True
            self.kill()

    def kill(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass

    def pause(self, paused: bool) -> None:
        """Stop the child (SIGSTOP) or let it go on (SIGCONT); its hang clock starts again
        when it goes on."""
        if paused == self.paused:
            return
        try:
            os.kill(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except (ProcessLookupError, TypeError):
            return
        self.paused = paused
        self.since = self.own()

    def status(self) -> str:
        """How the child ended, in words."""
        if self.hung:
            return (f"killed: one call stayed in flight for over {self.kill_after:g} s (twice the "
                    f"timeout plus {GRACE:g} s) and could not be interrupted")
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"

    def close(self) -> None:
        self.conn.close()
        self.beat.close()


class Watched:
    """One run, watched: the run in a child; if the target ends that child, the recording
    re-run in a second one; then the result (``pump`` returns it once there is one).
    ``nice``: added to the children's niceness until ``restore``."""

    def __init__(self, spec: RunSpec, log: str | None = None, nice: int = 0):
        self.spec, self.log, self.nice = spec, log, nice
        self.started = time.monotonic()
        self.child = _Child(spec, record=False, log=log, nice=nice)
        self.paused = False
        self.first: _Child | None = None  # the child the target ended, while re-running

    @property
    def conn(self):
        return self.child.conn

    def pump(self) -> dict | None:
        c = self.child
        c.pump()
        if not c.ended:
            return None
        c.close()
        if c.result is not None and self.first is None:
            return c.result
        if self.first is None:  # the target ended the run: re-run it, recording
            self.first = c
            self.child = _Child(self.spec, record=True, log=self.log, nice=self.nice,
                                kill_at=c.seen[0] if c.hung and c.seen else None)
            self.child.pause(self.paused)
            return None
        return died(self.spec, self.first, c, time.monotonic() - self.started)

    @property
    def shrinking_since(self) -> float | None:
        """Since when (``time.monotonic``) the run has been shrinking the violation it
        found; None while it has found none."""
        return self.child.shrinking_since

    def pause(self, paused: bool) -> None:
        """Stop the run's process, or let it go on (``_Child.pause``)."""
        self.paused = paused
        self.child.pause(paused)

    def restore(self) -> None:
        """Back to this process's priority (from ``nice``)."""
        if self.nice:
            self.nice = 0
            renice(self.child.proc.pid, 0)

    def kill(self) -> None:
        self.child.kill()
        self.child.proc.join()
        self.child.close()


def died(spec: RunSpec, first: _Child, again: _Child, seconds: float) -> dict:
    """The result of a run whose process the target ended (``first``), from the recording
    re-run (``again``): a crash or a hang, with the operations up to it as a trace."""
    what = "hung" if first.hung else "ended the process"
    out = {"run": spec.run, "verdict": "fail", "ops": 0, "seconds": seconds, "coverage": None,
           "capabilities": None, "trace": None, "original_length": 0, "process": first.status()}
    if again.result is not None:  # it finished this time: where is unknown
        witness = (f"the target {what} ({first.status()}); a re-run with the same seed did not "
                   f"end the same way, so where is unknown")
        out["violation"] = {"kind": "hang" if first.hung else "crash", "name": "process",
                            "witness": witness}
        return out
    records = again.records
    last = records[-1] if records else None
    if last is not None and last["r"] == "phase" and last["name"] in ("import", "build"):
        where = "while being imported" if last["name"] == "import" else "while being built"
        verdict = "bad-target" if last["name"] == "import" else "refused"
        return {**out, "verdict": verdict, "violation": None,
                "error": f"target {spec.target} {what} {where} ({first.status()})"}
    return {**out, **_recorded(spec, records, first, what)}


def _recorded(spec: RunSpec, records: list[dict], first: _Child, what: str) -> dict:
    """The violation and trace of a run the target ended, from its records."""
    from kvcheck.check.model import model_named
    from kvcheck.check.trace import Trace
    from kvcheck.check.violation import Violation

    model = model_named(spec.model)
    runs = recording.runs(records)
    why = "hung beyond interruption" if first.hung else "ended the process"
    scope = dict(spec.scope)
    nb, bs = scope.pop("num_blocks"), scope.pop("block_size")
    found = recording.found(runs)
    if found is not None:  # the run found a violation; a replay while shrinking it ended
        v = Violation.from_json(found)  # the process: what the run found, on its operations
        v.step = sum(r["r"] == "op" for r in runs[0])
        ops = recording.ops_of(runs[0], model)
        note = (f"not shrunk: while shrinking, a replay {what} ({first.status()}), so every "
                f"replay would need a process of its own; the trace is the run's")
        return _as_result(Trace(spec.target, nb, bs, ops, v, spec.seed, [], note,
                                model=spec.model, extra=scope), ops, v)
    run = (runs or [[]])[-1]  # (the target built last: the run it ended)
    ops = recording.ops_of(run, model)
    last_op = next((r for r in reversed(run) if r["r"] == "op"), None)
    last = records[-1] if records else None
    if last is None:
        where = "before kvcheck could say what it was doing"
    elif last["r"] == "phase":
        where = f"during {last['name']}"
    elif last["r"] == "op":
        where = f"during operation {last['step']}: {last['text']}"
    else:
        where = f"after operation {last['step']} ({last['text']}), while kvcheck observed it"
    kind = "hang" if first.hung else "crash"
    name = ops[-1].kind if ops and last is not None and last["r"] == "op" else "process"
    witness = f"the target {what} {where} ({first.status()})"
    step = last_op["step"] if last_op is not None else 0
    v = Violation(step, kind, name, witness=witness)
    return _as_result(Trace(spec.target, nb, bs, ops, v, spec.seed, [],
                            f"not shrunk: the target {why}, so every replay would need a "
                            f"process of its own", model=spec.model, extra=scope), ops, v)


def _as_result(trace, ops: list, v) -> dict:
    """A run's result fields for violation ``v`` and its trace of ``ops``."""
    try:
        data = trace.to_json()
    except Exception:  # noqa: BLE001 - operations the trace format cannot write: no trace
        data = None
    return {"ops": len(ops), "original_length": len(ops), "trace": data,
            "violation": {"kind": v.kind, "name": v.name, "witness": v.witness}}


def run_watched(spec: RunSpec, log: str | None = None) -> dict:
    """One run, watched, in this process's children: its result (a Ray task's body)."""
    w = Watched(spec, log)
    while True:
        result = w.pump()
        if result is not None:
            return result
        wait_for([w.conn], timeout=POLL)
