"""kvcheck's invariants on a KV-cache manager that an engine's own test built.

One design for every engine generation: a ``Reader`` per generation (``READERS``) names the
classes ``plugin.py`` wraps and reads a manager's state into one ``State``; ``check``
evaluates the spec's clauses on it, the same for all. ``V1Reader``: vLLM v1's
``KVCacheManager`` (below); ``V0Reader``: vLLM v0's block space manager (its docstring).
What follows is the v1 reading.

The state is read from the manager's own objects after each of its public methods returns
(``plugin.py`` wraps them): the ``BlockPool``'s blocks (``ref_cnt``, ``block_hash``), its
``FreeKVCacheBlockQueue`` walked link by link, its own count ``get_num_free_blocks()``, its
hash map ``cached_block_hash_to_block``, and the block tables, one per (request, KV-cache
group): every single-type manager's ``req_to_blocks``. The null block (vLLM's block 0, a
placeholder for skipped sliding-window and Mamba slots) is outside the id space, as in
``impl/thirdparty/vllm_v1.py``: a table entry naming it reads as ``NULL``; kvcheck's block
``b`` is vLLM's ``b + 1``.

What is evaluated is the spec's own text (``spec/invariants.py``, ``spec/prefix.py``) on a
``Snapshot`` / ``PrefixSnapshot`` of that state, with the concrete logic:

* block manager: ``refcount_conservation`` (a block's ``ref_cnt`` is the number of table
  entries naming it), ``free_list`` (on the free queue exactly when its ``ref_cnt`` is 0,
  at most once), ``free_list_in_pool``, ``num_free_agrees`` (the queue's own count is its
  length), ``free_list_size``, ``valid_block_ids``, ``no_aliasing`` (no two tables are one
  list object);
* prefix cache (with caching on): ``pool_partition`` (each block exactly one of free
  without a hash, evictable with one, or in use), ``evictable_keyed``, ``free_unkeyed``,
  ``one_key_per_block`` -- but not on a release whose pool keeps several keys per block by
  design (``BlockPool.cached_block_hashes_by_block``: 0.33.0's partial prefix-cache entries,
  ``cache_partial_block``, keep a block reachable under more than one key).

Holders besides the requests' tables: a partial prefix hit's pending copy-on-write (0.33.0,
``_pending_cow_copies``: the source keeps the hit's reference and the copy an extra one until
the copy is taken) holds one reference on each endpoint. Once
``take_kv_cache_block_copies`` hands those references to its caller (the scheduler, which
releases them after the worker's copy), the manager is no longer judged (``plugin.py``).

The managers judged: every KV-cache group of full attention, sliding-window attention or
Mamba (``out_of_scope``), one group or several over the one pool (a block's holders are then
the entries of every group's tables and the pending copies).

Not evaluated, because a test driving the manager directly gives no token count for its
requests (it calls ``allocate_slots`` without the scheduler's bookkeeping of
``num_computed_tokens``): the per-sequence invariants on lengths (``table_length``,
``waste_bound``, ``null_entries``, ``length_agrees``) and the prefix invariants on written
slots and content (``no_partial_cached``, ``key_after_write``, ``cache_content``). Those are
what ``kvcheck verify vllm-v1`` checks, driving the manager itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.impl.thirdparty.vllm_v1 import hash_map_blocks
from kvcheck.spec import invariants as block_spec
from kvcheck.spec import prefix as prefix_spec
from kvcheck.spec.logic import PY
from kvcheck.spec.state import NULL, Snapshot

BLOCK_INVARIANTS = ("refcount_conservation", "free_list", "free_list_in_pool", "num_free_agrees",
                    "free_list_size", "valid_block_ids", "no_aliasing")
PREFIX_INVARIANTS = ("pool_partition", "evictable_keyed", "free_unkeyed", "one_key_per_block")


@dataclass
class Broken:
    """The first invariant the state breaks: the clause, the element, what was read."""

    clause: str
    subject: str  # "block 7 (vLLM block 8)", "request 'a' group 0", or "the pool"
    evidence: str
    doc: str

    def explain(self, call: str) -> str:
        return (f"kvcheck: after {call}: {self.clause} is broken for {self.subject}: "
                f"{self.evidence}. The rule: {self.doc}")


@dataclass
class State:
    """One reading of a manager (kvcheck's block ids)."""

    num_blocks: int
    refs: list[int]
    queue: list[int]  # the free queue, in order (kvcheck ids)
    hashed: set[int]  # blocks with a block_hash
    num_free: int
    tables: dict[tuple[str, int], tuple[int, ...]]  # (request id, group) -> entries
    identities: dict[tuple[str, int], int]
    entries: list[tuple[object, int]]  # the hash map: (key, block)
    caching: bool
    multi_key: bool  # the pool keeps several keys per block by design (partial prefix entries)
    # the free blocks split as the prefix cache reads them, where the release keeps them
    # apart (vLLM v0: the hashless allocator's free ids and the evictor's); None: the free
    # queue's blocks, those with a block_hash evictable (vLLM v1)
    plain_free: list[int] | None = None
    evictable: list[int] | None = None
    names: tuple[str, ...] = ()  # the engine's name of each kvcheck block (v0: "GPU block 3")
    ref_word: str = "ref_cnt"  # what the engine calls a block's reference count
    unreached: frozenset = frozenset()  # blocks no table, list or map reaches (v0's manager v1)


IN_SCOPE = ("FullAttentionManager", "SlidingWindowManager", "MambaManager")


def out_of_scope(manager) -> str | None:
    """Why kvcheck does not judge this manager's states (None: it does).

    kvcheck's block-manager spec reads a state as tables of references to one pool; it
    judges a manager whose KV-cache groups are all of full attention, sliding-window
    attention or Mamba (one full-attention group is the configuration ``kvcheck verify
    vllm-v1`` drives), their pending copies counted as holders (``read``). HiSparse's source
    manager puts one block in two groups' tables under one reference, and the other
    single-type managers (circular buffer, chunked local, cross attention...) are not read
    yet: such managers run unobserved, counted apart, never judged."""
    singles = list(manager.coordinator.single_type_managers)
    for single in singles:
        kind = type(single).__name__
        if kind not in IN_SCOPE:
            return f"a {kind}"
    return None


def read(manager) -> State:
    """The manager's state, read from its own objects (nothing of it is changed)."""
    pool = manager.block_pool
    blocks = pool.blocks
    n = len(blocks) - 1
    refs = [b.ref_cnt for b in blocks[1:]]
    queue = [b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()]
    hashed = {b.block_id - 1 for b in blocks[1:] if b.block_hash is not None}
    tables: dict[tuple[str, int], tuple[int, ...]] = {}
    identities: dict[tuple[str, int], int] = {}
    for group, single in enumerate(manager.coordinator.single_type_managers):
        for req_id, req_blocks in single.req_to_blocks.items():
            tables[(req_id, group)] = tuple(
                NULL if (b.block_id == 0 or getattr(b, "is_null", False)) else b.block_id - 1
                for b in req_blocks)
            identities[(req_id, group)] = id(req_blocks)
        # a partial prefix hit's copy-on-write waiting for the worker (0.33.0): both endpoints
        # keep a reference until the copy is handed to the caller (the source its hit's, the
        # copy an extra one), as if a table of the copy held them
        for i, pair in enumerate(getattr(single, "_pending_cow_copies", ())):
            key = (f"<pending copy-on-write {i}>", group)
            tables[key] = tuple(b.block_id - 1 for b in pair)
            identities[key] = id(pair)
    entries = [(key, blk.block_id - 1)
               for key, blk in hash_map_blocks(pool.cached_block_hash_to_block)
               if blk.block_id != 0]
    return State(n, refs, queue, hashed, pool.get_num_free_blocks(), tables, identities, entries,
                 bool(getattr(pool, "enable_caching", False)),
                 hasattr(pool, "cached_block_hashes_by_block"))


def _v0_tables(manager) -> list[tuple[tuple[str, None], object]]:
    """``(label, table)`` for every block table a vLLM v0 block manager (v1 or v2) holds: a
    sequence's, and an encoder request's (``cross_block_tables``, cross attention)."""
    return [((f"{kind} {key!r}", None), table)
            for kind, held in (("sequence", manager.block_tables),
                               ("the encoder table of request",
                                getattr(manager, "cross_block_tables", {})))
            for key, table in held.items()]


def _subject(kind: str, element, names: dict[int, tuple[str, int]], state: State) -> str:
    if kind == "block":
        if state.names and 0 <= element < len(state.names):
            return f"block {element} (vLLM {state.names[element]})"
        return f"block {element} (vLLM block {element + 1})"
    if kind == "seq":
        req, group = names[element]
        return str(req) if group is None else f"request {req!r} (KV-cache group {group})"
    return "the pool"


def check(state: State) -> Broken | None:
    """The first broken invariant of ``state`` (block manager first, then the prefix cache),
    or None."""
    names = dict(enumerate(state.tables))
    tables = {i: state.tables[key] for i, key in names.items()}
    snap = Snapshot(state.num_blocks, 1, tables, {i: 1 for i in tables}, state.refs, state.queue,
                    identities={i: state.identities[key] for i, key in names.items()},
                    num_free=state.num_free)
    for name in BLOCK_INVARIANTS:
        inv = block_spec.by_name(name)
        elements = ([None] if inv.domain == "global" else
                    snap.blocks() if inv.domain == "block" else snap.seqs())
        for x in elements:
            if not inv.holds_for(PY, snap, x):
                return Broken(name, _subject(inv.domain, x, names, state),
                              _block_evidence(name, snap, x, state, names), inv.doc)
    if not state.caching:
        return None
    if state.plain_free is not None:
        free, evictable = state.plain_free, state.evictable or []
    else:
        free = [b for b in state.queue if b not in state.hashed]
        evictable = [b for b in state.queue if b in state.hashed]
    psnap = prefix_spec.PrefixSnapshot(state.num_blocks, 1, state.refs, free, evictable,
                                       state.entries, {})
    for name in PREFIX_INVARIANTS:
        if name == "one_key_per_block" and state.multi_key:
            continue  # (see the module doc)
        inv = prefix_spec.by_name(name)
        elements = [None] if inv.domain == "global" else psnap.blocks()
        for x in elements:
            if not inv.holds_for(PY, psnap, x):
                return Broken(name, _subject(inv.domain, x, names, state),
                              _prefix_evidence(psnap, x, state), inv.doc)
    return None


def _holder(req, group) -> str:
    return str(req) if group is None else f"{req!r} (group {group})"


def _holders(state: State, b: int) -> list[str]:
    return [_holder(req, group) for (req, group), t in state.tables.items()
            for entry in t if entry == b]


def _block_evidence(name: str, snap: Snapshot, x, state: State, names) -> str:
    if name == "refcount_conservation":
        held = _holders(state, x)
        return (f"{state.ref_word} is {snap.ref(x)}, but {len(held)} table entr"
                f"{'y names' if len(held) == 1 else 'ies name'} it"
                f"{': ' + ', '.join(held) if held else ''}")
    if name == "free_list" and x in state.unreached:
        return (f"no table, free list, hash map or evictor holds it, so its {state.ref_word} "
                f"cannot be read (read as 0): a block lost")
    if name == "free_list":
        return (f"{state.ref_word} is {snap.ref(x)} and it is on the free queue "
                f"{snap.free_count(x)} "
                f"time(s)")
    if name in ("free_list_in_pool", "num_free_agrees", "free_list_size"):
        zero = snap.zero_refs()
        return (f"the free queue holds {len(state.queue)} entries "
                f"({snap.free_entries()} of them pool blocks), get_num_free_blocks() is "
                f"{state.num_free}, {zero} block(s) have {state.ref_word} 0")
    if name == "valid_block_ids":
        return f"its table is {list(snap.table_tuple(x))} (pool of {state.num_blocks} blocks)"
    if name == "no_aliasing":
        req, group = names[x]
        others = [_holder(r, g) for (r, g), ident in state.identities.items()
                  if ident == state.identities[(req, group)] and (r, g) != (req, group)]
        return f"its block list is the same object as {', '.join(others)}'s"
    return "see the rule"


def _prefix_evidence(psnap, x, state: State) -> str:
    if x is None:
        return "the free and evictable counts disagree with the queue"
    where = []
    if psnap.on_free(x):
        where.append(f"on the free queue without a hash ({psnap.on_free(x)}x)")
    if psnap.on_evictable(x):
        where.append(f"on the free queue with a hash ({psnap.on_evictable(x)}x)")
    return (f"{state.ref_word} is {psnap.ref(x)}, {psnap.cache_entries(x)} key(s) of the "
            f"hash map name "
            f"it, it has {'a' if x in state.hashed else 'no'} block_hash"
            f"{', ' + ' and '.join(where) if where else ', not on the free queue'}")


# -- one reader per engine generation: which classes are observed, and how a state is read --

def _release_class(module: str, name: str):
    """The release's class ``module.name`` (through attach's import hook), or None where the
    release has no such module or class, or cannot import it here (an unavailable module's
    names are placeholders: ``finder.py``)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    cls = getattr(mod, name, None)
    if not isinstance(cls, type) or hasattr(cls, "__kvcheck_unavailable__"):
        return None
    return cls


class Reader:
    """How ``plugin.py`` observes one engine generation's KV-cache manager: the classes whose
    public methods it wraps, the pool objects whose methods a test may call behind the
    manager's back, the calls that hand references to the caller, and the reading of a
    manager's state into a ``State`` (``check`` is the same for every engine)."""

    engine = ""
    handoff: dict[str, str] = {}

    def manager_classes(self) -> list[type]:
        raise NotImplementedError

    def pool_classes(self) -> list[tuple[type, frozenset]]:
        """(class, names of its methods that change nothing): a call of another public
        method from outside a manager call marks the pool edited (``plugin._outside``)."""
        return []

    def pools(self, manager) -> list:
        """The objects of ``manager`` that ``plugin._outside`` may have marked."""
        return []

    def out_of_scope(self, manager) -> str | None:
        return None

    def outside_contract(self, manager, name: str, args: tuple, kwargs: dict,
                         by_test: bool) -> str | None:
        """Why the outermost call ``name(*args, **kwargs)`` about to be made on ``manager`` is
        outside its contract, staged by the test (``by_test``: the test itself calls it, not
        the release's own code), or None; the manager then stops being judged, with the
        reason (``plugin.py``)."""
        return None

    def read(self, manager) -> State:
        raise NotImplementedError


class V1Reader(Reader):
    """vLLM v1's ``KVCacheManager`` (``read``, ``out_of_scope`` above)."""

    engine = "vllm-v1"
    handoff = {"take_kv_cache_block_copies": "it handed references to its caller "
                                             "(take_kv_cache_block_copies: a copy's endpoints, "
                                             "released by the scheduler after the copy)",
               "pop_blocks_for_free": "it handed a request's blocks to its caller "
                                      "(pop_blocks_for_free: freed by the caller later)"}

    def manager_classes(self) -> list[type]:
        import vllm.v1.core.kv_cache_manager as kvm  # the release's own file, through the finder

        return [kvm.KVCacheManager]

    def pool_classes(self) -> list[tuple[type, frozenset]]:
        import vllm.v1.core.block_pool as bp

        return [(bp.BlockPool, frozenset({"get_num_free_blocks", "get_usage",
                                          "get_cached_block", "take_events"}))]

    def pools(self, manager) -> list:
        return [manager.block_pool]

    def out_of_scope(self, manager) -> str | None:
        return out_of_scope(manager)

    def read(self, manager) -> State:
        return read(manager)


class V0Reader(Reader):
    """vLLM v0's block space manager: block manager v2 (``SelfAttnBlockSpaceManager``,
    ``vllm/core/block_manager.py``, 0.6.3 on; ``BlockSpaceManagerV2``,
    ``block_manager_v2.py``, 0.4.2 .. 0.6.2), the reading ``impl/thirdparty/vllm_v0.py``
    and ``vllm_v0_engine.py`` use for ``kvcheck verify``:

    * the pool: the ``CpuGpuBlockAllocator``'s GPU and CPU allocators together (their block
      ids are disjoint, GPU first; a swap moves a table's blocks from one to the other), so
      kvcheck's block ``b`` is the ``b``-th of their ids (on a CUDA-like platform, vLLM's
      block id ``b``); a block's reference count is its allocator's ``RefCounter``;
    * the free blocks: each allocator's free ids (the prefix-caching allocator's
      ``_hashless_allocator``'s ``_free_block_indices``) and, with prefix caching, its
      evictor's ``free_table`` (cached, unreferenced: what ``get_num_free_blocks`` counts
      besides); ``get_num_free_blocks(device)`` summed over the two;
    * the tables: every ``BlockTable``'s blocks (``blocks``; 0.4.2: its list ``_blocks``) of
      ``block_tables`` (per sequence) and
      ``cross_block_tables`` (an encoder-decoder request's encoder table); a table entry
      that is the allocator's ``NullBlock`` (sliding window: a dropped block) reads as
      ``NULL``, and the null block's own block, allocated once and never freed, is held by
      the allocator (one holder, as if a table named it);
    * the prefix cache (``enable_caching``): each allocator's ``_cached_blocks`` (content
      hash -> block id), keyed by device.

    Block manager v1 (``BlockSpaceManagerV1``, the default scheduler's to 0.6.2 when
    ``use_v2_block_manager`` is off) is wrapped and read too (``_read_v1``), but for one with
    a sliding window (``out_of_scope``)."""

    engine = "vllm-v0"

    def manager_classes(self) -> list[type]:
        found = [_release_class("vllm.core.block_manager", "SelfAttnBlockSpaceManager")
                 or _release_class("vllm.core.block_manager_v2", "BlockSpaceManagerV2"),
                 _release_class("vllm.core.block_manager_v1", "BlockSpaceManagerV1")]
        return [cls for cls in found if cls is not None]

    def pool_classes(self) -> list[tuple[type, frozenset]]:
        cls = _release_class("vllm.core.block.cpu_gpu_block_allocator", "CpuGpuBlockAllocator")
        return [] if cls is None else [(cls, frozenset({
            "get_num_free_blocks", "get_num_total_blocks", "get_physical_block_id",
            "get_num_full_blocks_touched", "get_common_computed_block_ids", "all_block_ids",
            "get_prefix_cache_hit_rate", "find_cached_blocks_prefix",
            "get_num_blocks_touched"}))]

    def pools(self, manager) -> list:
        return [getattr(manager, "block_allocator", None)]

    def out_of_scope(self, manager) -> str | None:
        if type(manager).__name__ == "BlockSpaceManagerV1" and \
                getattr(manager, "block_sliding_window", None) is not None:
            return ("a BlockSpaceManagerV1 with a sliding window (block manager v1's cyclic "
                    "window: a table names a block at several positions, and its ref_count "
                    "counts sequences, not entries)")
        return None

    def outside_contract(self, manager, name: str, args: tuple, kwargs: dict,
                         by_test: bool) -> str | None:
        """Two preconditions the engine's callers keep and some of v0's tests break to stage a
        scenario (the manager then replaces a sequence's table without freeing it):

        * ``fork(parent, child)`` into a child that already holds a table, called by the
          test itself (the ``Scheduler`` forks into a new sequence);
        * ``allocate(seq_group)`` of a ``Sequence`` whose ``seq_id`` a *different* live
          ``Sequence`` object already holds a table under (the test built two sequences with
          one id, e.g. 0.4.2's ``create_dummy_prompt("1", ...)`` twice; the engine numbers
          sequences from a counter), whoever calls it. ``SelfAttnBlockSpaceManager.allocate``
          asserts "block table already exists"; ``BlockSpaceManagerV1`` does not. The same
          ``Sequence`` allocated twice is still judged (that would be the engine's)."""
        tables = getattr(manager, "block_tables", {})
        known = manager.__dict__.setdefault("__kvcheck_sequences__", {})
        if name == "fork":
            child = args[1] if len(args) > 1 else kwargs.get("child_seq")
            seq_id = getattr(child, "seq_id", None)
            if seq_id is None:
                return None
            known[seq_id] = child
            if by_test and seq_id in tables:
                return (f"the test called fork() into sequence {seq_id}, which already holds "
                        f"a block table (fork's precondition, kept by the Scheduler: a new "
                        f"sequence; the old table is replaced, its references never freed)")
        elif name == "allocate":
            group = args[0] if args else kwargs.get("seq_group")
            try:
                seqs = list(group.get_seqs())
            except Exception:  # noqa: BLE001 - not a SequenceGroup: the release's call decides
                return None
            why = None
            for seq in seqs:
                seq_id = getattr(seq, "seq_id", None)
                if seq_id in tables and known.get(seq_id, seq) is not seq and why is None:
                    why = (f"the test made two sequences with seq_id {seq_id} (allocate() of "
                           f"one while the other holds a block table under that id: the "
                           f"engine numbers sequences from a counter; the old table is "
                           f"replaced, its references never freed)")
                known[seq_id] = seq
            return why
        return None

    def read(self, manager) -> State:
        if type(manager).__name__ == "BlockSpaceManagerV1":
            return self._read_v1(manager)
        alloc = manager.block_allocator
        devices = sorted(alloc._allocators.items(), key=lambda kv: kv[0].value)
        owner = {bid: (dev, a) for dev, a in devices for bid in a.all_block_ids}
        ids = sorted(owner)
        index = {bid: i for i, bid in enumerate(ids)}
        n = len(ids)
        names = tuple(f"{owner[bid][0].name} block {bid}" for bid in ids)
        refs = [owner[bid][1]._refcounter.get(bid) for bid in ids]
        plain: list[int] = []
        evictable: list[int] = []
        entries: list[tuple[object, int]] = []
        num_free = 0
        for dev, a in devices:
            naive = getattr(a, "_hashless_allocator", a)
            plain += [index.get(b, n) for b in naive._free_block_indices]
            evictor = getattr(a, "evictor", None)
            if evictor is not None:
                evictable += [index.get(b, n) for b in evictor.free_table]
            for key, bid in getattr(a, "_cached_blocks", {}).items():
                entries.append(((dev.name, key), index.get(bid, n)))
            num_free += alloc.get_num_free_blocks(dev)
        null = getattr(alloc, "_null_block", None)
        null_id = None if null is None else null.block_id

        def entry(block) -> object:
            if null is not None and (block is null or type(block).__name__ == "NullBlock"):
                return NULL
            return index.get(block.block_id, n)

        tables: dict[tuple[str, object], tuple] = {}
        identities: dict[tuple[str, object], int] = {}
        for label, table in _v0_tables(manager):
            blocks = table.blocks if hasattr(table, "blocks") else table._blocks  # (0.4.2)
            tables[label] = tuple(entry(b) for b in blocks)
            identities[label] = id(table)
        if null_id is not None:
            label = ("the null block (the allocator's, never freed)", None)
            tables[label] = (index.get(null_id, n),)
            identities[label] = id(null)
        return State(n, refs, plain + evictable, {b for _, b in entries} | set(evictable),
                     num_free, tables, identities, entries,
                     bool(getattr(manager, "enable_caching", False)), False,
                     plain_free=plain, evictable=evictable, names=names, ref_word="refcount")


    def _read_v1(self, manager) -> State:
        """Block manager v1 (``vllm/core/block_manager_v1.py``, 0.4.2 .. 0.6.2; without a
        sliding window): ``PhysicalTokenBlock`` objects with their own ``ref_count``, one
        allocator per device (block numbers from 0 on each; kvcheck's block is the GPU's
        number, or ``num_gpu_blocks`` + the CPU's). ``UncachedBlockAllocator`` (caching off):
        its ``free_blocks`` list. ``CachedBlockAllocator`` (caching on): a block is made the
        first time it is needed (``current_num_blocks``), so the numbers from there up are
        free (unmade, no hash); a made block is in ``cached_blocks`` (hash -> block, in use) or
        in its evictor's ``free_table`` (hash -> block, unreferenced: evictable, its hash still
        a key). A block reachable from no table, free list, map or evictor has no reading of
        its ``ref_count``: it reads as 0 and on no list, which ``free_list`` reports (a block
        lost)."""
        devices = [("GPU", manager.gpu_allocator), ("CPU", manager.cpu_allocator)]
        base = {"GPU": 0, "CPU": manager.gpu_allocator.num_blocks}
        n = sum(a.num_blocks for _, a in devices)
        names = tuple(f"{dev} block {b}" for dev, a in devices for b in range(a.num_blocks))

        def kid(block) -> int:
            dev = getattr(block.device, "name", str(block.device))
            return base.get(dev, n) + block.block_number

        refs = [0] * n
        seen: dict[int, object] = {}
        plain: list[int] = []
        evictable: list[int] = []
        entries: list[tuple[object, int]] = []
        num_free = 0
        for dev, a in devices:
            num_free += a.get_num_free_blocks()
            for blk in getattr(a, "free_blocks", ()):
                plain.append(kid(blk))
                seen[kid(blk)] = blk
            if hasattr(a, "current_num_blocks"):
                plain += [base[dev] + b for b in range(a.current_num_blocks, a.num_blocks)]
                for key, blk in a.cached_blocks.items():
                    entries.append(((dev, key), kid(blk)))
                    seen[kid(blk)] = blk
                for key, blk in a.evictor.free_table.items():
                    entries.append(((dev, key), kid(blk)))
                    evictable.append(kid(blk))
                    seen[kid(blk)] = blk
        tables: dict[tuple[str, object], tuple] = {}
        identities: dict[tuple[str, object], int] = {}
        for label, table in _v0_tables(manager):
            tables[label] = tuple(kid(b) for b in table)
            identities[label] = id(table)
            for b in table:
                seen[kid(b)] = b
        for b, blk in seen.items():
            if 0 <= b < n:
                refs[b] = blk.ref_count
        unreached = frozenset(range(n)) - set(seen) - set(plain)
        return State(n, refs, plain + evictable, set(evictable) | {b for _, b in entries},
                     num_free, tables, identities, entries,
                     bool(getattr(manager, "enable_caching", False)), False,
                     plain_free=plain, evictable=evictable, names=names, ref_word="ref_count",
                     unreached=unreached)


READERS: dict[str, Reader] = {r.engine: r for r in (V1Reader(), V0Reader())}
