"""Adapter: SGLang's HiCache -- ``HiRadixCache`` with its host pool and ``HiCacheController``
-- as a tiers target (docs/tiers.md; ``kvcheck verify-tiers sglang-hicache@VERSION``, 0.4.5
pinned, 0.4.4.post2 .. 0.5.20: ``kvcheck install sglang==VERSION``). What differs
between those releases is read from each one's files: the constructor's arguments
(``hicache_ratio`` from 0.4.4.post2, ``hicache_size`` and ``hicache_write_policy`` from
0.4.6, ``hicache_io_backend`` from 0.4.9.post1: ``direct``, ``hicache_storage_backend``
from 0.4.9.post3: None, ``hicache_mem_layout`` from 0.4.10.post1: ``layer_first``,
``enable_metrics`` from 0.5.2: False), the host pool's module (``memory_pool_host.py`` from
0.4.7.post1), KV events (0.4.7), ``match_prefix``'s ``MatchResult`` and
``init_load_back(node, host_hit_length)`` (0.4.8), the allocator in
``mem_cache/allocator.py`` (0.4.8: loaded as ``sglang.py`` loads it, its Triton kernels
under Triton's interpreter, never launched at page size 1; ``need_sort`` from 0.5.1:
False, the scheduler's value outside disaggregation), the controller's copies (0.5.2:
issued at once on its streams, acked by CUDA events, no threads: ``_Event``), ``RadixKey``
(0.5.3: ``RadixKey(tokens, extra_key=None)``), the radix cache's ``evict_policy.py``
(0.5.3: LRU, its default), the host pool aligned up a page (0.5.5.post3: one slot more
than asked at page size 1, so one less is asked), ``Req.pop_committed_kv_cache``
(0.5.5.post3), the constructor's ``CacheInitParams`` and ``ServerArgs`` (0.5.6: the
dataclass from ``cache_init_params.py``, the server's arguments at the release's own
defaults read from its ``server_args.py``, with the ones above), the host buffer's
allocator table (0.5.6.post2: ``ALLOC_MEMORY_FUNCS``), ``MatchPrefixParams`` (0.5.8),
``ReqToTokenPool.alloc(reqs)`` / ``free(req)`` with the row freed after
``cache_finished_req`` as ``release_kv_cache`` does, ``EvictParams`` (0.5.9),
``InitLoadBackParams`` (0.5.10; its ``best_match_node``, the match's, 0.5.12), the KV
events mixin ``mem_cache/events.py`` (0.5.12, events off), the allocator package
``mem_cache/allocator/`` loaded as ``sglang.py`` loads it, the eviction policy's factory in
``mem_cache/utils.py``, ``Req.get_fill_ids`` and write backups published on their ack
(``ongoing_write_through`` holding (lock node, length, nodes): 0.5.13), the host pool's
``pool_host/`` package (0.5.14: its base class and allocation loaded from the files,
``get_mha_host_pool_cls`` and the MHA host pool compiled from ``memory_pool_host.py``
with what it imports from the package), the session mixin (0.5.15, sessions off), the
MHA host pool in ``pool_host/mha.py``, the host pool's frees staged in ``release_slots``
(free too), ``sglang.srt.runtime_context`` and ``cache_finished_req(kv_len_to_handle=)``
(0.5.16: the committed length, as ``release_kv_cache`` passes it), the HiCache arguments
read through the runtime context and ``alloc_mmap`` in ``storage/mmap.py`` (0.5.17), the
copies through ``l2_transfer.py``'s ``L2TransferEngine`` (loaded from the file, on the
stand-in streams and events), more KV event classes, ``Req.cache_salt`` and the device
pool's layer pointers and ``layer_shard_enabled`` (0.5.18), the request's KV fields in
``req.kv`` (a ``ReqKvInfo``: ``holds_kv``), the unified cache's component enum, host pool
groups and ``envs`` read while the host pool is built (0.5.19), the server's arguments
declared in ``arg_groups/fields/`` (one class per namespace, assembled into ``ServerArgs``)
and the storage key hash the controller imports (0.5.20). The storage tier
(``hicache_storage.py``, 0.4.9.post3 on: an L3 behind the host pool, prefetch and backup
threads) is loaded but off, as by default
(``hicache_storage_backend=None``): no backend is built, no prefetch or storage backup
starts, and its modules (the backends, metrics, 0.5.11's hybrid-pool controller and
assembler for NSA / Mamba models) are stand-ins that raise if built. 0.5.20 is the last
release with ``hiradix_cache.py`` (0.5.21 on: ``UnifiedRadixCache``).

What runs, from the installed wheel: ``mem_cache/hiradix_cache.py`` (``HiRadixCache``:
``match_prefix(include_evicted=True)``, ``init_load_back`` / ``load_back``,
``write_backup``, ``writing_check`` / ``loading_check``, device ``evict`` to host,
``evict_host``, node splits), ``mem_cache/radix_cache.py`` (``RadixCache``, ``TreeNode``:
insert, ``cache_unfinished_req``, ``cache_finished_req``, ``inc_lock_ref`` /
``dec_lock_ref``), ``base_prefix_cache.py``, ``managers/cache_controller.py``
(``HiCacheController.write`` / ``load`` / ``evict_device`` / ``evict_host``,
``CacheOperation``; 0.5.2 on ``start_writing`` / ``start_loading``, ``move_indices``,
``LayerDoneCounter``), ``hicache_storage.py`` and ``evict_policy.py`` where the release
has them, and of ``mem_cache/memory_pool.py`` the classes the cache uses,
compiled from the installed file one by one (``sglang.real_functions``):
``ReqToTokenPool``, ``TokenToKVPoolAllocator``, ``MemoryStateInt``, ``synchronized``,
``HostKVCache`` and ``MHATokenToKVPoolHost`` (the host pool: its free list, its slot
states). Token-level: these releases' HiRadixCache keys one token per slot, so
``block_size`` is 1 (a kvcheck block is a slot: device block b is SGLang's slot b + 1,
slot 0 being the padding slot; host block b is host slot b). Their host pool is
``hicache_ratio`` times the device pool, at least 1: ``host_blocks >= num_blocks``
(0.4.6 on: more than the device's, the release's own assert). The later releases keep
page size 1 (the server's default): their keys stay token-level (``RadixKey`` holds the
token list), so ``block_size`` stays 1 there too.

Stand-ins, all here (every other ``sglang.*`` import raises, ``_loader``):

``_DevicePool`` (``memory_pool.MHATokenToKVPool``)
    the device KV buffers: one layer, one head of width 1, never read (the copy kernels
    are stood in too); what the host pool and the controller read of it is its size,
    dtype, shape, device, layer buffers (0.5.2 on: named by the stood-in copies; 0.5.18:
    their pointers, never dereferenced), ``v_head_dim`` (0.5.14), ``layer_shard_enabled``
    False (0.5.18: the class default) and ``register_layer_transfer_counter``. ``MLATokenToKVPool`` is a
    class no pool here is an instance of.
the controller's threads and CUDA streams (before 0.5.2)
    ``HiCacheController`` builds two ``torch.cuda.Stream`` s and starts a write and a load
    thread (``threading.Thread``) that take operations off ``write_queue`` /
    ``load_queue``, copy, mark the host slots ``complete_io`` and put the node id on
    ``ack_write_queue`` / ``ack_load_queue``. Here the streams are inert, the threads are
    never started, and ``complete(job, ok)`` is that thread's step for the one operation
    the driver completes: it takes it off its queue, ``complete_io`` its host slots, puts
    its ack, then runs the scheduler's own ``writing_check()`` / ``loading_check()``
    (what ``Scheduler.get_next_batch_to_run`` calls each step). The copy itself is
    kvcheck's ghost (the oracle moves contents when a job completes). The driver may ack
    operations in any order, beyond the threads' FIFO; no transfer fails (the controller
    has no failure path: ``failures = ()``).
the write thread under the write_back policy (``make_write_back``)
    a device eviction writes unbacked nodes back and waits for them (0.4.5: a loop of
    ``writing_check`` and ``time.sleep(0.1)``; 0.4.5.post3 on: ``ack_write_queue.get()``):
    before 0.5.2 the controller's ``ack_write_queue`` is ``_SyncAcks``, which, read, first
    lets the write thread take every queued write (``complete_io``, the ack), and
    hiradix_cache.py's ``time.sleep`` returns at once; from 0.5.2 the eviction synchronizes
    each write's event (``_Event.synchronize``). Those writes complete inside the operation that
    evicts; ``store`` is not offered (write_back backs nothing up before an eviction).
the controller's streams and events (0.5.2 on)
    the copies are issued on the scheduler's thread: ``write`` runs ``start_writing`` at
    once, a load is issued with its batch (``ready_to_load_host_cache``, called here after
    the request is admitted, as ``get_new_batch_prefill`` does), each marks its host slots
    ``complete_io`` and queues a ``HiCacheAck`` whose ``finish_event`` the stream records.
    ``writing_check`` / ``loading_check`` ack the head of each queue while its event has
    ended (``query()``). Here the copy kernels (sgl_kernel's ``transfer_kv_*``) do nothing
    (``_no_copy``: the copy is kvcheck's ghost) and an event (``_Event``) ends when the
    driver completes its job; its ack is moved to the head of its queue, so copies end in
    the driver's order, as above (the acks' handling reads no order: each unlocks its own
    nodes). ``synchronize()`` ends an event: the write_back eviction's wait. The load
    ring (``LayerDoneCounter``: 3 events, reused in turn, asserting the reused one ended)
    gets ``RING`` (4096) more: on the GPU the forward pass waits for its layers' loads, so
    a load's copy has ended when its ring slot comes round; here a load stays pending until
    the driver completes it, which may be after any number of later loads (the ring reuses
    its slots in turn, whichever loads are still pending).
``torch.distributed`` in hiradix_cache.py, the tensor-parallel and attention ranks
    ``writing_check`` all-reduces its queue size over the tensor-parallel group: one
    worker here (``get_world_size`` 1); ``sglang.srt.distributed`` and
    ``layers.dp_attention`` (0.4.9.post4 on, read by the storage tier's configuration and
    the controller's) say rank 0 of 1, no data-parallel attention.
the storage tier's modules, metrics (0.4.9.post3 on)
    the storage backends (file, Mooncake, NIXL, 3FS: ``_stub_off``) and the metrics
    collectors (``metrics.collector``): classes that raise if built. With
    ``hicache_storage_backend=None`` and metrics off the release builds none of them, and
    the tree's storage paths (``prefetch_from_storage``, ``write_backup_storage``,
    ``check_prefetch_progress``, their queues) are behind ``enable_storage``: nothing the
    cache decides here reads them. With the storage tier on (``make_storage``) see the
    next three.
the storage backend (``make_storage``: ``mem_cache.storage``'s ``StorageBackendFactory``)
    ``_dict_backend``: a subclass of the release's own ``HiCacheStorage`` (its
    ``hicache_storage.py``) holding backed-up pages in a dict. It says it holds every page
    a prefetch asks about (``batch_exists``) and ``batch_get`` returns the first
    ``filled`` pages of the completion the driver chose, None after (pages that were
    listed and then not delivered: evicted from the storage meanwhile, or a failed read).
    It cannot change what the cache decides: the controller and the tree read only how
    many pages came back and the hashes, never the bytes. Built by name
    (``STORAGE_BACKEND``); every other backend the factory is asked for raises.
the storage tier's threads (``make_storage``)
    ``prefetch_thread_func``, ``prefetch_io_aux_func`` and ``backup_thread_func`` are the
    release's own loops, never started as threads (``_Inert``): ``complete`` of a prefetch
    runs one pass of each prefetch loop over that one operation, a completion runs one
    pass of the backup loop over every queued backup (``_OneShot``: a queue that hands out
    its items and then sets the storage threads' stop event, ``storage_stop_event`` from
    0.5.9, so the loop returns; 0.5.16 .. 0.5.18: the prefetch thread's pass runs in
    ``prefetch``, followed by the scheduler's ``check_hicache_events``, whose drain
    allocates the pages). The driver chooses when a prefetch's pages arrive and how
    many (``filled``); backups are acked in the step that queued them (a backup's protection
    of the host copy lasts no longer than the write's completion).
the storage keys' hash (``make_storage``, 0.5.15: ``cpp_utils.native_hash``)
    a C++ extension the release compiles at run time (not built here): ``_native_hash``
    computes the SHA-256 chain 0.5.14's own Python ``get_hash_str`` does; only equality
    and the chaining reach a decision.
``torch.distributed`` in the controller, ``mem_cache.deepseek_v4_memory_pool`` (0.5.13 on)
    with storage on the controller asks the tensor-parallel group's size (one worker) and
    the storage configuration tests the device pool against DeepSeek V4's class (no pool
    here is one: ``_stub_off``).
``sglang.srt.utils``
    the few functions the allocator reads, compiled from the release's file
    (``sglang._stub_utils``), its upper-case constants (0.5.3.post3: the radix cache's
    deterministic split size, used only in deterministic inference), no NPU or XPU, and
    ``get_device_module()`` the stand-in streams and events above.
``sglang.srt.runtime_context`` (0.5.16 on)
    the parallel layout (rank 0 of 1 in every group) and, from 0.5.17, the server's
    arguments the cache is being built with (set by the adapter just before it builds one;
    HiRadixCache reads them in ``__init__`` only); ``get_server_args`` (metrics only) raises.
``Req``
    the fields the radix cache reads (``ReqStandIn``; 0.5.19's ``req.kv`` is the request itself,
    which holds the same fields ``ReqKvInfo`` does), 0.5.5.post3's
    ``pop_committed_kv_cache`` without speculative decoding (the committed length: every
    token with a KV slot), 0.5.6's ``cache_protected_len`` (set as ``init_next_round_input``
    and ``PrefillAdder`` set it), 0.5.9's ``is_chunked`` and ``is_dllm()`` (no chunked
    prefill, no diffusion model).
``ServerArgs`` (0.5.6 on)
    a namespace of the release's own defaults (every field of its ``ServerArgs`` with a
    literal default; 0.5.20: of the ``arg_groups/fields/`` classes its ``server_args.py``
    imports and assembles, not its resolution pipeline, which reads the model) and the
    HiCache arguments above; ``disable_hicache_numa_detect``
    (0.5.8) True: the process is not bound to a NUMA node (placement, nothing the cache
    decides), ``bind_to_closest_numa_node_cuda`` a stand-in that raises.
``mem_cache/utils.py`` (0.5.6 on), ``environ.py``'s debug import, world groups
    of the first, the radix cache's key and hash helpers and (0.5.13) the eviction
    policy's factory and table, compiled from the file (its MLA Triton kernels are not
    loaded); ``sglang.srt.environ`` (0.5.9 on) is the release's own file (the environment's
    settings: 0.5.19 reads the host-register chunk size, used only to pin, which is off),
    its ``debug_utils.cuda_coredump`` import a stand-in; ``distributed.parallel_state``
    (0.5.19: world groups, read only when torch.distributed is initialized, which it is not
    here) a stand-in that raises if read.
``alloc_mmap`` (0.5.13), ``psutil``, torch in ``pool_host/`` (0.5.14)
    the host buffer is mmap-backed there (``mmap_allocator.py``); here plain heap memory:
    the buffer's bytes are never read by a decision (the copies are stood in). The
    host-memory check's ``psutil.virtual_memory()`` has room for the few bytes asked; the
    package's files allocate through the same unpinned torch as the compiled classes.
device tensors
    ``init_load_back`` asserts that the matched prefix's indices are CUDA tensors: the
    prefix is passed as a CPU tensor that says ``is_cuda`` (``_DeviceTensor``).
pinned memory, ``psutil``, ``debug_timing``, ``global_server_args_dict``, KV events
    the host buffer is allocated unpinned (no GPU to pin for; 0.5.4.post3 .. 0.5.5's
    ``cudaHostRegister`` does nothing, 0.5.5.post3's ``SUPPORT_PIN_MEMORY`` is False); the
    host-memory check reads
    a ``virtual_memory()`` with room for the few bytes asked; ``debug_timing`` only times
    (identity); the radix cache reads no server argument on these paths; its KV cache
    events (0.4.7: ``disaggregation.kv_events``) are off, as by default (stand-ins that
    raise if built).

Configuration (attributes of the release's objects, set after building them):
``write_through_threshold`` and the write policy. The controller's default policy,
``write_through_selective``, backs a node up when its hit count passes
``write_through_threshold`` (1: its second hit); here the threshold is never passed and
kvcheck's ``store(seq)`` starts the backup instead, with the very call the hit count makes
(``write_backup(node)``): when a backup starts is the driver's choice, as when a transfer
completes. ``load_back_threshold`` (10 tokens: a shorter host prefix is recomputed) is 1,
so that prompts of a few tokens reach the load-back.

The caller -- the scheduler, one request per batch, as 0.4.5's
``get_new_batch_prefill`` / ``PrefillAdder.add_one_req`` / ``prepare_for_extend`` /
``process_batch_result_*`` do it:

``allocate(seq, tokens)`` / ``load(seq, tokens)``
    ``Req.init_next_round_input``: ``match_prefix(tokens[:n - 1], include_evicted=True)``
    (``adjust_max_prefix_ids``: one token is always computed); ``_lock_node(last_node)``;
    ``load`` only: ``init_load_back(last_node_global, prefix)`` where the match ends in
    host-only nodes (a load job: ``load_back`` allocates device slots, ``controller.load``
    protects the host slots; the nodes get their device values at once, locked until the
    ack); ``inc_lock_ref(last_node)`` (the request's lock); ``alloc_token_slots``: the
    tree's ``evict`` (write-through nodes to the host, others dropped) when the free list
    is short, then ``alloc``; the row is written; after the forward,
    ``cache_unfinished_req`` (the prompt inserted: duplicates freed, the row repointed,
    the lock moved). ``OutOfBlocks`` (nothing changed) when the free and evictable device
    slots cannot hold the request: the scheduler's admission budget keeps it from trying.
``append(seq, token)``
    a decode step: ``alloc_token_slots(1)`` (evicting when short), the row written.
``store(seq)``
    ``write_backup(node)`` of the highest node on the request's path that has no host
    copy (one controller write: a job), evicting host nodes (``evict_host``) when the host
    is full; None when every node has one, or the host has no room. Highest first, as the
    release's own trigger orders them: every match and insert counts a hit on each node of
    the path, so an ancestor passes the threshold no later than its descendants (a split's
    upper half shares the host copy of a backed-up node). Backing up a leaf before its
    parent, an order the release does not produce, lets a device eviction drop the
    unbacked parent and orphan the leaf's host copy.
``complete(job, ok)``
    the controller thread's step for that operation, then ``writing_check`` /
    ``loading_check``: a write's ack unlocks the node (its host copy is findable); a
    load's ack unlocks the loaded nodes.
``evict(n)``
    ``evict_host(n)``.
``prefetch(seq, tokens)`` (``make_storage``)
    the scheduler's ``_prefetch_kvcache`` for a request not yet scheduled: its match
    (``init_next_round_input``) and, when the device match ends in a backed-up node,
    ``prefetch_from_storage(rid, last_host_node, tokens past the device and host hits,
    last_hash)``: the release protects the last host node, allocates host pages (evicting
    host nodes when short) and queues a ``PrefetchOperation`` (a job: ``("p", seq)``, its
    destinations ``ongoing_prefetch[rid][2]``); None when it is rate-limited (0.8 x (host -
    device) tokens in flight) or finds no room. The request itself is never admitted.
    0.5.16 .. 0.5.18: ``prefetch_from_storage`` queues the operation with no host pages;
    they are allocated by the scheduler's drain once the storage hit is known, so
    ``prefetch`` goes on with what follows in the same scheduler iteration: the prefetch
    thread's pass (``prefetch_thread_func``, ``_storage_hit_query``: every page hit, the
    operation put on ``prefetch_hit_queue``), then the scheduler's
    ``check_hicache_events`` (``get_next_batch_to_run`` calls it right after
    ``process_input_requests``, where ``_prefetch_kvcache`` runs), whose
    ``drain_storage_control_queues`` -> ``_drain_and_alloc_storage_hit`` allocates the
    host pages (evicting host nodes when short; the prefetch revoked when none are
    found: None) and puts the operation on ``prefetch_buffer``; the job's destinations
    are the operation's ``host_indices``. This fixes one order of the prefetch thread and
    the scheduler (the query done before the scheduler's next drain); the driver still
    chooses when the pages arrive. 0.5.19 on (the pages reported through the
    controller's ``ack_prefetch_queue``, and no cache factory builds HiRadixCache) are
    refused.
``complete(job, ok, filled)`` of a prefetch (``make_storage``)
    the prefetch thread's pass (``_storage_hit_query``: every page hit; the pages past the
    hit queued for release; 0.5.16 on: already run by ``prefetch``), the aux thread's
    pass (``_page_transfer``: ``filled`` pages come back, the rest queued for release --
    twice before 0.5.6, sglang #13501), the
    scheduler's ``check_prefetch_progress(rid)`` (the filled pages inserted as host-only
    nodes, those the tree already had freed, the protection released) and
    ``check_hicache_events()`` (``drain_storage_control_queues``: the queued pages freed).
    With the storage tier on every completion ends with the backup thread's pass and that
    drain (a completed write's node is backed up to the storage tier: ``writing_check``).
``free(seq)``
    the request finishes: one more sampled token, never forwarded, is appended (SGLang's
    last output token has no KV slot) and ``cache_finished_req`` inserts every token that
    has one, frees duplicates, frees the row and ``dec_lock_ref(last_node)``.

Observation. A device slot is held by the tree (one reference: the cache, findable under
its token path), by each live request's ``req_to_token`` row naming it, by each pending
operation copying into or out of it, and by the locks a pending operation holds on the
path above its own slots (a pin: ``write_backup`` and ``load_back`` lock the node and its
ancestors). Those counts are derived, so refcount conservation compares them with nothing
but themselves; what is checked is the tree's ``lock_ref``: the device slots the tree
would evict (nodes with ``lock_ref == 0``) are exactly those only the cache holds. A host
slot is held by the tree (a node's ``host_value`` whose write completed: findable under
the same token path) and by pending operations; the host slots ``evict_host`` evicts are
those of host-only nodes (a node still on the device keeps its host copy: an inclusive
cache). Eviction units: one node's slots go together. With the storage tier on, a pending
prefetch holds its host pages (a job from the ``storage`` pseudo pool, holding nothing
there), a node protected by ``protect_host`` (a pending prefetch's last host node) pins
its host slots and those of the nodes above it (``evict_host`` takes leaves only: none of
them is evictable while it lasts), and a page on ``host_mem_release_queue`` is held by
that queue once per time it is queued (a pin; the drain in the same step frees it).
"""

