"""Legal prefix-caching allocators that differ from the reference.

Each subclasses the reference ``PrefixCachingBlockManager`` and makes one
choice the spec allows; kvcheck must accept every one (``LEGAL`` maps a name
to the class).
"""

from kvcheck.impl.prefix_cache import PrefixCachingBlockManager


class MostRecentEvicted(PrefixCachingBlockManager):
    """Evicts the most recently freed evictable block instead of the least."""

    def _take(self):
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, key = self.evictable.popitem(last=True)
            self._uncache(block, key)
        self.ref[block] = 1
        return block


class DropsKeysOnFree(PrefixCachingBlockManager):
    """Forgets a block's key when its last holder lets go: no evictable list,
    a freed block goes straight back to the plain free list (nano-vllm's
    choice before it kept hashes)."""

    def _release(self, block):
        if self.ref[block] == 1 and block in self.key_of:
            self._uncache(block, self.key_of[block])
        super()._release(block)


class NeverCaches(PrefixCachingBlockManager):
    """Registers no key at all: every allocation is a miss, reported as 0 cached tokens."""

    def _register(self, block, key):
        pass


class SharesLastBlock(PrefixCachingBlockManager):
    """On a prompt wholly in the cache, serves every full block from it (the last
    one too) and reports one token fewer than the prompt: the engine computes the
    last token only."""

    def _lookup_limit(self, n_tokens):
        return n_tokens // self.block_size

    def allocate(self, seq, n_tokens, token_ids=None):
        return min(super().allocate(seq, n_tokens, token_ids), n_tokens - 1)


class ReportsNoCount(PrefixCachingBlockManager):
    """Reports no cached-token count (returns None): the count is not checked."""

    def allocate(self, seq, n_tokens, token_ids=None):
        super().allocate(seq, n_tokens, token_ids)


class ReportsFewer(PrefixCachingBlockManager):
    """Reports fewer cached tokens than it served (recomputes the last block served)."""

    def allocate(self, seq, n_tokens, token_ids=None):
        return max(0, super().allocate(seq, n_tokens, token_ids) - self.block_size)


LEGAL = {
    "recomputes-last-block": PrefixCachingBlockManager,  # the reference's own choice
    "most-recent-evicted": MostRecentEvicted,
    "drops-keys-on-free": DropsKeysOnFree,
    "never-caches": NeverCaches,
    "shares-last-block": SharesLastBlock,
    "reports-no-count": ReportsNoCount,
    "reports-fewer": ReportsFewer,
}
