"""The command line's supervisor: every check runs in a child process, so kvcheck always reports.

Inside one process a target can still end the run in ways no exception handler
sees: ``os._exit`` from a thread, a crash in C code, the kernel's OOM killer, a
loop in C that holds the interpreter lock so no timeout can interrupt it, or a
``print`` into kvcheck's own output. So each command that runs target code
(``SUPERVISED``) runs in a forked child, and the parent only watches:

* in the child, file descriptor 1 is pointed at stderr (the target's output,
  Python's or C's, lands there) and kvcheck writes its own output to the
  original stdout through a saved descriptor, so ``--json`` stays one object;
* the child's watchdog reports the calls it starts and whether one is in
  flight through a shared page (``kvcheck.watchdog.HEARTBEAT``); a call in
  flight for longer than ``2 x --timeout + GRACE`` seconds of the child's own
  time (``kvcheck.check.clock``: the wall clock less the time a loaded machine
  kept it waiting for a core) gets the child killed: a hang the child's own
  timeout could not break;
* the child writes its exit code to a pipe when its command returned. A
  child that ends without writing it ended because of the target.

Then the parent reports a violation (exit 1; exit 2 when the target could not
even be imported or built) saying how the process ended and where: it re-runs
the same command, deterministic from its seed, in a second child that reports
every phase and operation before it runs it (``kvcheck.watchdog.RECORDER``), and
names the last one. For ``verify`` that record is the counterexample trace
(not shrunk: each replay would need a process of its own): the record of the target
run (each build starts one: the search's, then each replay while shrinking) that ended
the process, or, when the search's run had ended with a violation and a replay while
shrinking it ended the process, that violation on the search's operations. A re-run that does
not end the same way is said to be so; no verdict is ever printed for a run
that did not finish.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field

from kvcheck.check import recording
from kvcheck.check.recording import Recorder

SUPERVISED = frozenset({"verify", "verify-prefix", "verify-scheduler", "verify-device", "verify-hybrid",
                        "verify-tiers", "verify-engine",
                        "prove",
                        "replay"})
GRACE = 5.0  # seconds beyond twice the timeout before a stuck child is killed
FORWARD_AFTER = 1.0  # seconds after a Ctrl-C this process got before it hands it to the child
REPORT_GRACE = 5.0  # seconds the child then has to say how far it got
_FILE_FLAGS = ("trace_out", "junit", "pytest_out", "output")


def available() -> bool:
    return hasattr(os, "fork") and os.environ.get("KVCHECK_NO_SUPERVISOR", "") in ("", "0")


@dataclass
class Ending:
    """How a child ended without reporting: its status, and what it was doing."""

    status: str  # "exit status 0", "killed by signal SIGSEGV", "killed: a call hung"
    hung: bool = False
    records: list[dict] = field(default_factory=list)  # from the recording re-run
    reproduced: bool = False  # the re-run ended the same way
    call: int = 0  # the number of the call in flight, by the child's last heartbeat

    def last(self, kind: str) -> dict | None:
        return next((r for r in reversed(self.records) if r["r"] == kind), None)

    def phase(self) -> str:
        """What the target was doing when the process ended, in words."""
        last = self.records[-1] if self.records else None
        if last is None:
            return "before kvcheck could say what it was doing"
        if last["r"] == "phase":
            return {"import": "while being imported", "build": "while being built"}.get(
                last["name"], f"during {last['name']}")
        if last["r"] == "op":
            return f"during operation {last['step']}: {last['text']}"
        return f"after operation {last['step']} ({last['text']}), while kvcheck observed it"

    def in_setup(self) -> bool:
        last = self.records[-1] if self.records else None
        return last is not None and last["r"] == "phase" and last["name"] in ("import", "build")


class PipeRecorder(Recorder):
    """Reports every phase and operation of a run to a file descriptor, as it happens."""

    def __init__(self, fd: int):
        super().__init__(_blocks_model)
        self.fd = fd

    def send(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def _blocks_model():
    from kvcheck.models.blocks import MODEL

    return MODEL


def run(args, entry) -> int:
    """Run ``entry(args) -> exit code`` in a supervised child; its exit code, or the report
    of how the target ended it."""
    timeout = getattr(args, "timeout", None) or 10.0
    code, ending = _child(entry, args, timeout, record=False)
    if ending is None:
        return code
    # Ended by the target: re-run, recording, to say where (a call that hung is killed as
    # soon as the re-run is in it again: a hang costs one wait, not two).
    quiet = _without_files(args)
    _, again = _child(entry, quiet, timeout, record=True, kill_at=ending.call if ending.hung else None)
    if again is not None:
        ending.records, ending.reproduced = again.records, True
    return report(args, ending)


def _without_files(args):
    """``args`` for the recording re-run: it writes no file the user asked for."""
    import copy

    quiet = copy.copy(args)
    for name in _FILE_FLAGS:
        if getattr(quiet, name, None) is not None and name != "output":
            setattr(quiet, name, None)
    return quiet


def _child(entry, args, timeout: float, record: bool,
           kill_at: int | None = None) -> tuple[int, Ending | None]:
    beat = mmap.mmap(-1, mmap.PAGESIZE)
    status_r, status_w = os.pipe()
    rec_r, rec_w = os.pipe() if record else (None, None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(status_r)
        if rec_r is not None:
            os.close(rec_r)
        _run_child(entry, args, beat, status_w, rec_w)
    os.close(status_w)
    if rec_w is not None:
        os.close(rec_w)

    def terminated(signum, frame):  # the parent is told to stop: so is the child
        os.kill(pid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return _watch(pid, beat, status_r, rec_r, timeout, kill_at)
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(status_r)
        if rec_r is not None:
            os.close(rec_r)
        beat.close()


def _run_child(entry, args, beat, status_w: int, rec_w: int | None) -> None:
    from kvcheck.check import interrupts, watchdog
    from kvcheck.check.processes import die_with_parent

    code = 3
    try:
        die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (the parent defers its own)
        interrupts.clear()
        watchdog.supervised_child(beat)
        own = os.dup(1)
        os.dup2(2, 1)  # the target's output, at any level, goes to stderr
        if rec_w is not None:  # the recording re-run: silent, reports every step instead
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.dup2(null, own)
            watchdog.RECORDER = PipeRecorder(rec_w)
        sys.stdout = io.TextIOWrapper(io.FileIO(own, "w", closefd=True), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        code = entry(args)
    except SystemExit as exc:  # argparse and friends
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - the entry point reports its own errors; this is a last resort
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os.write(status_w, f"rc {code}\n".encode())
        os._exit(code if isinstance(code, int) else 3)


def _watch(pid: int, beat, status_r: int, rec_r: int | None, timeout: float,
           kill_at: int | None) -> tuple[int, Ending | None]:
    from kvcheck.check import interrupts
    from kvcheck.check.clock import OwnClock
    from kvcheck.check.watchdog import read_heartbeat

    kill_after = 2 * timeout + GRACE
    asked, forwarded = None, False  # the user's Ctrl-C, as this process deferred it
    own = OwnClock(pid)  # the child's main thread's own time: load is never a hang
    seen, since = None, own()
    status, records, partial = b"", [], b""
    hung = False
    open_fds = [status_r] + ([rec_r] if rec_r is not None else [])
    try:
        while status_r in open_fds:
            ready, _, _ = select.select(open_fds, [], [], 0.25)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == status_r:
                    status += chunk
                else:
                    partial += chunk
                    *lines, partial = partial.split(b"\n")
                    records += [json.loads(x) for x in lines if x]
            if asked is None and interrupts.requested():
                asked = time.monotonic()
            if asked is not None:
                waited = time.monotonic() - asked
                if not forwarded and waited > FORWARD_AFTER:  # not the terminal's: the child
                    forwarded = True  # never got it (a terminal's Ctrl-C reaches both)
                    os.kill(pid, signal.SIGINT)
                elif waited > FORWARD_AFTER + REPORT_GRACE:  # it said nothing: it is stopped
                    _reap(pid, wait=0.0)
                    return 130, None
            now = own()
            state = read_heartbeat(beat)
            if state != seen:
                seen, since = state, now
            elif state[1] and (now - since > kill_after or state[0] == kill_at):
                hung = True
                os.kill(pid, signal.SIGKILL)
                since, kill_at = now, None
        while rec_r in open_fds:  # the rest of what the recording child reported
            chunk = os.read(rec_r, 65536)
            if not chunk:
                break
            partial += chunk
        records += [json.loads(x) for x in partial.split(b"\n") if x]
    except KeyboardInterrupt:  # the user's Ctrl-C: the child got it too and reports itself
        _reap(pid, wait=2.0)
        return 130, None
    _, raw = os.waitpid(pid, 0)
    text = status.decode(errors="replace")
    if text.startswith("rc "):
        return int(text.split()[1]), None
    if hung:
        how = (f"killed: one call stayed in flight for over {kill_after:g} s (twice the timeout "
               f"plus {GRACE:g} s) and could not be interrupted")
    elif os.WIFSIGNALED(raw):
        how = f"killed by signal {signal.Signals(os.WTERMSIG(raw)).name}"
    else:
        how = f"exit status {os.WEXITSTATUS(raw)}"
    return 1, Ending(how, hung, records, call=seen[0] if seen else 0)


def _reap(pid: int, wait: float) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


# -- the report ---------------------------------------------------------------------------
def report(args, ending: Ending) -> int:
    """Say how the target ended the run: a violation (exit 1), or bad input while it was
    being imported or built (exit 2)."""
    target = getattr(args, "target", None) or "the target"
    where = ending.phase() if ending.reproduced else (
        "(a re-run with the same seed did not end the same way, so where is unknown)")
    what = "hung" if ending.hung else "ended the process"
    if ending.reproduced and ending.in_setup():
        print(f"kvcheck: error: target {target} {what} {where} ({ending.status})", file=sys.stderr)
        return 2
    if args.command == "verify" and ending.reproduced:
        return _report_verify(args, ending, what)
    witness = f"the target {what} {where} ({ending.status})"
    if getattr(args, "json", False):
        json.dump({"verdict": "fail", "target": target, "error": witness,
                   "violation": {"kind": "hang" if ending.hung else "crash", "name": "process",
                                 "witness": witness}}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"FAIL {target}: {witness}; the run did not finish, so there is no verdict "
              f"beyond this")
    return 1


def _report_verify(args, ending: Ending, what: str) -> int:
    from kvcheck.check.trace import Trace
    from kvcheck.check.violation import Violation
    from kvcheck.cli.commands.verify import report as verify_report
    from kvcheck.models.blocks import MODEL
    from kvcheck.verify import Result

    runs = recording.runs(ending.records)
    why = "hung beyond interruption" if ending.hung else "ended the process"
    found = recording.found(runs)
    if found is not None:
        # The run itself ended with a violation, and a replay while shrinking it ended the
        # process: report what the run found, on the run's own operations.
        v = Violation.from_json(found)
        v.step = sum(r["r"] == "op" for r in runs[0])
        ops = recording.ops_of(runs[0], MODEL)
        trace = None
        if not ending.hung:  # each replay in a process of its own; one that crashes is not it
            trace = _shrunk_in_processes(args, None, ops, v)
        if trace is None:
            note = (f"not shrunk: while shrinking, a replay ended the process "
                    f"({ending.status} {ending.phase()}), so every replay would need a "
                    f"process of its own" + (" and a hang's would each wait out the timeout"
                                             if ending.hung else "") + "; the trace is the run's")
            trace = Trace(args.target, args.blocks, args.block_size, ops, v, args.seed, [], note)
        return verify_report(args, Result("fail", v.step, 0.0, v, trace, len(ops)))
    run = runs[-1] if runs else []
    ops, last = recording.ops_of(run, MODEL), next((r for r in reversed(run) if r["r"] == "op"), None)
    kind = "hang" if ending.hung else "crash"
    name = ops[-1].kind if ops and last is not None else "process"
    witness = f"the target {what} {ending.phase()} ({ending.status})"
    step = sum(r["r"] == "op" for r in run) if last is not None else 0
    v = Violation(step, kind, name, witness=witness)
    trace = None
    if kind == "crash" and ops and last is not None and not getattr(args, "no_shrink", False):
        trace = _shrunk_in_processes(args, ending, ops, v)
    if trace is None:
        trace = Trace(args.target, args.blocks, args.block_size, ops, v, args.seed, [],
                      f"not shrunk: the target {why}, so every replay would need a process of "
                      f"its own" + ("; a hang's would each wait out the timeout"
                                    if ending.hung else ""))
    result = Result("fail", step, 0.0, v, trace, len(ops))
    return verify_report(args, result)


# -- shrinking a crash that ends the process: every replay in a process of its own ---------
def _shrunk_in_processes(args, ending: Ending | None, ops: list, v):
    """The counterexample of ``v``, shrunk like any other violation (``kvcheck.check.shrink``,
    the same budget) with every replay in a supervised child of its own. ``ending``: ``v``
    is a crash that ended the process (a signal, an exit), and a candidate fails the same way
    when its child ends the same way (``Ending.status``) during an operation of the same
    kind; None: ``v`` is a violation the run found (a replay while shrinking it ended the
    process), and a candidate fails the same way when its child finds it (one that ends
    the process does not). None when the recorded operations do not fail so again."""
    from kvcheck.check.model import Options
    from kvcheck.check.shrink import counterexample
    from kvcheck.cli.commands.common import shrink_budget
    from kvcheck.models.blocks import MODEL
    from kvcheck.models.blocks.model import BlockScope

    def replayer(model, factory, scope, cand, options, record=False):
        return _replay_in_child(args, ending, model, scope, cand, options, record)

    scope = BlockScope(args.blocks, args.block_size)
    options = Options(mode="full", timeout=args.timeout, seed=args.seed,
                      allow=frozenset(getattr(args, "allow", None) or ()))
    first = _replay_in_child(args, ending, MODEL, scope, ops, options)
    if first.violation is None or first.violation.key != v.key:
        return None
    trace = counterexample(MODEL, args.target, None, scope, first.ops, first.violation,
                           args.seed, options, budget=shrink_budget(args), replayer=replayer)
    trace.minimality += ("; each replay ran in a process of its own (the target can end the "
                         "process)")
    return trace


def _replay_in_child(args, ending: Ending | None, model, scope, cand: list, options,
                     record: bool = False):
    """``kvcheck.check.run.replay`` of ``cand`` in a supervised child. With ``ending``: a
    ``Replay`` whose violation is the crash at the operation in flight when the child ended
    the way ``ending`` did, else none (a candidate that no longer ends the process fails no
    way the shrinker counts). Without: the child's own ``Replay`` when it finished, none
    when it ended the process."""
    import dataclasses
    import os
    import pickle
    import tempfile

    from kvcheck.check.run import Replay
    from kvcheck.check.violation import Violation

    fd, path = tempfile.mkstemp(prefix="kvcheck-replay-")
    os.close(fd)

    def entry(a) -> int:
        from kvcheck.check.run import replay
        from kvcheck.targets.loading import load_exception, resolve

        _, factory = model.resolve(a.target) or resolve(a.target)
        oob = load_exception(a.out_of_blocks) if getattr(a, "out_of_blocks", None) else None
        r = replay(model, factory, scope, cand, dataclasses.replace(options, out_of_blocks=oob),
                   record=record)
        with open(path, "wb") as f:
            pickle.dump(r, f)
        return 0

    try:
        _, again = _child(entry, _without_files(args), args.timeout or 10.0, record=True)
        if again is None and ending is None:
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            except Exception:  # noqa: BLE001 - a result that cannot be read back: not it
                return Replay(None, cand)
    finally:
        os.unlink(path)
    if again is None or ending is None:  # finished, or ended the process: not this failure
        return Replay(None, cand)
    if again.hung or again.status != ending.status or again.in_setup():
        return Replay(None, cand)
    run = recording.runs(again.records)
    ran = recording.ops_of(run[-1], model) if run else []
    if not ran:
        return Replay(None, cand)
    witness = f"the target ended the process {again.phase()} ({again.status})"
    return Replay(Violation(len(ran), "crash", ran[-1].kind, witness=witness), ran)