from __future__ import annotations

import heapq
import itertools
import re
import types
from collections.abc import Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, sglang
from ._loader import Loaded, takes

MEM = "sglang.srt.mem_cache"
HIRADIX, RADIX = f"{MEM}.hiradix_cache", f"{MEM}.radix_cache"
CONTROLLER = "sglang.srt.managers.cache_controller"
FILES = (HIRADIX, RADIX, f"{MEM}.base_prefix_cache", CONTROLLER)
OPTIONAL = (f"{MEM}.hicache_storage",  # (0.4.9.post3 on: loaded where the release has them)
            f"{MEM}.evict_policy",  # (0.5.3 on: the radix cache's eviction order)
            f"{MEM}.cache_init_params",  # (0.5.6 on: the cache's constructor arguments)
            f"{MEM}.events",  # (0.5.12 on: the KV events mixin, events off)
            f"{MEM}.pool_host.base", f"{MEM}.pool_host.common",  # (0.5.14 on: the host
            f"{MEM}.pool_host.hisparse",  # pool's base class and allocation, real files)
            f"{MEM}.session_radix_cache",  # (0.5.15 on: a mixin, sessions off by default)
            "sglang.srt.distributed.communication_tags",  # (0.5.16 on: pipeline sync tags)
            f"{MEM}.l2_transfer",  # (0.5.18 on: the copies' engine, on the stand-in streams)
            f"{MEM}.unified_cache.component_type",  # (0.5.19 on: an enum of tree components)
            f"{MEM}.pool_host.group",  # (0.5.19 on: host pool groups, from the package)
            "sglang.srt.environ")  # (0.5.9 on: the environment's settings, the release's own)
