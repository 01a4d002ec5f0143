"""An allocator whose out-of-blocks exception is not named OutOfBlocks (for --out-of-blocks)."""

from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import OutOfBlocks


class PoolExhausted(Exception):
    pass


class NotAnException:
    pass


class Renamed(BlockManager):
    def allocate(self, seq, n_tokens):
        try:
            return super().allocate(seq, n_tokens)
        except OutOfBlocks as exc:
            raise PoolExhausted(str(exc)) from None

    def append_slot(self, seq):
        try:
            return super().append_slot(seq)
        except OutOfBlocks as exc:
            raise PoolExhausted(str(exc)) from None


def refuses(num_blocks, block_size):
    raise RuntimeError("no GPU here")


NOT_CALLABLE = 42
