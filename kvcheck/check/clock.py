"""A thread's own time: what a hang is measured in, so that a loaded machine is never one.

The wall clock counts the time a busy machine keeps a thread waiting for a core, so on a
loaded CI machine a slow but working call would read as a hang. A thread's *own time* is
the wall clock less that wait: the time it ran, plus the time it slept or blocked by
itself. A target that loops, sleeps or deadlocks accumulates own time as fast as the
clock; one that only waits its turn for a core does not.

Linux reports the wait per thread (``/proc/<pid>/task/<tid>/schedstat``: the time run,
the time waited on a run queue, in nanoseconds). Where it cannot be read, own time is the
wall clock (``OwnClock.exact`` is False), as before.
"""

from __future__ import annotations

import os
import threading
import time


class OwnClock:
    """``clock()``: seconds of thread ``tid`` of process ``pid`` on a monotonic scale, less
    the time it waited for a core. Default: this process and the calling thread; another
    process's main thread (its id is the process's).

    (``threading.main_thread().native_id`` is not used: in a forked child it still names the
    parent's thread.)"""

    def __init__(self, pid: int | None = None, tid: int | None = None):
        pid = os.getpid() if pid is None else pid
        if tid is None:
            tid = threading.get_native_id() if pid == os.getpid() else pid
        self.path = f"/proc/{pid}/task/{tid}/schedstat"
        self.waited = self._waited()  # the last wait read (kept once the thread is gone)
        self.exact = self.waited is not None

    def _waited(self) -> float | None:
        try:
            with open(self.path, "rb") as f:
                fields = f.read().split()
            return int(fields[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def __call__(self) -> float:
        now = time.monotonic()
        if not self.exact:
            return now
        waited = self._waited()
        if waited is not None:
            self.waited = waited
        return now - self.waited
