"""The reference tiered store (``impl/tiered_cache.py``) on its own: hand-written scenarios,
one per rule of docs/tiers.md, read through the target's observation methods only and
independent of kvcheck's tiers oracle (``Run`` below is a small ghost of its own: what
each block holds, what each key was stored as).

Every legal variant of ``tests/corpus/tiers.py`` passes every scenario; every buggy
variant fails one, with the rule it breaks named (``CAUGHT``), in a test of its own."""

from __future__ import annotations

from collections import Counter

import pytest

from kvcheck.impl.errors import MisuseError, OutOfBlocks
from kvcheck.impl.tiered_cache import DEVICE, HOST, TieredCache

from corpus.tiers import CORPUS, LEGAL


class Broken(AssertionError):
    """A rule the target broke, worded as the scenario checks it."""


def rule(ok: bool, what: str) -> None:
    if not ok:
        raise Broken(what)


def prompt(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def full_prefixes(toks, B: int) -> set[tuple]:
    """The prefixes of the full blocks of ``toks``: what a store of them makes findable."""
    return {tuple(toks[: (i + 1) * B]) for i in range(len(toks) // B)}


class Run:
    """Drives one target, checks each operation's own rule as it returns and, after every
    step, the rules every state obeys: refcounts count every holder (tables, pending jobs,
    the cache), the free list is the unheld blocks, a pending store's destination is not
    findable, the evictable blocks are exactly those the cache alone holds, a findable
    block holds the prefix its key was stored as, a live request's blocks hold its tokens
    (except those a pending load is still writing)."""

    def __init__(self, cls, n: int = 8, B: int = 2, host: int = 8):
        self.t = cls(n, B, host)
        self.B = B
        self.sizes = dict(self.t.pools())
        rule(self.sizes == {DEVICE: n, HOST: host}, "pools() names both pools and their sizes")
        self.toks: dict[int, list] = {}
        self.content: dict[tuple[str, int], tuple] = {}  # (pool, block) -> prefix it holds
        self.meaning: dict = {}  # key -> the prefix its store copied
        self.jobs: dict = {}  # job -> what it was started as
        self.check()

    # -- the ghost -------------------------------------------------------------------
    def prefix(self, toks, i: int) -> tuple:
        return tuple(toks[: min((i + 1) * self.B, len(toks))])

    def nblocks(self, toks) -> int:
        return -(-len(toks) // self.B)

    def keyed(self, pool: str = HOST) -> dict[int, object]:
        return {b: k for k, b in self.t.cache_entries(pool)}

    def observe(self):
        t = self.t
        return ({p: [t.refcount(p, b) for b in range(n)] for p, n in self.sizes.items()},
                {p: list(t.free_blocks(p)) for p in self.sizes},
                {q: t.table(q) for q in self.toks},
                {j: (d["kind"], d["seq"], d["src"][0], list(d["src"][1]), d["dst"][0],
                     list(d["dst"][1])) for j, d in t.pending_jobs().items()},
                {p: sorted(map(repr, t.cache_entries(p))) for p in self.sizes},
                {p: sorted(t.evictable_blocks(p)) for p in self.sizes})

    def check(self) -> None:
        t = self.t
        jobs = t.pending_jobs()
        rule(set(jobs) == set(self.jobs), "the pending jobs are those started and not completed")
        rule(set(t.live_seqs()) == set(self.toks), "live_seqs() names the live requests")
        for pool, size in self.sizes.items():
            holders: Counter = Counter()
            for q in self.toks:
                p, blocks = t.table(q)
                if p == pool:
                    holders.update(blocks)
            for d in jobs.values():
                for side in ("src", "dst"):
                    p, blocks = d[side]
                    if p == pool:
                        holders.update(blocks)
            cached = [b for _, b in t.cache_entries(pool)]
            holders.update(cached)
            for b in range(size):
                rule(t.refcount(pool, b) == holders[b],
                     "a refcount counts every holder's references (tables, jobs, the cache)")
            free = list(t.free_blocks(pool))
            rule(len(free) == len(set(free)) and set(free) == {b for b in range(size) if not holders[b]},
                 "a block is on the free list, once, exactly when nothing holds it")
            rule(len(cached) == len(set(cached)), "a key names one block, a block has one key")
            writing = {b for d in jobs.values() if d["dst"][0] == pool for b in d["dst"][1]}
            rule(not writing & set(cached), "a pending store's destination is not findable")
            rule(set(t.evictable_blocks(pool)) == {b for b in cached if holders[b] == 1},
                 "the evictable blocks are exactly those the cache alone holds")
            if not self.toks and not jobs:
                rule(all(holders[b] == 0 or b in cached for b in range(size)),
                     "at quiescence only the cache holds a block")
        for key, b in t.cache_entries(HOST):
            rule(key in self.meaning, "every key was published by a store that completed")
            rule(self.content.get((HOST, b)) == self.meaning[key],
                 "a findable block holds the prefix its key was stored as")
        for q, toks in self.toks.items():
            pool, table = t.table(q)
            rule(len(table) == self.nblocks(toks), "a request holds ceil(len / B) blocks")
            writing = {b for d in jobs.values() if d["dst"][0] == pool for b in d["dst"][1]}
            for i, b in enumerate(table):
                rule(b in writing or self.content.get((pool, b)) == self.prefix(toks, i),
                     "a live request's blocks hold its tokens")

    def expect_oob(self, fn, *args) -> None:
        before = self.observe()
        with pytest.raises(OutOfBlocks):
            fn(*args)
        rule(self.observe() == before, "an operation out of blocks changes nothing")

    # -- operations -------------------------------------------------------------------
    def _admitted(self, q: int, toks: list, table: list, skip: int = 0) -> None:
        self.toks[q] = list(toks)
        for i, b in enumerate(table[skip:], start=skip):
            self.content[(DEVICE, b)] = self.prefix(toks, i)

    def allocate(self, q: int, toks: list) -> None:
        self.t.allocate(q, toks)
        pool, table = self.t.table(q)
        rule(pool == DEVICE and len(table) == self.nblocks(toks),
             "allocate: ceil(len / B) device blocks")
        self._admitted(q, toks, table)
        self.check()

    def load(self, q: int, toks: list):
        keyed = self.keyed()
        j = self.t.load(q, toks)
        pool, table = self.t.table(q)
        rule(pool == DEVICE and len(table) == self.nblocks(toks), "load: ceil(len / B) device blocks")
        if j is None:
            self._admitted(q, toks, table)
            self.check()
            return None
        d = self.t.pending_jobs()[j]
        rule(d["kind"] == "load" and d["seq"] == q and d["src"][0] == HOST and d["dst"][0] == DEVICE,
             "a load's job copies host blocks to the request's device blocks")
        src, dst = list(d["src"][1]), list(d["dst"][1])
        rule(0 < len(src) == len(dst) and dst == table[: len(src)],
             "a load copies its hits into the request's leading blocks")
        rule(len(src) <= (len(toks) - 1) // self.B, "a load leaves the last token to compute")
        for i, b in enumerate(src):
            rule(b in keyed and self.meaning.get(keyed[b]) == self.prefix(toks, i),
                 "each hit is a findable block stored as exactly that prefix of the request")
        self.jobs[j] = {"kind": "load", "src": src, "dst": dst,
                        "wanted": [self.prefix(toks, i) for i in range(len(src))]}
        self._admitted(q, toks, table, skip=len(src))
        self.check()
        return j

    def append(self, q: int, token) -> None:
        n = len(self.toks[q])
        block, offset = self.t.append(q, token)
        self.toks[q].append(token)
        pool, table = self.t.table(q)
        rule(pool == DEVICE and block == table[n // self.B] and offset == n % self.B,
             "an append writes slot len of the request's table")
        self.content[(DEVICE, block)] = self.prefix(self.toks[q], n // self.B)
        self.check()

    def free(self, q: int) -> None:
        self.t.free(q)
        del self.toks[q]
        rule(self.t.table(q) is None, "a freed request has no table")
        self.check()

    def store(self, q: int):
        t, toks = self.t, self.toks[q]
        pool, table = t.table(q)
        on_host = set(self.meaning[k] for k in self.keyed().values())
        on_host |= {p for j in self.jobs.values() if j["kind"] == "store" for p in j["prefixes"]}
        room = set(t.free_blocks(HOST)) | set(t.evictable_blocks(HOST))
        j = t.store(q)
        if j is None:
            self.check()
            return None
        d = t.pending_jobs()[j]
        rule(d["kind"] == "store" and d["seq"] == q and d["src"][0] == DEVICE and d["dst"][0] == HOST,
             "a store's job copies the request's device blocks to host blocks")
        src, dst = list(d["src"][1]), list(d["dst"][1])
        full = table[: len(toks) // self.B]
        rule(0 < len(src) == len(set(src)) and set(src) <= set(full),
             "a store copies only full blocks of the request")
        prefixes = [self.prefix(toks, table.index(b)) for b in src]
        rule(not set(prefixes) & on_host, "a store never copies a prefix already cached or being stored")
        rule(len(dst) == len(src) == len(set(dst)) and set(dst) <= room,
             "a store's destinations were free, or held by the cache alone")
        self.jobs[j] = {"kind": "store", "src": src, "dst": dst, "prefixes": prefixes}
        self.check()
        return j

    def store_all(self, q: int) -> int:
        """Store and complete until nothing is left to store; how many stores it took."""
        for n in range(4 * len(self.toks[q]) + 1):
            j = self.store(q)
            if j is None:
                return n
            self.complete(j, True)
        raise Broken("a store keeps starting jobs for the same blocks")

    def complete(self, j, ok: bool) -> None:
        rec = self.jobs.pop(j)
        self.t.complete(j, ok)
        rule(j not in self.t.pending_jobs(), "a completed job is no longer pending")
        keyed = self.keyed()
        if rec["kind"] == "store":
            for s, d, p in zip(rec["src"], rec["dst"], rec["prefixes"], strict=True):
                if ok:
                    rule(d in keyed, "a stored block is findable once its store completed")
                    self.meaning.setdefault(keyed[d], p)
                    self.content[(HOST, d)] = self.content.get((DEVICE, s))
                else:
                    rule(d not in keyed and d in self.t.free_blocks(HOST),
                         "a failed store leaves its destinations free and unfindable")
        else:
            for s, d, w in zip(rec["src"], rec["dst"], rec["wanted"], strict=True):
                self.content[(DEVICE, d)] = self.content.get((HOST, s)) if ok else w
        self.check()

    def evict(self, n: int) -> int:
        before = set(self.keyed())
        evictable = set(self.t.evictable_blocks(HOST))
        got = self.t.evict(n)
        gone = before - set(self.keyed())
        rule(got == len(gone), "evict returns how many blocks it evicted")
        rule(len(gone) <= n, "evict(n) evicts at most n blocks")
        rule(gone <= evictable, "eviction takes only blocks the cache alone holds")
        rule(gone <= set(self.t.free_blocks(HOST)), "an evicted block is free")
        self.check()
        return got

    def swap(self, q: int, out: bool) -> bool:
        t = self.t
        src, dst = (DEVICE, HOST) if out else (HOST, DEVICE)
        pool, table = t.table(q)
        rule(pool == src, "a swap starts from the pool the request is in")
        admitted = (t.can_swap_out if out else t.can_swap_in)(q)
        rule(admitted == (len(t.free_blocks(dst)) >= len(table)),
             "a swap's admission check agrees with the free blocks of the other pool")
        swap = t.swap_out if out else t.swap_in
        if not admitted:
            self.expect_oob(swap, q)
            self.check()
            return False
        moved = swap(q)
        pool, new = t.table(q)
        rule(pool == dst and len(new) == len(table) and dict(moved) == dict(zip(table, new, strict=True)),
             "an admitted swap moves the whole table to the other pool, block by block")
        for a, b in zip(table, new, strict=True):
            self.content[(dst, b)] = self.content.get((src, a))
        self.check()
        return True


# -- scenarios, one per rule ------------------------------------------------------------------
def store_then_complete_makes_findable(cls, B):
    """A store pins full blocks and is not findable until it completes; then every full
    block of the request is findable, held by the cache alone, and nothing is stored twice."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    j = r.store(0)
    rule(j is not None, "a store of full blocks not on the host starts a job")
    src, dst = r.jobs[j]["src"], r.jobs[j]["dst"]
    rule(all(r.t.refcount(DEVICE, b) == 2 for b in src), "a store pins each source")
    rule(not set(dst) & set(r.keyed()), "a pending store's destination is not findable")
    r.complete(j, True)
    rule(all(r.t.refcount(DEVICE, b) == 1 for b in src), "a completed store releases its sources")
    rule(all(r.t.refcount(HOST, b) == 1 and b in r.t.evictable_blocks(HOST) for b in dst),
         "a stored block is held by the cache alone")
    r.store_all(0)
    rule(set(r.meaning.values()) == full_prefixes(toks, B),
         "every full block of the request is stored, the partial one never")
    rule(r.store(0) is None, "nothing left to store: no job")
    r.free(0)
    rule(len(r.t.free_blocks(DEVICE)) == 8, "at quiescence every device block is free")


def store_skips_pending_prefix(cls, B):
    """Two requests with the same prefix: the second's store never copies what the first's
    pending store is copying."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    j = r.store(0)
    r.allocate(1, toks + [99])
    j1 = r.store(1)  # Run.store checks it copies no prefix being stored
    r.complete(j, True)
    if j1 is not None:
        r.complete(j1, True)
    r.store_all(0)
    r.store_all(1)
    r.free(0)
    r.free(1)


def load_of_stored_hits(cls, B):
    """A load of stored prefixes pins each hit until it completes and copies it into the
    request's leading blocks; then the hits are the cache's alone again. A failed load
    leaves the same references (the engine recomputes)."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    r.store_all(0)
    r.free(0)
    j = r.load(1, toks)
    rule(j is not None, "a load of a stored prefix hits")
    hits = r.jobs[j]["src"]
    rule(all(r.t.refcount(HOST, b) == 2 and b not in r.t.evictable_blocks(HOST) for b in hits),
         "a load pins the hits it reads")
    r.complete(j, True)
    rule(all(r.t.refcount(HOST, b) == 1 and b in r.t.evictable_blocks(HOST) for b in hits),
         "a hit is the cache's alone once the load completed")
    r.free(1)
    j = r.load(2, toks[: 2 * B])  # Run.load checks the last token is left to compute
    if j is not None:
        r.complete(j, True)
    r.free(2)
    j = r.load(3, toks)
    r.complete(j, False)
    r.free(3)


def load_stops_at_first_miss(cls, B):
    """A load's hits are leading blocks, up to the first miss: with the first block's copy
    evicted, the second block's copy is no hit. Returns whether that state was reached."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    r.store_all(0)
    r.free(0)
    first = tuple(toks[:B])
    while first in {r.meaning[k] for k in r.keyed().values()} and r.evict(1):
        pass
    on_host = {r.meaning[k] for k in r.keyed().values()}
    j = r.load(1, toks)  # Run.load checks each hit is exactly that prefix
    rule(first in on_host or j is None, "a load stops at the first miss")
    if j is not None:
        r.complete(j, True)
    r.free(1)
    return first not in on_host and tuple(toks[: 2 * B]) in on_host


def failed_store_frees_and_retries(cls, B):
    """A failed store publishes nothing and frees its destinations; the same blocks can be
    stored again, and then are found."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    j = r.store(0)
    r.complete(j, False)
    rule(not r.t.cache_entries(HOST), "a failed store publishes nothing")
    rule(len(r.t.free_blocks(HOST)) == 8, "a failed store leaves the host pool free")
    rule(r.store_all(0) >= 1, "a failed store can be retried")
    rule(set(r.meaning.values()) == full_prefixes(toks, B), "a retried store makes the blocks findable")
    r.free(0)


def abort_in_flight_releases_once_complete(cls, B):
    """A request freed while its store (or load) is in flight: the job keeps its blocks
    held until it completes, and then every block is free or cached."""
    r = Run(cls, 8, B, 8)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    j = r.store(0)
    src = r.jobs[j]["src"]
    r.free(0)
    rule(j in r.t.pending_jobs(), "an abort leaves its transfers pending")
    rule(all(r.t.refcount(DEVICE, b) == 1 and b not in r.t.free_blocks(DEVICE) for b in src),
         "a block a pending store pins stays held after its request is freed")
    r.complete(j, True)
    rule(len(r.t.free_blocks(DEVICE)) == 8, "an aborted request's blocks are free once its store completes")
    j = r.load(1, toks)
    r.free(1)
    rule(all(r.t.refcount(DEVICE, b) == 1 for b in r.jobs[j]["dst"]),
         "a block a pending load writes stays held after its request is freed")
    r.complete(j, True)
    rule(len(r.t.free_blocks(DEVICE)) == 8, "an aborted request's blocks are free once its load completes")
    r.allocate(2, prompt(2 * B, start=100))
    j = r.store(2)
    r.free(2)
    r.complete(j, False)
    rule(len(r.t.free_blocks(DEVICE)) == 8, "an aborted request's blocks are free once its failed store completes")


def eviction_never_takes_pinned(cls, B):
    """A host block a pending load reads is neither evicted by evict nor taken by a store
    that needs room."""
    toks = prompt(2 * B + 1)
    host = len(toks) // B  # room for every full block, no more
    r = Run(cls, 8, B, host)
    r.allocate(0, toks)
    r.store_all(0)
    r.free(0)
    j = r.load(1, toks)
    rule(j is not None, "a load of a stored prefix hits")
    pinned = r.jobs[j]["src"]
    r.evict(host)
    r.allocate(2, prompt(B, start=100))
    r.allocate(3, prompt(B, start=200))
    js = [r.store(2), r.store(3)]  # Run.store checks each destination was free or evictable
    rule(all(b in r.keyed() and r.t.refcount(HOST, b) == 2 for b in pinned),
         "a block a pending load reads stays cached and pinned")
    r.complete(j, True)
    for x in js:
        if x is not None:
            r.complete(x, True)
    for q in (1, 2, 3):
        r.free(q)


def evict_at_most_n(cls, B):
    """evict(n) evicts at most n blocks, each one the cache alone held, and says how many."""
    r = Run(cls, 8, B, 8)
    r.allocate(0, prompt(3 * B))
    r.store_all(0)
    r.free(0)
    r.evict(0)
    r.evict(1)
    r.evict(1)
    r.evict(8)


def swaps_agree_with_admission(cls, B):
    """can_swap_out / can_swap_in say yes exactly when the other pool has a free block for
    each of the sequence's blocks (cached blocks are no room); an admitted swap moves the
    table whole, a refused one changes nothing."""
    r = Run(cls, 4, B, 4)
    r.allocate(0, prompt(B + 1))
    rule(r.swap(0, out=True), "a swap-out with room is admitted")
    r.allocate(1, prompt(3 * B, start=50))  # one device block left, two needed
    r.swap(0, out=False)
    r.free(1)
    rule(r.swap(0, out=False), "a swap-in with room is admitted")
    r.append(0, 7)
    r.free(0)
    r = Run(cls, 4, B, 2)
    r.allocate(5, prompt(2 * B, start=70))
    r.store_all(5)
    r.free(5)
    r.allocate(0, prompt(B + 1))
    r.swap(0, out=True)  # the host's blocks are cached, none free
    r.evict(2)
    r.swap(0, out=True)
    r.free(0)
    r = Run(cls, 4, B, 4)  # a swap-out while a store of the request is in flight
    r.allocate(0, prompt(2 * B))
    j = r.store(0)
    rule(r.swap(0, out=True), "a swap-out with room is admitted")
    r.complete(j, True)
    r.swap(0, out=False)
    r.free(0)


def out_of_blocks_changes_nothing(cls, B):
    """allocate, load and append out of device blocks raise OutOfBlocks and change
    nothing (a load pins no hit)."""
    r = Run(cls, 3, B, 4)
    toks = prompt(2 * B + 1)
    r.allocate(0, toks)
    r.store_all(0)
    r.expect_oob(r.t.allocate, 1, [9])
    r.expect_oob(r.t.load, 1, toks)
    r.free(0)
    r.allocate(1, prompt(3 * B, start=30))
    r.expect_oob(r.t.append, 1, 7)
    r.free(1)


def append_in_place_or_fresh(cls, B):
    """An append writes the block at position len // B: the last one while it has room, a
    fresh one at a block boundary; a store then finds the blocks the appends filled."""
    r = Run(cls, 8, B, 8)
    r.allocate(0, prompt(1))
    for k in range(2 * B):
        r.append(0, 100 + k)
    r.store_all(0)
    rule(len(r.meaning) == (1 + 2 * B) // B, "the blocks appends filled are stored")
    r.free(0)


def prefetch_fills_part_releases_rest_once(cls, B):
    """A prefetch holds one host block per full block of the prompt, none findable while
    pending; a completion that filled only its first page publishes that page under its
    prefix (or releases it) and releases every other page once: on the free list once,
    held by nothing. A later prefetch of the same prompt fetches only the pages past what
    the cache now holds."""
    r = Run(cls, 8, B, 8)
    toks = prompt(3 * B)
    j = r.t.prefetch(100, toks)
    rule(j is not None, "a prefetch of pages not on the host starts a job")
    d = r.t.pending_jobs()[j]
    pool, dst = d["dst"][0], list(d["dst"][1])
    rule(d["kind"] == "prefetch" and pool == HOST and len(dst) == 3,
         "a prefetch takes one host block per full block of the prompt")
    rule(all(r.t.refcount(HOST, b) == 1 for b in dst) and not set(dst) & set(r.keyed())
         and not set(dst) & set(r.t.free_blocks(HOST)),
         "a prefetch's destinations are held by it alone, not findable")
    r.jobs[j] = {"kind": "prefetch"}
    r.check()
    del r.jobs[j]
    r.t.complete(j, True, 1)
    rule(j not in r.t.pending_jobs(), "a completed job is no longer pending")
    keyed, free = r.keyed(), list(r.t.free_blocks(HOST))
    rule(all(free.count(b) == 1 and r.t.refcount(HOST, b) == 0 and b not in keyed
             for b in dst[1:]), "a prefetched page it does not keep is released once")
    if dst[0] in keyed:  # (kept: it holds the first page's prefix)
        r.meaning[keyed[dst[0]]] = r.content[(HOST, dst[0])] = r.prefix(toks, 0)
    else:
        rule(free.count(dst[0]) == 1, "a filled page it does not keep is released once")
    r.check()
    j = r.t.prefetch(101, toks)
    d = r.t.pending_jobs()[j]
    rule(len(d["dst"][1]) == 3 - len(keyed), "a prefetch fetches only the pages not cached")
    r.jobs[j] = {"kind": "prefetch"}
    r.check()


SCENARIOS = {f.__name__: f for f in (
    prefetch_fills_part_releases_rest_once,
    store_then_complete_makes_findable, store_skips_pending_prefix, load_of_stored_hits,
    load_stops_at_first_miss, failed_store_frees_and_retries, abort_in_flight_releases_once_complete,
    eviction_never_takes_pinned, evict_at_most_n, swaps_agree_with_admission,
    out_of_blocks_changes_nothing, append_in_place_or_fresh)}
GOOD = {"reference": TieredCache, **LEGAL}

# Each buggy variant: the scenario that catches it and the rule it breaks there.
CAUGHT = {
    "frees-pinned-block": ("abort_in_flight_releases_once_complete", "a refcount counts every holder"),
    "publishes-at-store-start": ("store_then_complete_makes_findable",
                                 "a pending store's destination is not findable"),
    "evicts-load-source": ("eviction_never_takes_pinned",
                           "the evictable blocks are exactly those the cache alone holds"),
    "leaks-aborted-store": ("abort_in_flight_releases_once_complete", "a refcount counts every holder"),
    "swap-in-floor-admission": ("swaps_agree_with_admission",
                                "a swap's admission check agrees with the free blocks"),
    "failed-store-publishes": ("failed_store_frees_and_retries",
                               "a failed store leaves its destinations free and unfindable"),
    "load-past-first-miss": ("load_stops_at_first_miss",
                             "each hit is a findable block stored as exactly that prefix"),
    "store-evicts-pinned": ("eviction_never_takes_pinned",
                            "a store's destinations were free, or held by the cache alone"),
    "stores-cached-prefix": ("store_then_complete_makes_findable",
                             "a store never copies a prefix already cached or being stored"),
    "store-never-registered": ("store_then_complete_makes_findable",
                               "a stored block is findable once its store completed"),
    "cancels-job-on-abort": ("abort_in_flight_releases_once_complete",
                             "the pending jobs are those started and not completed"),
    "store-keeps-sources": ("store_then_complete_makes_findable", "a refcount counts every holder"),
    "load-releases-host-twice": ("load_of_stored_hits", "a refcount counts every holder"),
    "stores-partial-block": ("store_then_complete_makes_findable",
                             "a store copies only full blocks of the request"),
    "evicts-past-n": ("evict_at_most_n", "evict(n) evicts at most n blocks"),
    "swap-out-counts-cached": ("swaps_agree_with_admission",
                               "a swap's admission check agrees with the free blocks"),
    "prefetch-releases-tail-twice": ("prefetch_fills_part_releases_rest_once",
                                     "a prefetched page it does not keep is released once"),
}


@pytest.mark.parametrize("B", [1, 2, 3])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", sorted(GOOD))
def test_rule_holds(name, scenario, B):
    SCENARIOS[scenario](GOOD[name], B)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_buggy_variant_caught(name):
    scenario, says = CAUGHT[name]
    with pytest.raises(Broken) as caught:
        SCENARIOS[scenario](CORPUS[name][0], 2)
    assert says in str(caught.value), f"{name}: {caught.value}"


def test_every_corpus_entry_is_caught_here():
    assert set(CAUGHT) == set(CORPUS)
    assert all(kind in ("invariant", "contract") and n >= 1 for _, kind, n in CORPUS.values())


# -- the reference's own choices -----------------------------------------------------------------
@pytest.mark.parametrize("B", [1, 2, 3])
def test_first_miss_state_reached(B):
    """The reference's LRU evicts the first block's copy first, so the first-miss scenario
    is not vacuous on it (nor on the buggy variant, which keeps the same LRU)."""
    assert load_stops_at_first_miss(TieredCache, B)


def test_lru_order_and_exact_counts():
    r = Run(TieredCache, 8, 2, 8)
    r.allocate(0, prompt(7))  # three full blocks
    r.store_all(0)
    r.free(0)
    by_prefix = {r.meaning[k]: b for b, k in r.keyed().items()}
    first, second = by_prefix[tuple(prompt(2))], by_prefix[tuple(prompt(4))]
    assert r.t.evictable_blocks(HOST)[0] == first  # stored first, used least recently
    j = r.load(1, prompt(3))  # one hit: the first block's copy, used now
    r.complete(j, True)
    r.free(1)
    assert r.t.evictable_blocks(HOST)[-1] == first
    assert r.evict(1) == 1 and second not in r.keyed()
    assert r.evict(5) == 2 and r.evict(1) == 0
    assert not r.t.cache_entries(HOST) and len(r.t.free_blocks(HOST)) == 8


def test_store_takes_room_by_evicting_lru():
    r = Run(TieredCache, 8, 2, 2)
    r.allocate(0, prompt(4))
    r.store_all(0)
    r.free(0)
    lru = r.t.evictable_blocks(HOST)[0]
    assert lru == r.t.cache[tuple(prompt(2))]
    r.allocate(1, prompt(2, start=50))
    j = r.store(1)
    assert j is not None and r.jobs[j]["dst"] == [lru]  # the least recently used copy made room
    assert [k for k, _ in r.t.cache_entries(HOST)] == [tuple(prompt(4))]
    r.complete(j, True)
    r.free(1)


def test_job_ids_start_at_one_and_results():
    t = TieredCache(4, 2, 4)
    t.allocate(0, [1, 2, 3])
    assert t.store(0) == 1
    assert t.append(0, 4) == (t.table(0)[1][1], 1)
    assert t.append(0, 5) == (t.table(0)[1][2], 0)
    assert t.store(0) == 2
    assert t.capabilities >= {"allocate", "append", "free", "store", "load", "complete", "evict",
                              "swap_out", "swap_in"}
    assert t.pins(HOST) == {} and t.cache_entries(DEVICE) == [] and t.evictable_blocks(DEVICE) == []


def test_misuse_changes_nothing():
    r = Run(TieredCache, 4, 2, 4)
    r.allocate(0, prompt(3))
    before = r.observe()
    for fn, args in [(r.t.allocate, (0, [1])), (r.t.load, (0, [1])), (r.t.allocate, (1, [])),
                     (r.t.free, (9,)), (r.t.store, (9,)), (r.t.complete, (5, True)),
                     (r.t.append, (9, 1)), (r.t.can_swap_in, (0,)), (r.t.swap_in, (0,)),
                     (r.t.evict, (-1,))]:
        with pytest.raises(MisuseError):
            fn(*args)
        assert r.observe() == before, fn.__name__
    for bad in [(0, 2, 1), (4, 0, 1), (4, 2, -1), (True, 2, 1)]:
        with pytest.raises(MisuseError):
            TieredCache(*bad)


def test_swapped_out_request():
    """A swapped-out request is not running: no append (a caller's error), nothing to
    store (None), and it can be freed from the host."""
    r = Run(TieredCache, 4, 2, 4)
    r.allocate(0, prompt(4))
    r.swap(0, out=True)
    with pytest.raises(MisuseError):
        r.t.append(0, 9)
    assert r.store(0) is None
    r.free(0)
    assert len(r.t.free_blocks(HOST)) == 4


def test_swap_of_a_request_being_loaded_is_refused():
    """A request whose load is pending is not running (its leading blocks are still being
    written): swapping it out is a caller's error, and changes nothing."""
    r = Run(TieredCache, 8, 2, 8)
    r.allocate(0, prompt(5))
    r.store_all(0)
    r.free(0)
    j = r.load(1, prompt(5))
    before = r.observe()
    with pytest.raises(MisuseError):
        r.t.swap_out(1)
    assert r.observe() == before
    r.complete(j, True)
    r.swap(1, out=True)
    r.free(1)


def test_registered_as_reference_tiers():
    from kvcheck.targets.loading import _import_attr
    from kvcheck.targets.registry import TIERS_TARGETS

    assert _import_attr(TIERS_TARGETS["reference-tiers"][0]) is TieredCache


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(GOOD))
def test_random_walk_keeps_every_rule(name, seed):
    """Seeded random operations (shared prefixes, stores and loads completed or failed in
    any order, aborts in flight, evictions, swaps) with every rule of ``Run`` checked after
    each step."""
    import random

    rng = random.Random(seed)
    B = 1 + seed % 3
    r = Run(GOOD[name], 6, B, 4)
    prompts = [prompt(rng.randint(1, 3 * B + 1)) for _ in range(3)]
    next_seq, ops = 0, Counter()
    for _ in range(400):
        live = sorted(r.toks)
        loading = {q for j in r.jobs.values() if j["kind"] == "load"
                   for q in live if set(j["dst"]) & set(r.t.table(q)[1])}
        roll = rng.random()
        before = r.observe()
        try:
            if roll < 0.2 or not live:
                toks = list(rng.choice(prompts))[: rng.randint(1, 3 * B + 1)]
                toks += [rng.randrange(2) for _ in range(rng.randint(0, B))]
                toks = toks or [0]
                (r.load if rng.random() < 0.6 else r.allocate)(next_seq, toks)
                next_seq += 1
                ops["admit"] += 1
            elif roll < 0.35 and r.jobs:
                r.complete(rng.choice(sorted(r.jobs)), rng.random() < 0.8)
                ops["complete"] += 1
            elif roll < 0.5:
                q = rng.choice(live)
                if r.t.table(q)[0] == DEVICE:
                    ops["store"] += r.store(q) is not None
            elif roll < 0.6:
                r.free(rng.choice(live))
                ops["free"] += 1
            elif roll < 0.67:
                ops["evicted"] += r.evict(rng.randint(1, 3))
            elif roll < 0.75:
                q = rng.choice(live)
                if q not in loading:
                    ops["swap"] += r.swap(q, out=r.t.table(q)[0] == DEVICE)
            else:
                q = rng.choice(live)
                if r.t.table(q)[0] == DEVICE:
                    r.append(q, rng.randrange(2))
                    ops["append"] += 1
        except OutOfBlocks:
            rule(r.observe() == before, "an operation out of blocks changes nothing")
            ops["oob"] += 1
    assert all(ops[k] for k in ("admit", "complete", "store", "free", "evicted", "swap",
                                "append", "oob")), ops