POOL_CLASSES = ("ReqToTokenPool", "KVCache", "TokenToKVPoolAllocator", "MemoryStateInt",
                "synchronized", "HostTensorAllocator", "get_allocator_from_storage",
                "alloc_with_host_register", "alloc_with_pin_memory",  # (0.5.6.post2 on)
                "HostKVCache", "MHATokenToKVPoolHost",
                "AsymmetricMHATokenToKVPoolHost", "get_mha_host_pool_cls")  # (0.5.14 on)
OTHER_POOLS = ("NSATokenToKVPool", "NSATokenToKVPoolHost", "DSATokenToKVPool",
               "HybridLinearKVPool", "MiniMaxSparseKVPool", "MHATokenToKOnlyPool", "MambaPool")
POOL_TABLES = ("ALLOC_MEMORY_FUNCS",  # (0.5.6.post2 on: the host buffer's allocator by device)
               "HICACHE_HOST_MEMORY_RESERVE_BYTES")  # (0.5.11 on: the host-memory check's)
ENGINE_KEY = "sglang-hicache"
RING = 4096  # more slots in the controller's load-event ring (LayerDoneCounter), see below
DEVICE, HOST = "device", "host"


class _DeviceTensor:  # replaced below by a torch.Tensor subclass (torch imported lazily)
    pass


def _device_tensor_class():
    import torch

    global _DeviceTensor
    if not issubclass(_DeviceTensor, torch.Tensor):
        class _DeviceTensor(torch.Tensor):  # noqa: N801 - the stand-in's name
            """A CPU tensor that says it is on the GPU (``init_load_back``'s assert)."""

            @property
            def is_cuda(self) -> bool:
                return True
        globals()["_DeviceTensor"] = _DeviceTensor
    return _DeviceTensor


def _torch_unpinned():
    """torch, with host buffers allocated unpinned (no GPU to pin memory for)."""
    import torch

    class _Torch(types.ModuleType):
        """torch, with host buffers allocated unpinned (no GPU to pin memory for)."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, pin_memory=False, **kwargs):
            return torch.empty(*args, **kwargs)

        @staticmethod
        def zeros(*args, pin_memory=False, **kwargs):
            return torch.zeros(*args, **kwargs)

        class cuda:  # noqa: N801 - torch.cuda: 0.5.4.post3 .. 0.5.5 pin the host buffer by
            @staticmethod  # cudaHostRegister (no GPU to pin for)
            def cudart():
                return types.SimpleNamespace(cudaHostRegister=lambda *_a: 0,
                                             cudaHostUnregister=lambda *_a: 0)

    return _Torch("torch")


def _stub_psutil(mod: types.ModuleType, _: Loaded) -> None:
    """``psutil`` for the host-memory check (0.5.14's pool_host/base.py imports it): room
    for the few bytes asked."""
    mod.virtual_memory = lambda: types.SimpleNamespace(available=1 << 50)


def _alloc_mmap(dims, dtype):
    """``mmap_allocator.alloc_mmap`` (0.5.13 on: the host buffer mmap-backed): heap memory
    here, whose bytes no decision reads (the copies are stood in)."""
    import torch

    return torch.zeros(dims, dtype=dtype)


def _stub_mmap(mod: types.ModuleType, _: Loaded) -> None:
    mod.alloc_mmap = _alloc_mmap


def stub_memory_pool(mod: types.ModuleType, loaded: Loaded) -> None:
    import abc
    import logging
    import threading
    import typing
    from enum import IntEnum
    from functools import wraps

    import numpy as np

    psutil = types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(
        available=1 << 50))

    class TorchMemorySaverAdapter:
        @staticmethod
        def create(enable: bool):
            assert not enable, "memory saver is off"
            import contextlib

            return types.SimpleNamespace(region=contextlib.nullcontext)

    class MLATokenToKVPool:  # no pool here is one
        pass

    rel = f"{mod.__kvcheck_real_name__.replace('.', '/')}.py"  # (0.5.16: pool_host/mha.py)
    text = (loaded.root / rel).read_text()  # memory_pool.py (memory_pool_host.py: 0.4.7.post1)
    names = [n for n in POOL_CLASSES if f"\nclass {n}" in text or f"\ndef {n}(" in text]
    env = {"torch": _torch_unpinned(), "np": np, "psutil": psutil, "abc": abc,
           "logging": logging, "threading": threading, "IntEnum": IntEnum, "wraps": wraps,
           **{n: getattr(typing, n) for n in ("List", "Optional", "Tuple", "Union")},
           "TorchMemorySaverAdapter": TorchMemorySaverAdapter,
           "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache", "nullcontext": __import__(
               "contextlib").nullcontext,
           "debug_timing": lambda f: f, "logger": logging.getLogger(
               "kvcheck.thirdparty.sglang.memory_pool"),
           "MHATokenToKVPool": _DevicePool, "MLATokenToKVPool": MLATokenToKVPool,
           "SWAKVPool": type("SWAKVPool", (), {}),  # (0.4.9's allocator: isinstance only)
           "MLATokenToKVPoolHost": MLATokenToKVPool,
           **{n: type(n, (), {}) for n in OTHER_POOLS},  # (later releases: no pool here is one)
           "alloc_mmap": _alloc_mmap,  # (0.5.13)
           "_is_npu": False, "_is_xpu": False, "_is_cuda": False, "_is_hip": False,  # (0.5.2 on; 0.5.6: no
           "SUPPORT_PIN_MEMORY": False,  # JIT copy kernel)
           **{n: _no_copy for n in set(re.findall(r"\b(transfer_kv_\w+)", text))}}
    import ast

    for node in ast.parse(text).body:  # (0.5.14 on: what it imports from pool_host/, and
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(  # its own
                f"{MEM}.pool_host"):  # constants)
            src = loaded.get(node.module)
            env.update({a.asname or a.name: getattr(src, a.name) for a in node.names})
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.lstrip("_").isupper():
            try:
                env[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    sglang.real_functions(mod, loaded, rel, names, env)

    mod.__dict__.setdefault("defaultdict", __import__("collections").defaultdict)
    _loader.exec_definitions(loaded.root / rel, mod.__dict__, POOL_TABLES)  # (its own tables)


def _no_copy(*_a, **_k) -> None:
    """sgl_kernel's KV copy kernels (``transfer_kv_*``, 0.5.2 on: the copies run on the
    scheduler's thread, on the controller's streams): the copy is kvcheck's ghost."""


def _stub_schedule_batch(mod: types.ModuleType, _: Loaded) -> None:
    mod.global_server_args_dict = {}


def _stub_kv_events(mod: types.ModuleType, loaded: Loaded) -> None:
    """KV cache events are off (``enable_kv_cache_events`` False): the event classes raise
    if built; the storage media they name (0.5.9: ``MEDIUM_*``, 0.5.14: ``StorageMedium``)
    are the release's own."""
    import ast
    import enum

    def off(*_a, **_k):
        raise NotImplementedError("kvcheck stand-in: KV cache events are off")

    for name in ("AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent"):
        setattr(mod, name, off)

    def attr(name: str):  # (0.5.18 on: more event classes, BlockStoredWithMetadata & co.)
        if name.startswith("__"):
            raise AttributeError(name)
        return off

    mod.__getattr__ = attr
    rel = "sglang/srt/disaggregation/kv_events.py"
    text = (loaded.root / rel).read_text() if (loaded.root / rel).is_file() else ""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.startswith("MEDIUM_"):
            setattr(mod, node.targets[0].id, ast.literal_eval(node.value))
    if "\nclass StorageMedium(" in text:
        sglang.real_functions(mod, loaded, rel, ["StorageMedium"], {"enum": enum})


def _stub_distributed(mod: types.ModuleType, _: Loaded) -> None:
    """One worker: tensor- and pipeline-parallel rank 0 of 1 (the storage tier's key
    suffix, its backend config; a storage backend is never built here)."""
    mod.get_tensor_model_parallel_rank = mod.get_pipeline_model_parallel_rank = lambda: 0
    mod.get_tensor_model_parallel_world_size = lambda: 1
    mod.get_pipeline_model_parallel_world_size = lambda: 1  # (0.5.13 on)


