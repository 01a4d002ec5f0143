"""Adapter: SGLang's ``RadixCache`` over its token / paged allocator, as a ``Target`` (0.5.23
pinned; ``sglang-radix@VERSION`` for 0.5.22 .. 0.5.23, see ``load``).

What runs, from the installed wheel (``bash scripts/install_thirdparty.sh sglang``):
``mem_cache/radix_cache.py`` (``RadixCache``, ``RadixKey``, ``TreeNode``: match, insert,
node splits, ``lock`` / ``unlock`` = ``inc_lock_ref`` / ``dec_lock_ref``, LRU ``evict``,
``checkpoint``), ``base_prefix_cache.py`` (``free_kv_row``, ``EvictParams``),
``cache_init_params.py``, ``events.py`` (disabled recorder), ``mem_cache/utils.py``
(``get_eviction_strategy``), ``evict_policy.py`` (``LRUStrategy``), ``environ.py``,
``cpp_utils/native_hash.py``, ``unified_cache/component_type.py`` and the allocators
of ``sglang.py`` (``PagedTokenToKVPoolAllocator`` with ``page_size = block_size``; at
block size 1 ``TokenToKVPoolAllocator``, as ``kv_cache_configurator.py`` chooses).

Stand-ins, besides ``sglang.py`` 's (every other ``sglang.*`` import raises):

``sglang.srt.mem_cache.memory_pool``
    the *real* ``ReqToTokenPool`` class, compiled from the installed file by itself
    (``ast``), with ``TorchMemorySaverAdapter`` a no-op region (memory saving is off by
    default) and ``GPU_MEMORY_TYPE_KV_CACHE`` its tag; the rest of the 260 KB module
    (KV buffers, triton kernels) is not needed.
``sglang.srt.mem_cache.common``
    the *real* ``coalesce_ranges``, ``free_kv_row_segments``, ``evict_from_tree_cache``
    and ``_evict_until_allocatable`` from the installed ``common.py`` (``ast``), with the
    real ``page_interleave_shard_size`` of ``allocator/page_interleave.py``, whose
    ``PageInterleavePoolAllocator`` is a class no allocator here is an instance of (the
    stock allocators are not page-interleaved: shard size 1).
``sglang.srt.disaggregation.kv_events``, ``sglang.srt.observability.metrics_collector``,
``sglang.srt.runtime_context``, ``sglang.kernels.ops.kvcache.mla_buffer``
    read only with KV events or metrics on (both off here, as by default) or by MLA
    buffers: stand-ins that raise if called.

The caller -- what the scheduler does around the tree -- is the adapter, step by step
as SGLang 0.5.23 does it (one request per batch):

``allocate(seq, n, token_ids)``
    one prefill iteration of the scheduler for this request:
    ``ReqToTokenPool.alloc_rows(1)``; ``Req.init_next_round_input``'s match:
    ``match_prefix(RadixKey(tokens, limit=n - 1))`` (``_compute_max_prefix_len``: at
    least one token is computed), prefix indices = ``path_device_indices(last_node)``;
    ``lock(last_node)`` (``PrefillAdder``); then ``alloc_token_slots`` /
    ``alloc_paged_token_slots_extend``: ``evict_from_tree_cache(tree, demand)`` (the
    real one; demand ``extend + page_size`` when paged, as its conservative count) and
    ``alloc`` / ``alloc_extend(prefix_lens, seq_lens, last_loc)`` (``last_loc`` =
    ``get_last_loc_torch``: the row's slot before the extension, or -1). ``None`` ->
    ``OutOfBlocks`` (the engine raises "Prefill out of memory"; its admission budget
    keeps it from trying), after unlocking and freeing the row. The row is written
    (``req_to_token[row, :n]``); the forward pass writes the KV (the oracle does, as
    for every target without ``commit``); then ``process_batch_result_prefill``'s
    ``checkpoint_kv_cache`` -> ``tree.checkpoint(req, up_to=n)``: the page-aligned
    prompt is inserted, the request's own copies of pages the tree already holds are
    freed and its row repointed at the tree's (a full page the match's ``n - 1`` limit
    left out, recomputed), the lock moves to the new node. Returns the matched length:
    the tokens the engine does not recompute. (Inserting only after the forward is
    the scheduler's order within one iteration: publish-after-write is by
    construction here, not driven as a separate ``commit``.)
``append_slot(seq, token_id)``
    a decode step: ``evict_from_tree_cache(tree, page_size)``, then ``alloc(1)`` /
    ``alloc_decode(seq_lens=[L+1], last_loc=[row[L-1]])``; the slot is written to the row.
``free_seq(seq)``
    ``release_kv_cache(req, tree, checkpoint=True)``: ``tree.checkpoint(req,
    up_to=L)`` (every written token, page-aligned, into the tree), ``free_kv_row`` of
    ``[cache_protected_len, L)`` (the real one: the unaligned tail the tree did not
    take), ``unlock(req.lock)``, ``ReqToTokenPool.free``.

Not offered: ``fork`` (SGLang has none: parallel samples are separate requests that
share through the tree), copy-on-write (a shared page is full and never written),
``append_slots`` / ``rollback`` (speculative decoding not driven), ``preempt``
(retraction is ``release_kv_cache`` again).

Observation -- SGLang keeps no refcounts; sharing is the tree's lock counts:

* table: the request's ``req_to_token`` row, as pages (``sglang.row_pages``);
* refcount of a page in the tree: its node's ``lock_ref`` (every request whose locked
  node lies at or below the node holds one lock on it), so *refcount conservation*
  compares the tree's lock counts with the rows naming the page: checked. A page no
  node holds: the number of rows naming it (derived, so vacuous for such pages);
* cache: every page of every node, keyed by the token path up to the page's end;
  evictable: the pages of nodes with ``lock_ref == 0``; free list: the allocator's
  (``get_all_free_pages``); their sizes: ``available_size()`` and
  ``evictable_size()`` (SGLang's own counters, so *pool_sizes* is checked);
* ``free_blocks`` (the structural view) is free list + evictable, as for every
  prefix-caching target: an unlocked cached page is structurally free.

*Eviction frees only unlocked nodes* is the free-list rule on this view: a locked
page that reached the free list has a refcount (its lock) and a row naming it.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import types
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import install, sglang
from ._loader import Loaded
from .sglang import real_functions, row_pages

MEM = "sglang.srt.mem_cache"
ROW_TABLE_SLOTS = 1 << 25  # int32 entries of ReqToTokenPool's table at most (128 MiB): see admits
FILES = (*sglang.FILES, f"{MEM}.radix_cache", f"{MEM}.base_prefix_cache",
         f"{MEM}.cache_init_params", f"{MEM}.events", f"{MEM}.utils", f"{MEM}.evict_policy",
         f"{MEM}.cpp_utils.native_hash", f"{MEM}.unified_cache.component_type",
         "sglang.srt.environ")

VACUOUS = {
    "no_aliasing": "the tables are req_to_token rows, one per request",
    "length_agrees": "the token count is the adapter's (the request's seqlen)",
}


def _raising(what: str):
    def fail(*_a, **_k):
        raise NotImplementedError(f"kvcheck stand-in: {what} is off in this adapter")
    return fail


def _stub_memory_pool(mod: types.ModuleType, loaded: Loaded) -> None:
    from collections.abc import Callable
    from typing import Optional

    import torch

    class TorchMemorySaverAdapter:
        @staticmethod
        def create(enable: bool):
            assert not enable, "memory saver is off"
            return types.SimpleNamespace(region=lambda _tag: contextlib.nullcontext())

    env = {"torch": torch, "Any": Any, "Optional": Optional, "Callable": Callable,
           "List": list, "TorchMemorySaverAdapter": TorchMemorySaverAdapter,
           "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache"}
    real_functions(mod, loaded, "sglang/srt/mem_cache/memory_pool.py", ("ReqToTokenPool",), env)


def _stub_common(mod: types.ModuleType, loaded: Loaded) -> None:
    import torch

    base = loaded.get(f"{MEM}.base_prefix_cache")
    rel = "sglang/srt/mem_cache/common.py"
    text = (loaded.root / rel).read_text()
    names = ("coalesce_ranges", "free_kv_row_segments", "evict_from_tree_cache",
             "_evict_until_allocatable")
    # what the release defines (0.5.19, which sglang-engine@0.5.19 loads, has no
    # coalesce_ranges nor _evict_until_allocatable: its evict_from_tree_cache evicts once)
    names = tuple(n for n in names if f"\ndef {n}(" in text)
    extra = {"torch": torch, "EvictParams": base.EvictParams,
             "EvictResult": getattr(base, "EvictResult", None),
             # to 0.5.20 evict_from_tree_cache asks isinstance(allocator, it) (the SWA arm;
             # sglang-engine@0.5.19 .. 0.5.20): no allocator here is one
             "SWATokenToKVPoolAllocator": type("SWATokenToKVPoolAllocator", (), {})}
    interleave = "sglang/srt/mem_cache/allocator/page_interleave.py"  # 0.5.20 on
    if (loaded.root / interleave).is_file():
        class PageInterleavePoolAllocator:  # no stock allocator is one
            pass

        shard = types.ModuleType("page_interleave_shard_size")
        real_functions(shard, loaded, interleave, ("page_interleave_shard_size",),
                       {"PageInterleavePoolAllocator": PageInterleavePoolAllocator})
        extra["page_interleave_shard_size"] = shard.page_interleave_shard_size
    real_functions(mod, loaded, rel, names, extra)


def _stub_kv_events(mod: types.ModuleType, _: Loaded) -> None:
    class StorageMedium(enum.Enum):
        GPU = "GPU"
        CPU = "CPU"

    mod.StorageMedium = StorageMedium
    for name in ("AllBlocksCleared", "BlockRemoved", "BlockStored", "kv_event_namespace_seed",
                 "namespaced_block_hash",
                 # 0.5.19's events.py imports these two too (sglang-engine@0.5.19)
                 "BlockStoredMetadata", "BlockStoredWithMetadata"):
        setattr(mod, name, _raising("KV events"))


def _stub_metrics(mod: types.ModuleType, _: Loaded) -> None:
    mod.STAT_LOGGER_ROLE_RADIX_CACHE = "radix_cache"
    for name in ("RadixCacheMetricsCollector", "radix_cache_metric_labels",
                 "resolve_collector_class"):
        setattr(mod, name, _raising("metrics"))


def _stub_runtime_context(mod: types.ModuleType, _: Loaded) -> None:
    for name in ("get_observability", "get_parallel"):
        setattr(mod, name, _raising("runtime context (metrics, KV events)"))


def _stub_mla(mod: types.ModuleType, _: Loaded) -> None:
    for name in ("get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton",
                 "set_mla_kv_buffer_dcp_sharded_triton", "set_mla_kv_buffer_fp8_quant_kernel",
                 "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
                 "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel",
                 "set_mla_kv_scale_buffer_triton"):
        setattr(mod, name, _raising("MLA buffers"))


def _stub_utils_common(mod: types.ModuleType, loaded: Loaded) -> None:
    real_functions(mod, loaded, "sglang/srt/utils/common.py", ("ceil_div", "ceil_align"), {})


STUBS = {**sglang.STUBS,
         f"{MEM}.memory_pool": _stub_memory_pool,
         f"{MEM}.common": _stub_common,
         "sglang.srt.disaggregation.kv_events": _stub_kv_events,
         "sglang.srt.observability.metrics_collector": _stub_metrics,
         "sglang.srt.runtime_context": _stub_runtime_context,
         "sglang.kernels.ops.kvcache.mla_buffer": _stub_mla,
         "sglang.srt.utils.common": _stub_utils_common}


ENGINE_KEY = "sglang-radix"  # install.ENGINES row: sglang-radix@VERSION (0.5.22 .. 0.5.23)


def load(version: str | None = None) -> Loaded:
    """SGLang's radix cache and allocators at ``version`` (default: the environment's SGLang
    if in range, else 0.5.23; ``ThirdPartyMissing`` if not installed). The range starts
    where ``RadixCache`` has the scheduler API this adapter drives (``checkpoint``,
    ``lock`` / ``unlock``, ``path_device_indices``: 0.5.22); before, the scheduler calls
    ``cache_unfinished_req`` / ``cache_finished_req`` and ``inc_lock_ref``, another driver."""
    return sglang.load_dist(install.select(ENGINE_KEY, version), FILES, STUBS,
                            (*sglang.FILES, f"{MEM}.radix_cache", f"{MEM}.common",
                             f"{MEM}.memory_pool"))


class _Kv:
    """The fields of ``ReqKvInfo`` the tree and ``ReqToTokenPool`` read (no sliding window,
    no SWA eviction)."""

    def __init__(self) -> None:
        self.req_pool_idx: int | None = None
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.swa_evict_floor = 0

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    def get_evicted_seqlen(self, _component) -> int:
        return 0

    def swa_dead_lo(self, _page_size: int) -> int:
        return 0


class Req:
    """The fields of ``Req`` that ``RadixCache.checkpoint`` reads."""

    def __init__(self, tokens: Sequence[int]):
        self.origin_input_ids = array("q", tokens)
        self.output_ids = array("q")
        self.extra_key = None
        self.cache_salt = None
        self.priority = None
        self.kv = _Kv()
        self.lock = None
        self.last_node = None
        self.prefix_len = 0

    @property
    def full_untruncated_fill_ids(self) -> array:
        return self.origin_input_ids + self.output_ids

    def __len__(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


class SglangRadixTarget:
    """``Target`` over SGLang's ``RadixCache`` and allocator (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "free_seq"})
    # Caching the request after its forward (``checkpoint``) frees the pages it prefilled
    # where the tree holds the same prefix and points the request at those: a position
    # the prefill computed may name the cached page holding that very prefix
    # (``spec.prefix.unwritten``'s ``twins``).
    writes_cached_twins = True
    vacuous = VACUOUS

    def __init__(self, num_blocks: int, block_size: int, check_first: bool = True,
                 version: str | None = None):
        import torch

        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.torch = torch
        self.num_blocks = num_blocks
        self.block_size = block_size
        mods = load(version)
        self.version = mods.dist.version
        paged = block_size > 1
        allocators, size = mods[sglang.ALLOCATOR], num_blocks * block_size
        if paged:
            self.alloc = allocators.PagedTokenToKVPoolAllocator(size, block_size, torch.float16,
                                                                "cpu", None, False)
        else:
            self.alloc = allocators.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
        context = num_blocks * block_size + block_size  # a row holds any request's tokens
        rows = max(2, min(num_blocks + 1, ROW_TABLE_SLOTS // context))  # admits: row budget
        self.pool = mods[f"{MEM}.memory_pool"].ReqToTokenPool(rows, context, "cpu", False)
        params = mods[f"{MEM}.cache_init_params"].CacheInitParams(
            disable=False, req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc,
            page_size=block_size)
        radix = mods[f"{MEM}.radix_cache"]
        self.tree = radix.RadixCache(params)
        self._radix = radix
        self._base = mods[f"{MEM}.base_prefix_cache"]
        self._common = mods[f"{MEM}.common"]
        self.check_first = check_first
        self.reqs: dict[int, Req] = {}
        self._tokens = itertools.count(1 << 20)  # fresh ids, apart from a driver's small ones

    def _t(self, values):
        return self.torch.tensor(values, dtype=self.torch.int64)

    def _reclaimable(self) -> int:
        """Pages an allocation could get: free, or evictable (unlocked) in the tree."""
        return (int(self.alloc.available_size()) + int(self.tree.evictable_size())) \
            // self.block_size

    def _row(self, req: Req):
        return self.pool.req_to_token[req.kv.req_pool_idx, : len(req)].to(self.torch.int64)

    def admits(self, op) -> bool:
        """An allocation only while a ``req_to_token`` row is free: SGLang's scheduler
        admits no more requests than ``ReqToTokenPool`` has free rows
        (``Scheduler.get_num_allocatable_reqs``'s ``row_budget``). Requests sharing cached
        pages can outnumber the pool's blocks; the adapter's pool has ``num_blocks + 1``
        rows, fewer on a pool so large that its row table (rows x the pool's tokens) would
        pass ``ROW_TABLE_SLOTS``. Every other operation its precondition allows."""
        if op.kind == "allocate":
            return self.pool.available_size() > 0
        return True

    # -- operations -----------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        if seq in self.reqs:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        tokens = list(token_ids) if token_ids is not None else [
            next(self._tokens) for _ in range(n_tokens)]
        if len(tokens) != n_tokens:
            raise MisuseError("len(token_ids) != n_tokens")
        req = Req(tokens)
        rows = self.pool.alloc_rows(1)
        if rows is None:
            raise MisuseError("no req_to_token row left")
        req.kv.req_pool_idx = rows[0]
        tree, ps = self.tree, self.block_size
        key = self._radix.RadixKey(req.full_untruncated_fill_ids, None, limit=n_tokens - 1)
        match = tree.match_prefix(self._base.MatchPrefixParams(key=key))
        req.prefix_len = p = match.device_prefix_len
        req.last_node = match.last_device_node
        req.kv.cache_protected_len = p
        prefix = tree.path_device_indices(req.last_node)[:p]
        req.lock = tree.lock(req.last_node)
        extend = n_tokens - p
        need = -(-n_tokens // ps) - p // ps  # new pages (p is page-aligned)
        if self.check_first and need > self._reclaimable():
            tree.unlock(req.lock)
            self.pool.free(req)
            raise OutOfBlocks(f"SGLang prefill of {extend} tokens ({p} cached) needs {need} "
                              f"pages; {self._reclaimable()} free or evictable")
        if ps == 1:
            self._common.evict_from_tree_cache(tree, extend)
            out = self.alloc.alloc(extend)
        else:
            self._common.evict_from_tree_cache(tree, extend + ps)
            pl, sl = self._t([p]), self._t([n_tokens])
            last = self._t([int(prefix[p - 1]) if p > 0 else -1])
            out = self.alloc.alloc_extend(pl, pl.clone(), sl, sl.clone(), last, extend)
        if out is None:
            tree.unlock(req.lock)
            self.pool.free(req)
            raise OutOfBlocks(f"SGLang prefill of {extend} tokens ({p} cached): alloc "
                              "returned None after eviction")
        self.pool.write((req.kv.req_pool_idx, slice(0, n_tokens)),
                        self.torch.cat((prefix.to(self.torch.int64), out)).to(self.torch.int32))
        tree.checkpoint(req, up_to=n_tokens)  # checkpoint_kv_cache after the forward
        req.prefix_len = n_tokens
        self.reqs[seq] = req
        return p

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        req = self._live(seq)
        length, ps = len(req), self.block_size
        if self.check_first and length % ps == 0 and self._reclaimable() < 1:
            raise OutOfBlocks("SGLang decode needs a page; none free or evictable")
        self._common.evict_from_tree_cache(self.tree, ps)
        if ps == 1:
            out = self.alloc.alloc(1)
        else:
            lens = self._t([length + 1])
            last = self._row(req)[length - 1 : length].clone()
            out = self.alloc.alloc_decode(lens, lens.clone(), last)
        if out is None:
            raise OutOfBlocks("SGLang decode alloc returned None after eviction")
        self.pool.write((req.kv.req_pool_idx, slice(length, length + 1)),
                        out.to(self.torch.int32))
        req.output_ids.append(next(self._tokens) if token_id is None else token_id)
        slot = int(out[0])
        return slot // ps - 1, slot % ps, None

    def fork(self, parent: int, child: int) -> None:
        raise NotImplementedError("SGLang has no fork")

    def free_seq(self, seq: int) -> None:
        """``release_kv_cache(req, tree, checkpoint=True)``."""
        req = self._live(seq)
        length = len(req)
        self.tree.checkpoint(req, up_to=length)
        self.tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, length)])
        self.tree.unlock(req.lock)
        req.lock = None
        self.pool.free(req)
        del self.reqs[seq]

    def _live(self, seq: int) -> Req:
        req = self.reqs.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- the tree -----------------------------------------------------------------
    def _nodes(self):
        """(node, its key's token path from the root) for every node but the root."""
        stack = [(child, ()) for child in self.tree.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + tuple(node.key.token_ids[: len(node.key)])
            yield node, path
            stack.extend((c, path) for c in node.children.values())

    def _tree_pages(self):
        """(kvcheck block, key, node) for every page the tree holds."""
        ps = self.block_size
        out = []
        for node, path in self._nodes():
            if node.value is None:
                continue
            values = node.value.tolist()
            start = len(path) - len(values)
            for i in range(0, len(values), ps):
                out.append((values[i] // ps - 1, path[: start + i + ps], node))
        return out

    # -- observation ------------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        return row_pages(self._row(self.reqs[seq]).tolist(), self.block_size)

    def refcounts(self) -> Sequence[int]:
        counts = [0] * self.num_blocks
        in_tree = set()
        for b, _key, node in self._tree_pages():
            if 0 <= b < self.num_blocks:
                counts[b] += node.lock_ref
                in_tree.add(b)
        for s in self.reqs:
            for b in self.block_table(s):
                if isinstance(b, int) and 0 <= b < self.num_blocks and b not in in_tree:
                    counts[b] += 1
        return counts

    def refcount(self, block: int) -> int:
        return self.refcounts()[block]

    def free_list_blocks(self) -> list[int]:
        return [p - 1 for p in self.alloc.get_all_free_pages().tolist()]

    def evictable_blocks(self) -> list[int]:
        return [b for b, _key, node in self._tree_pages() if node.lock_ref == 0]

    def cache_entries(self) -> list[tuple[Any, int]]:
        return [(key, b) for b, key, _node in self._tree_pages()]

    def num_free_list(self) -> int:
        return int(self.alloc.available_size()) // self.block_size

    def num_evictable(self) -> int:
        return int(self.tree.evictable_size()) // self.block_size

    def free_blocks(self) -> Iterable[int]:
        return self.free_list_blocks() + self.evictable_blocks()

    def num_free(self) -> int:
        return self.num_free_list() + self.num_evictable()

    def table_identity(self, seq: int) -> object | None:
        return None

    def seq_len(self, seq: int) -> int | None:
        return len(self.reqs[seq])

    def token_ids(self, seq: int) -> list[int]:
        return list(self.reqs[seq].full_untruncated_fill_ids)

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, version: str | None = None) -> SglangRadixTarget:
    """Admission first: a prefill or decode page that cannot be had even by evicting every
    unlocked page is refused before anything is evicted (see module docstring)."""
    return SglangRadixTarget(num_blocks, block_size, version=version)


def make_evict_first(num_blocks: int, block_size: int,
                     version: str | None = None) -> SglangRadixTarget:
    """The allocation paths' own order with no admission check before them: evict, then
    allocate, so an allocation that fails has already evicted (a documented deviation from
    "out-of-blocks changes nothing, the cache included"; see docs/findings.md)."""
    return SglangRadixTarget(num_blocks, block_size, check_first=False, version=version)
