"""Memory beyond one pool: several pools, holders that are not sequences, transfers in
flight. Written once; the tiers model (``kvcheck.models.tiers``) evaluates it.

An engine that offloads KV keeps blocks in several *pools* (``DEVICE``, ``HOST``; a
second device pool behind a mapping is a third), each with its own free list and
refcounts, and moves content between them with *transfer jobs* that complete later.
Blocks are held by *holders*, each a multiset of references into one pool:

    a sequence's table      ("seq", q): request q's blocks, in the pool its KV is in (a
                            running request's on the device, a swapped-out one's on the
                            host)
    a job's references      ("job", j): a pending transfer holds its sources and its
                            destinations until it completes (pinned: nothing may free,
                            evict, reuse or overwrite them meanwhile)
    the cache               ("cache", pool): one reference per key naming a block: a
                            cached block is held by the cache, and evictable exactly when
                            the cache is its only holder
    other pins              ("pin", name): a connector's own references (a P/D transfer's
                            delayed free, an offload scan's touches), each taken and
                            dropped by its own operations
    a mapped table          ("mapped", q): request q's blocks in a pool reached through a
                            mapping from its device table (SGLang's SWA pool behind
                            ``full_to_swa_index_mapping``): one entry per block of its
                            table, ``NULL`` where the tokens of that block left the
                            sliding window (released there, kept on the device)
    a window table          ("window", q): request q's blocks of a sliding-window KV-cache
                            group sharing its pool (vLLM v1's hybrid coordinator: full
                            attention and sliding-window groups in one pool): one entry per
                            block of its table, ``NULL`` where the window has moved past
                            (the engine drops those blocks itself, on an append or at
                            the request's end); a sequence of its pool, as a mapped table

So each pool, read with every holder's references as its tables, is a block-manager
state, and every invariant of ``kvcheck.spec.invariants`` holds of it as written
(``pool_view``): refcounts count every holder's references, a block is on the free list
exactly when nothing holds it, a sequence holds ceil(len / B) blocks in its pool; a mapped
table is a sequence of its pool, so ``valid_block_ids``, ``null_entries`` (released
entries are leading, never the newest token's block), ``table_length`` and ``free_list``
(a block at most once on the free list, never while a mapping names it) hold of it as
written. Every pool but ``DEVICE`` and ``HOST`` is one behind a mapping. On top
of that (``TIER_INVARIANTS``): a pending store's destinations are not findable, a key names
one block that holds exactly the tokens it names (data level), evictable blocks are those
only the cache holds, a sequence's KV is in one pool, and at quiescence (no request, no
job in flight) only the cache holds anything.

Transfers are two events: the start (``store``: device -> host, ``load``: host -> device,
``swap_out``/``swap_in``: a whole sequence, ``prefetch``: a storage tier's pages -> host)
and the completion (``complete(job, ok, filled)``, success or failure; a prefetch may
fill only a leading part of its pages, ``filled``), in any order the engine (or kvcheck's
driver) chooses. The contracts below say what each event may do. A page a prefetch
does not keep is released once, by exactly one owner (``RELEASED_ONCE``: SGLang PR
#13501, the unfilled tail queued for release twice).

Vocabulary of a ``TierState`` (what the model's oracle observes, plus the oracle's own
ghost: lengths, what each block holds, what each key means):

    pools()                   the pool names, ``DEVICE`` first
    num_blocks(p)             blocks in pool p
    ref(p, b)                 the engine's refcount of block b of pool p (a cached
                              block counts one reference for the cache)
    free_count(p, b)          how many times b is on p's free list
    holders(p)                {holder: tuple of block ids} for pool p
    seqs()                    live sequences; pool_of(q) where q's KV is; length(q)
    table(q)                  q's table (in pool_of(q))
    mapped_pools()            the pools reached through a mapping (every pool but DEVICE
                              and HOST); mapped_table(p, q) q's table there (NULL:
                              released)
    jobs()                    {(q, n): Job} pending transfers (the n-th started for q)
    keys(p)                   {key: block} p's cache (findable blocks)
    evictable(p)              the blocks p's cache would evict
    content(p, b)             what b holds (the ghost: the prefix id of the tokens up to
                              its last written slot, or None)
    wanted(q, i)              what block i of q's table must hold: the prefix id of q's
                              tokens up to the end of that block (or its last token)
    meaning(key)              the prefix id a key names (the ghost: from the tokens the
                              engine was asked to store under it)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from .state import NULL, Snapshot

DEVICE, HOST = "device", "host"
_NONE: Counter = Counter()  # (held_by of a block nothing holds; never changed)
STORE, LOAD, SWAP_OUT, SWAP_IN = "store", "load", "swap_out", "swap_in"
SEND = "send"  # a P/D connector's send of a finished request's blocks to a remote peer
PREFETCH = "prefetch"  # a storage tier's pages fetched into host blocks (SGLang's HiCache L3)
STORAGE = "storage"  # a pseudo pool: the storage tier a prefetch reads (no blocks, no
# free list, no invariants: content-addressed pages named by the prefix they hold)
REMOTE = "remote"  # a pseudo pool: a remote peer's memory (a P/D send's destination, a
# P/D receive's source: vLLM's NIXL connector); no blocks, no free list, no invariants
RELEASED_ONCE = "complete: a prefetched page it does not keep is released once, by one owner"


@dataclass(frozen=True)
class Job:
    """A pending transfer: ``src`` blocks of pool ``src_pool`` copied into ``dst`` blocks of
    ``dst_pool`` (position by position), for sequence ``seq``. ``keys``: a store's intended
    prefix ids of its destinations (what each will be findable as once it completes).
    ``holds_src`` / ``holds_dst``: whether the job holds a reference to its sources /
    destinations; an engine that leaves a device side to the request's own references (vLLM
    v1's OffloadingConnector: a store's sources are the request's blocks, a load's
    destinations the blocks allocated for it) reports False there, and the job is no
    holder of those blocks. ``flushed``: the engine has waited for the copy to land (vLLM's
    ``jobs_to_flush``: before a step writes a block the store still reads) while its
    completion is still to be reported. A ``PREFETCH`` reads the ``STORAGE`` pseudo pool
    (``src`` empty, ``holds_src`` False) into host blocks ``dst``, one per page, ``keys``
    the prefix id each page names (the storage is content-addressed)."""

    kind: str
    seq: int
    src_pool: str
    src: tuple[int, ...]
    dst_pool: str
    dst: tuple[int, ...]
    keys: tuple[int, ...] = ()
    holds_src: bool = True
    holds_dst: bool = True
    flushed: bool = False  # its copy has landed (the engine waited for it); report pending


@dataclass
class TierState:
    """A concrete state of a tiered store (see the module doc)."""

    block_size: int
    sizes: Mapping[str, int]  # pool -> num_blocks
    refs: Mapping[str, list[int]]
    free: Mapping[str, Counter]
    tables: Mapping[int, tuple[int, ...]]  # live sequence -> its table (in pool_of)
    where: Mapping[int, str]  # live sequence -> its pool
    lengths: Mapping[int, int]
    jobs: Mapping[int, Job] = field(default_factory=dict)
    pins: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    cache: Mapping[str, Mapping[object, int]] = field(default_factory=dict)  # pool -> key -> b
    evictable_blocks: Mapping[str, frozenset] = field(default_factory=dict)
    contents: Mapping[str, Mapping[int, object]] = field(default_factory=dict)  # ghost
    meanings: Mapping[object, object] = field(default_factory=dict)  # ghost: key -> prefix id
    wants: Mapping[int, tuple] = field(default_factory=dict)  # ghost: q -> prefix id per block
    num_free_reported: Mapping[str, int | None] = field(default_factory=dict)
    reserved: Mapping[int, int] = field(default_factory=dict)  # ghost: q -> lookahead slots
    mapped: Mapping[str, Mapping[int, tuple[int, ...]]] = field(default_factory=dict)
    windows: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # q -> window table
    window_groups: int = 0  # sliding-window groups sharing the device pool (0 or 1)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    # -- vocabulary ------------------------------------------------------------
    def pools(self) -> list[str]:
        return list(self.sizes)

    def num_blocks(self, p: str) -> int:
        return self.sizes.get(p, 0)  # (a pool the store lacks, e.g. no host: no blocks)

    def ref(self, p: str, b: int) -> int:
        r = self.refs.get(p, ())
        return r[b] if 0 <= b < len(r) else 0

    def free_count(self, p: str, b: int) -> int:
        return self.free.get(p, _NONE).get(b, 0)

    def seqs(self) -> list[int]:
        return list(self.tables)

    def live(self, q: int) -> bool:
        return q in self.tables

    def pool_of(self, q: int) -> str | None:
        return self.where.get(q)

    def length(self, q: int) -> int:
        return self.lengths.get(q, 0)

    def table(self, q: int) -> tuple[int, ...]:
        return self.tables.get(q, ())

    def mapped_pools(self) -> list[str]:
        return [p for p in self.sizes if p not in (DEVICE, HOST)]

    def mapped_table(self, p: str, q: int) -> tuple[int, ...]:
        return self.mapped.get(p, {}).get(q, ())

    def keys(self, p: str) -> Mapping[object, int]:
        return self.cache.get(p, {})

    def evictable(self, p: str) -> frozenset:
        return self.evictable_blocks.get(p, frozenset())

    def available(self, p: str) -> int:
        """The blocks of ``p`` an operation may take: those on the free list and the
        evictable ones (a cache that evicts for room: vLLM v0's prefix-caching allocator
        counts its evictor's blocks as free, ``get_num_free_blocks``)."""
        return sum(1 for b in range(self.num_blocks(p))
                   if self.free_count(p, b) or b in self.evictable(p))

    def content(self, p: str, b: int):
        return self.contents.get(p, {}).get(b)

    def meaning(self, key):
        return self.meanings.get(key)

    def wanted(self, q: int, i: int):
        w = self.wants.get(q, ())
        return w[i] if 0 <= i < len(w) else None

    def holders(self, p: str) -> dict[tuple, tuple[int, ...]]:
        """Every holder's references into pool ``p``."""
        memo = self._memo.get(("holders", p))
        if memo is not None:
            return memo
        out: dict[tuple, tuple[int, ...]] = {}
        for q, t in self.tables.items():
            if self.where.get(q) == p:
                out[("seq", q)] = t
        for q, t in self.mapped.get(p, {}).items():
            if t:
                out[("mapped", q)] = t  # (a NULL entry names no block)
        for q, t in self.windows.items():
            if t and self.where.get(q) == p:
                out[("window", q)] = t
        for j, job in self.jobs.items():
            refs = (job.src if job.src_pool == p and job.holds_src else ()) + (
                job.dst if job.dst_pool == p and job.holds_dst else ())
            if refs:
                out[("job", j)] = refs
        for name, refs in self.pins.get(p, {}).items():
            if refs:
                out[("pin", name)] = tuple(refs)
        cached = tuple(self.keys(p).values())
        if cached:
            out[("cache", p)] = cached
        self._memo[("holders", p)] = out
        return out

    def held_by(self, p: str, b: int) -> Counter:
        """How many references each holder kind has to block ``b`` of pool ``p``."""
        memo = self._memo.get(("held", p))
        if memo is None:
            memo = {}
            for (kind, _), refs in self.holders(p).items():
                for x in refs:
                    if x != NULL:
                        memo.setdefault(x, Counter())[kind] += 1
            self._memo[("held", p)] = memo
        return memo.get(b, _NONE)

    def pending_dst(self, p: str) -> set[int]:
        """Blocks of ``p`` a pending transfer is still writing."""
        memo = self._memo.get(("pending", p))
        if memo is None:
            memo = self._memo[("pending", p)] = {
                b for job in self.jobs.values() if job.dst_pool == p for b in job.dst}
        return memo

    def keyed(self, p: str) -> Counter:
        """How many keys of ``p``'s cache name each block."""
        memo = self._memo.get(("keyed", p))
        if memo is None:
            memo = self._memo[("keyed", p)] = Counter(self.keys(p).values())
        return memo

    # -- the per-block vocabulary of the tier invariants (``kvcheck.spec.tier_steps``
    # states the same terms over Z3 variables, one pool's blocks at a time) ----------
    def held(self, p: str, b: int, kind: str) -> int:
        """How many references holders of ``kind`` ("seq", "mapped", "window", "job",
        "pin", "cache") have to block ``b`` of ``p``."""
        return self.held_by(p, b).get(kind, 0)

    def held_total(self, p: str, b: int) -> int:
        """How many references every holder together has to block ``b`` of ``p``."""
        return sum(self.held_by(p, b).values())

    def keys_naming(self, p: str, b: int) -> int:
        """How many keys of ``p``'s cache name block ``b`` (= ``held(p, b, "cache")``)."""
        return self.keyed(p)[b]

    def key_meanings(self, p: str, b: int) -> list:
        """The prefix ids the keys naming block ``b`` of ``p`` name (those bound)."""
        memo = self._memo.get(("naming", p))  # (the cache's keys, not their ghost meanings)
        if memo is None:
            memo = self._memo[("naming", p)] = {}
            for k, x in self.keys(p).items():
                memo.setdefault(x, []).append(k)
        return [m for m in map(self.meaning, memo.get(b, ())) if m is not None]

    def is_pending(self, p: str, b: int) -> bool:
        """Whether a pending transfer is still writing block ``b`` of ``p``."""
        return b in self.pending_dst(p)

    def is_storing(self, p: str, b: int) -> bool:
        """Whether block ``b`` of ``p`` is a pending store's (or prefetch's) destination: a
        pending write into the host under a key."""
        memo = self._memo.get(("storing", p))
        if memo is None:
            memo = self._memo[("storing", p)] = {
                x for job in self.jobs.values() if job.kind in (STORE, PREFETCH)
                and job.dst_pool == p for x in job.dst}
        return b in memo

    def is_evictable(self, p: str, b: int) -> bool:
        return b in self.evictable(p)

    def backs_another(self, p: str, b: int) -> bool:
        return backs_another(self, p, b)

    def pool_view(self, p: str) -> PoolSnapshot:
        """Pool ``p`` as a block-manager state: every holder's references are a table,
        the sequences whose KV is in ``p`` are its sequences."""
        holders = self.holders(p)
        seqs = {h[1] for h in holders if h[0] == "seq"}
        return PoolSnapshot(self.sizes[p], self.block_size,
                            {i: t for i, t in enumerate(holders.values())},
                            {i: self.lengths[h[1]] for i, h in enumerate(holders)
                             if h[0] in ("seq", "mapped", "window")},
                            self.refs[p], self.free[p].elements(),
                            num_free=self.num_free_reported.get(p),
                            reserved={i: self.reserved.get(h[1], 0)
                                      for i, h in enumerate(holders) if h[0] == "seq"},
                            sequences={i for i, h in enumerate(holders)
                                       if h[0] in ("mapped", "window")
                                       or (h[0] == "seq" and h[1] in seqs)},
                            names={i: h for i, h in enumerate(holders)})


class PoolSnapshot(Snapshot):
    """One pool of a ``TierState`` as a block-manager ``Snapshot``: ``tables`` are every
    holder's references (so ``holders(b)`` counts them all), ``seqs()`` only the sequences
    (the per-sequence invariants speak of sequences, not of jobs or the cache)."""

    def __init__(self, *args, sequences: set[int], names: dict, **kw):
        super().__init__(*args, **kw)
        self.sequences = sequences
        self.names = names  # table index -> holder, to name it in a report

    def seqs(self) -> list[int]:
        return [q for q in self.tables if q in self.sequences]

    def live(self, q: int) -> bool:
        return q in self.sequences


# -- invariants of a tiered state, beyond each pool's block-manager invariants ---------
def pending_not_findable(L, s: TierState, p: str, b: int):
    """A block a pending transfer is still writing is not findable: no key names a
    pending store's or prefetch's destination (a lookup finds a host block only after its
    store, or the prefetch filling it, completed). A load's destinations may be (an engine
    whose compute waits on the copy, as SGLang's HiCache, publishes the loaded blocks on the
    device at once)."""
    return L.implies(s.is_storing(p, b), s.keys_naming(p, b) == 0)


def one_key_per_block(L, s: TierState, p: str, b: int):
    """At most one key of a pool's cache names a block."""
    return s.keys_naming(p, b) <= 1


def evictable_only_cached(L, s: TierState, p: str, b: int):
    """The blocks a cache would evict are exactly the cached blocks the cache alone
    holds: never a block a sequence, a pending transfer or a pin still holds. An inclusive
    cache keeps a block whose key the device cache also names (the backup of a block still
    cached on the device: SGLang's HiCache evicts a host copy only once its device copy is
    gone), and evicts it only once that key is gone there."""
    cached = s.held(p, b, "cache")
    return s.is_evictable(p, b) == L.and_(cached >= 1, s.held_total(p, b) == cached,
                                          L.not_(s.backs_another(p, b)))


def backs_another(s: TierState, p: str, b: int) -> bool:
    """Whether block ``b`` of ``p`` (not the device) is cached under a key the device cache
    also names: a backup of a block the device still caches."""
    if p == DEVICE or not s.keyed(p)[b] or not s.keys(DEVICE):
        return False
    return any(k in s.keys(DEVICE) for k, x in s.keys(p).items() if x == b)


def key_content(L, s: TierState, p: str, b: int):
    """A findable block holds exactly the tokens its key names: the content the store
    copied into it is the prefix the engine was asked to store under that key (data
    level: a hit returns the right tokens' KV), once no pending transfer is still writing
    it (a load's destination published at once holds its prefix when the copy lands)."""
    return L.implies(L.and_(s.keys_naming(p, b) >= 1, L.not_(s.is_pending(p, b))),
                     L.all_(s.content(p, b) == m for m in s.key_meanings(p, b)))


def holds_its_tokens(L, s: TierState, q: int):
    """Every block of a live sequence's table that no pending transfer is still writing
    holds exactly its tokens, in whichever pool its KV is (data level: a swapped-in or
    loaded block holds what was stored, a copy never lands in another's block). A block
    beyond the tokens (reserved lookahead slots only) holds nothing to check yet."""
    p = s.pool_of(q)
    pending = s.pending_dst(p) if p is not None else set()
    n = len(s.wants.get(q, ()))
    return L.all_(b in pending or i >= n or s.content(p, b) == s.wanted(q, i)
                  for i, b in enumerate(s.table(q)))


def in_one_pool(L, s: TierState, q: int):
    """A live sequence's KV is in exactly one pool, whole: its table there holds
    ceil(len / B) blocks (checked per pool by table_length), and no other pool holds a
    table for it (a swap moves all of it)."""
    return s.pool_of(q) in s.sizes


def quiescent_nothing_held(L, s: TierState):
    """At quiescence (no live sequence, no transfer in flight) nothing but the cache holds
    a block: every other block of every pool is free, none leaked."""
    if s.tables or s.jobs:
        return True
    return L.all_(kind in ("cache", "pin") for p in s.pools() for (kind, _) in s.holders(p)) \
        and not any(refs for p in s.pools() for refs in s.pins.get(p, {}).values())


def unheld_sources_kept(L, s: TierState):
    """A pending store whose job holds no reference to its sources (the request's own
    references kept them) reads blocks nothing else may take until its copy has landed:
    each source is its request's, or free, until the engine flushes the store (waits for
    the copy) -- never another holder's, whose writes the copy would read (vLLM #46951)."""
    for job in s.jobs.values():
        if job.kind != STORE or job.holds_src or job.flushed:
            continue
        mine = {("seq", job.seq), ("window", job.seq)}
        for (kind, x), refs in s.holders(job.src_pool).items():
            if (kind, x) not in mine and set(refs) & set(job.src):
                return False
    return True


TIER_BLOCK_INVARIANTS = [
    ("pending_not_findable", pending_not_findable),
    ("one_key_per_block", one_key_per_block),
    ("evictable_only_cached", evictable_only_cached),
    ("key_content", key_content),
]
TIER_SEQ_INVARIANTS = [("in_one_pool", in_one_pool), ("holds_its_tokens", holds_its_tokens)]
TIER_GLOBAL_INVARIANTS = [("quiescent_nothing_held", quiescent_nothing_held),
                          ("unheld_sources_kept", unheld_sources_kept)]


def invariant_doc(name: str) -> str:
    fn = dict(TIER_BLOCK_INVARIANTS + TIER_SEQ_INVARIANTS + TIER_GLOBAL_INVARIANTS)[name]
    return " ".join((fn.__doc__ or "").split())


# -- operation contracts (pre, post: TierState; op: the model's operation) -------------
UNKNOWN_JOB = "jobs: every pending job is one an operation started"
DATA_READ_BACK = "data: every block holds the K/V of the tokens it holds"
DATA_READ_BACK_DOC = (
    "The device data level (a target that holds K/V: kvcheck.models.tiers.data): every "
    "block of every pool that no pending transfer is still writing holds, slot by slot, "
    "the K/V of exactly the tokens holds_its_tokens and key_content say it holds: every "
    "copy (store, load, swap) moved the right bytes, a failed load's blocks were "
    "recomputed.")


def new_job(kind: str) -> str:
    """The clause a store or load breaks when the job it returns is not a new pending one."""
    return f"{kind}: a new pending job for the request"


def side_change(pre, post, p: str, b: int) -> tuple[int, int]:
    """How many references to block ``b`` of ``p`` the window tables and the pins gained
    (negative: dropped) from ``pre`` to ``post``: holders an operation may change beside
    what it names (an append drops blocks behind a window and gives the window a fresh
    one; a connector touches or releases blocks as it starts or ends a transfer)."""
    if not (pre.windows or post.windows or pre.pins.get(p) or post.pins.get(p)):
        return (0, 0)  # (neither holder in either state: the common case, kept cheap)
    was, now = pre.held_by(p, b), post.held_by(p, b)
    return (now.get("window", 0) - was.get("window", 0), now.get("pin", 0) - was.get("pin", 0))


def _others_unchanged(L, pre, post, p, mine: set, what: str, blocks=None):
    """Every block of ``p`` outside ``mine`` keeps its refcount and free-list place, but
    for the references a window table or a pin gained or dropped (``side_change``): its
    refcount moves by exactly those, and a block a window gains was free before."""
    for b in (range(pre.num_blocks(p)) if blocks is None else blocks):
        if b in mine:
            continue
        window, pin = side_change(pre, post, p, b)
        if window or pin:
            yield (f"{what}: a block changes only by the window's or a pin's references",
                   (p, b), post.ref(p, b) == pre.ref(p, b) + window + pin)
            if window > 0:
                yield (f"{what}: a window takes only a free block", (p, b),
                       L.or_(pre.free_count(p, b) == 1, b in pre.evictable(p)))
            continue
        yield (f"{what}: other blocks untouched", (p, b),
               L.and_(post.ref(p, b) == pre.ref(p, b),
                      post.free_count(p, b) == pre.free_count(p, b)))


def _fresh(L, pre, post, p, blocks, what):
    """Each of ``blocks`` was free in ``pre``, or evictable (held by the cache alone: a
    cache that evicts for room, or revives a block it still holds for the same content,
    as vLLM v0's prefix-caching allocator takes its evictor's blocks)."""
    for b in blocks:
        yield f"{what}: every block it takes was free", (p, b), L.or_(
            pre.free_count(p, b) == 1, b in pre.evictable(p))


def device_hits(pre, post, q) -> set:
    """Blocks of q's new table the device cache held before under the key it still names
    them by (a device-side hit, shared: SGLang's radix tree), rather than taken fresh."""
    was = {b: k for k, b in pre.keys(DEVICE).items()}
    now = post.keys(DEVICE)
    return {b for b in post.table(q) if b in was and now.get(was[b]) == b}


def _hits(L, pre, post, q, shared, what):
    """Each device hit holds q's prefix up to it (data level where its key's meaning is
    bound) and gains the request's reference."""
    t = post.table(q)
    name = {b: k for k, b in pre.keys(DEVICE).items()}
    for i, b in enumerate(t):
        if b in shared:
            m = pre.meaning(name[b])
            yield (f"{what}: a device hit is cached under exactly that prefix", (DEVICE, b),
                   L.or_(m is None, m == post.wanted(q, i)))
            yield (f"{what}: a device hit gains the request's reference", (DEVICE, b),
                   post.ref(DEVICE, b) >= pre.ref(DEVICE, b) + 1)


def written_back(pre, post) -> set:
    """Host blocks a device eviction wrote back (a write-back cache demotes what it evicts
    from the device: SGLang's HiCache with write_back): each free, or evicted for it,
    before, and now cached under a key the device cache named before; with the host
    blocks evicted to make room for them."""
    was, now = pre.keys(DEVICE), post.keys(DEVICE)
    out = {h for k, h in post.keys(HOST).items() if k in was and k not in pre.keys(HOST)
           and (pre.free_count(HOST, h) == 1 or h in pre.evictable(HOST))}
    if not out:
        return out
    demoted_then_evicted = {  # (evicted from the device, then from the host for room)
        h for k, h in pre.keys(HOST).items() if k in was and k not in now
        and k not in post.keys(HOST) and post.free_count(HOST, h) == 1}
    return out | evicted(pre, post, HOST) | demoted_then_evicted


def evicted(pre, post, p) -> set:
    """Blocks of ``p`` an operation evicted for room: evictable before, free after."""
    return {b for b in pre.evictable(p) if pre.free_count(p, b) == 0
            and post.free_count(p, b) == 1 and not post.keyed(p)[b]}


def allocate(L, pre, post, op):
    """allocate(seq, tokens): a new request on the device: ceil(len / B) blocks, every one
    free before; nothing else changes. (A load is an allocation whose leading blocks come
    from the host cache: ``load``.)"""
    q = op.seq
    t = post.table(q)
    yield "allocate: the request is live on the device", q, L.and_(
        post.live(q), post.pool_of(q) == DEVICE, post.length(q) == len(op.tokens))
    shared = device_hits(pre, post, q)
    yield from _hits(L, pre, post, q, shared, "allocate")
    yield from _fresh(L, pre, post, DEVICE, set(t) - shared, "allocate")
    yield from _others_unchanged(L, pre, post, DEVICE, set(t) | evicted(pre, post, DEVICE),
                                 "allocate")
    yield from _others_unchanged(L, pre, post, HOST, written_back(pre, post), "allocate")
    yield from _mapped_taken(L, pre, post, q, "allocate")


def _mapped_taken(L, pre, post, q, what):
    """In each pool behind a mapping the request holds a table (``table_length`` says how
    long), and the blocks it takes there, beyond those it held, were free; nothing else
    there changes."""
    for p in pre.mapped_pools():
        yield (f"{what}: the request holds a table in every pool behind a mapping", q,
               q in post.mapped.get(p, {}))
        new = set(post.mapped_table(p, q)) - set(pre.mapped_table(p, q)) - {NULL}
        yield from _fresh(L, pre, post, p, new, what)
        yield from _others_unchanged(L, pre, post, p, new, what)


def append(L, pre, post, op):
    """append(seq, token): one more token, in the block at position len // B: the last
    block if it has room, else a fresh one; a block a pending transfer still holds is
    never written (its copy would read or be overwritten by the token)."""
    q, B = op.seq, pre.block_size
    p = DEVICE
    pos = pre.length(q) // B
    old, new = pre.table(q), post.table(q)
    yield "append: one more token, on the device", q, L.and_(
        post.pool_of(q) == p, post.length(q) == pre.length(q) + 1)
    yield from _others_unchanged(L, pre, post, HOST, written_back(pre, post), "append")
    for m in pre.mapped_pools():
        was, now = pre.mapped_table(m, q), post.mapped_table(m, q)
        yield "append: behind a mapping too, the entries it had are kept", q, \
            now[: len(was)] == was
    yield from _mapped_taken(L, pre, post, q, "append")
    if pos < len(old):
        b = old[pos]
        yield "append: the token goes into the block holding slot len", q, new == old
        yield ("append: never into a block a pending transfer holds", (p, b),
               pre.held_by(p, b).get("job", 0) == 0)
        yield "append: writes only a block the sequence holds alone", (p, b), \
            pre.ref(p, b) == 1
        gained = post.keyed(p)[b] - pre.keyed(p)[b]  # (a prefix cache publishes it once full)
        yield ("append: the written block gains only the cache's reference, once full",
               (p, b), L.and_(post.ref(p, b) == pre.ref(p, b) + gained,
                              post.free_count(p, b) == pre.free_count(p, b),
                              gained in ((0, 1) if (pre.length(q) + 1) % B == 0 else (0,))))
        yield from _others_unchanged(L, pre, post, p, {b}, "append")
    else:
        yield "append: a fresh block when the last one is full", q, L.and_(
            len(new) == len(old) + 1, new[:len(old)] == old)
        fresh = set(new[len(old):])
        dropped = {b for b in fresh if side_change(pre, post, p, b)[0] < 0}
        for b in dropped:  # (the engine drops the window's blocks behind it, then takes)
            yield ("append: a block its window dropped in the same step was held by it alone",
                   (p, b), pre.ref(p, b) == -side_change(pre, post, p, b)[0])
        yield from _fresh(L, pre, post, p, fresh - dropped, "append")
        yield from _others_unchanged(L, pre, post, p, fresh | evicted(pre, post, p), "append")


def free(L, pre, post, op):
    """free(seq) -> job or None: the request ends (finished or aborted): it holds nothing in
    any pool; each of its blocks loses one reference per entry, and a block a pending
    transfer still holds stays held until that transfer completes (an abort in flight frees
    nothing the copy is still using; an engine may keep such blocks by a pin of its own
    instead, vLLM's delayed free of a request whose load is pending). An engine may start
    a final store of the request's full blocks there (vLLM v1's OffloadingConnector, at
    the next step): a new store job, as ``store`` starts one. Or a send (a P/D connector's
    delayed free: vLLM's NIXL connector with the scheduler keeping the blocks until the
    worker reports ``finished_sending``): a new ``send`` job whose sources are blocks of
    the request's table, each keeping a reference (the job's, or the scheduler's pin) until
    it completes -- the request's reference passes to it, nothing is freed. A final store
    that holds its sources takes the request's references over the same way (vLLM 0.11.0 ..
    0.20.2's OffloadingConnector: the scheduler keeps a finished request's blocks until
    the worker reports its stores, ``finished_sending``)."""
    q = op.seq
    p = pre.pool_of(q)
    yield "free: the request holds nothing", q, L.and_(
        L.not_(post.live(q)), q not in post.windows, L.all_(q not in post.mapped.get(m, {})
                                                            for m in pre.mapped_pools()))
    if p is None:
        return
    if op.job is not None:  # a final store of the request's blocks, started at its end
        job = post.jobs.get((q, op.job))
        kind = job.kind if job is not None and job.kind == SEND else STORE
        yield new_job(kind), q, L.and_(job is not None, (q, op.job) not in pre.jobs,
                                       job is not None and job.kind == kind)
        if job is not None and kind == SEND:
            yield "free: a send's sources are blocks of the request's table", q, L.and_(
                job.src_pool == p, set(job.src) <= set(pre.table(q)), not job.dst)
        elif job is not None:
            yield from _store_job(L, pre, post, op, job)
    sent = post.jobs.get((q, op.job)) if op.job is not None else None
    sent = Counter(sent.src if sent is not None and sent.holds_src
                   else ())  # (the references the job it starts takes over from the
    # request: a send's, or a final store's the scheduler keeps the request's blocks for
    # until the worker reports it -- vLLM 0.11.0 .. 0.20.2's OffloadingConnector)
    for pool, held in [(p, pre.table(q) + pre.windows.get(q, ()))] + [
            (m, pre.mapped_table(m, q)) for m in pre.mapped_pools()]:
        mine = Counter(held)
        for b in range(pre.num_blocks(pool)):
            left = max(0, post.keyed(pool)[b] - pre.keyed(pool)[b])  # (left to the cache)
            yield ("free: a refcount drops by the entries the request held", (pool, b),
                   post.ref(pool, b) == pre.ref(pool, b) - mine.get(b, 0) + left
                   + side_change(pre, post, pool, b)[1]  # (a pin that keeps it: the
                   # scheduler's delayed free of the blocks a pending load still writes)
                   + (sent.get(b, 0) if pool == p else 0))  # (a send's own references)


def store(L, pre, post, op):
    """store(seq) -> job: a pending device -> host copy of some of the request's full
    blocks not yet in the host cache: the job holds each source (it must not be freed or
    overwritten until the copy completes) and one host destination per source, each free
    before (or evicted for it: cached, held by the cache alone); no key names a
    destination until the job completes. (A prefix another pending store is still copying
    may be stored again: the second copy costs a host block, and a lookup still finds the
    right tokens under either key; vLLM's BlockHashToBlockMap keeps every block stored
    under one hash.) No job: nothing changed but the host blocks it evicted trying to make
    room (SGLang's write_backup evicts before it finds the host still full)."""
    if op.job is None:
        for p in pre.pools():
            yield from _others_unchanged(L, pre, post, p, evicted(pre, post, p),
                                         "store (no job)")  # (room it tried to make)
        return
    name = (op.seq, op.job)
    job = post.jobs.get(name)
    yield new_job(STORE), op.seq, L.and_(
        job is not None, name not in pre.jobs, job is not None and job.kind == STORE,
        job is not None and job.seq == op.seq)
    if job is None:
        return
    yield from _store_job(L, pre, post, op, job)
    yield from _others_unchanged(L, pre, post, DEVICE, set(job.src), "store")


def _store_job(L, pre, post, op, job):
    """What a new store job is (``store``, or a final store started by ``free``)."""
    B, table, n = pre.block_size, pre.table(op.seq), pre.length(op.seq)
    full = set(table[: n // B])
    yield "store: sources are full blocks of the request's table", op.seq, L.and_(
        job.src_pool == DEVICE, set(job.src) <= full)  # (one listed twice: copied twice,
    # a reference per entry, as a connector's scan may list it)
    yield ("store: never a block a pending load is still writing", op.seq,
           not set(job.src) & pre.pending_dst(DEVICE))
    for k in job.keys:
        yield ("store: never a prefix already cached", op.seq,
               k not in {pre.meaning(x) for x in pre.keys(HOST)})
    yield "store: one host destination per source", op.seq, L.and_(
        job.dst_pool == HOST, len(job.dst) == len(job.src), len(set(job.dst)) == len(job.dst))
    for b in job.dst:
        was = pre.held_by(HOST, b)
        yield ("store: each destination was free, or cached and held by the cache alone",
               (HOST, b), L.or_(pre.free_count(HOST, b) == 1,
                                L.and_(was.get("cache", 0) >= 1,
                                       sum(was.values()) == was.get("cache", 0))))


def load(L, pre, post, op):
    """load(seq, tokens) -> job: a new request whose leading full blocks are found in the
    host cache: each hit a findable host block whose key names exactly that prefix of
    the request's tokens (a completed store: a pending one is not findable), for the
    leading blocks of the first len - 1 tokens; the request gets ceil(len / B) device
    blocks, every one free before, and the job holds the hit host blocks (they stay valid
    until it completes) and the device blocks they are copied into. No hit: no job, an
    allocation. A load from a remote peer (``REMOTE``: a P/D receive, vLLM's NIXL
    connector on the decode instance) has no sources: its destinations are leading blocks
    of the request's table (the request's own, or the job's), written by the peer's prefill
    of the request's prompt; they stay the request's until the job completes, and an
    abort meanwhile keeps them by a pin (``free``)."""
    q = op.seq
    t = post.table(q)
    yield "load: the request is live on the device", q, L.and_(
        post.live(q), post.pool_of(q) == DEVICE, post.length(q) == len(op.tokens))
    shared = device_hits(pre, post, q)
    yield from _hits(L, pre, post, q, shared, "load")
    yield from _fresh(L, pre, post, DEVICE, set(t) - shared, "load")
    yield from _others_unchanged(L, pre, post, DEVICE, set(t) | evicted(pre, post, DEVICE),
                                 "load")
    job = post.jobs.get((q, op.job)) if op.job is not None else None
    hits = set(job.src) if job is not None and job.src_pool == HOST else set()
    for b in hits:  # (a hit is pinned: one reference more, no other change)
        yield ("load: a hit gains the job's reference and nothing else", (HOST, b),
               L.and_(post.ref(HOST, b) == pre.ref(HOST, b) + job.src.count(b),
                      post.free_count(HOST, b) == pre.free_count(HOST, b)))
    yield from _others_unchanged(L, pre, post, HOST, hits | written_back(pre, post), "load")
    if op.job is None:
        return
    name = (q, op.job)
    job = post.jobs.get(name)
    yield new_job(LOAD), q, L.and_(
        job is not None, name not in pre.jobs, job is not None and job.kind == LOAD)
    if job is None:
        return
    if job.src_pool == REMOTE:
        yield "load: a remote load writes leading blocks of the request's table", q, L.and_(
            not job.src, job.dst_pool == DEVICE, 1 <= len(job.dst) <= len(t),
            tuple(job.dst) == tuple(t[: len(job.dst)]))
        return
    B = pre.block_size
    # blocks wholly within the first len - 1 tokens; or within all of them for an engine
    # that recomputes the last token of a whole hit once the load lands (the oracle's
    # ``recompute_last``, from the target: vLLM's scheduler, a full external hit)
    lookup = (len(op.tokens) - (0 if getattr(op, "recompute_last", False) else 1)) // B
    at = t.index(job.dst[0]) if job.dst and job.dst[0] in t else 0  # (after device hits)
    yield "load: hits are leading blocks within the first len - 1 tokens", q, L.and_(
        job.src_pool == HOST, job.dst_pool == DEVICE, at + len(job.src) <= lookup,
        tuple(job.dst) == tuple(t[at: at + len(job.src)]),
        all(b in shared for b in t[:at]))
    found = {b: k for k, b in pre.keys(HOST).items()}
    for i, b in enumerate(job.src, start=at):
        yield ("load: each hit was findable before, under the key of exactly that prefix",
               (HOST, b), L.and_(b in found, op.wanted is not None and i < len(op.wanted)
                                 and pre.meaning(found.get(b)) == op.wanted[i]))


def prefetch(L, pre, post, op):
    """prefetch(seq, tokens) -> job or None: before request seq is scheduled, the pages of
    its prompt past what the caches hold are fetched from the storage tier into host
    blocks (SGLang's ``prefetch_from_storage``): a new pending job reading the ``STORAGE``
    pseudo pool, one host destination per page (the prompt's last full blocks), each free
    before (or evicted for it: cached, held by the cache alone), held by the job alone and
    not findable until it completes; the device unchanged. No job (too few pages, no room):
    nothing changed but the host blocks it evicted trying to make room."""
    for p in pre.pools():
        if p != HOST or op.job is None:
            yield from _others_unchanged(L, pre, post, p, evicted(pre, post, p)
                                         if p == HOST else set(), "prefetch")
    if op.job is None:
        return
    name = (op.seq, op.job)
    job = post.jobs.get(name)
    yield new_job(PREFETCH), op.seq, L.and_(
        job is not None, name not in pre.jobs, job is not None and job.kind == PREFETCH,
        job is not None and job.seq == op.seq)
    if job is None:
        return
    full = len(op.tokens) // pre.block_size
    yield "prefetch: one host destination per page past the cached prefix", op.seq, L.and_(
        job.src_pool == STORAGE, not job.src, job.dst_pool == HOST, 1 <= len(job.dst) <= full,
        len(set(job.dst)) == len(job.dst))
    yield from _fresh(L, pre, post, HOST, set(job.dst), "prefetch")
    for b in job.dst:
        yield ("prefetch: each destination is held by the job alone", (HOST, b),
               L.and_(post.ref(HOST, b) == 1, post.free_count(HOST, b) == 0,
                      post.keyed(HOST)[b] == 0))
    yield from _others_unchanged(L, pre, post, HOST, set(job.dst) | evicted(pre, post, HOST),
                                 "prefetch")


def filled_of(op, job) -> int:
    """The leading destinations a completion filled: ``op.filled`` (a prefetch's partial
    completion), else all of them when it succeeded and none when it failed."""
    filled = getattr(op, "filled", None)
    return (len(job.dst) if op.ok else 0) if filled is None else filled


def complete(L, pre, post, op):
    """complete(job, ok, filled): a pending transfer ends: the job holds nothing any more
    (each source and destination loses the job's reference). A store that succeeded makes
    each destination findable under the key of the prefix its source held (the cache holds
    it); one that failed leaves its destinations free and unkeyed. A load's destinations
    then hold the copied prefix (or, when it failed, what the engine recomputes). A
    prefetch fills only its first ``filled`` pages (what the storage returned): each may
    become findable under its page's prefix (the cache's reference replacing the job's);
    every page it does not keep (unfilled, or a prefix the cache already had) is released
    once, by one owner: free once, or held once by a release queue (a pin) that frees it
    later -- never queued or freed twice."""
    name = (op.seq, op.job)
    job = pre.jobs.get(name)
    yield "complete: the job is no longer pending", op.seq, L.and_(
        job is not None, name not in post.jobs)
    if job is None:
        return
    keyed = {b: k for k, b in post.keys(HOST).items()}
    if job.kind == PREFETCH:
        filled = filled_of(op, job)
        yield "complete: a prefetch fills a leading part of its pages", op.seq, \
            0 <= filled <= len(job.dst)
        for i, b in enumerate(job.dst):
            pin = side_change(pre, post, HOST, b)[1]
            released = L.and_(b not in keyed, pin + post.free_count(HOST, b) == 1)
            if i < filled:
                yield ("complete: a filled page is findable under its page's prefix, or "
                       "released", (HOST, b), L.or_(released, L.and_(
                           b in keyed, post.free_count(HOST, b) == 0, pin == 0,
                           post.meaning(keyed.get(b)) is None or i >= len(job.keys)
                           or post.meaning(keyed.get(b)) == job.keys[i])))
            else:
                yield RELEASED_ONCE, (HOST, b), released
    if job.kind == STORE:
        for i, b in enumerate(job.dst):
            if op.ok:
                yield ("complete: a stored block is findable under its prefix's key",
                       (HOST, b), L.and_(b in keyed, post.meaning(keyed.get(b)) is None
                                         or post.meaning(keyed.get(b)) == job.keys[i]))
            else:
                yield ("complete: a failed store leaves its destinations free", (HOST, b),
                       L.and_(b not in keyed, post.free_count(HOST, b) == 1))
    src = Counter(job.src if job.holds_src else ())
    dst = Counter(job.dst if job.holds_dst else ())
    for b in src:  # (and whatever pins of the connector's the completion releases with it)
        yield ("complete: each source loses the job's reference", (job.src_pool, b),
               post.ref(job.src_pool, b) == pre.ref(job.src_pool, b) - src[b]
               + side_change(pre, post, job.src_pool, b)[1])
    for b in dst:
        # the cache's reference replaces the job's (a store that succeeded; a prefetched
        # page the cache keeps)
        cached = (1 if op.ok else 0) if job.kind == STORE else (
            1 if job.kind == PREFETCH and b in keyed else 0)
        yield ("complete: each destination loses the job's reference", (job.dst_pool, b),
               post.ref(job.dst_pool, b) == pre.ref(job.dst_pool, b) - dst[b] + cached
               + side_change(pre, post, job.dst_pool, b)[1])


EVICT_BOUND = "evict: at most n blocks"  # (n rounded up to the last entry it evicts)


def evict(L, pre, post, op):
    """evict(n): the host cache evicts at most n blocks, each cached and held by the cache
    alone (never one a pending load still copies from): it loses its key and is free. A
    cache whose entries span several blocks (a radix node's slots, ``eviction_units``)
    evicts an entry whole, so it may pass n, but only with the entry that reached it: the
    blocks of the entries it evicted before its widest one number fewer than n (it stops
    once it has n; SGLang's evict_host that never counted what it evicted took them all)."""
    before = {b for b in pre.keys(HOST).values()}
    after = {b for b in post.keys(HOST).values()}
    gone = before - after
    unit = {b: len(u) for u in (op.units or ()) for b in u}
    widest = max((unit.get(b, 1) for b in gone), default=0)
    yield EVICT_BOUND, None, L.or_(len(gone) <= op.n, len(gone) - widest < op.n)
    for b in gone:
        held = pre.held_by(HOST, b)
        yield ("evict: only a block the cache alone holds", (HOST, b),
               sum(held.values()) == held.get("cache", 0))
        yield "evict: an evicted block is free", (HOST, b), post.free_count(HOST, b) == 1
    for p in pre.pools():
        yield from _others_unchanged(L, pre, post, p, gone if p == HOST else set(), "evict")


def swap_need(pre, op) -> int:
    """The blocks a swap takes in the other pool: one per block of the sequence's table;
    a swap-in with ``lookahead`` slots (vLLM v0's scheduler: ``can_swap_in(group,
    num_lookahead_slots)``, then ``swap_in`` and ``append_slots`` with those slots) as
    many as ceil((len + lookahead) / B) when that is more."""
    need = len(pre.table(op.seq))
    look = getattr(op, "lookahead", 0) or 0
    if op.kind == SWAP_IN and look:
        need = max(need, -(-(pre.length(op.seq) + look) // pre.block_size))
    return need


def swap(L, pre, post, op):
    """swap_out(seq) / swap_in(seq, lookahead) (of a sequence no pending load is writing):
    the sequence's KV moves whole to the other pool: ``swap_need`` blocks there (one per
    block of its table; a swap-in with lookahead slots also the blocks those slots need),
    each free before or evictable, its blocks here released (one reference each). The
    engine's own admission check (``can_swap_out`` / ``can_swap_in``, the result
    ``admitted``) agrees with what the swap takes: it admits only when the other pool has
    that many blocks free or evictable (a swap may evict cached blocks for room) and
    refuses only when fewer are free; a swap it admits succeeds; one it refuses changes
    nothing."""
    q = op.seq
    src = pre.pool_of(q)
    dst = HOST if op.kind == SWAP_OUT else DEVICE
    need = swap_need(pre, op)
    free = sum(1 for b in range(pre.num_blocks(dst)) if pre.free_count(dst, b))
    yield f"{op.kind}: the admission check agrees with the free blocks", q, \
        pre.available(dst) >= need if op.admitted else free < need
    if not op.admitted:
        yield f"{op.kind}: a refused swap changes nothing", q, L.and_(
            post.pool_of(q) == src, post.table(q) == pre.table(q))
        return
    yield f"{op.kind}: an admitted swap moves the sequence", q, L.and_(
        post.pool_of(q) == dst, len(post.table(q)) == need, post.length(q) == pre.length(q))
    yield from _fresh(L, pre, post, dst, set(post.table(q)), op.kind)


SLIDE = "slide"
MAPPING_KEEPS = "slide: a block the mapping still names is not freed"


def slide(L, pre, post, op):
    """slide(seq, upto): the sliding window moves past the request's first ``upto`` tokens
    (never into the block of its newest token): in each pool behind a mapping the blocks
    those tokens hold there are released, while the device pool keeps them (the request's
    table, its length and every device block's refcount and free-list place unchanged).
    An entry wholly behind the window becomes NULL; the entry whose block the window's edge
    cuts is either kept or released whole (the mapping cleared for every token of that
    block, not only for those behind the window); every later entry is kept. A released
    block loses the request's reference (free once nothing holds it); a block the mapping
    still names is not freed; nothing else changes."""
    q, B = op.seq, pre.block_size
    yield "slide: the device pool keeps the request's blocks", q, L.and_(
        post.live(q), post.pool_of(q) == pre.pool_of(q), post.table(q) == pre.table(q),
        post.length(q) == pre.length(q))
    yield from _others_unchanged(L, pre, post, DEVICE, set(), SLIDE)
    behind, edge = op.upto // B, -(-op.upto // B)  # wholly behind; the last one touched
    for p in pre.mapped_pools():
        was, now = pre.mapped_table(p, q), post.mapped_table(p, q)
        yield "slide: one entry per block, as before", q, len(now) == len(was)
        for i, (a, b) in enumerate(zip(was, now, strict=False)):
            if i < behind:
                yield "slide: a block wholly behind the window is released", q, b == NULL
            elif i < edge:
                yield ("slide: the block the window's edge cuts is kept or released whole",
                       q, L.or_(b == a, b == NULL))
            else:
                yield "slide: a block in the window is kept", q, b == a
        gone = Counter(a for a, b in zip(was, now, strict=False) if a != NULL and b == NULL)
        kept = {b for b in now if b != NULL}
        for b in range(pre.num_blocks(p)):
            if gone.get(b):
                yield ("slide: a released block loses the request's reference", (p, b),
                       post.ref(p, b) == pre.ref(p, b) - gone[b])
            elif b in kept:
                yield MAPPING_KEEPS, (p, b), L.and_(
                    post.ref(p, b) == pre.ref(p, b),
                    post.free_count(p, b) == pre.free_count(p, b))
            else:
                yield (f"{SLIDE}: other blocks untouched", (p, b),
                       L.and_(post.ref(p, b) == pre.ref(p, b),
                              post.free_count(p, b) == pre.free_count(p, b)))


CONTRACTS = {"allocate": allocate, "append": append, "free": free, "store": store,
             "load": load, PREFETCH: prefetch, "complete": complete, "evict": evict, "swap_out": swap,
             "swap_in": swap, SLIDE: slide}


def out_of_blocks(L, pre, post, op):
    """An operation that fails for lack of blocks changes nothing, in any pool, and fails
    so only when it needs more blocks than its pool has free or evictable: a new request (allocate,
    load) ceil(len / B) device blocks (and as many in each pool behind a mapping), an
    append a fresh block at a block boundary (on the device, or behind a mapping); a swap
    only when its own admission check refused it. With a sliding-window group sharing the
    device pool (``window_groups``) each group needs its blocks, and the engine may first
    drop a window's blocks behind it (entries turned NULL, a reference less each): that,
    and nothing else, may change; the room is counted after that drop."""
    def free_in(p):
        return pre.available(p)  # (an evictable block counts: the cache evicts for room)

    free_dev = min([free_in(DEVICE)] + [free_in(p) for p in pre.mapped_pools()])
    if pre.window_groups:  # (the engine drops a window's blocks behind it, then looks)
        free_dev = sum(1 for b in range(post.num_blocks(DEVICE))
                       if post.free_count(DEVICE, b) or b in post.evictable(DEVICE))
    groups = 1 + pre.window_groups  # (each KV-cache group sharing the device pool takes one)
    B = pre.block_size
    if op.kind in ("allocate", "load"):
        yield ("out of blocks: only when the device lacks the request's blocks", op.seq,
               free_dev < -(-len(op.tokens) // B) * groups)
    elif op.kind == "append":
        yield ("out of blocks: only at a block boundary with no free device block", op.seq,
               L.and_(pre.length(op.seq) % B == 0, free_dev < groups))
    elif op.kind in (SWAP_OUT, SWAP_IN):
        yield f"{op.kind}: a swap its admission check admits succeeds", op.seq, not op.admitted
    for p in pre.pools():
        for b in range(pre.num_blocks(p)):
            window = side_change(pre, post, p, b)[0]
            if window < 0:
                yield ("out of blocks: only the window's drop behind it changed", (p, b),
                       post.ref(p, b) == pre.ref(p, b) + window)
                continue
            yield ("out of blocks: nothing changed", (p, b),
                   L.and_(post.ref(p, b) == pre.ref(p, b),
                          post.free_count(p, b) == pre.free_count(p, b)))
    for q in pre.seqs():
        was, now = pre.windows.get(q, ()), post.windows.get(q, ())
        yield "out of blocks: nothing changed", q, L.and_(
            post.table(q) == pre.table(q), len(now) == len(was),
            L.all_(b == a or b == NULL for a, b in zip(was, now, strict=False)),
            L.all_(post.mapped_table(p, q) == pre.mapped_table(p, q)
                   for p in pre.mapped_pools()))
