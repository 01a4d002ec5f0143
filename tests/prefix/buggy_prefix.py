"""Buggy prefix-caching allocators, one per bug real engines have shipped.

Each subclasses the reference ``PrefixCachingBlockManager`` and breaks one
thing. ``CORPUS`` maps a name to (class, the violation names kvcheck may
report for it, the longest acceptable shrunk trace).
"""

from legal_prefix import RebaseCopiesIntoOwnBlock

from kvcheck.impl.prefix_cache import (
    CommittingPrefixCachingBlockManager,
    EnginePrefixCachingBlockManager,
    PrefixCachingBlockManager,
    block_key,
)


class EvictedLeftInMap(PrefixCachingBlockManager):
    """vLLM: an evicted block is handed out for new content but its old hash
    stays in the hash map, so a later lookup of that prefix hits a block that
    now holds something else."""

    def _take(self):
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)  # bug: key left in the cache
            del self.key_of[block]
        self.ref[block] = 1
        return block


class StaleKeyAfterReuse(PrefixCachingBlockManager):
    """nano-vllm: a freed block goes back to the plain free list with its hash
    still registered; reusing it for new content leaves a stale entry."""

    def _release(self, block):
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free_list.append(block)  # bug: keyed blocks too, key kept

    def _share(self, block):
        if self.ref[block] == 0:
            self.free_list.remove(block)
        self.ref[block] += 1

    def _take(self):
        block = self.free_list.popleft()
        self.ref[block] = 1
        return block


class PinnedOnFreeQueue(PrefixCachingBlockManager):
    """TensorRT-LLM: a cache hit on an evictable block pins it (refcount + 1)
    but leaves it on the free queue, from which it can be handed out again."""

    def _share(self, block):
        self.ref[block] += 1  # bug: not removed from the evictable list

    def _take(self):
        while self.free_list or self.evictable:
            if self.free_list:
                block = self.free_list.popleft()
            else:
                block, key = self.evictable.popitem(last=False)
                if self.ref[block] > 0:
                    continue
                self._uncache(block, key)
            self.ref[block] = 1
            return block
        raise AssertionError("no block")


class EvictableDoubleCounted(PrefixCachingBlockManager):
    """SGLang: the evictable-size counter is bumped whenever a cached block
    loses a holder, even one that stays in use, so it over-reports."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.evictable_size = 0

    def num_evictable(self):
        return self.evictable_size

    def _release(self, block):
        if block in self.key_of:
            self.evictable_size += 1  # bug: counted even if refcount stays > 0
        super()._release(block)

    def _share(self, block):
        if self.ref[block] == 0:
            self.evictable_size -= 1
        super()._share(block)

    def _take(self):
        if not self.free_list:
            self.evictable_size -= 1
        return super()._take()


class PartialBlockCached(PrefixCachingBlockManager):
    """Registers a key for the prompt's partial last block too."""

    def _prompt_keys(self, tokens):
        bs, keys, parent = self.block_size, [], None
        for start in range(0, len(tokens), bs):  # bug: includes the partial tail
            parent = block_key(parent, tokens[start : start + bs])
            keys.append(parent)
        return keys


class UnchainedKeys(PrefixCachingBlockManager):
    """Keys a block by its own tokens only, not its parent's key, so a hit can
    return a block computed under a different prefix."""

    def _prompt_keys(self, tokens):
        bs = self.block_size
        return [block_key(None, tokens[s : s + bs]) for s in range(0, len(tokens) - bs + 1, bs)]


class KeysFromFirstBlock(PrefixCachingBlockManager):
    """vLLM v1's ``cache_full_blocks`` shape: after a partial hit, the blocks taken for the
    rest of the prompt are published with the prompt's keys counted from its first block
    instead of from the first block not served from the cache, so each new block goes
    into the cache under the key of the prefix one block shorter (a key the cache holds
    already is skipped). Until another prompt asks for that shorter prefix, the key is
    seen only on the block it wrongly names."""

    _staged = None

    def allocate(self, seq, n_tokens, token_ids=None):
        self._staged = staged = []
        try:
            got = super().allocate(seq, n_tokens, token_ids)
        finally:
            self._staged = None
        keys = self.keys[seq]
        for j, (block, _key) in enumerate(staged):  # bug: keys[j], not keys[hits + j]
            PrefixCachingBlockManager._register(self, block, keys[j])
        return got

    def _register(self, block, key):
        if self._staged is not None:
            self._staged.append((block, key))
        else:
            super()._register(block, key)


