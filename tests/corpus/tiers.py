"""Buggy tiered stores (issue 33 section 4): each subclasses the reference
``kvcheck.impl.tiered_cache.TieredCache`` and breaks one rule of ``kvcheck.spec.tiers``,
most of them as a real engine did (the B numbers are
``../shared/research/real-allocator-bugs.md``'s); the legal variants at the end must pass.

``CORPUS``: name -> (class, the kind of violation kvcheck must report, the longest
acceptable shrunk trace). ``LEGAL``: name -> class. The shortest traces, as computed by
hand, are in each docstring; they assume the shrinker may take the host pool down to the
blocks the trace needs. ``tests/core/test_tiered_cache.py`` catches every entry with a
hand-written check of its own, independent of kvcheck's oracle.
"""

from __future__ import annotations

import hashlib
import struct

from kvcheck.impl.tiered_cache import (
    DEVICE,
    HOST,
    LOAD,
    STORE,
    PrefetchingTieredCache,
    TieredCache,
)


# -- buggy ---------------------------------------------------------------------------------
class FreesPinnedBlock(TieredCache):
    """free drops every block of the request to the free list, though a pending store
    still pins one (vLLM #46951, B66: the offloading connector fenced a pending store's
    blocks only when told of their allocation, so one was handed to a new request while
    its copy ran). Shortest: allocate (one full block), store, free: the source leaves
    the job's reference behind on a free block."""

    def free(self, seq):
        table = self._live(seq)
        pool = self.where.pop(seq)
        del self.tables[seq], self.tokens[seq]
        for b in table:
            self.ref[pool][b] = 0  # bug: the request's reference taken for the only one
            self.free_list[pool].append(b)


class PublishesAtStoreStart(TieredCache):
    """A store publishes its keys when it starts, not when its copy completes: a lookup
    finds a host block still being written (a hit on an unfinished store). Shortest:
    allocate, store."""

    def store(self, seq):
        job = super().store(seq)
        if job is not None:
            j = self.jobs[job]
            for b, key in zip(j.dst, j.keys, strict=True):
                self.cache[key], self.key_of[b] = b, key  # bug: findable before the copy
                self.ref[HOST][b] += 1  # the cache's reference, beside the job's
        return job

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is None or j.kind != STORE:
            return super().complete(job, ok)
        del self.jobs[job]
        self.storing.difference_update(j.keys)
        for b, key in zip(j.dst, j.keys, strict=True):
            if not ok and self.key_of.get(b) == key:
                del self.cache[key], self.key_of[b]
                self._release(HOST, b)  # the cache's reference
            self._release(HOST, b)  # the job's
        for b in j.src:
            self._release(DEVICE, b)


class EvictsLoadSource(TieredCache):
    """A load's hits stay on the evictable list (pinning a block does not take it off
    the LRU) and the evictor frees what it evicts, taking the cache for its only holder:
    a host block a pending load still reads is evicted and handed out again (SGLang PR
    #27631, B75: a nested host eviction frees pages load-back is still restoring).
    Shortest: allocate, store, complete, load (the pinned hit is reported evictable)."""

    def _hold(self, pool, b):
        self.ref[pool][b] += 1  # bug: a pinned host block stays on the LRU

    def _evict_one(self):
        b, _ = self.lru.popitem(last=False)
        del self.cache[self.key_of.pop(b)]
        self.ref[HOST][b] = 0  # the cache taken for its only holder
        self.free_list[HOST].append(b)
        return b


class LeaksAbortedStore(TieredCache):
    """A store whose request was freed before it completed (an abort in flight) never
    drops its sources: "the request is gone, its blocks went with it" (vLLM #49889, B67:
    a request aborted mid-offload). The sources stay held by nothing, and never return
    to the free list. Shortest: allocate, store, free, complete."""

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is not None and j.kind == STORE and j.seq not in self.tables:
            j.src = []  # bug: the job's pins on the sources are forgotten
        super().complete(job, ok)


