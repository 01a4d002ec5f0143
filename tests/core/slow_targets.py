"""Targets that are slow but never hung: kvcheck must not blame them on a loaded machine."""

from __future__ import annotations

import os
import time

from kvcheck.impl.block_manager import BlockManager

BURN = float(os.environ.get("KVCHECK_TEST_BURN", "1.0"))  # CPU seconds of the slow call


def burn(seconds: float) -> None:
    """Run (not sleep) for ``seconds`` of this process's CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class SlowAllocate(BlockManager):
    """Each allocation computes for ``BURN`` CPU seconds, then allocates correctly: slow,
    never hung."""

    def allocate(self, seq, n_tokens):
        burn(BURN)
        return super().allocate(seq, n_tokens)


class SleepsInFork(BlockManager):
    """A fork that sleeps forever: a hang whatever the load (no CPU used at all)."""

    def fork(self, parent, child):
        while True:
            time.sleep(60)


class CrashesLate(BlockManager):
    """An append crashes (IndexError) once 300 appends have run, on a sequence of two blocks
    or more: a bug behind hidden state, so its shrink is long and runs into its budget."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.appends = 0

    def append_slot(self, seq):
        self.appends += 1
        if self.appends > 300 and len(self.tables[seq]) >= 2:
            return [][len(self.tables[seq])]
        return super().append_slot(seq)
