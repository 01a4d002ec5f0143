"""Targets whose ``capabilities`` leave kvcheck nothing (or something) to run (tests/core/test_capabilities.py)."""

from kvcheck.impl.block_manager import BlockManager
from kvcheck.targets.protocol import SeedAdapter


def _with(name, caps):
    class T(SeedAdapter):
        def __init__(self, num_blocks, block_size):
            super().__init__(BlockManager(num_blocks, block_size), num_blocks, block_size)
            self.capabilities = caps
    T.__name__ = T.__qualname__ = name
    return T


Empty = _with("Empty", frozenset())
NoneCaps = _with("NoneCaps", None)
Unknown = _with("Unknown", frozenset({"defragment"}))
Newer = _with("Newer", frozenset({"allocate", "append_slot", "fork", "free_seq", "defragment"}))
OnlyFree = _with("OnlyFree", frozenset({"free_seq"}))


class Bare:
    def __init__(self, num_blocks, block_size):
        self.tables, self.ref, self.free = {}, [0] * num_blocks, list(range(num_blocks))