class SwapInFloorAdmission(TieredCache):
    """can_swap_in counts len // B blocks, the full ones, instead of ceil(len / B): with
    a partial last block it admits a swap the device cannot take, and swap_in then runs
    out of blocks (vLLM PR #8824, PR #6849: swap-in admission counts that disagreed with
    what swap_in took). Shortest (B >= 2): allocate (one token: len // B is 0), swap_out,
    allocate (every device block), swap_in."""

    def can_swap_in(self, seq):
        self._in(seq, HOST)
        return len(self.free_list[DEVICE]) >= len(self.tokens[seq]) // self.block_size  # bug


class FailedStorePublishes(TieredCache):
    """A store whose copy failed is published anyway: its destinations are findable
    though they hold nothing (SGLang PR #27108, B74: write-back treated a node as backed
    up although the host write had failed). Shortest: allocate, store, complete(ok=False)."""

    def complete(self, job, ok=True):
        super().complete(job, True)  # bug: the failure is ignored


class LoadPastFirstMiss(TieredCache):
    """A load skips a missing block and goes on looking: the hits after it are copied
    into the request's leading blocks, so its first block gets a later block's KV.
    Shortest: allocate (two full blocks and a token), store, complete, evict(1) (the
    first block's copy, least recently used), load of the same prompt (a device pool
    with room for both requests; else a free before the load)."""

    def _lookup(self, tokens):
        keys = self._keys(tokens, (len(tokens) - 1) // self.block_size)
        return [self.cache[k] for k in keys if k in self.cache]  # bug: past the first miss


class StoreEvictsPinned(TieredCache):
    """A store that finds no free and no evictable host block takes the oldest cached
    one anyway, though a pending load still reads it: the copy overwrites a block being
    loaded (SGLang PR #27631, B75, from the store's side). Shortest: allocate (two full
    blocks) on a host of one block, store (the first block), complete, load (pins its
    copy), store (the second block evicts it)."""

    def _room(self):
        return len(self.free_list[HOST]) + len(self.cache)  # bug: every cached block

    def _take_host(self):
        if self.free_list[HOST] or self.lru:
            return super()._take_host()
        key, b = next(iter(self.cache.items()))  # bug: pinned by a pending load
        del self.cache[key], self.key_of[b]
        self.ref[HOST][b] = 1
        return b


class StoresCachedPrefix(TieredCache):
    """A store checks only the pending stores, not the cache: a prefix already on the
    host is stored again, and its completion overwrites the cache entry, leaving the old
    copy held by a key that names another block (duplicate cached copies, a dangling
    mapping: nano-vllm #219, vLLM PR #24084, B57/B61). Shortest: allocate, store,
    complete, store."""

    def _to_store(self, seq):
        toks = self.tokens[seq]
        full = len(toks) // self.block_size
        todo = [(b, k) for b, k in zip(self.tables[seq][:full], self._keys(toks, full), strict=True)
                if k not in self.storing]  # bug: the cache is not consulted
        return todo[: self._room()]


class StoreNeverRegistered(TieredCache):
    """A completed store stamps the key on the host block but never enters it in the
    lookup map: nothing stored is ever found, and the block is held by nothing
    (vLLM #53498, B68: SimpleCPUOffloadConnector set the CPU block's hash directly).
    Shortest: allocate, store, complete."""

    def _publish(self, b, key):
        self.key_of[b] = key  # bug: not in self.cache, not evictable


class CancelsJobOnAbort(TieredCache):
    """An abort cancels the request's transfers in flight at once: the jobs vanish and
    their sources and destinations are released while the worker's copy still runs (the
    rule: an abort in flight frees nothing the copy still uses; vLLM #49889, B67).
    Shortest: allocate, store, free."""

    def free(self, seq):
        for jid in [jid for jid, j in self.jobs.items() if j.seq == seq]:
            j = self.jobs.pop(jid)  # bug: cancelled, though the copy is in flight
            self.storing.difference_update(j.keys)
            src_pool, dst_pool = j.pools
            for b in j.dst:
                self._release(dst_pool, b)
            for b in j.src:
                self._release(src_pool, b)
        super().free(seq)


class StoreKeepsSources(TieredCache):
    """A store that succeeded never releases its device sources (SGLang #5499, B76:
    with write-back the device indices were not released after the host write
    completed; vLLM #44181, B70: device memory grows with offloading). Shortest:
    allocate, store, complete."""

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is not None and j.kind == STORE and ok:
            j.src = []  # bug
        super().complete(job, ok)


class LoadReleasesHostTwice(TieredCache):
    """A completed load releases each host block it read twice: a cached block's
    refcount reaches 0 and it is on the free list while still findable (SGLang PR
    #13501, B73: HiCache prefetch released the same host indices twice). Shortest:
    allocate, store, complete, load, complete."""

    def complete(self, job, ok=True):
        j = self.jobs.get(job)
        if j is not None and j.kind == LOAD:
            j.src = j.src + j.src  # bug
        super().complete(job, ok)


class StoresPartialBlock(TieredCache):
    """A store copies the request's partial last block too, whose KV is still being
    written (vLLM PR #31341, B72: offload copied KV the compute had not finished
    writing; vLLM #49889: keys of never-computed blocks). Shortest: allocate (one token),
    store."""

    def _to_store(self, seq):
        toks = self.tokens[seq]
        n = -(-len(toks) // self.block_size)  # bug: ceil, the partial block included
        todo = [(b, k) for b, k in zip(self.tables[seq][:n], self._keys(toks, n), strict=True)
                if k not in self.cache and k not in self.storing]
        return todo[: self._room()]


class EvictsPastN(TieredCache):
    """evict(n) evicts every evictable block, whatever n (SGLang #4987 / PR #4989, B77:
    evict_host ignored how much it had evicted). Shortest: allocate (two full blocks),
    store, complete, evict(1)."""

    def evict(self, n):
        done = 0
        while self.lru:  # bug: n never consulted
            self._evict_one()
            done += 1
        return done


class SwapOutCountsCached(TieredCache):
    """can_swap_out counts the host cache's evictable blocks as room, but swap_out takes
    only free blocks: the admission over-commits the host pool (vLLM PR #6849, B12: a
    block whose cached copy sits in the evictor counted twice). Shortest: allocate (one
    full block) on a host of one block, store, complete, swap_out."""

    def can_swap_out(self, seq):
        return len(self.free_list[HOST]) + len(self.lru) >= len(self._in(seq, DEVICE))  # bug


class PrefetchReleasesTailTwice(PrefetchingTieredCache):
    """A prefetch completion that filled only part of its pages releases the unfilled
    tail twice: the same host block goes onto the free list twice, and two later
    allocations get it (SGLang PR #13501, B73: 0.5.5.post3's ``_page_transfer`` and the
    prefetch aux thread each queued ``host_indices[completed_tokens:]`` on
    ``host_mem_release_queue``). Shortest: prefetch (one full block), complete(filled=0)."""

    def _prefetched(self, j, filled):
        super()._prefetched(j, filled)
        for b in j.dst[filled:]:
            self.free_list[HOST].append(b)  # bug: released a second time


CORPUS = {
    "frees-pinned-block": (FreesPinnedBlock, "contract", 3),
    "publishes-at-store-start": (PublishesAtStoreStart, "invariant", 2),
    "evicts-load-source": (EvictsLoadSource, "invariant", 4),
    "leaks-aborted-store": (LeaksAbortedStore, "contract", 4),
    "swap-in-floor-admission": (SwapInFloorAdmission, "contract", 4),
    "failed-store-publishes": (FailedStorePublishes, "contract", 3),
    "load-past-first-miss": (LoadPastFirstMiss, "contract", 5),
    "store-evicts-pinned": (StoreEvictsPinned, "contract", 5),
    "stores-cached-prefix": (StoresCachedPrefix, "contract", 4),
    "store-never-registered": (StoreNeverRegistered, "contract", 3),
    "cancels-job-on-abort": (CancelsJobOnAbort, "contract", 3),
    "store-keeps-sources": (StoreKeepsSources, "contract", 3),
    "load-releases-host-twice": (LoadReleasesHostTwice, "contract", 5),
    "stores-partial-block": (StoresPartialBlock, "contract", 2),
    "evicts-past-n": (EvictsPastN, "contract", 4),
    "swap-out-counts-cached": (SwapOutCountsCached, "contract", 4),
    "prefetch-releases-tail-twice": (PrefetchReleasesTailTwice, "contract", 2),
}


# -- legal -----------------------------------------------------------------------------------
class OneBlockPerStore(TieredCache):
    """A store takes at most one block per call (a connector that offloads one block a
    step): the rest waits for later stores."""

    def _to_store(self, seq):
        return super()._to_store(seq)[:1]


class ShorterLoad(TieredCache):
    """A load copies one hit fewer than it found (a connector that recomputes the last
    hit rather than wait for it): a shorter hit is legal; one hit becomes no hit."""

    def _lookup(self, tokens):
        return super()._lookup(tokens)[:-1]


class HashedKeys(TieredCache):
    """The host cache keyed by chained hashes (BLAKE2b of the parent's key and the
    block's tokens, as vLLM's block hashes) instead of token tuples."""

    def _keys(self, tokens, n):
        B, parent, out = self.block_size, b"root", []
        for i in range(n):
            h = hashlib.blake2b(parent, digest_size=16)
            block = tokens[i * B: (i + 1) * B]
            h.update(struct.pack(f"<{len(block)}q", *block))
            parent = h.digest()
            out.append(parent.hex())
        return out


class MruEviction(TieredCache):
    """Eviction takes the most recently used cache-only block first (pinned blocks are
    still never on the list)."""

    def _evict_one(self):
        b, _ = self.lru.popitem(last=True)
        del self.cache[self.key_of.pop(b)]
        self._release(HOST, b)
        return b


class FifoEviction(TieredCache):
    """Eviction by the order blocks were stored, first stored first, whatever loads read
    them since (SGLang's FIFO host eviction policy); still only cache-only blocks."""

    def __init__(self, num_blocks, block_size, host_blocks):
        super().__init__(num_blocks, block_size, host_blocks)
        self.stored_at: dict[int, int] = {}
        self.stores = 0

    def _publish(self, b, key):
        self.stores += 1
        self.stored_at[b] = self.stores
        super()._publish(b, key)

    def _evict_one(self):
        b = min(self.lru, key=self.stored_at.__getitem__)
        del self.lru[b], self.cache[self.key_of.pop(b)]
        self._release(HOST, b)
        return b


class NoEvictForStore(TieredCache):
    """A store uses free host blocks only, never evicting for room (eviction is left to
    evict): fewer stores, legal."""

    def _room(self):
        return len(self.free_list[HOST])


class LifoFree(TieredCache):
    """Both free lists are stacks: the most recently freed block is reused first."""

    def _take(self, pool):
        b = self.free_list[pool].pop()
        self.ref[pool][b] = 1
        return b


class PrefetchKeepsNone(PrefetchingTieredCache):
    """A prefetch whose pages are never kept: every page, filled or not, is released once
    at the completion (a cache that declines what the storage returned; legal, if
    wasteful)."""

    def _prefetched(self, j, filled):
        super()._prefetched(j, 0)


LEGAL = {
    "one-block-per-store": OneBlockPerStore,
    "shorter-load": ShorterLoad,
    "hashed-keys": HashedKeys,
    "mru-eviction": MruEviction,
    "fifo-eviction": FifoEviction,
    "no-evict-for-store": NoEvictForStore,
    "lifo-free": LifoFree,
    "prefetching-reference": PrefetchingTieredCache,
    "prefetch-keeps-none": PrefetchKeepsNone,
}
