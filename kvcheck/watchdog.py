"""Per-operation timeout: a hung allocator is a finding, not a hung kvcheck.

A daemon thread watches a counter the oracle bumps around each call. If one
call stays in flight longer than ``timeout`` seconds, the thread sends
SIGUSR1 to the main thread, whose handler raises ``OperationTimeout`` inside
the allocator's code. Costs two attribute writes per operation. Only active
when used from the main thread (signal handlers live there); elsewhere it is
a no-op.
"""

from __future__ import annotations

import signal
import threading
import time


class OperationTimeout(Exception):
    """An allocator call exceeded the per-operation timeout."""


class Watchdog:
    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.started = 0  # number of calls started
        self.busy = False
        self._active = False
        self._stop = threading.Event()
        self._fired = False

    def __enter__(self) -> Watchdog:
        if not self.timeout or threading.current_thread() is not threading.main_thread():
            return self
        self._previous = signal.signal(signal.SIGUSR1, self._on_signal)
        self._active = True
        self._main = threading.main_thread().ident
        threading.Thread(target=self._watch, name="kvcheck-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._active:
            self._stop.set()
            signal.signal(signal.SIGUSR1, self._previous)
            self._active = False

    def _on_signal(self, signum, frame):
        if self.busy and self._fired:
            self._fired = False
            raise OperationTimeout(f"operation did not return within {self.timeout:g} s")

    def _watch(self) -> None:
        seen, since = -1, time.monotonic()
        step = max(self.timeout / 4, 0.01)
        while not self._stop.wait(step):
            now = time.monotonic()
            if not self.busy or self.started != seen:
                seen, since = self.started, now
                continue
            if now - since >= self.timeout:
                self._fired = True
                signal.pthread_kill(self._main, signal.SIGUSR1)
                since = now
