"""Allocators with a deliberate policy or a documented deviation (tests of refusals and
``verify --allow``)."""

from kvcheck.impl.block_manager import EngineBlockManager, OutOfBlocks


class Refused(Exception):
    """The allocator's own refusal signal (kvcheck matches the class name)."""


def _need(self, n_tokens: int) -> int:
    return -(-n_tokens // self.block_size)


class Watermark(EngineBlockManager):
    """Refuses an admission that would leave fewer than 2 blocks free (a watermark)."""

    def allocate(self, seq, n_tokens):
        if len(self.free) - _need(self, n_tokens) < 2:
            raise Refused(f"watermark: {len(self.free)} free")
        return super().allocate(seq, n_tokens)


class LeakyRefusal(EngineBlockManager):
    """Refuses like Watermark, but takes a block off the free list first."""

    def allocate(self, seq, n_tokens):
        if len(self.free) - _need(self, n_tokens) < 2:
            self.free.pop()
            raise Refused("watermark")
        return super().allocate(seq, n_tokens)


class WatermarkOutOfBlocks(EngineBlockManager):
    """A documented deviation: a watermark signalled as out-of-blocks (the spec allows
    out-of-blocks only when too few blocks are free), as vLLM's can_allocate does."""

    def allocate(self, seq, n_tokens):
        if len(self.free) - _need(self, n_tokens) < 1:
            raise OutOfBlocks("watermark")
        return super().allocate(seq, n_tokens)


class WatermarkAndForkBug(WatermarkOutOfBlocks):
    """The same deviation, and a real bug later: fork forgets to count the child."""

    def fork(self, parent, child):
        self.tables[child] = list(self.tables[parent])
        self.lens[child] = self.lens[parent]
