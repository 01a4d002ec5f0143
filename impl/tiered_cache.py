"""Reference tiered KV store: a device pool, a host pool with a cache of stored prefixes,
and transfers that complete later (issue 33; the rules: ``kvcheck.spec.tiers``, the
target protocol: docs/tiers.md; ``kvcheck verify-tiers reference-tiers``).

``TieredCache(num_blocks, block_size, host_blocks)`` keeps, per pool, a free list (a
deque: taken from the front, returned at the back) and a refcount per block: the number
of references every holder has to it. The holders:

    a request's table   ``tables[seq]``, in the pool its KV is in (``where[seq]``): the
                        device while it runs, the host while it is swapped out
    a pending job       a store's device sources and host destinations, a load's host
                        sources and device destinations, one reference each, until
                        ``complete(job, ok)``
    the host cache      one reference per key: ``cache`` maps a key to the host block
                        holding that prefix's KV (only completed stores are in it)

The device pool has no cache of its own (it is a plain block manager); only the host
pool's blocks are findable.

Keys. A full block's key is the tuple of the request's tokens from the first up to the
end of that block: a chain, so a key names every token before it too, and a key *is*
what the block holds. (``_keys`` is the one place that says so; a subclass may key by
chained hashes instead.)

LRU. ``lru`` holds the cached host blocks the cache alone holds (refcount 1), least
recently used first: the evictable blocks. A block enters at the back when it becomes
cache-only (its store completed, or the last load reading it completed) and leaves when
a load pins it or it is evicted. Eviction (``evict``, or a store that needs room) takes
the front: a pinned block is never on the list, so it is never evicted.

Jobs. ``store`` and ``load`` start a job (ids 1, 2, 3 ...; never 0, so a job id is never
falsy) and ``complete(job, ok)`` ends it, in any order the caller chooses. A store's
destinations are not findable until it completes; ``storing`` holds the keys of pending
stores so that no prefix is stored twice at once.

Prefetches (``prefetch``, offered by ``PrefetchingTieredCache``):
a storage tier's pages of a prompt fetched into host blocks; ``complete(job, ok, filled)``
publishes the first ``filled`` and releases every other page once.

Swaps (vLLM v0 style: synchronous, no job, no cache): ``swap_out`` moves a device
sequence's table to fresh host blocks from the host free list (never by evicting
cached blocks), ``swap_in`` back; ``can_swap_out`` / ``can_swap_in`` say exactly whether
the other pool's free list has a block for each of the sequence's blocks.

Every operation either succeeds or raises (``OutOfBlocks``, ``MisuseError``) with
nothing changed: checks come before any change.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .errors import MisuseError, OutOfBlocks

DEVICE, HOST = "device", "host"  # kvcheck.spec.tiers.DEVICE, HOST
STORE, LOAD, PREFETCH = "store", "load", "prefetch"
STORAGE = "storage"  # the storage tier a prefetch reads (kvcheck.spec.tiers.STORAGE)


@dataclass
class Job:
    """A pending transfer: ``src`` blocks of one pool copied into ``dst`` blocks of the
    other, position by position, for request ``seq``; ``keys``: a store's key per
    destination (what it is findable as once the store succeeds)."""

    kind: str
    seq: int
    src: list[int]
    dst: list[int]
    keys: list = field(default_factory=list)

    @property
    def pools(self) -> tuple[str, str]:
        if self.kind == PREFETCH:
            return (STORAGE, HOST)
        return (DEVICE, HOST) if self.kind == STORE else (HOST, DEVICE)


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise MisuseError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


class TieredCache:
    """A device pool and a host pool, the host cache, stores and loads in flight, swaps."""

    capabilities = frozenset({"allocate", "append", "free", "store", "load", "complete",
                              "evict", "swap_out", "swap_in"})

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int):
        self.block_size = _count("block_size", block_size, 1)
        self.sizes = {DEVICE: _count("num_blocks", num_blocks, 1),
                      HOST: _count("host_blocks", host_blocks, 0)}
        self.ref = {p: [0] * n for p, n in self.sizes.items()}
        self.free_list = {p: deque(range(n)) for p, n in self.sizes.items()}
        self.tables: dict[int, list[int]] = {}
        self.where: dict[int, str] = {}
        self.tokens: dict[int, list] = {}
        self.cache: dict = {}  # key -> host block (completed stores only: findable)
        self.key_of: dict[int, object] = {}  # host block -> its key
        self.lru: OrderedDict[int, None] = OrderedDict()  # cache-only host blocks, LRU first
        self.jobs: dict[int, Job] = {}
        self.storing: set = set()  # keys of pending stores
        self._last_job = 0

    # -- references ------------------------------------------------------------------
    def _take(self, pool: str) -> int:
        """A free block of ``pool``, refcount 1 (the caller checked there is one)."""
        b = self.free_list[pool].popleft()
        assert self.ref[pool][b] == 0, f"{pool} block {b} on the free list, refcount {self.ref[pool][b]}"
        self.ref[pool][b] = 1
        return b

    def _hold(self, pool: str, b: int) -> None:
        """One more reference to a held block; a host block a job pins is not evictable."""
        if pool == HOST:
            self.lru.pop(b, None)
        self.ref[pool][b] += 1

    def _release(self, pool: str, b: int) -> None:
        """One reference fewer: at 0 the block is free; a cached host block left to the
        cache alone (refcount 1) becomes evictable, the most recently used."""
        count = self.ref[pool][b] - 1
        assert count >= 0, f"double free of {pool} block {b}"
        self.ref[pool][b] = count
        if count == 0:
            self.free_list[pool].append(b)
        elif count == 1 and pool == HOST and b in self.key_of:
            self.lru[b] = None

    def _room(self) -> int:
        """How many host blocks a store may take: the free ones and the evictable ones."""
        return len(self.free_list[HOST]) + len(self.lru)

    def _evict_one(self) -> int:
        """Evict the least recently used cache-only block: it loses its key and is free."""
        b, _ = self.lru.popitem(last=False)
        del self.cache[self.key_of.pop(b)]
        self._release(HOST, b)  # the cache's reference, the only one
        return b

    def _take_host(self) -> int:
        """A host block for a store's copy: a free one, else an evicted one."""
        if not self.free_list[HOST]:
            self._evict_one()
        return self._take(HOST)

    def _publish(self, b: int, key) -> None:
        """A stored block becomes findable under ``key``: the cache's reference replaces
        the job's (the refcount stays 1) and, the cache alone holding it, it is evictable."""
        self.cache[key] = b
        self.key_of[b] = key
        self.lru[b] = None

    # -- keys and lookups --------------------------------------------------------------
    def _keys(self, tokens, n: int) -> list:
        """The keys of the first ``n`` blocks of ``tokens``: the tokens up to the end of
        each block (a chain: a block's key names every token before it too)."""
        B = self.block_size
        return [tuple(tokens[: (i + 1) * B]) for i in range(n)]

    def _lookup(self, tokens) -> list[int]:
        """The host blocks of the leading full blocks of ``tokens`` found in the cache,
        within the first ``len - 1`` tokens (one token is always left to compute), in
        order, up to the first miss."""
        hits = []
        for key in self._keys(tokens, (len(tokens) - 1) // self.block_size):
            b = self.cache.get(key)
            if b is None:
                break
            hits.append(b)
        return hits

    def _to_store(self, seq: int) -> list[tuple[int, object]]:
        """(device block, key) of the request's full blocks whose key is neither cached
        nor being stored, in table order, as many as the host has room for."""
        toks = self.tokens[seq]
        full = len(toks) // self.block_size
        todo = [(b, k) for b, k in zip(self.tables[seq][:full], self._keys(toks, full), strict=True)
                if k not in self.cache and k not in self.storing]
        return todo[: self._room()]

    # -- requests ----------------------------------------------------------------------
    def _live(self, seq: int) -> list[int]:
        table = self.tables.get(seq)
        if table is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return table

    def _new(self, seq: int, tokens) -> list:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        toks = list(tokens)
        if not toks:
            raise MisuseError("a prompt has at least one token")
        return toks

    def _device_blocks(self, toks: list) -> list[int]:
        need = -(-len(toks) // self.block_size)
        if need > len(self.free_list[DEVICE]):
            raise OutOfBlocks(f"need {need} device blocks, {len(self.free_list[DEVICE])} free")
        return [self._take(DEVICE) for _ in range(need)]

    def _start(self, job: Job) -> int:
        self._last_job += 1
        self.jobs[self._last_job] = job
        return self._last_job

    # -- operations ----------------------------------------------------------------------
    def allocate(self, seq: int, tokens) -> None:
        """A new request on the device: ceil(len / B) free device blocks, no lookup."""
        toks = self._new(seq, tokens)
        self.tables[seq] = self._device_blocks(toks)
        self.where[seq], self.tokens[seq] = DEVICE, toks

    def append(self, seq: int, token) -> tuple[int, int]:
        """One more token of a running request, in the block at position len // B: the
        last block when it has room, else a fresh device block. Returns ``(block,
        offset)``. A partial last block is the request's alone: a store copies only full
        blocks, a load writes only blocks within the first len - 1 tokens of its prompt."""
        table = self._live(seq)
        if self.where[seq] != DEVICE:
            raise MisuseError(f"sequence {seq!r} is swapped out")
        k, offset = divmod(len(self.tokens[seq]), self.block_size)
        if k == len(table):
            if not self.free_list[DEVICE]:
                raise OutOfBlocks("no free device block for a new tail block")
            table.append(self._take(DEVICE))
        self.tokens[seq].append(token)
        return table[k], offset

    def free(self, seq: int) -> None:
        """The request ends (finished or aborted): each block of its table loses the
        request's reference; a block a pending job still holds stays held (by the job)
        until that job completes."""
        table = self._live(seq)
        pool = self.where.pop(seq)
        del self.tables[seq], self.tokens[seq]
        for b in table:
            self._release(pool, b)

    def store(self, seq: int) -> int | None:
        """Start copying the request's full blocks whose key is neither cached nor being
        stored to the host, in table order, as many as the host has room for (free
        blocks first, then evicting cache-only blocks, least recently used first). The
        job pins each device source (+1) and holds each host destination (refcount 1);
        no destination is findable until the job completes. None (nothing changed) when
        there is nothing to store, no room, or the request is swapped out."""
        self._live(seq)
        if self.where[seq] != DEVICE:
            return None
        todo = self._to_store(seq)
        if not todo:
            return None
        src = [b for b, _ in todo]
        for b in src:
            self._hold(DEVICE, b)
        dst = [self._take_host() for _ in todo]
        keys = [k for _, k in todo]
        self.storing.update(keys)
        return self._start(Job(STORE, seq, src, dst, keys))

    def load(self, seq: int, tokens) -> int | None:
        """A new request whose leading full blocks (within its first len - 1 tokens) are
        looked up in the host cache, in order, up to the first miss. It gets ceil(len / B)
        free device blocks (OutOfBlocks: nothing changed, nothing pinned); with hits, the
        job pins each hit host block (+1: not evictable until the load completes) and
        holds the first h device blocks it copies them into (+1). No hit: an allocation,
        None."""
        toks = self._new(seq, tokens)
        hits = self._lookup(toks)
        table = self._device_blocks(toks)
        self.tables[seq], self.where[seq], self.tokens[seq] = table, DEVICE, toks
        if not hits:
            return None
        for b in hits:
            self._hold(HOST, b)
        dst = table[: len(hits)]
        for b in dst:
            self._hold(DEVICE, b)
        return self._start(Job(LOAD, seq, list(hits), dst))

    def complete(self, job: int, ok: bool = True, filled: int | None = None) -> None:
        """A pending job ends (``filled``: a prefetch's leading pages filled, see
        ``PrefetchingTieredCache``). A store that succeeded makes each destination findable
        under its key (the cache's reference replaces the job's: refcount 1, evictable);
        one that failed frees its destinations; either way each source loses the job's
        reference. A load (succeeded or failed: the engine recomputes what it could not
        copy) drops its references to its sources and destinations: a hit left to the
        cache alone is evictable again, a destination of a request freed meanwhile is
        free."""
        j = self.jobs.pop(job, None)
        if j is None:
            raise MisuseError(f"no pending job {job!r}")
        src_pool, dst_pool = j.pools
        if j.kind == PREFETCH:
            self._prefetched(j, len(j.dst) if filled is None and ok else filled or 0)
            return
        if j.kind == STORE:
            self.storing.difference_update(j.keys)
            for b, key in zip(j.dst, j.keys, strict=True):
                if ok:
                    self._publish(b, key)
                else:
                    self._release(HOST, b)
        else:
            for b in j.dst:
                self._release(dst_pool, b)
        for b in j.src:
            self._release(src_pool, b)

    def _prefetched(self, j: Job, filled: int) -> None:
        """A prefetch's completion: its first ``filled`` pages are findable under their
        keys (the cache's reference replaces the job's), each other page is released once
        (``kvcheck.spec.tiers.RELEASED_ONCE``)."""
        self.storing.difference_update(j.keys)
        for i, (b, key) in enumerate(zip(j.dst, j.keys, strict=True)):
            if i < filled:
                self._publish(b, key)
            else:
                self._release(HOST, b)

    def prefetch(self, seq: int, tokens) -> int | None:
        """Fetch request ``seq``'s prompt pages from the storage tier into host blocks,
        before it is scheduled (offered as an operation by ``PrefetchingTieredCache``):
        one host block per full block of the prompt past its longest cached prefix, up to
        the prompt's last full block (free blocks first, then evicting cache-only ones).
        All or nothing: too little room, or a page whose key is cached or still being
        written by a store or another prefetch, and no job (None). The job holds each
        destination (refcount 1), none findable until ``complete(job, ok, filled)``
        publishes the first ``filled`` and releases the rest once."""
        toks = list(tokens)
        if not toks:
            raise MisuseError("a prompt has at least one token")
        keys = self._keys(toks, len(toks) // self.block_size)
        at = 0
        while at < len(keys) and keys[at] in self.cache:
            at += 1
        todo = keys[at:]
        if not todo or len(todo) > self._room() or any(
                k in self.storing or k in self.cache for k in todo):
            return None
        dst = [self._take_host() for _ in todo]
        self.storing.update(todo)
        return self._start(Job(PREFETCH, seq, [], dst, todo))

    def evict(self, n: int) -> int:
        """Evict at most ``n`` blocks the cache alone holds, least recently used first:
        each loses its key and is free. Returns how many it evicted."""
        _count("n", n, 0)
        done = 0
        while done < n and self.lru:
            self._evict_one()
            done += 1
        return done

    # -- swaps ----------------------------------------------------------------------------
    def _in(self, seq: int, pool: str) -> list[int]:
        table = self._live(seq)
        if self.where[seq] != pool:
            raise MisuseError(f"sequence {seq!r} is not in the {pool} pool")
        return table

    def can_swap_out(self, seq: int) -> bool:
        """True exactly when the host's free list has a block for each of the sequence's."""
        return len(self.free_list[HOST]) >= len(self._in(seq, DEVICE))

    def can_swap_in(self, seq: int) -> bool:
        """True exactly when the device's free list has a block for each of the sequence's."""
        return len(self.free_list[DEVICE]) >= len(self._in(seq, HOST))

    def swap_out(self, seq: int) -> dict[int, int]:
        """Move a running sequence's KV whole to fresh host blocks: ``{device: host}``."""
        return self._swap(seq, DEVICE, HOST)

    def swap_in(self, seq: int) -> dict[int, int]:
        """Move a swapped-out sequence's KV whole back to fresh device blocks:
        ``{host: device}``."""
        return self._swap(seq, HOST, DEVICE)

    def _swap(self, seq: int, src: str, dst: str) -> dict[int, int]:
        """Fresh ``dst`` blocks from its free list (never evicted ones), one per block of
        the table, taken before the ``src`` blocks lose the sequence's reference (a block
        a pending store still reads stays held by the store). A sequence a pending load
        is still writing is not running: swapping it is a caller's error."""
        table = self._in(seq, src)
        if any(b in j.dst for j in self.jobs.values() if j.pools[1] == src for b in table):
            raise MisuseError(f"sequence {seq!r} has blocks a pending load is still writing")
        if len(table) > len(self.free_list[dst]):
            raise OutOfBlocks(f"need {len(table)} {dst} blocks, {len(self.free_list[dst])} free")
        new = [self._take(dst) for _ in table]
        for b in table:
            self._release(src, b)
        self.tables[seq], self.where[seq] = new, dst
        return dict(zip(table, new, strict=True))

    # -- observation (docs/tiers.md) ---------------------------------------------------------
    def pools(self) -> dict[str, int]:
        return dict(self.sizes)

    def refcount(self, pool: str, b: int) -> int:
        """Every holder's references to block ``b`` of ``pool``, the cache's included."""
        return self.ref[pool][b]

    def free_blocks(self, pool: str) -> list[int]:
        return list(self.free_list[pool])

    def table(self, seq: int) -> tuple[str, list[int]] | None:
        """``(pool, blocks)`` of a live sequence; None for any other."""
        if seq not in self.tables:
            return None
        return self.where[seq], list(self.tables[seq])

    def live_seqs(self) -> list[int]:
        return list(self.tables)

    def pending_jobs(self) -> dict[int, dict]:
        out = {}
        for jid, j in self.jobs.items():
            src_pool, dst_pool = j.pools
            out[jid] = {"kind": j.kind, "seq": j.seq, "src": (src_pool, list(j.src)),
                        "dst": (dst_pool, list(j.dst))}
            if j.kind == PREFETCH:
                out[jid]["holds_src"] = False  # (the storage tier: nothing held)
        return out

    def cache_entries(self, pool: str) -> list[tuple[object, int]]:
        """The blocks a lookup can find: the host cache's (the device pool has none)."""
        return list(self.cache.items()) if pool == HOST else []

    def evictable_blocks(self, pool: str) -> list[int]:
        """The blocks the cache would evict, in the order it would."""
        return list(self.lru) if pool == HOST else []

    def pins(self, pool: str) -> dict[str, list[int]]:
        return {}


class PrefetchingTieredCache(TieredCache):
    """The reference with a storage tier behind the host (SGLang's HiCache L3): besides
    every operation of ``TieredCache``, ``prefetch(seq, tokens)`` (``TieredCache.prefetch``)
    fetches a request's prompt pages from the storage into host blocks before it is
    scheduled (``kvcheck verify-tiers kvcheck.impl.tiered_cache:PrefetchingTieredCache``).

    The storage is content-addressed and answers what the caller says: the completion
    ``complete(job, ok, filled)`` tells how many leading pages came back (``filled``; the
    rest were missing or the fetch was cut short): the filled pages are published under
    their keys, every other page is released once (``kvcheck.spec.tiers.RELEASED_ONCE``)."""

    capabilities = TieredCache.capabilities | {PREFETCH}
