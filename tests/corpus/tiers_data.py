"""Tiered stores whose refcounts, tables and keys are all right but whose K/V is not: only
the data level (``kvcheck.models.tiers.data``) can catch them. Each is the reference with
its K/V (``kvcheck.impl.tiered_data.DataTieredCache``) and one copy gone wrong."""

from __future__ import annotations

from kvcheck.impl.tiered_cache import DEVICE, HOST, LOAD, STORE
from kvcheck.impl.tiered_data import DataTieredCache


class SwapInReversed(DataTieredCache):
    """swap_in copies the sequence's blocks into the fresh device blocks in reverse order
    (a copy kernel handed the block mapping's pairs with one side reversed).
    Shortest: allocate (two blocks), swap_out, swap_in."""

    def _swap(self, seq, src, dst):
        moved = super(DataTieredCache, self)._swap(seq, src, dst)
        targets = list(moved.values())
        if dst == DEVICE:
            targets.reverse()  # bug
        self._copy(src, list(moved), dst, targets)
        return moved


class FailedLoadNotRecomputed(DataTieredCache):
    """A load that fails leaves its device destinations as they were: the engine treats
    the blocks as computed though neither the copy nor a recompute wrote them (a KV load
    failure policy that forgets to reschedule the tokens).
    Shortest: allocate, store, complete, load, complete(ok=False)."""

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is not None and j.kind == LOAD and not ok:
            super(DataTieredCache, self).complete(job, ok)  # bug: no recompute
            return
        super().complete(job, ok)


class StoreCopiesNextBlock(DataTieredCache):
    """A store's copy reads each source one block further along the device pool (an
    off-by-one in the copy's source offset): the host block is findable under the right
    key and holds another block's K/V.
    Shortest: allocate, store, complete."""

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is not None and j.kind == STORE and ok:
            super(DataTieredCache, self).complete(job, ok)
            n = self.sizes[DEVICE]
            self._copy(DEVICE, [(b + 1) % n for b in j.src], HOST, j.dst)  # bug
            return
        super().complete(job, ok)


class StructureOnly:
    """A data target seen without its data methods: the structural oracle alone."""

    def __init__(self, cls):
        self.cls = cls

    def __call__(self, *args):
        obj = self.cls(*args)
        obj.block_data = None  # (not callable: not a data target)
        return obj


DATA_CORPUS = {
    "swap-in-reversed": SwapInReversed,
    "failed-load-not-recomputed": FailedLoadNotRecomputed,
    "store-copies-next-block": StoreCopiesNextBlock,
}
