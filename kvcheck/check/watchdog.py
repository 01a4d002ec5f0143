"""Running target code: a timeout on every call, and what a target may not do to kvcheck.

Everything kvcheck does with a target (importing it, building it, every
operation together with the observation after it) runs between
``Watchdog.enter()`` and ``Watchdog.leave()``. While a call is inside:

* when it stays in flight longer than ``timeout`` seconds of the main thread's
  *own time* (``kvcheck.check.clock``: the wall clock less the time a loaded machine
  kept it waiting for a core, so that load is never a hang), a daemon thread sends
  SIGUSR1 to the main thread, whose handler raises ``OperationTimeout`` in the
  target's code. It is a ``BaseException``, so a target's ``except
  Exception`` cannot swallow it (one that catches everything is ended by the
  supervisor, ``kvcheck.supervise``);
* ``os._exit`` raises ``TargetExit`` instead of ending the process (``sys.exit``
  raises ``SystemExit`` anyway), so the oracle reports it like any exception;
* in a supervised child process, the target's ``print`` goes to stderr and
  never into kvcheck's own output (``--json`` stays parseable).

While a watchdog is active the user's Ctrl-C raises ``Interrupted`` (a
``KeyboardInterrupt``): a ``KeyboardInterrupt`` that is not one came from the
target and is its misbehaviour, not the user's wish.

``enter``/``leave`` nest (only the outermost pair counts as one call) and cost
two method calls per operation. Timeouts need the main thread (signal handlers
live there); elsewhere the traps still apply, the timer does not.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import threading
import time

from kvcheck.check.clock import OwnClock


class OperationTimeout(BaseException):
    """A call into the target exceeded the per-operation timeout."""


class Interrupted(KeyboardInterrupt):
    """The user pressed Ctrl-C while kvcheck was running a target."""


class TargetExit(BaseException):
    """The target called ``os._exit(code)`` inside a call; raised in its place."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return f"os._exit({self.code!r})"


# kvcheck's own control flow: never the target's fault, never to be reported as a crash.
CONTROL = (OperationTimeout, Interrupted)

_REAL_EXIT = os._exit

# Set by the supervisor in its child process: (shared memory for the heartbeat,
# the stream kvcheck writes its own output to, so that target prints are redirected).
HEARTBEAT = None
_HEARTBEAT = struct.Struct("<qb")  # calls started, busy
# Sessions started in this process. The heartbeat's count is the session's number (high
# bits) and its calls started (low bits), so that a call of a new session (each replay
# while shrinking has its own) never reads as a call of the last one still in flight.
_SESSIONS = [0]
_ACTIVE: list[Watchdog] = []  # innermost last; only it reports to the heartbeat

# Set by a recording re-run (a ``kvcheck.check.recording.Recorder``: the supervisor's, or a
# campaign's watched run's): told of every phase (``phase(name)``) and operation
# (``op(op)``, ``outcome(op, violation)``) as it happens, so that a run the target ends
# can say where.
RECORDER = None


def record_phase(name: str) -> None:
    if RECORDER is not None:
        RECORDER.phase(name)


def supervised_child(heartbeat) -> None:
    """Called once in a supervised child: report calls to ``heartbeat`` (a shared mmap)."""
    global HEARTBEAT
    HEARTBEAT = heartbeat


def read_heartbeat(heartbeat) -> tuple[int, bool]:
    """``(calls started, busy)`` as the child last reported them."""
    started, busy = _HEARTBEAT.unpack_from(heartbeat, 0)
    return started, bool(busy)


