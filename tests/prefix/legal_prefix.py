"""Legal prefix-caching allocators that differ from the reference.

Each subclasses the reference ``PrefixCachingBlockManager`` and makes one
choice the spec allows; kvcheck must accept every one (``LEGAL`` maps a name
to the class).
"""

from kvcheck.impl.prefix_cache import (
    CommittingPrefixCachingBlockManager,
    EnginePrefixCachingBlockManager,
    PrefixCachingBlockManager,
)


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


class SharesLastBlockHeldByNoOne(PrefixCachingBlockManager):
    """On a prompt wholly in the cache, serves its last full block from the cache too when
    no other sequence holds it (an evictable block, revived) and reports one token fewer
    than the prompt: the engine computes the last token only, into a block that is the
    sequence's alone. (Served while another sequence holds it, that write lands in a block
    the other reads: ``buggy_prefix.SharesLastBlock``.)"""

    def _lookup_limit(self, n_tokens):
        limit = n_tokens // self.block_size
        if limit and n_tokens % self.block_size == 0:
            keys = self._pending_keys[:limit]
            block = self.cache.get(keys[-1]) if len(keys) == limit else None
            if block is None or self.ref[block]:
                return (n_tokens - 1) // self.block_size
        return limit

    def _prompt_keys(self, tokens):
        self._pending_keys = keys = super()._prompt_keys(tokens)
        return keys

    def allocate(self, seq, n_tokens, token_ids=None):
        return min(super().allocate(seq, n_tokens, token_ids), n_tokens - 1)


class ReportsNoCount(PrefixCachingBlockManager):
    """Reports no cached-token count (returns None): the count is not checked."""

    def allocate(self, seq, n_tokens, token_ids=None):
        super().allocate(seq, n_tokens, token_ids)


class ReportsFewer(PrefixCachingBlockManager):
    """Reports fewer cached tokens than it served (recomputes the last block served) where
    that block is the sequence's alone (revived from the evictable list): the prefill
    rewrites it in place. (Where another sequence holds it: ``buggy_prefix.
    RecomputesASharedBlock``.)"""

    def allocate(self, seq, n_tokens, token_ids=None):
        got = super().allocate(seq, n_tokens, token_ids)
        bs = self.block_size
        if got and self.ref[self.tables[seq][got // bs - 1]] == 1:
            return got - bs
        return got


# -- through rollback, rebase and preemption (EnginePrefixCachingBlockManager) ---------
class RollbackReleasesBlocks(EnginePrefixCachingBlockManager):
    """A rollback releases the blocks wholly past the new last token instead of keeping
    them as reservation: their content is intact, so a keyed one stays cached and
    becomes evictable; only the block now holding the last token loses its key."""

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        table, keep = self.tables[seq], -(-self.lens[seq] // self.block_size)
        for block in reversed(table[keep:]):
            self._release(block)
        del table[keep:]

    def _unkey_from(self, seq, n):
        table, bs = self.tables[seq], self.block_size
        if n % bs:  # (blocks past it are released above, their keys still true)
            block = table[n // bs]
            if block in self.key_of:
                self._uncache(block, self.key_of[block])


class RebaseCopiesIntoOwnBlock(EnginePrefixCachingBlockManager):
    """A rebase copies the source's partial last block into the child's own last block
    (eagerly, into a block only the child held), dropping that block's key first: the
    copy overwrites the content the key named."""

    FORGETS_KEY = False

    def rebase(self, source, child):
        table, old = self._live(source), self._live(child)
        n, bs = self.lens[source], self.block_size
        t = (n - 1) // bs
        dst = old[-1] if old else None
        if (n % bs == 0 or len(table) != t + 1 or dst is None or self.ref[dst] != 1
                or dst in table or old.count(dst) != 1 or child == source):
            return super().rebase(source, child)
        if not self.FORGETS_KEY and dst in self.key_of:
            self._uncache(dst, self.key_of[dst])
        for block in table[:t]:
            self.ref[block] += 1
        for block in reversed(old[:-1]):
            self._release(block)
        self.tables[child] = [*table[:t], dst]
        self.lens[child] = n
        self.tokens[child] = list(self.tokens[source])
        self.keys[child] = list(self.keys[source])
        return [(table[t], dst)]


class PreemptDropsKeys(EnginePrefixCachingBlockManager):
    """A preemption forgets the keys of the preempted sequence's blocks it alone held
    (never caching a preempted request's content): its recompute finds nothing."""

    def preempt(self, seq):
        for block in self._live(seq):
            key = self.key_of.get(block)
            if key is not None and self.ref[block] == 1:
                self._uncache(block, key)
        super().preempt(seq)


class CommitEngine(CommittingPrefixCachingBlockManager, EnginePrefixCachingBlockManager):
    """Publish after write, with rollback, rebase and preemption (a sequence preempted
    before its write publishes nothing)."""


LEGAL = {
    "recomputes-last-block": PrefixCachingBlockManager,  # the reference's own choice
    "most-recent-evicted": MostRecentEvicted,
    "drops-keys-on-free": DropsKeysOnFree,
    "never-caches": NeverCaches,
    "shares-last-block-held-by-no-one": SharesLastBlockHeldByNoOne,
    "reports-no-count": ReportsNoCount,
    "reports-fewer": ReportsFewer,
    "prefix-engine": EnginePrefixCachingBlockManager,  # rollback drops the keys it makes partial
    "rollback-releases-blocks": RollbackReleasesBlocks,
    "rebase-copies-into-own-block": RebaseCopiesIntoOwnBlock,
    "preempt-drops-keys": PreemptDropsKeys,
    "commit-engine": CommitEngine,
}
