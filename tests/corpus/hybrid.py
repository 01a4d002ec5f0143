"""Buggy hybrid pools (issue 15 section 3): each breaks one rule of ``kvcheck.spec.hybrid``
or of the block-manager spec over the shared pool; the legal variants at the end must pass.

All derive from the reference ``kvcheck.impl.hybrid_manager.HybridBlockManager`` (a
full-attention group 0 and a sliding-window group 1 of window ``2 x block_size``).
``HYBRID_CORPUS``: name -> (class, the clause it breaks, the longest shrunk trace).
"""

from __future__ import annotations

from kvcheck.impl.hybrid_manager import NULL, HybridBlockManager, OutOfBlocks


class SharedAcrossGroups(HybridBlockManager):
    """The sliding group's last prompt block is the full group's (a refcount of 2, counted
    right): one block holds two groups' KV, one overwrites the other."""

    def allocate(self, seq, tokens):
        out = super().allocate(seq, tokens)
        full, sliding = self.tables[seq]
        mine = sliding[-1]
        if mine != full[-1] and self.ref[mine] == 1:
            self._release(mine)
            sliding[-1] = full[-1]
            self.ref[full[-1]] += 1
        return out


class FreeOneGroup(HybridBlockManager):
    """free_seq releases the full group's table only: the sliding group's blocks leak."""

    def free_seq(self, seq):
        tables, _ = self._live(seq)
        for b in reversed(tables[0]):
            self._release(b)
        del self.tables[seq], self.tokens[seq]


