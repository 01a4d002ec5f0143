"""Targets that try to end, wedge or flood the process kvcheck runs them in (issue 12 §1).

Each is the reference block manager with one operation misbehaving."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import OutOfBlocks as ReferenceOutOfBlocks


class ExitsInFork(BlockManager):
    def fork(self, parent, child):
        sys.exit(0)


class HardExitsInFork(BlockManager):
    def fork(self, parent, child):
        os._exit(0)


class ExitsFromThread(BlockManager):
    """``os._exit`` from another thread: no exception handler can see it."""

    def fork(self, parent, child):
        t = threading.Thread(target=os._exit, args=(0,))
        t.start()
        time.sleep(5)


class SegfaultsInFork(BlockManager):
    def fork(self, parent, child):
        ctypes.string_at(0)


class KilledInFork(BlockManager):
    def fork(self, parent, child):
        os.kill(os.getpid(), signal.SIGKILL)


class ExitsInConstructor(BlockManager):
    def __init__(self, num_blocks, block_size):
        sys.exit(0)


class InterruptsInFork(BlockManager):
    """Raises KeyboardInterrupt itself: the target's doing, not the user's Ctrl-C."""

    def fork(self, parent, child):
        raise KeyboardInterrupt


class OutOfBlocks(BaseException):  # noqa: N818 - the name kvcheck matches by default
    """An out-of-blocks class deriving from BaseException, not Exception."""


class BaseExceptionOutOfBlocks(BlockManager):
    """Signals out-of-blocks with a BaseException subclass named OutOfBlocks."""

    def allocate(self, seq, n_tokens):
        try:
            return super().allocate(seq, n_tokens)
        except ReferenceOutOfBlocks:
            raise OutOfBlocks() from None

    def append_slot(self, seq):
        try:
            return super().append_slot(seq)
        except ReferenceOutOfBlocks:
            raise OutOfBlocks() from None


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text for you")


class RaisesUnprintable(BlockManager):
    def fork(self, parent, child):
        raise Unprintable()


class Chatty(BlockManager):
    """Prints a lot, at Python and at file-descriptor level, on every operation."""

    def append_slot(self, seq):
        print("{" * 20_000)
        os.write(1, b"}" * 20_000 + b"\n")
        return super().append_slot(seq)


class _HangingIterable(list):
    def __iter__(self):
        while True:
            time.sleep(0.01)


class FreeListHangs(BlockManager):
    """Observing the free list never returns (after the first fork)."""

    def fork(self, parent, child):
        super().fork(parent, child)
        self.free = _HangingIterable(self.free)


class HangsInConstructor(BlockManager):
    def __init__(self, num_blocks, block_size):
        while True:
            time.sleep(0.01)


HANG_ENTRIES: list[float | None] = []  # the active watchdog's timeout at each hanging fork


class HangsInFork(BlockManager):
    def fork(self, parent, child):
        from kvcheck.check.watchdog import active_watchdog

        wd = active_watchdog()
        HANG_ENTRIES.append(None if wd is None else wd.timeout)
        while True:
            time.sleep(0.01)


class HangsBeyondInterruption(BlockManager):
    """Swallows every exception, the watchdog's timeout included."""

    def fork(self, parent, child):
        while True:
            try:
                time.sleep(0.05)
            except BaseException:  # noqa: BLE001, S110 - exactly the misbehaviour under test
                pass


class LeaksThenSegfaultsWhenShrunk(BlockManager):
    """A real bug the run finds (``free_seq`` keeps the table's blocks: a leak), and a
    process-ending one only a replay while shrinking meets: every target built after the
    first segfaults at its first allocation."""

    built = 0

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        type(self).built += 1
        self.nth = type(self).built

    def allocate(self, seq, n_tokens):
        if self.nth > 1:
            ctypes.string_at(0)
        return super().allocate(seq, n_tokens)

    def free_seq(self, seq):
        self._live(seq)
        del self.tables[seq]
        del self.lens[seq]


class SegfaultsOnSharedAppend(BlockManager):
    """Segfaults only when appending to a sequence whose last block is shared: a crash that
    ends the process, behind a state three operations build."""

    def append_slot(self, seq):
        t = self.tables[seq]
        if t and self.ref[t[-1]] > 1:
            ctypes.string_at(0)
        return super().append_slot(seq)