class FullHitNoTokenLeft(PrefixCachingBlockManager):
    """vLLM PR #11186, nano-vllm #144: a prompt wholly in the cache is served
    entirely from it and reported as all cached, leaving the engine no token
    to compute (it needs the last token's logits)."""

    def _lookup_limit(self, n_tokens):
        return n_tokens // self.block_size  # bug: the block holding the last token too


class SharesLastBlock(PrefixCachingBlockManager):
    """vLLM v0's full hit (``_compute_for_prefix_cache_hit``: "Full hit. Only compute the
    last token"): a prompt wholly in the cache is served entirely from it, its last full
    block too, and reported as one token short of the prompt; the engine computes the
    last token into that block while another sequence holding it reads it."""

    def _lookup_limit(self, n_tokens):
        return n_tokens // self.block_size

    def allocate(self, seq, n_tokens, token_ids=None):
        return min(super().allocate(seq, n_tokens, token_ids), n_tokens - 1)


class RecomputesASharedBlock(PrefixCachingBlockManager):
    """Reports one block fewer of cached tokens than it served from the cache, so the
    prefill recomputes the last block served, in place, while other sequences hold it."""

    def allocate(self, seq, n_tokens, token_ids=None):
        return max(0, super().allocate(seq, n_tokens, token_ids) - self.block_size)


class EvictorKeepsComputed(PrefixCachingBlockManager):
    """vLLM PR #5364: a "computed" mark per block, separate from the cache map,
    set once a block's content is computed and consulted for the cached-token
    count; a block taken from the evictable list for new content keeps its
    mark, so the engine skips computing the new content."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.computed = set()

    def _take(self):
        from_free = bool(self.free_list)
        block = super()._take()
        if from_free:
            self.computed.discard(block)  # bug: not when it comes from the evictable list
        return block

    def allocate(self, seq, n_tokens, token_ids=None):
        super().allocate(seq, n_tokens, token_ids)
        table = self.tables[seq]
        skip = sum(1 for b in table[: self._lookup_limit(n_tokens)] if b in self.computed)
        self.computed.update(table[: n_tokens // self.block_size])  # the prefill computed them
        return skip * self.block_size

    def append_slot(self, seq, token_id=None):
        out = super().append_slot(seq, token_id)
        if self.lens[seq] % self.block_size == 0:
            self.computed.add(self.tables[seq][-1])
        return out


class PublishedBeforeWrite(CommittingPrefixCachingBlockManager):
    """Publishes a prompt's keys when it is scheduled (allocate), before the
    engine has written its KV: a request admitted meanwhile hits blocks that
    hold nothing yet."""

    def _register(self, block, key):
        PrefixCachingBlockManager._register(self, block, key)  # bug: not staged for commit


class PublishedOnEarlyFree(CommittingPrefixCachingBlockManager):
    """vLLM PR #43569: a request freed (aborted, preempted) before its forward
    pass has its blocks cached on the way out as if computed, so a later
    request hits a block whose KV was never written."""

    def free_seq(self, seq):
        if seq in self.pending:
            self.commit(seq)  # bug: publishes what was never written
        super().free_seq(seq)


# -- the cache through rollback, rebase and preemption (EnginePrefixCachingBlockManager) --
class RollbackKeepsKey(EnginePrefixCachingBlockManager):
    """A rollback of rejected speculative tokens into a cached full block keeps the
    block's key: the block is partial in its table now, and the sequence's next token
    is written into it in place, over the KV the key still names."""

    def _unkey_from(self, seq, n):
        pass  # bug: the blocks the rollback makes partial stay cached


class RebaseKeepsOldRefs(EnginePrefixCachingBlockManager):
    """A beam-search rebase re-points the child at the source's blocks without dropping
    the references of the child's old table: its blocks never return to the pool (and
    never become evictable), refcounts count a table that is gone."""

    def rebase(self, source, child):
        table = self._live(source)
        self._live(child)
        for block in table:
            self.ref[block] += 1
        # bug: the child's old blocks are not released
        self.tables[child] = list(table)
        self.lens[child] = self.lens[source]
        self.tokens[child] = list(self.tokens[source])
        self.keys[child] = list(self.keys[source])


class RebaseCopiesIntoKeyedBlock(RebaseCopiesIntoOwnBlock):
    """A rebase copies the source's partial last block into the child's own last block
    (legal: a block only the child held), but that block was a cached full block and
    keeps its key, which now names a block holding the source's partial tail."""

    FORGETS_KEY = True  # bug: the copy overwrites a cached block, its key stays