def _stub_off(mod: types.ModuleType, _: Loaded) -> None:
    """A module of what the storage tier builds (its backends: file, Mooncake, NIXL, 3FS):
    every name it is asked for is a class that raises if built, that no object here is an
    instance of (``hicache_storage_backend`` is None: no backend is built)."""
    where = mod.__kvcheck_real_name__

    def off(name: str):
        def refuse(*_a, **_k):
            raise NotImplementedError(f"kvcheck stand-in: {where}.{name} (the storage tier "
                                      f"is off)")

        return type(name, (), {"__init__": refuse, "__call__": refuse})

    def attr(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return off(name)

    mod.__getattr__ = attr


STORAGE_BACKEND = "kvcheck-dict"  # the stand-in backend's name (make_storage)


def _stub_storage(mod: types.ModuleType, loaded: Loaded) -> None:
    """``mem_cache.storage`` (the backends' package) with the storage tier on
    (``make_storage``): its ``StorageBackendFactory`` builds only the stand-in backend
    ``STORAGE_BACKEND`` (``_dict_backend``); every other name it is asked for is a class
    that raises if built (as ``_stub_off``)."""
    _stub_off(mod, loaded)

    class StorageBackendFactory:
        @staticmethod
        def create_backend(backend_name, storage_config, mem_pool_host, **_kw):
            if backend_name != STORAGE_BACKEND:
                raise ValueError(f"kvcheck stand-in: no storage backend {backend_name!r}")
            return _dict_backend(loaded)(storage_config)

    mod.StorageBackendFactory = StorageBackendFactory


def _dict_backend(loaded: Loaded):
    """The stand-in storage backend: a subclass of the release's own ``HiCacheStorage``
    holding pages in a dict (hash -> page). What it answers is the driver's: it holds
    every page a prefetch asks about (``batch_exists``: all of them), and ``batch_get``
    returns the first ``limit`` pages and None after (``limit``: the completion's
    ``filled``, set by the adapter just before the prefetch thread's step; a page stored
    by a backup comes back with its bytes, any other as a zero page). It cannot change what
    the cache decides: the controller and the tree read only how many pages came back
    (``completed_tokens``) and the hashes, never the bytes."""
    base = loaded.get(f"{MEM}.hicache_storage").HiCacheStorage
    import torch

    class _DictStorage(base):
        def __init__(self, config=None):
            self.pages: dict = {}
            self.limit = None  # (None: every page comes back)
            self.mem_pool_host = None

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host

        def get(self, key, target_location=None, target_sizes=None):
            return self.pages.get(key, target_location)

        def batch_get(self, keys, target_locations=None, target_sizes=None):
            n = len(keys) if self.limit is None else max(0, min(self.limit, len(keys)))
            self.limit = None if self.limit is None else self.limit - n
            dst = list(target_locations or [None] * len(keys))
            got = [self.pages.get(k, dst[i]) for i, k in enumerate(keys[:n])]
            return [x if x is not None else torch.zeros(1) for x in got] + [None] * (
                len(keys) - n)

        def set(self, key, value=None, target_location=None, target_sizes=None):
            self.pages[key] = value
            return True

        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
            for i, k in enumerate(keys):
                self.pages[k] = None if values is None else values[i]
            return True

        def exists(self, key) -> bool:
            return True

        def batch_exists(self, keys, extra_info=None) -> int:
            return len(keys)

        def clear(self) -> None:
            self.pages.clear()

        def get_stats(self):
            return None

    return _DictStorage


def _stub_runtime_context(mod: types.ModuleType, _: Loaded) -> None:
    """``sglang.srt.runtime_context`` (0.5.16 on): the parallel layout the controller reads
    (rank 0 of 1 in every group); the server's arguments through it only for metrics (off):
    a stand-in that raises."""
    mod.get_parallel = lambda: types.SimpleNamespace(
        tp_rank=0, tp_size=1, attn_tp_rank=0, attn_tp_size=1, pp_rank=0, pp_size=1,
        attn_cp_rank=0, attn_cp_size=1, attn_dp_rank=0, attn_dp_size=1)

    def get_server_args():
        raise NotImplementedError("kvcheck stand-in: no runtime server arguments")

    mod.get_server_args = get_server_args
    mod.current = None  # (0.5.17 on: the server's arguments the cache is built with, set
    # by the adapter before it builds one: what get_memory / get_serving /
    # get_observability give, read in HiRadixCache.__init__ only)
    mod.get_memory = mod.get_serving = mod.get_observability = lambda: mod.current


def _stub_dp_attention(mod: types.ModuleType, _: Loaded) -> None:
    """No data-parallel attention: attention rank 0 of 1."""
    mod.get_attention_tp_rank = mod.get_attention_dp_rank = lambda: 0
    mod.get_attention_tp_size = lambda: 1
    mod.is_dp_attention_enabled = lambda: False


def _stub_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    """sglang's own utility functions (``sglang._stub_utils``), CUDA's device module the
    stand-in one (``CudaStandIn``), on no NPU or XPU."""
    import ast

    sglang.STUBS["sglang.srt.utils"](mod, loaded)
    mod.get_device_module = lambda: CudaStandIn
    mod.is_npu = mod.is_xpu = mod.is_cuda = mod.is_hip = mod.is_mps = lambda: False

    def bind_to_closest_numa_node_cuda():  # (0.5.8 on: off by disable_hicache_numa_detect)
        raise NotImplementedError("kvcheck stand-in: no NUMA binding here")

    mod.bind_to_closest_numa_node_cuda = bind_to_closest_numa_node_cuda
    rel = next(r for r in ("sglang/srt/utils/common.py", "sglang/srt/utils.py")
               if (loaded.root / r).is_file())
    for node in ast.parse((loaded.root / rel).read_text()).body:  # its constants (0.5.3.post3:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(  # the
                node.targets[0], ast.Name) and node.targets[0].id.isupper():  # radix cache's
            try:  # deterministic-inference split size)
                setattr(mod, node.targets[0].id, ast.literal_eval(node.value))
            except ValueError:
                pass


MEM_UTILS = ("convert_to_bigram_key", "compute_node_hash_values", "split_node_hash_value",
             "get_hash_str", "hash_str_to_int64", "compute_node_event_hash_values",
             "get_eviction_strategy",  # (0.5.13 on: the eviction policy's factory)
             "storage_namespace_seed",  # (0.5.20: the storage tier's key hash, which the
             "get_storage_hash_str")  # controller imports; called only with storage on)
MEM_UTILS_TABLES = ("_EVICTION_POLICY_FACTORIES",)


def _native_hash(token_ids, prior_digest: bytes | None, page_size: int | None = None):
    """``cpp_utils.native_hash.get_native_hash`` (0.5.15 on: a C++ extension compiled at run
    time, not built here): the SHA-256 chain 0.5.14's own ``get_hash_str`` computes in
    Python (each token as 4 little-endian bytes after the prior digest), one hex digest,
    or with ``page_size`` one per page, each chained on the one before. Only equality and
    the chaining reach a decision (storage keys; the stand-in backend lists every page)."""
    import hashlib

    raw = getattr(token_ids, "token_ids", token_ids)
    toks = list(raw[: len(token_ids)])

    def digest(chunk, prior):
        h = hashlib.sha256()
        if prior:
            h.update(prior)
        for t in chunk:
            for e in (t if isinstance(t, tuple) else (t,)):
                h.update(int(e).to_bytes(4, byteorder="little", signed=False))
        return h.digest()

    if page_size is None:
        return digest(toks, prior_digest).hex()
    out, prior = [], prior_digest
    for i in range(0, len(toks), page_size):
        prior = digest(toks[i: i + page_size], prior)
        out.append(prior.hex())
    return out


def _stub_mem_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    """``mem_cache/utils.py`` (0.5.6 on): of it, the radix cache's key and hash helpers,
    compiled from the installed file (its Triton kernels for MLA buffers are not)."""
    import hashlib
    import typing

    import torch

    rel = "sglang/srt/mem_cache/utils.py"
    text = (loaded.root / rel).read_text()
    names = [n for n in MEM_UTILS if f"\ndef {n}(" in text]
    policies = loaded.get(f"{MEM}.evict_policy") if "evict_policy import" in text else None
    sglang.real_functions(mod, loaded, rel, names, {
        "torch": torch, "hashlib": hashlib, "get_native_hash": _native_hash,  # (0.5.15 on)
        **{n: getattr(typing, n) for n in ("Any", "Callable", "List", "Optional", "Tuple")},
        **{n: v for n, v in vars(policies or types.ModuleType("none")).items()
           if n.endswith("Strategy")}})
    _loader.exec_definitions(loaded.root / rel, mod.__dict__, MEM_UTILS_TABLES)  # its table


STUBS = {f"{MEM}.memory_pool": stub_memory_pool, f"{MEM}.memory_pool_host": stub_memory_pool,
         "sglang.srt.managers.schedule_batch": _stub_schedule_batch,
         "sglang.srt.disaggregation.kv_events": _stub_kv_events,
         "sglang.srt.distributed": _stub_distributed, "sglang.srt.utils": _stub_utils,
         "sglang.srt.layers.dp_attention": _stub_dp_attention,
         "sglang.srt.metrics.collector": _stub_off,  # (metrics: off, 0.5.2 on)
         "sglang.srt.observability.metrics_collector": _stub_off,  # (0.5.10 on)
         f"{MEM}.utils": _stub_mem_utils,
         "sglang.srt.debug_utils.cuda_coredump": _stub_off,  # (environ.py imports it)
         "sglang.srt.distributed.parallel_state": _stub_off,  # (0.5.19: world groups, read
         # only when torch.distributed is initialized; it is not here)
         "psutil": _stub_psutil, f"{MEM}.mmap_allocator": _stub_mmap,
         f"{MEM}.storage.mmap": _stub_mmap,  # (0.5.17 on: where alloc_mmap lives)
         "sglang.srt.runtime_context": _stub_runtime_context,
         f"{MEM}.pool_host.mha": stub_memory_pool,  # (0.5.16 on: the MHA host pool there)
         f"{MEM}.pool_host.mla": _stub_off,  # (no pool here is an MLA one)
         **{f"{MEM}.{name}": _stub_off for name in (  # the storage backends (0.4.10 on)
             "mooncake_store.mooncake_store", "nixl.hicache_nixl", "storage",
             "storage.hf3fs.storage_hf3fs", "storage.mooncake_store.mooncake_store",
             "storage.nixl.hicache_nixl",
             # the hybrid (NSA, Mamba) pools' controller and assembler (0.5.11 on)
             "hybrid_cache.hybrid_cache_controller", "hybrid_cache.hybrid_pool_assembler")},
         f"{MEM}.storage": _stub_storage,  # (the backends' factory: make_storage's backend)
         f"{MEM}.deepseek_v4_memory_pool": _stub_off}  # (0.5.13 on: the storage config's
# isinstance test; no pool here is one)


class _DevicePool:
    """Stand-in for the device KV buffers (``MHATokenToKVPool``): see the module doc."""

    def __init__(self, size: int):
        import torch

        self.size = size
        self.store_dtype = torch.float16
        self.dtype = torch.float16
        self.head_num = self.head_dim = self.v_head_dim = self.layer_num = 1  # (v: 0.5.14)
        self.layer_shard_enabled = False  # (0.5.18: KVCache's class default)
        self.start_layer, self.end_layer = 0, 1  # (pipeline parallelism: one stage)
        self.layer_transfer_counter = None
        self.device = "cpu"  # (0.4.10.post1's host pool puts its layer pointers there)
        # (0.5.2 on: the copies name the layers' buffers; the kernels are stood in)
        self.k_buffer = [torch.zeros((size + 1, 1, 1), dtype=torch.float16)]
        self.v_buffer = [torch.zeros((size + 1, 1, 1), dtype=torch.float16)]
        self.k_data_ptrs = torch.tensor([self.k_buffer[0].data_ptr()], dtype=torch.uint64)
        self.v_data_ptrs = torch.tensor([self.v_buffer[0].data_ptr()], dtype=torch.uint64)
        # (0.5.18: the copies name the layers' pointers too; never dereferenced here)

    def register_layer_transfer_counter(self, counter) -> None:
        self.layer_transfer_counter = counter


class _Event:
    """A CUDA event (0.5.2 on: a copy issued on the controller's stream records one when it
    ends; ``writing_check`` / ``loading_check`` ack what ``query()`` says ended). Here it
    ends when the driver completes its job (``complete``), or when the release waits for
    it (``synchronize``: the write_back eviction); never recorded, it has ended, as CUDA's."""

    def __init__(self, *_a, **_k):
        self.done = True

    def record(self, *_a) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def wait(self, *_a) -> None:
        pass