class Watchdog:
    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.started = 0  # outermost calls started
        self.serial = 0  # this session's number in the heartbeat (see _SESSIONS)
        self.busy = False
        self.depth = 0
        self.swap = False  # redirect the target's stdout to stderr while busy
        self._own_stdout = None
        self._active = False
        self._stop = threading.Event()
        self._fired = False
        self._saved: list = []

    # -- one call into the target --------------------------------------------------
    def enter(self) -> None:
        self.depth += 1
        if self.depth == 1:
            self.started += 1
            self.busy = True
            if self.swap:
                self._own_stdout = sys.stdout
                sys.stdout = sys.stderr

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.busy = False
            if self.swap:
                sys.stdout = self._own_stdout

    # -- the session -----------------------------------------------------------------
    def __enter__(self) -> Watchdog:
        main = threading.current_thread() is threading.main_thread()
        self.swap = HEARTBEAT is not None
        _SESSIONS[0] += 1
        self.serial = _SESSIONS[0] << 32
        self._thread = threading.get_ident()
        self._saved = [os._exit]
        os._exit = self._trap_exit
        if main:
            self._saved.append(signal.getsignal(signal.SIGINT))
            if self._saved[-1] is signal.default_int_handler:
                signal.signal(signal.SIGINT, self._on_interrupt)
            if self.timeout:
                self._saved.append(signal.signal(signal.SIGUSR1, self._on_signal))
                self._main = threading.main_thread().ident
                self._main_tid = threading.get_native_id()  # (this is the main thread)
                threading.Thread(target=self._watch, name="kvcheck-watchdog", daemon=True).start()
        self._active = True
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        self._active = False
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        os._exit = self._saved[0]
        if len(self._saved) > 1:
            signal.signal(signal.SIGINT, self._saved[1])
        if len(self._saved) > 2:
            signal.signal(signal.SIGUSR1, self._saved[2])
        if self.depth:  # left by an exception mid-call
            self.depth = 1
            self.leave()
        if HEARTBEAT is not None and not _ACTIVE:
            _HEARTBEAT.pack_into(HEARTBEAT, 0, self.serial + self.started, 0)

    def _trap_exit(self, code=0):
        if self.busy and threading.get_ident() == self._thread:
            raise TargetExit(code)
        _REAL_EXIT(code)  # from another thread, or outside a call: it really ends the process

    def _on_interrupt(self, signum, frame):
        raise Interrupted()

    def _on_signal(self, signum, frame):
        if self.busy and self._fired:
            self._fired = False
            raise OperationTimeout(f"did not return within {self.timeout:g} s")

    def _watch(self) -> None:
        own = OwnClock(tid=self._main_tid)  # the main thread's own time: wall less core waits
        seen, since = -1, own()
        step = max(self.timeout / 4, 0.01)
        last, cpu = _now(), time.process_time()
        while not self._stop.wait(step):
            if HEARTBEAT is not None and _ACTIVE and _ACTIVE[-1] is self:
                _HEARTBEAT.pack_into(HEARTBEAT, 0, self.serial + self.started, self.busy)
            wall, cpu_now = _now(), time.process_time()
            now = own()
            gap = wall - last - step  # how much later than asked this thread woke
            if gap > STOPPED_GAP and cpu_now - cpu < gap / 2:
                # and the process ran little meanwhile: it was stopped (SIGSTOP: a campaign
                # holding the runs beside a shrinking one; a suspend). That time is not the
                # call's. (A call that holds the interpreter lock in C keeps this thread from
                # waking too, but it runs: its time counts, and the supervisor's heartbeat
                # watch is there for a call that never lets go.)
                since += gap
            last, cpu = wall, cpu_now
            if not self.busy or self.started != seen:
                seen, since = self.started, now
                continue
            if now - since >= self.timeout:
                self._fired = True
                signal.pthread_kill(self._main, signal.SIGUSR1)
                since = now


_now = time.monotonic
STOPPED_GAP = 1.0  # seconds this thread may wake late before it asks whether the process ran


def active_watchdog() -> Watchdog | None:
    """The innermost active watchdog session (what a call made without one runs under)."""
    return _ACTIVE[-1] if _ACTIVE else None


def guarded(watchdog: Watchdog | None):
    """A context manager: one call into the target under ``watchdog`` (default: the
    active session's, if any)."""
    return _Guard(watchdog if watchdog is not None else active_watchdog())


class _Guard:
    __slots__ = ("wd",)

    def __init__(self, wd):
        self.wd = wd

    def __enter__(self):
        if self.wd is not None:
            self.wd.enter()

    def __exit__(self, *exc):
        if self.wd is not None:
            self.wd.leave()