class PreemptPublishesUnwritten(CommittingPrefixCachingBlockManager,
                               EnginePrefixCachingBlockManager):
    """vLLM PR #43569 through preemption: a request preempted before its forward pass
    ran has its scheduled blocks cached on the way out, as if computed; the recompute
    (or any request with that prefix) hits blocks whose KV was never written."""

    def preempt(self, seq):
        if seq in self.pending:
            self.commit(seq)  # bug: publishes what was never written
        super().preempt(seq)


class SharedWrittenInPlace(EnginePrefixCachingBlockManager):
    """append_slots writes into the block it lands in even when another table shares it
    (a fork, a cache hit): after a rollback into a shared full block, the next token
    overwrites in place the KV the other holders read."""

    def append_slots(self, seq, n_tokens, lookahead=0, token_ids=None):
        ref = self.ref
        table = self._live(seq)
        saved = {b: ref[b] for b in table}
        for b in table:  # bug: every block looks held alone, so none is replaced
            ref[b] = 1
        try:
            return super().append_slots(seq, n_tokens, lookahead, token_ids)
        finally:
            for b, r in saved.items():
                ref[b] = r


class AppendSlotPastReservation(EnginePrefixCachingBlockManager):
    """The bundled prefix engine's single-slot append before issue 32: the plain
    reference's, which at a block boundary always takes a fresh block and otherwise
    writes the table's last block, though the sequence holds reserved blocks (a
    rollback's): the token lands past the reservation, and the block it fills is keyed
    with the reserved blocks between it and the tokens before it."""

    def append_slot(self, seq, token_id=None):
        return PrefixCachingBlockManager.append_slot(self, seq, token_id)  # bug


CORPUS = {
    "evicted-left-in-map": (EvictedLeftInMap, {"allocate: cache hit returns a block holding "
                                               "the requested prefix", "cache_content",
                                               "no_partial_cached"}, 6),
    "stale-key-after-reuse": (StaleKeyAfterReuse, {"free_unkeyed"}, 3),
    "pinned-on-free-queue": (PinnedOnFreeQueue, {
        "allocate: free list shrinks by the blocks that had refcount 0", "free_list",
        "pool_partition"}, 4),
    "evictable-double-counted": (EvictableDoubleCounted, {"pool_sizes"}, 4),
    "partial-block-cached": (PartialBlockCached, {"no_partial_cached"}, 2),
    "unchained-keys": (UnchainedKeys, {"allocate: cache hit returns a block holding the "
                                       "requested prefix", "cache_content"}, 5),
    "keys-from-first-block": (KeysFromFirstBlock, {"cache_content"}, 2),
    "full-hit-no-token-left": (FullHitNoTokenLeft, {
        "allocate: a prompt fully in the cache leaves at least one token to compute"}, 2),
    "shares-last-block": (SharesLastBlock, {
        "allocate: every block the prefill writes was free: the sequence's alone"}, 3),
    "recomputes-a-shared-block": (RecomputesASharedBlock, {
        "allocate: every block the prefill writes was free: the sequence's alone"}, 3),
    "evictor-keeps-computed": (EvictorKeepsComputed, {
        "allocate: every block the cached tokens skip holds the requested prefix",
        "allocate: cached tokens stop at the blocks served from the cache"}, 3),
    "published-before-write": (PublishedBeforeWrite, {"key_after_write"}, 1),
    "published-on-early-free": (PublishedOnEarlyFree, {"key_after_write"}, 2),
    "rollback-keeps-key": (RollbackKeepsKey, {"no_partial_cached"}, 2),
    "rebase-keeps-old-refs": (RebaseKeepsOldRefs, {
        "rebase: refcount +1 per entry of the child's table, -1 per entry it had"}, 5),
    "rebase-copies-into-keyed-block": (RebaseCopiesIntoKeyedBlock, {
        "no_partial_cached", "key_after_write", "cache_content"}, 6),
    "preempt-publishes-unwritten": (PreemptPublishesUnwritten, {"key_after_write"}, 2),
    "append-slot-past-reservation": (AppendSlotPastReservation, {
        "append_slot: returns the block holding slot len",
        "append_slot: a new block only at a block boundary"}, 3),
    "shared-written-in-place": (SharedWrittenInPlace, {
        "append_slots: every block a new token lands in is the sequence's alone",
        "append_slots: a block the sequence holds alone is written in place",
        "append_slots: refcounts change only as the sequence's table does"}, 4),
}