class _Ring(list):
    """The load-event ring with ``RING`` more slots (see the module doc), each slot's
    ``LayerLoadingEvent`` built when the ring first reaches it (the release indexes its ring
    only: ``events[i]``), not 4096 at every build (most of a target's build time)."""

    def __init__(self, head, make, num_layers: int, total: int):
        super().__init__(head)
        self.make, self.num_layers, self.total = make, num_layers, total

    def __getitem__(self, i):
        if isinstance(i, int) and len(self) <= i < self.total:
            self.extend(self.make(self.num_layers) for _ in range(i + 1 - len(self)))
        return super().__getitem__(i)


class _Inert:
    """A CUDA stream or a thread that is never run (the driver delivers completions)."""

    def __init__(self, *_a, **_k):
        pass

    def start(self) -> None:
        pass

    def join(self, *_a) -> None:
        pass

    def wait_event(self, *_a) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CudaStandIn:
    """``torch.cuda`` (and 0.5.5's ``device_module``) as the controller sees it: inert
    streams, events that end when the driver says (``_Event``)."""

    Stream = _Inert
    Event = _Event

    @staticmethod
    def current_stream():
        return _Inert()

    @staticmethod
    def stream(_s):
        import contextlib

        return contextlib.nullcontext()


def patch_modules(mods: Loaded) -> None:
    """The stand-ins that live in the release's own modules' globals (see the module doc):
    the controller's streams and threads, and hiradix_cache's tensor-parallel group."""
    import threading

    import torch

    ctl = mods[CONTROLLER]
    if getattr(ctl, "__kvcheck_patched__", False):
        return

    class _CtlTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    class _Threading(types.ModuleType):
        Thread = _Inert

        def __getattr__(self, name):
            return getattr(threading, name)

    ctl_torch = _CtlTorch("torch")
    ctl_torch.cuda = CudaStandIn
    ctl.torch = ctl_torch
    if hasattr(ctl, "device_module"):  # (0.5.5 on: get_device_module(), read at import)
        ctl.device_module = CudaStandIn
    ctl.threading = _Threading("threading")

    class _OneRank(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    one = _OneRank("torch")
    one.distributed = types.SimpleNamespace(get_world_size=lambda group=None: 1,
                                            all_reduce=lambda *a, **k: None,
                                            ReduceOp=torch.distributed.ReduceOp,
                                            ProcessGroup=object)
    mods[HIRADIX].torch = one
    ctl_torch.distributed = one.distributed  # (the storage tier's controller: one worker)
    import time

    class _Time(types.ModuleType):  # (0.4.5's write_back eviction sleeps between its
        def __getattr__(self, name):  # checks for the write thread's acks: _SyncAcks)
            return getattr(time, name)

        @staticmethod
        def sleep(_seconds) -> None:
            pass

    mods[HIRADIX].time = _Time("time")
    for name, module in list(mods.modules.items()):  # (0.5.14 on: the host pool's files,
        if name.startswith(f"{MEM}.pool_host"):  # real, allocate through torch: unpinned)
            module.torch = _torch_unpinned()
    ctl.__kvcheck_patched__ = True


class _OneShot:
    """A storage thread's queue for one step (``make_storage``): it hands out the items it
    was given and, with the last, sets the controller's ``stop_event``, so the release's
    own thread loop (``prefetch_thread_func``, ``prefetch_io_aux_func``,
    ``backup_thread_func``: ``while not stop_event.is_set(): queue.get(...)``) runs
    exactly those items and returns (the driver delivers what the thread would do)."""

    def __init__(self, items, stop):
        self.items, self.stop = list(items), stop

    def get(self, *_a, **_k):
        import queue

        if not self.items:
            self.stop.set()
            raise queue.Empty
        item = self.items.pop(0)
        if not self.items:
            self.stop.set()
        return item

    def put(self, item, *_a, **_k) -> None:
        self.items.append(item)

    def empty(self) -> bool:
        return not self.items

    def qsize(self) -> int:
        return len(self.items)


class _SyncAcks:
    """``ack_write_queue`` under the write_back policy: a device eviction writes the nodes it
    evicts back and waits for the write thread's acks (0.4.5: ``writing_check`` then a
    sleep, in a loop; 0.4.6 on: ``ack_write_queue.get()``); read, the queue first lets the
    stood-in write thread take every queued write (``complete_io``, the ack)."""

    def __init__(self, target: SglangHiCacheTarget):
        import queue

        self.target, self.q = target, queue.Queue()

    def _drain(self) -> None:
        ctl = self.target.ctl
        while ctl.write_queue.queue:
            op = ctl.write_queue.get()
            self.target.host.complete_io(op.host_indices)
            for node_id in op.node_ids:
                if node_id != 0:
                    self.q.put(node_id)

    def qsize(self) -> int:
        self._drain()
        return self.q.qsize()

    def empty(self) -> bool:
        self._drain()
        return self.q.empty()

    def get(self, *args, **kwargs):
        self._drain()
        return self.q.get_nowait()

    def get_nowait(self):
        return self.get()

    def put(self, item, *args, **kwargs) -> None:
        self.q.put(item)


def load(version: str | None = None) -> Loaded:
    """HiRadixCache and what it imports, at ``version`` (default 0.4.5)."""
    from . import _loader

    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    files = FILES + tuple(f for f in OPTIONAL if (root / f"{f.replace('.', '/')}.py").is_file())
    if (root / "sglang/srt/mem_cache/pool_host/__init__.py").is_file():  # (0.5.14 on)
        files += (f"{MEM}.pool_host",)
    if sglang.single_file(root):  # 0.4.8 on: mem_cache/allocator.py
        loaded = sglang.load_dist(dist, (*files, sglang.ALLOCATOR), {**sglang.STUBS, **STUBS},
                                  (sglang.ALLOCATOR, HIRADIX))
    elif (root / "sglang/srt/mem_cache/allocator").is_dir():  # 0.5.13 on: the package
        loaded = sglang.load_dist(dist, (*files, *sglang.FILES), {**sglang.STUBS, **STUBS},
                                  (sglang.ALLOCATOR, HIRADIX))
    else:
        loaded = _loader.load(dist, files, STUBS, (HIRADIX,))
    patch_modules(loaded)
    return loaded


_SERVER_DEFAULTS: dict[str, dict] = {}


def _literal_fields(cls) -> dict:
    """The fields of a class body (``ast.ClassDef``) with a literal default."""
    import ast

    found = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            try:
                found[node.target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def _server_defaults(root) -> dict:
    """Every ``ServerArgs`` field of the release in ``root`` with a literal default, read
    once from its ``server_args.py`` and (0.5.20) the namespace classes it imports from
    ``arg_groups/fields/`` and assembles into ``ServerArgs`` (a field of its own winning,
    as its ``ServerArgs.__annotations__`` merge has it)."""
    import ast

    path = root / "sglang/srt/server_args.py"
    found = _SERVER_DEFAULTS.get(str(path))
    if found is None:
        body = ast.parse(path.read_text()).body
        found = {}
        for node in body:  # (0.5.20 on: the fields live in one class per namespace)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "sglang.srt.arg_groups.fields."):
                names = {a.name for a in node.names}
                rel = root / (node.module.replace(".", "/") + ".py")
                for cls in ast.parse(rel.read_text()).body:
                    if isinstance(cls, ast.ClassDef) and cls.name in names:
                        found.update(_literal_fields(cls))
        found.update(_literal_fields(next(n for n in body if isinstance(n, ast.ClassDef)
                                          and n.name == "ServerArgs")))
        _SERVER_DEFAULTS[str(path)] = found
    return found


class ReqStandIn:
    """The fields of ``Req`` the radix cache reads."""

    def __init__(self, tokens: Sequence[int], row: int | None):
        self.origin_input_ids = list(tokens)
        self.output_ids: list = []
        self.fill_ids = list(tokens)
        self.req_pool_idx = row
        self.prefix_indices = None
        self.last_node = None
        self.last_node_global = None
        self.extra_key = None  # (0.5.3 on: no LoRA, no cache salt)
        self.cache_salt = None  # (0.5.18 on: the salt apart from extra_key)
        self.kv_committed_len = len(tokens)  # (0.5.5.post3 on: the tokens with a KV slot)
        self.kv_committed_freed = False
        self.is_chunked = 0  # (0.5.9 on: what ReqToTokenPool.alloc reads)
        self.kv_allocated_len = len(tokens)  # (0.5.19 on: no speculation: the committed)
        self.last_matched_prefix_len = 0  # (0.5.3 on: set by cache_unfinished_req)

    @staticmethod
    def is_dllm() -> bool:  # (0.5.9 on: no diffusion language model)
        return False

    def get_fill_ids(self) -> list:  # (0.5.13 on: the tokens to fill, as fill_ids before)
        return self.fill_ids

    def pop_committed_kv_cache(self) -> int:
        """``Req.pop_committed_kv_cache`` (0.5.5.post3 on) without speculative decoding: the
        committed length, once."""
        assert not self.kv_committed_freed, "Committed KV cache already freed"
        self.kv_committed_freed = True
        return self.kv_committed_len

    @property
    def kv(self) -> ReqStandIn:  # (0.5.19 on: the request's KV fields in a ReqKvInfo: here the
        return self  # same fields, on the request itself)

    @property
    def holds_kv(self) -> bool:  # (0.5.19 on: ReqKvInfo.holds_kv)
        return self.req_pool_idx is not None

    holds_mamba = False  # (no Mamba state)
    mamba_pool_idx = None


class SglangHiCacheTarget:
    """A tiers target over SGLang's HiRadixCache (see the module doc)."""

    capabilities = frozenset({"allocate", "append", "free", "store", "load", "complete",
                              "evict"})
    failures = ()  # the controller has no failure path: every transfer completes

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 version: str | None = None, write_policy: str = "write_through_selective",
                 storage: bool = False):
        import torch

        if block_size != 1:
            raise MisuseError("sglang-hicache drives HiRadixCache at page size 1 (token-level "
                              "keys; 0.4.4.post2 .. 0.4.5 know no other): block_size must be 1")
        if num_blocks < 1 or host_blocks < num_blocks:
            raise MisuseError(f"HiCache's host pool is at least the device pool "
                              f"(hicache_ratio >= 1): host_blocks {host_blocks} < "
                              f"num_blocks {num_blocks}")
        self.torch = torch
        self.nb, self.nh = num_blocks, host_blocks
        self.storage = storage
        mods = self.mods = self._load(version)
        self.version = mods.dist.version
        if storage and not hasattr(mods[CONTROLLER].HiCacheController, "prefetch_io_aux_func"):
            raise MisuseError(f"sglang-hicache-storage: SGLang {self.version}'s controller has "
                              f"no storage prefetch (prefetch_io_aux_func, 0.5.x); "
                              f"0.5.3 .. 0.5.18 are driven")
        ctl_text = ((mods.root / "sglang/srt/managers/cache_controller.py").read_text()
                    if storage else "")
        tree_file = mods.root / "sglang/srt/mem_cache/hiradix_cache.py"
        if storage and "ack_prefetch_queue" in ctl_text:
            raise MisuseError(f"sglang-hicache-storage: SGLang {self.version}'s prefetch "
                              f"reports its pages through the controller's "
                              f"ack_prefetch_queue (0.5.19 on), which no stand-in here "
                              f"feeds, and no cache factory of the release builds "
                              f"HiRadixCache; 0.5.3 .. 0.5.18 are driven")
        # 0.5.16 on: a prefetch's host pages allocated by the scheduler's drain once the
        # storage hit is known (_drain_and_alloc_storage_hit; see prefetch)
        self._lazy_hit = storage and "_drain_and_alloc_storage_hit" in tree_file.read_text()
        if storage and "StorageBackendFactory" not in ctl_text:
            raise MisuseError(f"sglang-hicache-storage: SGLang {self.version}'s controller "
                              f"builds its storage backends by name (no "
                              f"StorageBackendFactory, before 0.5.3), no stand-in backend "
                              f"here; 0.5.3 .. 0.5.18 are driven")
        pool = mods[f"{MEM}.memory_pool"]
        hiradix = mods[HIRADIX]
        allocators = pool if hasattr(pool, "TokenToKVPoolAllocator") else mods[sglang.ALLOCATOR]
        cls = allocators.TokenToKVPoolAllocator
        extra = (False,) if takes(cls.__init__, "need_sort") else ()  # 0.5.1 on (the
        self.alloc = cls(num_blocks, torch.float16, "cpu", _DevicePool(num_blocks), *extra)
        # scheduler's need_sort is for disaggregated prefill / decode only: off)
        context = 8 * num_blocks + 16
        self.rows = pool.ReqToTokenPool(2 * num_blocks + 2, context, "cpu", False)
        self.tree = self._build(hiradix, host_blocks, write_policy)
        if int(self._host_of(self.tree).size) > host_blocks:  # 0.5.5.post3 on: the
            extra = int(self._host_of(self.tree).size) - host_blocks  # pool aligned
            self.tree = self._build(hiradix, host_blocks - extra, write_policy)  # up a page
        self.tree.write_through_threshold = float("inf")  # store(seq) starts backups
        # 0.5.2 on: copies issued at once on the controller's streams, acked by their events
        self._events = isinstance(self.tree.cache_controller.ack_write_queue, list)
        counter = getattr(self.tree.cache_controller, "layer_done_counter", None)
        if self._events and hasattr(counter, "events"):  # a ring of one load per batch in
            counter.events = _Ring(counter.events, type(counter.events[0]),  # flight: the
                                   counter.num_layers, len(counter.events) + RING)  # driver
            counter.num_counters = counter.events.total  # may keep a load pending long
        if storage:
            self.capabilities = self.capabilities | {"prefetch"}
            import logging  # (the controller warns of every page a prefetch missed: the
            logging.getLogger(mods[CONTROLLER].__name__).setLevel(logging.ERROR)  # driver's)
        if write_policy == "write_back":  # (0.4.5 takes no policy argument: its attribute)
            self.tree.cache_controller.write_policy = "write_back"
            if not self._events:  # (0.5.2 on: the eviction synchronizes the write's event)
                self.tree.cache_controller.ack_write_queue = _SyncAcks(self)
            self.capabilities = self.capabilities - {"store"}  # (backups only on eviction)
        self.tree.load_back_threshold = 1
        self.ctl = self.tree.cache_controller
        self._radix_key = getattr(mods[RADIX], "RadixKey", None)
        self.host = self._host_of(self.tree)
        if int(self.host.size) != host_blocks:
            raise MisuseError(f"the host pool has {self.host.size} slots, not {host_blocks}")
        self.reqs: dict[int, ReqStandIn] = {}
        self.jobs: dict[tuple, dict] = {}  # ("w" | "l", node id) -> {op, seq, kind}
        self._sampled = itertools.count(1 << 20)
        self.Dev = _device_tensor_class()
        self._epoch = 0  # bumped by every operation (refcount's memo)
        self._memo: tuple = (None, [])
        self._kept: tuple = (None, {})  # (epoch, _protected's nodes)

    Req = ReqStandIn  # (the request's fields; sglang_unified's has more)

    def _load(self, version: str | None) -> Loaded:
        return load(version)

    @staticmethod
    def _host_of(tree):
        """The tree's host pool (sglang_unified: its FULL component's, in a group)."""
        return tree.token_to_kv_pool_host

    def _build(self, hiradix, host_slots: int, write_policy: str):
        """The release's HiRadixCache over the device pool, its host pool of ``host_slots``
        (``hicache_ratio`` x the device's) built by the release itself."""
        ratio = host_slots / self.nb
        if int(self.nb * ratio) != host_slots:
            raise MisuseError(f"host_blocks {host_slots} is no ratio of {self.nb}")
        init = hiradix.HiRadixCache.__init__
        if takes(init, "params"):  # 0.5.6 on: CacheInitParams and the server's arguments
            args = self._server_args(
                hicache_ratio=ratio, hicache_size=0, hicache_write_policy=write_policy,
                hicache_io_backend="direct", hicache_mem_layout="layer_first",
                hicache_storage_backend=STORAGE_BACKEND if self.storage else None,
                disable_hicache_numa_detect=True, **self._storage_args("server"))
            if not hasattr(args, "extra_metric_labels"):
                args.extra_metric_labels = None
            context = self.mods.modules.get("sglang.srt.runtime_context")
            if context is not None:  # (0.5.17 on: read through the runtime context)
                context.current = args
            return hiradix.HiRadixCache(self._params(), args)
        kw: dict[str, Any] = {"req_to_token_pool": self.rows,
                              "token_to_kv_pool_allocator": self.alloc,
                              "tp_cache_group": None, "page_size": 1}
        if takes(init, "hicache_ratio"):
            kw["hicache_ratio"] = ratio
        if takes(init, "hicache_size"):  # 0.4.6 on: 0 = by ratio
            kw["hicache_size"] = 0
        if takes(init, "hicache_write_policy"):
            kw["hicache_write_policy"] = write_policy
        if takes(init, "hicache_io_backend"):  # 0.4.9.post1 on
            kw["hicache_io_backend"] = "direct"  # (torch copies; never run: stood in)
        if takes(init, "hicache_mem_layout"):  # 0.4.10.post1 on
            kw["hicache_mem_layout"] = "layer_first"  # (what "direct" asks for)
        if takes(init, "enable_metrics"):  # 0.5.2 on
            kw["enable_metrics"] = False  # (its default: no metrics collector built)
        if takes(init, "hicache_storage_backend"):  # 0.4.9.post3 on
            kw["hicache_storage_backend"] = None  # (the storage tier off: its default)
            if self.storage:  # (make_storage: the stand-in backend, its prefetch settings)
                kw.update(hicache_storage_backend=STORAGE_BACKEND, **self._storage_args("kw"))
        return hiradix.HiRadixCache(**kw)

    def _storage_args(self, how: str) -> dict:
        """The storage tier's settings (``make_storage``): the stand-in backend, a prefetch
        threshold of one page (page size 1: a prompt of a few tokens prefetches), the
        best_effort prefetch policy (the default: a prefetch ends when its request is
        scheduled, with what arrived)."""
        if not self.storage:
            return {}
        extra = '{"prefetch_threshold": 1}'
        if how == "kw":
            return {"storage_backend_extra_config": extra,
                    "hicache_storage_prefetch_policy": "best_effort"}
        return {"hicache_storage_backend_extra_config": extra,
                "hicache_storage_prefetch_policy": "best_effort"}

    def _params(self):
        """``CacheInitParams`` (0.5.6 on), its fields as the scheduler fills them for a
        radix cache at page size 1, the rest at their defaults (no EAGLE, metrics and KV
        events off, LRU)."""
        cls = self.mods[f"{MEM}.cache_init_params"].CacheInitParams
        import dataclasses

        fields = {f.name for f in dataclasses.fields(cls)}
        given = {"disable": False, "req_to_token_pool": self.rows,
                 "token_to_kv_pool_allocator": self.alloc, "page_size": 1,
                 "tp_cache_group": None, "enable_metrics": False,
                 "enable_kv_cache_events": False}
        return cls(**{k: v for k, v in given.items() if k in fields})

    def _server_args(self, **given):
        """The server's arguments (``ServerArgs``, 0.5.6 on) as HiRadixCache reads them:
        the release's own defaults, read from its ``server_args.py`` (every field with a
        literal default), and the ones given."""
        return types.SimpleNamespace(**{**_server_defaults(self.mods.root), **given})

    # -- helpers ---------------------------------------------------------------------
    def _key(self, tokens: list):
        """A radix key: the token list, or (0.5.3 on) ``RadixKey(tokens, extra_key=None)``."""
        return tokens if self._radix_key is None else self._radix_key(tokens, None)

    def _match(self, tokens: list):
        """``match_prefix`` of the tree for ``tokens``, host-only nodes included (before
        0.5: ``include_evicted=True``; 0.5.8 on: a ``MatchPrefixParams``)."""
        match = self.tree.match_prefix
        if takes(type(self.tree).match_prefix, "params"):
            params = self.mods[f"{MEM}.base_prefix_cache"].MatchPrefixParams
            return match(params(key=self._key(tokens)))
        return match(key=self._key(tokens), include_evicted=True)

    def _t(self, values, dtype=None):
        return self.torch.tensor(list(values), dtype=dtype or self.torch.int64)

    def _row(self, req: ReqStandIn, n: int | None = None):
        n = len(req.fill_ids) if n is None else n
        return self.rows.req_to_token[req.req_pool_idx, :n].to(self.torch.int64)

    def _live(self, seq: int) -> ReqStandIn:
        req = self.reqs.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    def _reclaimable(self) -> int:
        return int(self.alloc.available_size()) + int(self.tree.evictable_size())

    def _alloc_token_slots(self, n: int):
        """``ScheduleBatch.alloc_token_slots``: evict when the free list is short."""
        if self.alloc.available_size() < n:
            if takes(type(self.tree).evict, "params"):  # 0.5.9 on: EvictParams
                self.tree.evict(self.mods[f"{MEM}.base_prefix_cache"].EvictParams(num_tokens=n))
            else:
                self.tree.evict(n)
        out = self.alloc.alloc(n)
        if out is None:
            raise RuntimeError(f"out of memory allocating {n} tokens after eviction")
        return out

    def _find_op(self, queue, node_id: int):
        for op in list(queue if self._events else queue.queue):
            if node_id in op.node_ids:
                return op
        return None

    def _started(self, queue, node_id: int, load: bool = False, node=None) -> dict:
        """The job's record: its operation (the controller's queue entry: a
        ``CacheOperation``), and from 0.5.2 the ack its copy's issue queued with its event.
        A write is issued as ``write`` queues it (its op: the node's values); a load once
        the batch is formed: the scheduler's ``ready_to_load_host_cache()``."""
        if not self._events:
            return {"op": self._find_op(queue, node_id)}
        if load:
            op = self._find_op(queue, node_id)
            self.tree.ready_to_load_host_cache()  # (start_loading: the batch's load)
            acks = self.ctl.ack_load_queue
        else:
            op = types.SimpleNamespace(host_indices=node.host_value.clone(),
                                       device_indices=node.value.clone(),
                                       node_ids=[node_id])
            acks = self.ctl.ack_write_queue
        ack = next(a for a in reversed(acks) if node_id in a.node_ids)
        return {"op": op, "ack": ack}

    # -- operations ------------------------------------------------------------------
    def _admit(self, seq: int, tokens, load_back: bool):
        self._epoch += 1
        if seq in self.reqs:
            raise MisuseError(f"sequence {seq!r} already exists")
        toks = list(tokens)
        if not toks:
            raise MisuseError("a prompt has at least one token")
        n, tree = len(toks), self.tree
        req = self.Req(toks, None)
        by_req = takes(type(self.rows).alloc, "reqs")  # (0.5.9 on: rows given to requests)
        rows = self.rows.alloc([req] if by_req else 1)
        if rows is None:
            raise MisuseError("no req_to_token row left")
        req.req_pool_idx = rows[0]
        found = self._match(toks[: n - 1])
        if hasattr(found, "device_indices"):  # 0.4.8 on: a MatchResult
            value, last, last_global = (found.device_indices, found.last_device_node,
                                        found.last_host_node)
            host_hit = found.host_hit_length
        else:
            value, last, last_global = found
            host_hit = None
        req.prefix_indices = value.to(self.torch.int64).as_subclass(self.Dev)
        req.cache_protected_len = len(value)  # (0.5.6 on: what the tree already holds)
        req.last_node, req.last_node_global = last, last_global
        job = None
        tree.inc_lock_ref(last)  # PrefillAdder._lock_node(req.last_node)
        if n - len(value) > self._reclaimable():  # (its budget check, under that lock)
            tree.dec_lock_ref(last)
            self.rows.free(req if by_req else req.req_pool_idx)
            raise OutOfBlocks(f"{n - len(value)} device slots needed, "
                              f"{self.alloc.available_size()} free, "
                              f"{tree.evictable_size()} evictable")
        try:
            if load_back and last_global is not None and last_global.evicted:
                before = dict(tree.ongoing_load_back)
                if host_hit is None:
                    req.last_node, req.prefix_indices = tree.init_load_back(
                        last_global, req.prefix_indices)
                elif host_hit > 0:  # (0.4.8's PrefillAdder: the loaded indices appended)
                    if takes(type(tree).init_load_back, "params"):  # 0.5.10 on
                        params = self.mods[f"{MEM}.base_prefix_cache"].InitLoadBackParams
                        node = ("best_match_node" if "best_match_node" in getattr(
                            params, "__dataclass_fields__", ()) else "last_host_node")
                        given = {node: getattr(found, "best_match_node", last_global),
                                 "host_hit_length": host_hit}  # (0.5.12: the match's
                        if "req" in getattr(params, "__dataclass_fields__", ()):  # best_match_node;
                            given["req"] = req  # UnifiedRadixCache reads req.last_node)
                        loaded, req.last_node = tree.init_load_back(params(**given))
                    else:
                        loaded, req.last_node = tree.init_load_back(last_global, host_hit)
                    req.prefix_indices = self.torch.cat(
                        [self.torch.Tensor.as_subclass(req.prefix_indices, self.torch.Tensor),
                         loaded]).as_subclass(self.Dev)
                    req.cache_protected_len = len(req.prefix_indices)
                new = [k for k in tree.ongoing_load_back if k not in before]
                if new:
                    job = ("l", new[0])
                    self.jobs[job] = {"seq": seq, "kind": "load",
                                      **self._started(self.ctl.load_queue, new[0], load=True)}
            tree.inc_lock_ref(req.last_node)
        finally:
            tree.dec_lock_ref(last)
        p = len(req.prefix_indices)
        out = self._alloc_token_slots(n - p)
        prefix = self.torch.Tensor.as_subclass(req.prefix_indices, self.torch.Tensor)
        self.rows.write((req.req_pool_idx, slice(0, n)),
                        self.torch.cat((prefix.to(self.torch.int64), out)).to(self.torch.int32))
        req.prefix_indices = prefix.to(self.torch.int64)
        tree.cache_unfinished_req(req)  # after the forward (process_batch_result_prefill)
        self.reqs[seq] = req
        return job

    def allocate(self, seq: int, tokens) -> None:
        """A request admitted with the device prefix it matches (no load-back)."""
        self._admit(seq, tokens, load_back=False)

    def load(self, seq: int, tokens):
        """A request admitted with its host prefix loaded back: the load job, or None."""
        return self._admit(seq, tokens, load_back=True)

    def append(self, seq: int, token) -> tuple[int, int]:
        self._epoch += 1
        req = self._live(seq)
        n = len(req.fill_ids)
        if self._reclaimable() < 1:
            raise OutOfBlocks("SGLang decode needs a slot; none free or evictable")
        out = self._alloc_token_slots(1)
        self.rows.write((req.req_pool_idx, slice(n, n + 1)), out.to(self.torch.int32))
        req.output_ids.append(token)
        req.fill_ids = req.origin_input_ids + req.output_ids
        req.kv_committed_len += 1
        req.kv_allocated_len += 1
        return int(out[0]) - 1, 0

    def free(self, seq: int) -> None:
        self._epoch += 1
        req = self._live(seq)
        req.output_ids.append(next(self._sampled))  # sampled last: no KV slot
        if takes(type(self.tree).cache_finished_req, "kv_len_to_handle"):  # 0.5.16 on: as
            self.tree.cache_finished_req(  # release_kv_cache passes it (no speculation: the
                req, kv_len_to_handle=req.kv_committed_len)  # committed length)
        else:
            self.tree.cache_finished_req(req)
        if req.req_pool_idx is not None and takes(type(self.rows).free, "req"):  # 0.5.9
            self.rows.free(req)  # on: release_kv_cache frees the row after the cache
        del self.reqs[seq]

    def _path(self, node):
        out = []
        while node is not None and node is not self.tree.root_node:
            out.append(node)
            node = node.parent
        return out[::-1]

    def store(self, seq: int):
        self._epoch += 1
        req = self._live(seq)
        for node in self._path(req.last_node):
            if node.host_value is None and not node.evicted:
                if not self.tree.write_backup(node):  # (None before 0.4.9, 0 after)
                    continue  # (no host room for it: its hit count starts again)
                job = ("w", node.id)
                self.jobs[job] = {"seq": seq, "kind": "store",
                                  **self._started(self.ctl.write_queue, node.id, node=node)}
                return job
        return None

    def prefetch(self, seq: int, tokens):
        """The scheduler's ``_prefetch_kvcache`` for a request not yet scheduled
        (``make_storage``): its match (``init_next_round_input``), and when the match ends
        in a backed-up node, ``prefetch_from_storage`` of the tokens past the device and
        host hits: a prefetch job, or None (rate-limited, no host room)."""
        self._epoch += 1
        if not self.storage:
            raise MisuseError("prefetch needs the storage tier (sglang-hicache-storage)")
        toks = list(tokens)
        if not toks:
            raise MisuseError("a prompt has at least one token")
        job = ("p", seq)
        if seq in self.reqs or job in self.jobs:
            raise MisuseError(f"sequence {seq!r} already exists")
        found = self._match(toks[: len(toks) - 1])
        if not found.last_device_node.backuped:
            return None  # (the scheduler's rule: the device prefix must be backed up)
        last_host = found.last_host_node
        matched = len(found.device_indices) + found.host_hit_length
        rid = f"kvcheck-{seq}"
        more = (None,) if takes(type(self.tree).prefetch_from_storage, "prefix_keys") else ()
        self.tree.prefetch_from_storage(rid, last_host, toks[matched:],  # (prefix_keys,
                                        last_host.get_last_hash_value(), *more)  # 0.5.3.post3 on)
        if rid not in self.tree.ongoing_prefetch:
            return None
        op = self._prefetch_op(rid)
        if self._lazy_hit:  # 0.5.16 on: the prefetch thread's storage hit query, then the
            self._hit_and_alloc(op)  # scheduler's next drain allocates the host pages
            if rid not in self.tree.ongoing_prefetch:
                return None  # (revoked: too few hits, or no host room)
        self.jobs[job] = {"seq": seq, "kind": "prefetch", "rid": rid, "op": op}
        return job

    def _prefetch_op(self, rid: str):
        """A pending prefetch's ``PrefetchOperation``, last in its ``ongoing_prefetch``
        entry: (last host node, key, host pages, operation) to 0.5.15, (last host node,
        key, operation) from 0.5.16."""
        return self.tree.ongoing_prefetch[rid][-1]

    def _prefetch_pages(self, rid: str):
        """A pending prefetch's host pages (0.5.16 on: its operation's, allocated by the
        drain)."""
        if self._lazy_hit:
            return self._prefetch_op(rid).host_indices
        return self.tree.ongoing_prefetch[rid][2]

    def _hit_and_alloc(self, op) -> None:
        """0.5.16 .. 0.5.18: ``prefetch_from_storage`` queues the operation with no host
        pages; the prefetch thread's pass (``prefetch_thread_func``: the storage hit query,
        every page a hit, the operation put on ``prefetch_hit_queue``) and then the
        scheduler's ``check_hicache_events`` (``drain_storage_control_queues`` ->
        ``_drain_and_alloc_storage_hit``: the host pages allocated, evicting host nodes
        when short, or the prefetch revoked; the operation put on ``prefetch_buffer``).
        The scheduler calls ``check_hicache_events`` in ``get_next_batch_to_run`` right
        after ``process_input_requests`` (where ``_prefetch_kvcache`` runs): with the
        prefetch thread's query done meanwhile, this is the order of one scheduler
        iteration. The operation is then taken off ``prefetch_buffer`` (the aux thread's
        queue) until the driver completes it (``_prefetched``)."""
        import queue

        ctl = self.ctl
        self._hit_query(op)
        self.tree.check_hicache_events()
        got = list(ctl.prefetch_buffer.queue)
        ctl.prefetch_buffer = queue.Queue()
        if any(o is not op for o in got):  # (each prefetch's operation is taken here)
            raise AssertionError(f"prefetch_buffer held other operations: {got}")

    def _hit_query(self, op) -> None:
        """The prefetch thread's pass over one operation (``prefetch_thread_func``: the
        storage hit query; the stand-in backend holds every page)."""
        ctl = self.ctl
        ctl.prefetch_queue.queue.remove(op)  # (taken off its queue by this thread alone)
        self._stop().set()  # (prefetch_thread_func runs until its queue is empty)
        self._thread_step(ctl.prefetch_thread_func, "prefetch_queue", [op])

    def _stop(self):
        """The storage threads' stop event (0.5.9 on: ``storage_stop_event``, their own)."""
        ctl = self.ctl
        return ctl.storage_stop_event if hasattr(ctl, "storage_stop_event") else ctl.stop_event

    def _thread_step(self, func, attr: str, items) -> None:
        """One step of a storage thread of the release's controller: ``func`` (its own
        loop) over ``items`` on a one-shot queue in place of ``attr`` (``_OneShot``)."""
        ctl, stop = self.ctl, self._stop()
        kept = getattr(ctl, attr)
        setattr(ctl, attr, _OneShot(items, stop))
        try:
            if items:
                func()
        finally:
            setattr(ctl, attr, kept)
            stop.clear()

    def _prefetched(self, rec, filled: int) -> None:
        """The prefetch threads' steps for one operation: ``prefetch_thread_func`` (the
        storage hit query: the stand-in backend holds every page) then
        ``prefetch_io_aux_func`` (``_page_transfer``: ``filled`` pages come back, then the
        aux thread's release of the rest); then the scheduler's
        ``check_prefetch_progress`` (the filled pages inserted, the operation ended)."""
        import queue

        ctl, op = self.ctl, rec["op"]
        if self._lazy_hit:  # 0.5.16 on: the query and the drain ran in prefetch
            got = [op]
        else:
            self._hit_query(op)
            got = list(ctl.prefetch_buffer.queue)
        ctl.storage_backend.limit = filled
        try:
            self._thread_step(ctl.prefetch_io_aux_func, "prefetch_buffer", got)
        finally:
            ctl.storage_backend.limit = None
            ctl.prefetch_buffer = queue.Queue()
        self.tree.check_prefetch_progress(rec["rid"])

    def _storage_events(self) -> None:
        """The backup thread's step for every queued backup (``backup_thread_func``: the
        page set on the stand-in backend, the ack), then the scheduler's
        ``check_hicache_events`` (its ``drain_storage_control_queues``: backups acked, the
        host pages queued for release freed)."""
        ctl = self.ctl
        items = []
        while not ctl.backup_queue.empty():
            items.append(ctl.backup_queue.get_nowait())
        self._thread_step(ctl.backup_thread_func, "backup_queue", items)
        self.tree.check_hicache_events()

    def complete(self, job, ok: bool = True, filled: int | None = None) -> None:
        self._epoch += 1
        rec = self.jobs.pop(job, None)
        if rec is None:
            raise MisuseError(f"no pending job {job!r}")
        if job[0] == "p":
            n = len(self._prefetch_pages(rec["rid"]))
            filled = (n if ok else 0) if filled is None else filled
            if not 0 <= filled <= n:
                raise MisuseError(f"filled {filled} is not in 0..{n}")
            self._prefetched(rec, filled)
            self._storage_events()
            return
        op = rec["op"]
        queue, acks = ((self.ctl.write_queue, self.ctl.ack_write_queue) if job[0] == "w"
                       else (self.ctl.load_queue, self.ctl.ack_load_queue))
        if self._events:  # the copy's stream reaches its event; acks are read in order:
            ack = rec["ack"]  # the copies end in the driver's order (its ack goes first)
            ack.finish_event.done = True
            acks[:] = [ack] + [a for a in acks if a is not ack]
        else:
            queue.queue.remove(op)  # the controller thread takes it off its queue
            heapq.heapify(queue.queue)
            self.host.complete_io(op.host_indices)
            for node_id in op.node_ids:
                if node_id != 0:
                    acks.put(node_id)
        self.tree.writing_check()  # the scheduler's step
        self.tree.loading_check()
        if self.storage:  # (a write's ack queues its backup to the storage tier)
            self._storage_events()

    def evict(self, n: int) -> int:
        self._epoch += 1
        before = int(self.host.available_size())
        self.tree.evict_host(n)
        return int(self.host.available_size()) - before

    # -- the tree --------------------------------------------------------------------
    def _nodes(self):
        """(node, token path from the root to the node's end) for every node but the root."""
        stack = [(c, ()) for c in self.tree.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + tuple(node.key)
            yield node, path
            stack.extend((c, path) for c in node.children.values())

    def _pending_ops(self):
        """The pending copies between the device and the host (prefetches: ``_prefetches``)."""
        return [(job, rec) for job, rec in self.jobs.items()
                if rec["op"] is not None and job[0] != "p"]

    def _prefetches(self):
        """(job, its host pages) of every pending prefetch (``ongoing_prefetch``)."""
        return [(job, [int(x) for x in self._prefetch_pages(rec["rid"]).tolist()])
                for job, rec in self.jobs.items() if job[0] == "p"]

    def _protected(self) -> dict:
        """Nodes whose host copy a protection keeps from host eviction (``protect_host``: a
        pending prefetch's last host node, a backup to storage not yet acked) and the
        nodes above it (``evict_host`` takes leaves only), a pin on their host slots
        whether or not the device holds them too: id -> node. Derived once per state
        (``evictable_blocks`` and ``pins`` of the host both ask it)."""
        if self._kept[0] == self._epoch:
            return self._kept[1]
        out = {}
        for node, _path in self._nodes():
            if getattr(node, "host_ref_counter", 0) > 0:
                for n in self._path(node):
                    if n.host_value is not None and len(n.host_value):
                        out[id(n)] = n
        self._kept = (self._epoch, out)
        return out

    def _pending_host(self) -> set:
        return {int(h) for job, rec in self._pending_ops() if job[0] == "w"
                for h in rec["op"].host_indices.tolist()}

    def _slots(self, pool: str):
        """(block, key, node) of every slot the tree holds in ``pool``."""
        out = []
        writing = self._pending_host() if pool == HOST else set()
        for node, path in self._nodes():
            values = node.value if pool == DEVICE else node.host_value
            if values is None:
                continue
            values = values.tolist()
            start = len(path) - len(values)
            for i, v in enumerate(values):
                if pool == DEVICE:
                    out.append((v - 1, path[: start + i + 1], node))
                elif v not in writing:
                    out.append((v, path[: start + i + 1], node))
        return out

    def _lock_pins(self) -> dict:
        pins = {}
        for job, rec in self._pending_ops():
            own = {int(x) for x in rec["op"].device_indices.tolist()}
            if job[0] == "w":
                node = self.tree.ongoing_write_through.get(job[1])
                node = node[0] if isinstance(node, tuple) else node  # (0.5.13: the lock node,
                # its backup length and the nodes the ack publishes)
            else:
                node = self.tree.ongoing_load_back.get(job[1])
                node = node[1] if isinstance(node, tuple) else node  # (0.5.2 on: the node)
            held = []
            for n in self._path(node):
                if n.value is not None:
                    held += [v - 1 for v in n.value.tolist() if v not in own]
            if held:
                pins[f"lock of job {job[0]}{job[1]}"] = held
        return pins

    # -- observation (docs/tiers.md) -------------------------------------------------
    def pools(self) -> dict:
        return {DEVICE: self.nb, HOST: self.nh}

    def refcount(self, pool: str, b: int) -> int:
        key = (pool, self._epoch)  # (derived once per state: the oracle reads every block)
        if self._memo[0] != key:
            self._memo = (key, self._refs(pool))
        return self._memo[1][b]

    def _refs(self, pool: str) -> list[int]:
        n = self.nb if pool == DEVICE else self.nh
        refs = [0] * n
        for b, _k, _node in self._slots(pool):
            if 0 <= b < n:
                refs[b] += 1
        if pool == DEVICE:
            for seq in self.reqs:
                for b in self.table(seq)[1]:
                    if 0 <= b < n:
                        refs[b] += 1
        for _job, _pool, blocks in self._job_blocks():
            if _pool == pool:
                for b in blocks:
                    if 0 <= b < n:
                        refs[b] += 1
        if pool == HOST:
            for _job, blocks in self._prefetches():
                for b in blocks:
                    if 0 <= b < n:
                        refs[b] += 1
        for blocks in self.pins(pool).values():
            for b in blocks:
                if 0 <= b < n:
                    refs[b] += 1
        return refs

    def _job_blocks(self):
        for job, rec in self._pending_ops():
            op = rec["op"]
            yield job, DEVICE, [int(x) - 1 for x in op.device_indices.tolist()]
            yield job, HOST, [int(x) for x in op.host_indices.tolist()]

    def free_blocks(self, pool: str) -> list[int]:
        if pool == DEVICE:
            free = (self.alloc.free_slots.tolist() if hasattr(self.alloc, "free_slots")
                    else sglang.free_pages_of(self.alloc))  # (free_pages from 0.4.8)
            return [int(x) - 1 for x in free]
        staged = [x for t in getattr(self.host, "release_slots", ()) for x in t.tolist()]
        return [int(x) for x in self.host.free_slots.tolist() + staged]  # (0.5.16 on: frees
        # staged in release_slots, merged into free_slots when an alloc needs them)

    def table(self, seq: int):
        req = self.reqs.get(seq)
        if req is None:
            return None
        return DEVICE, [int(x) - 1 for x in self._row(req).tolist()]

    def live_seqs(self) -> list[int]:
        return list(self.reqs)

    def pending_jobs(self) -> dict:
        out = {}
        for job, rec in self._pending_ops():
            op = rec["op"]
            dev = [int(x) - 1 for x in op.device_indices.tolist()]
            host = [int(x) for x in op.host_indices.tolist()]
            src, dst = ((DEVICE, dev), (HOST, host)) if job[0] == "w" else \
                ((HOST, host), (DEVICE, dev))
            out[job] = {"kind": rec["kind"], "seq": rec["seq"], "src": src, "dst": dst}
        for job, host in self._prefetches():  # (from the storage tier: nothing held there)
            out[job] = {"kind": "prefetch", "seq": job[1], "src": ("storage", []),
                        "dst": (HOST, host), "holds_src": False}
        return out

    def cache_entries(self, pool: str) -> list:
        return [(key, b) for b, key, _node in self._slots(pool)]

    def evictable_blocks(self, pool: str) -> list[int]:
        if pool == DEVICE:
            return [b for b, _k, node in self._slots(DEVICE) if node.lock_ref == 0]
        kept = self._protected() if self.storage else {}
        return [b for b, _k, node in self._slots(HOST)
                if node.evicted and node.lock_ref == 0 and id(node) not in kept]

    def eviction_units(self, pool: str) -> list[list[int]]:
        """The blocks one eviction takes together: a node's slots."""
        units: dict = {}
        for b, _k, node in self._slots(pool):
            units.setdefault(id(node), []).append(b)
        return list(units.values())

    def pins(self, pool: str) -> dict:
        if pool == DEVICE:
            return self._lock_pins()
        if not self.storage:
            return {}
        out = {}
        kept = [int(x) for n in self._protected().values() for x in n.host_value.tolist()]
        if kept:
            out["protect_host"] = kept
        queued = [int(x) for t in list(self.ctl.host_mem_release_queue.queue)
                  for x in t.tolist()]
        if queued:
            out["host_mem_release"] = queued  # (one reference per time a page is queued)
        return out

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, host_blocks: int,
         version: str | None = None) -> SglangHiCacheTarget:
    return SglangHiCacheTarget(num_blocks, block_size, host_blocks, version=version)


def make_write_back(num_blocks: int, block_size: int, host_blocks: int,
                    version: str | None = None) -> SglangHiCacheTarget:
    """The write_back policy: nothing is backed up until the device evicts it, then the
    eviction writes it to the host and waits for the write (``_SyncAcks``); no ``store``."""
    return SglangHiCacheTarget(num_blocks, block_size, host_blocks, version=version,
                               write_policy="write_back")


def make_storage(num_blocks: int, block_size: int, host_blocks: int,
                 version: str | None = None) -> SglangHiCacheTarget:
    """The storage tier on (``sglang-hicache-storage@VERSION``, 0.5.3 .. 0.5.18: the
    releases with the storage prefetch and its host-release queue; 0.5.16 on the host
    pages allocated by the scheduler's drain, see ``prefetch``): the stand-in backend
    (``_dict_backend``), prefetches (``prefetch``) completed by the driver with the pages
    that came back (``complete(job, ok, filled)``), every write backed up to the storage
    tier and acked in the same step. The release limits prefetches to 0.8 x (host - device)
    tokens in flight: the host pool must be well above the device pool for any."""
    return SglangHiCacheTarget(num_blocks, block_size, host_blocks,
                               version=version or "0.5.6", storage=True)
