"""Randomly faulty prefix caches: the reference, with faults injected at random steps.

``faulty(seed)`` is a factory ``(num_blocks, block_size) -> Faulty``: after an operation
(or while taking a block), with a small probability drawn from ``seed``, the manager
corrupts itself one way of ``FAULTS``. Deterministic from the seed, so two checks of the
same seed see the very same run.
"""

from __future__ import annotations

import random

from kvcheck.impl.prefix_cache import PrefixCachingBlockManager

FAULTS = ("refcount_up", "refcount_down", "drop_entry", "stale_evictable", "lost_free",
          "double_free", "rekey", "forget_key")


class Faulty(PrefixCachingBlockManager):
    def __init__(self, num_blocks, block_size, seed=0, rate=0.03, faults=FAULTS):
        super().__init__(num_blocks, block_size)
        self._rng = random.Random(seed)
        self._rate = rate
        self._faults = faults

    # -- when ---------------------------------------------------------------------
    def _maybe(self):
        if self._rng.random() < self._rate:
            getattr(self, f"_{self._rng.choice(self._faults)}")()

    def allocate(self, seq, n_tokens, token_ids=None):
        out = super().allocate(seq, n_tokens, token_ids)
        self._maybe()
        return out

    def append_slot(self, seq, token_id=None):
        out = super().append_slot(seq, token_id)
        self._maybe()
        return out

    def fork(self, parent, child):
        super().fork(parent, child)
        self._maybe()

    def free_seq(self, seq):
        super().free_seq(seq)
        self._maybe()

    def _take(self):
        if not self.free_list and self.evictable and self._rng.random() < self._rate:
            block, _ = self.evictable.popitem(last=False)  # skip the eviction: key left cached
            del self.key_of[block]
            self.ref[block] = 1
            return block
        return super()._take()

    # -- what -----------------------------------------------------------------------
    def _pick(self, blocks):
        blocks = sorted(blocks)
        return self._rng.choice(blocks) if blocks else None

    def _refcount_up(self):
        b = self._pick(b for b in range(self.num_blocks) if self.ref[b] > 0)
        if b is not None:
            self.ref[b] += 1

    def _refcount_down(self):
        b = self._pick(b for b in range(self.num_blocks) if self.ref[b] > 1)
        if b is not None:
            self.ref[b] -= 1

    def _drop_entry(self):
        keys = sorted(self.cache)
        if keys:
            del self.cache[self._rng.choice(keys)]  # key_of still names it

    def _stale_evictable(self):
        b = self._pick(b for b in self.key_of if self.ref[b] > 0)
        if b is not None:
            self.evictable[b] = self.key_of[b]

    def _lost_free(self):
        if self.free_list:
            self.free_list.remove(self._pick(self.free_list))

    def _double_free(self):
        b = self._pick(b for b in range(self.num_blocks) if self.ref[b] > 0)
        if b is not None:
            self.free_list.append(b)

    def _rekey(self):
        keys = sorted(self.cache)
        if len(keys) >= 2:
            a, b = self._rng.sample(keys, 2)
            self.cache[a], self.cache[b] = self.cache[b], self.cache[a]

    def _forget_key(self):
        b = self._pick(self.key_of)
        if b is not None:
            key = self.key_of.pop(b)
            self.cache.pop(key, None)
            if b in self.evictable:
                del self.evictable[b]
                self.free_list.append(b)


def faulty(seed: int, **kw):
    def factory(num_blocks, block_size):
        return Faulty(num_blocks, block_size, seed, **kw)

    factory.__qualname__ = f"faulty({seed})"
    return factory