class HitsPerGroup(HybridBlockManager):
    """Each group looks up its own hit: the full group serves its cached prefix, the sliding
    group (which caches nothing) computes the whole prompt, so the two report different
    cached-token counts (the coordinator must take the hit common to all groups)."""

    def _hit(self, toks):
        B = self.block_size
        for h in range((len(toks) - 1) // B, 0, -1):
            if all(self._key(0, toks, i) in self.cache for i in range(h)):
                return h
        return 0

    def _publish(self, g, toks, i, b):
        if g == 0:
            super()._publish(g, toks, i, b)

    def allocate(self, seq, tokens):
        toks = list(tokens)
        h = self._hit(toks)
        if h == 0:
            return super().allocate(seq, tokens)
        B, n = self.block_size, len(toks)
        nb = -(-n // B)
        hits = [self.cache[self._key(0, toks, i)] for i in range(h)]
        revived = {b for b in hits if self.ref[b] == 0}
        if (nb - h) + nb > len(self.free) - len(revived):
            raise OutOfBlocks("too few free blocks")
        for b in revived:
            self.free.remove(b)
        full = []
        for b in hits:
            self.ref[b] += 1
            full.append(b)
        full += [self._take() for _ in range(h, nb)]
        self.tables[seq] = [full, [self._take() for _ in range(nb)]]
        self.tokens[seq] = toks
        return [h * B, 0]


class WindowDropInFull(HybridBlockManager):
    """The window drop runs over every group: the full-attention group loses blocks its
    next token still attends to."""

    def _needed_from(self, g, end):
        W = max(self.windows)
        return max(0, (end - W + 1) // self.block_size)


class DropInsideWindow(HybridBlockManager):
    """The sliding group drops one block too many: the block holding the first token of
    the next token's window."""

    def _needed_from(self, g, end):
        W = self.windows[g]
        return 0 if W == 0 else max(0, (end - W + 1) // self.block_size + 1)


class DropsForNextToken(HybridBlockManager):
    """A decode step drops against the length after it (the *next* token's window): the
    block holding the first token of the new token's own window is released before the
    step's attention reads it."""

    def _drops(self, seq):
        length = len(self.tokens[seq]) + 1
        return [(g, i) for g, t in enumerate(self.tables[seq])
                for i in range(min(self._needed_from(g, length), len(t))) if t[i] != NULL]

    def append_slot(self, seq, token):
        tables, toks = self._live(seq)
        if len(toks) % self.block_size == 0:
            freed = sum(1 for g, i in self._drops(seq) if self.ref[tables[g][i]] == 1)
            if len(tables) > len(self.free) + freed:
                raise OutOfBlocks("a decode step needs a block per group")
        super().append_slot(seq, token)


class PrefillDropsForLastToken(HybridBlockManager):
    """An admission drops the sliding group's blocks behind the window of the prompt's
    *last* token: the prefill computes every prompt token, and the first ones attend to
    the blocks just released."""

    def allocate(self, seq, tokens):
        out = super().allocate(seq, tokens)
        n = len(self.tokens[seq])
        for g, table in enumerate(self.tables[seq]):
            for i in range(min(self._needed_from(g, n - 1), len(table))):
                if table[i] != NULL:
                    self._release(table[i])
                    table[i] = NULL
        return out


class ChunkDropsForLastToken(HybridBlockManager):
    """A multi-token step drops behind the window of its *last* token: its first tokens
    still attend to the blocks released."""

    def _drops(self, seq):
        self._pending = getattr(self, "_pending", 0)
        end = len(self.tokens[seq]) + max(self._pending - 1, 0)
        return [(g, i) for g, t in enumerate(self.tables[seq])
                for i in range(min(self._needed_from(g, end), len(t))) if t[i] != NULL]

    def append_tokens(self, seq, tokens):
        self._pending = len(list(tokens))
        try:
            super().append_tokens(seq, tokens)
        finally:
            self._pending = 0


class FullHitNoTokenLeft(HybridBlockManager):
    """A prompt wholly in the cache is served whole: no token is left to compute (the
    engine needs one to produce the next token's logits; vLLM caps hits at n - 1)."""

    def _hit(self, toks):
        B = self.block_size
        for h in range(len(toks) // B, 0, -1):
            if all(self._key(g, toks, i) in self.cache
                   for g in range(len(self.windows))
                   for i in range(self._needed_from(g, h * B), h)):
                return h
        return 0


class FreeCountsNulls(HybridBlockManager):
    """num_free counts the null entries a freed table held (as vLLM #42571 counted a block
    named twice): the pool's free count is over-counted."""

    extra = 0

    def free_seq(self, seq):
        self.extra += sum(1 for t in self.tables.get(seq, ()) for b in t if b == NULL)
        super().free_seq(seq)

    def num_free(self):
        return len(self.free) + self.extra


class KeyIgnoresGroup(HybridBlockManager):
    """The cache key is the token prefix alone: a sliding-window lookup finds the full
    group's block for the same tokens and shares it across groups."""

    def _key(self, g, toks, i):
        return (0, tuple(toks[: (i + 1) * self.block_size]))


class PartialOnOOB(HybridBlockManager):
    """An allocation that fits the full group but not the sliding one takes the full
    group's blocks, then fails without giving them back (not all or nothing)."""

    def allocate(self, seq, tokens):
        nb = -(-len(tokens) // self.block_size)
        if len(self.windows) * nb > len(self.free) >= nb and self._hit(list(tokens)) == 0:
            for _ in range(nb):
                self._take()
            raise OutOfBlocks("no blocks left for the sliding group")
        return super().allocate(seq, tokens)


# -- legal variants -----------------------------------------------------------------
class DropBeforeOOB(HybridBlockManager):
    """A decode step releases the blocks behind the window before it finds it cannot get
    the new blocks (as vLLM's allocate_slots does): the drop is legal on its own."""

    def append_slot(self, seq, token):
        tables, toks = self._live(seq)
        for g, i in self._drops(seq):
            self._release(tables[g][i])
            tables[g][i] = NULL
        if len(toks) % self.block_size == 0 and len(self.free) < len(tables):
            raise OutOfBlocks("a decode step needs a block per group")
        super().append_slot(seq, token)


class NoCaching(HybridBlockManager):
    """Never caches (every hit is 0 tokens)."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, caching=False)


class KeepsWindow(HybridBlockManager):
    """The sliding group never drops a block (wasteful, legal)."""

    def _drops(self, seq):
        return []


class LifoFree(HybridBlockManager):
    """Freed blocks are reused first (LIFO free list)."""

    def _release(self, b):
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free.insert(0, b)


class DropsKeysOnFree(HybridBlockManager):
    """A block returning to the pool loses its cache key (no evictable blocks, nothing
    revived: fewer hits, legal)."""

    def _release(self, b):
        super()._release(b)
        if self.ref[b] == 0 and b in self.key_of:
            del self.cache[self.key_of.pop(b)]


class WideWindow(HybridBlockManager):
    """Three groups: full attention and two sliding windows (block size, at least 2, and
    3 x block size)."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, windows=(0, max(2, block_size), 3 * block_size))


HYBRID_CORPUS = {
    "shared-across-groups": (SharedAcrossGroups, "one_group_per_block", 1),
    "free-one-group": (FreeOneGroup, "refcount_conservation", 2),
    "hits-per-group": (HitsPerGroup, "allocate: every group serves the same number of cached tokens", 3),
    "full-hit-no-token-left": (FullHitNoTokenLeft,
                               "allocate: cached tokens are whole blocks and leave a token to compute", 2),
    "window-drop-in-full": (WindowDropInFull, "window_nulls", 2),
    "drop-inside-window": (DropInsideWindow,
                           "append_slot: a null entry lies behind the window of the token written", 2),
    "prefill-drops-for-last-token": (PrefillDropsForLastToken,
                                     "allocate: a null entry lies behind the window of the first "
                                     "token computed", 1),
    "free-counts-nulls": (FreeCountsNulls, "num_free_agrees", 3),
    "key-ignores-group": (KeyIgnoresGroup, "allocate: a position inside the hit is served from the cache", 3),
    "drops-for-next-token": (DropsForNextToken,
                             "append_slot: a null entry lies behind the window of the token written", 2),
    "chunk-drops-for-last-token": (ChunkDropsForLastToken,
                                   "append_tokens: a null entry lies behind the window of the "
                                   "first new token", 2),
    "partial-on-oob": (PartialOnOOB, "out of blocks: a refcount drops only by the entries released", 2),
}
HYBRID_LEGAL = {"no-caching": NoCaching, "keeps-window": KeepsWindow, "lifo-free": LifoFree,
                "three-groups": WideWindow, "drops-before-oob": DropBeforeOOB,
                "drops-keys-on-free": DropsKeysOnFree}
