"""Ctrl-C taken where it is safe: deferred, never raised in the middle of an import.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. In
the middle of an import that exception can be swallowed (``Exception ignored in ...
_get_module_lock``) or turned into another error (a dataclass field's ``__set_name__``
wraps it in ``RuntimeError``), and the program goes on as if nothing had happened: a
campaign interrupted while it started up ran to the end and printed PASS. So a kvcheck
process that is starting up, or that only waits on others (a campaign, the supervisor),
takes SIGINT through ``defer()``: the signal sets a flag and nothing else, and the code
asks ``requested()`` where it can act on it, or ``restore()``s Python's own handling,
raising ``KeyboardInterrupt`` there if a Ctrl-C came meanwhile.
"""

from __future__ import annotations

import signal
import threading

_REQUESTED = [False]


def _record(signum, frame) -> None:
    _REQUESTED[0] = True


def defer() -> None:
    """From now on SIGINT only sets the flag (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _record)


def deferring() -> bool:
    """Whether SIGINT is deferred now."""
    return signal.getsignal(signal.SIGINT) is _record


def requested() -> bool:
    """Whether a Ctrl-C came while deferred (and was not yet acted on)."""
    return _REQUESTED[0]


def clear() -> None:
    _REQUESTED[0] = False


def restore() -> None:
    """Python's own SIGINT handling again (``KeyboardInterrupt``), if deferred; raises
    ``KeyboardInterrupt`` now if a Ctrl-C came while deferred."""
    if deferring():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _REQUESTED[0]:
        _REQUESTED[0] = False
        raise KeyboardInterrupt
