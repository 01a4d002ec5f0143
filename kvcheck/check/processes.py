"""The processes kvcheck forks (supervised children, campaign runs, proof workers): what
every one of them needs from the system."""

from __future__ import annotations

import os
import signal


def die_with_parent() -> None:
    """Linux: this (forked) process gets SIGKILL when its parent dies first (best effort
    elsewhere). Called first thing in every child kvcheck forks."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
