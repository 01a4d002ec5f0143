"""Adapter: the scheduler side of vLLM v1's ``SimpleCPUOffloadConnector`` (eager mode) over
the release's own ``KVCacheManager`` with a hybrid KV-cache config, as a target of the
tiers model (``kvcheck verify-tiers``; protocol: docs/tiers.md).

Releases: vLLM 0.20.2 .. 0.34.0 (``vllm-v1-simple-offload@VERSION``, the releases of
``vllm_v1``'s range that ship ``vllm/v1/simple_kv_offload/manager.py``; run on 0.20.2,
0.23.0, 0.24.0, 0.33.0, the default, and 0.34.0) and aphrodite-engine 0.20.0 .. 0.24.1
(``aphrodite-simple-offload@VERSION``, the same files under ``aphrodite/``; run on all
four). Differences are handled by feature: the manager's constructor keywords
(``scheduler_block_size``, ``hash_block_size`` from 0.24), ``KVCacheTensor``'s fields
(``shared_by`` to 0.32, ``layers`` and strides from 0.33), 0.33.0's final flush on
finish (``free``), and 0.34.0's request field ``prefix_cache_hit_limit`` (0: no GPU
lookup), which replaces ``skip_reading_prefix_cache`` (``vllm_v1.Request`` sets one with
the other). 0.34.0's lazy store walks the GPU free queue from its head (0.33.0 kept a
cursor) and returns its source blocks to the eviction end (``evict_first``).

What runs is the release's own code, loaded from its installed files by ``_loader``
(never imported as ``vllm``): the KV-cache manager's files (``vllm_v1.FILES``: the
``KVCacheManager``, the ``HybridKVCacheCoordinator``, ``BlockPool``, ``kv_cache_utils``,
the single-type managers, ``kv_cache_interface``), and
``vllm/v1/simple_kv_offload/{manager, metadata}.py`` and ``vllm/v1/core/sched/output.py``
(``SchedulerOutput``, ``NewRequestData``, ``CachedRequestData``: the release's own
dataclasses). The connector's scheduler half is the release's ``SimpleCPUOffloadScheduler``
(``SimpleCPUOffloadConnector``'s scheduler-side methods call exactly it; the connector
class itself imports the worker and torch), built with ``lazy_offload=False`` (eager, the
default), bound to the GPU manager's ``BlockPool`` (``bind_gpu_block_pool``, as
``Scheduler.__init__`` does). Its CPU pool is its own ``BlockPool`` (vLLM derives it from the
GPU config: ``_derive_cpu_config``), of ``host_blocks + 1`` blocks (its block 0 is the null
block).

The KV-cache config: two groups sharing one GPU pool of ``num_blocks + 1`` blocks (vLLM's
block 0 is the null block; kvcheck's id ``b`` is vLLM's ``b + 1``, in both pools): group 0
``FullAttentionSpec`` (``SimpleCPUOffloadScheduler`` asserts a full-attention group, its
prefix-cache matching group), group 1 ``SlidingWindowSpec`` of window ``2 x block_size``
(the layout of the reports' model, gpt-oss: full and sliding-window layers), prefix caching
on, ``sha256``, one KV-cache tensor shared by both layers (its sizes only scale the CPU
pool).

Stand-ins, in one place (``OFFLOAD_STUBS`` below, on top of ``vllm_v1.STUBS``), each with
why it cannot change what the connector decides:

``vllm.distributed.kv_transfer.kv_connector.utils``
    The real module imports torch, the model executor and the platform. The one function
    the manager imports from it, ``yield_req_data``, is the release's own: its definition
    is read from that file and executed alone (``release_function``), not copied.
``vllm.distributed.kv_transfer.kv_connector.v1.base``
    ``KVConnectorMetadata`` / ``KVConnectorWorkerMetadata``: the base classes of the
    connector's metadata records (abstract, no state); the real module imports the
    engine's config and torch.
``vllm.v1.outputs``
    ``KVConnectorOutput``: what the worker reports each step; a record with the fields
    ``update_connector_output`` reads (``finished_recving``,
    ``kv_connector_worker_meta``, ...). The real module imports torch.
``VllmConfig`` (an argument)
    A ``_loader.Settings`` of the settings the connector reads (``_settings``; one it does
    not hold is kvcheck's gap: one line, exit 2): no KV events, ``block_size``, data /
    prefill / decode parallel sizes 1 (world size 1: one worker reports each store),
    ``max_model_len``, ``max_num_batched_tokens``, ``max_in_flight_tokens`` (aphrodite
    0.22.0; ``max_model_len``, as the GPU manager's default), 0.33.0's
    ``speculative_config`` (None: no speculative decoding) and
    ``num_prefill_lookahead_tokens`` (0), and 0.34.0's ``num_hash_lookahead_tokens`` (0:
    ``VllmConfig`` resolves it to 0 without EAGLE drafting).
the worker and its copy kernels
    Not loaded: kvcheck's driver is the worker. A store event's completion is
    ``update_connector_output`` with ``SimpleCPUOffloadWorkerMetadata({event: 1})`` (the
    release's record), as the worker reports it; which pending store completes next is
    the driver's choice.

How the scheduler drives it (vLLM's ``Scheduler``: ``schedule``, ``_free_request``,
``update_from_output``), one tiers operation at a time:

``allocate(seq, tokens)``
    a new request admitted with no lookup: its ``skip_reading_prefix_cache`` is set (as
    for a request asking prompt logprobs), so ``get_computed_blocks`` finds nothing on the
    GPU, and the connector's ``get_num_new_matched_tokens`` is not asked (the tiers
    ``allocate`` has no lookup: as the connector answering ``(0, False)``); then
    ``allocate_slots(req, n, 0, computed)`` (``None`` -> ``OutOfBlocks``) and
    ``update_state_after_alloc(req, get_blocks(req), 0)``, which registers the request
    for eager stores; ``num_computed_tokens = n``.
``append(seq, token)``
    a decode step: the token joins the request (``append_output_token_ids``, which
    hashes a block it completes), ``allocate_slots(req, 1)`` (which first drops the
    sliding-window blocks behind the window: ``remove_skipped_blocks``); ``None`` ->
    ``OutOfBlocks`` with the token removed again.
``store(seq)``
    the connector's ``build_connector_meta`` for a step that schedules ``seq`` alone: a
    ``SchedulerOutput`` naming it (as a new request the first time, with all its block
    ids; later as a cached request with the block ids it was given since), its tokens
    since the last build as ``num_scheduled_tokens``. The eager store scan runs there
    (``_prepare_eager_store_specs``); a store event it starts is the job. kvcheck builds a
    step's metadata only when it stores (the split keeps every store one kvcheck asked
    for): several decode steps' new blocks reach the connector in one build, concatenated
    as ``yield_req_data`` accumulates them anyway; in the engine the builds in between
    would each have scanned too. A request given no token since its last build is not
    scheduled: no build, no job. In lazy mode (``make_lazy``, ``vllm-v1-simple-offload-lazy``) the
    build's store walks the GPU free queue from its cursor instead, copying cached blocks
    no request holds: the whole event is the connector's pins (no pair is the request's).
``complete(job, ok)``
    the worker's report of a store event: ``update_connector_output`` with the event in
    ``kv_connector_worker_meta`` (the copy done). The connector has no failed-store
    report: a store's completion never fails (``failures`` is empty).
``free(seq)``
    the request finishes: ``_connector_finished`` (``remove_skipped_blocks`` at its
    computed tokens, then ``request_finished_all_groups``), then ``KVCacheManager.free``.
    A store still in flight keeps its touches; its completion releases them. 0.33.0
    queues a final store of the request's confirmed blocks there (a flush on finish):
    the adapter runs the next step's ``build_connector_meta`` and completes that event at
    once (``_final_flush``: a stand-in for the worker, the one completion kvcheck's driver
    does not choose).

Observation (kvcheck's block ``b`` is vLLM's ``b + 1`` in each pool):

``table(seq)``
    the full-attention group's blocks (``req_to_blocks`` of group 0).
``window(seq)``
    the sliding-window group's blocks, ``None`` for vLLM's null block (a position behind
    the window).
``pending_jobs()``
    per store event in flight: its pairs whose GPU block is in the request's
    full-attention table when the store starts (``src`` GPU blocks, ``dst`` CPU blocks;
    a block the scan listed twice, twice); the connector's touches of the event's other
    entries (the sliding-window group's blocks, whose content kvcheck's ghost does not
    follow) are ``pins``: ``{"store <event>": [blocks]}`` in each pool, a multiset.
``refcount``
    ``ref_cnt``; on the CPU pool, plus one for a block its cache map names (the cache's
    reference).
``free_blocks``
    the GPU free queue as it is (duplicates included: ``get_all_free_blocks``); the CPU
    free queue without the blocks its cache map names (those are evictable).
``num_free``
    the GPU pool's own count, ``get_num_free_blocks()`` (the CPU pool's counts its
    evictable blocks too: not reported).
``cache_entries(host)``
    ``((hash, block, event), block)`` for each block of the CPU pool's
    ``cached_block_hash_to_block`` (the hash carries the group; one key per block, as
    vLLM's map may hold several blocks under one hash; the store event that filled the
    block makes each publication a new key, whose meaning kvcheck binds from the copy
    it saw, or leaves unbound for a pin's entry);
    ``cache_entries(device)`` is empty: the GPU prefix cache is not read (above), its
    freed blocks are free.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, vllm_v1
from ._loader import Loaded
from .vllm_v1 import Request, RequestStatus

ENGINE_KEY = "vllm-v1"  # the releases of vllm_v1's range (TARGET@VERSION)

OFFLOAD_FILES = ("vllm.v1.simple_kv_offload.manager", "vllm.v1.simple_kv_offload.metadata",
                 "vllm.v1.core.sched.output")
UTILS = "vllm.distributed.kv_transfer.kv_connector.utils"
WHERE = "impl/thirdparty/vllm_v1_offload.py"  # (names this adapter in a stand-in's gap)


def release_function(loaded: Loaded, module: str, name: str, namespace: dict) -> Any:
    """The release's own ``name`` from ``module``'s file: its ``def`` alone, parsed from the
    installed file and executed in ``namespace`` (the rest of that module is not run)."""
    path = loaded.root / (module.replace(".", "/") + ".py")
    if not _loader.exec_definitions(path, namespace, (name,)):
        raise ImportError(f"{name} is not defined in {path}", name=name)
    return namespace[name]


def _stub_connector_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    from collections.abc import Iterator

    real = mod.__kvcheck_real_name__
    ns = {"__builtins__": mod.__dict__["__builtins__"], "Iterator": Iterator, "Any": Any,
          "__name__": mod.__name__}
    mod.yield_req_data = release_function(loaded, real, "yield_req_data", ns)


def _stub_connector_base(mod: types.ModuleType, _: Loaded) -> None:
    class KVConnectorMetadata:  # noqa: B903 - a base class with no state
        pass

    class KVConnectorWorkerMetadata:
        def aggregate(self, other):
            raise NotImplementedError

    mod.KVConnectorMetadata = KVConnectorMetadata
    mod.KVConnectorWorkerMetadata = KVConnectorWorkerMetadata


def _stub_outputs(mod: types.ModuleType, _: Loaded) -> None:
    @dataclass
    class KVConnectorOutput:
        finished_sending: set | None = None
        finished_recving: set | None = None
        kv_connector_stats: Any = None
        kv_cache_events: Any = None
        kv_connector_worker_meta: Any = None
        invalid_block_ids: set = field(default_factory=set)
        expected_finished_count: int = 0

    mod.KVConnectorOutput = KVConnectorOutput


def _stub_offload_metrics(mod: types.ModuleType, _: Loaded) -> None:
    """0.33.0: the connector's Prometheus metrics (names and a stats record), read only by
    ``get_stats``, which the scheduler calls for logging; kvcheck never does."""
    class MetricName:
        SAVE_OUTCOMES = LOAD_BLOCKS = USED_BLOCKS = PENDING_STORE_BLOCKS = INFO = "unused"

    mod.MetricName = MetricName
    mod.OUTCOME_TO_FIELD = {}
    mod.SimpleCPUOffloadStats = vllm_v1.unreachable("the connector's metrics")


def _stub_offload_sizing(mod: types.ModuleType, loaded: Loaded) -> None:
    """0.33.0: ``sizing.py`` imports torch.distributed (for the worker's sizing); the one
    function the manager imports, ``gpu_total_bytes``, is the release's own (read from the
    file and executed alone, as ``yield_req_data``)."""
    ns = {"__builtins__": mod.__dict__["__builtins__"], "__name__": mod.__name__,
          "KVCacheConfig": Any}
    mod.gpu_total_bytes = release_function(loaded, mod.__kvcheck_real_name__,
                                            "gpu_total_bytes", ns)


def _stub_ec_manager_config(mod: types.ModuleType, _: Loaded) -> None:
    """0.33.0: ``sched/output.py`` names the encoder-cache manager's metadata (a field of
    ``SchedulerOutput``, None here); the real module imports the config machinery."""
    class EncoderCacheManagerMetadata:  # annotation only
        pass

    mod.EncoderCacheManagerMetadata = EncoderCacheManagerMetadata


def _stub_kv_events(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm_v1``'s stand-in, and 0.33.0's ``MEDIUM_STORAGE`` (a KV event's medium name;
    events are off)."""
    vllm_v1.STUBS["vllm.distributed.kv_events"](mod, loaded)
    mod.MEDIUM_STORAGE = "STORAGE"


def _stub_mm_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm_v1``'s stand-in, and 0.33.0's ``strip_covered_mm_data``: reached only for a
    multimodal request, which kvcheck never makes (it raises)."""
    vllm_v1.STUBS["vllm.multimodal.utils"](mod, loaded)
    mod.strip_covered_mm_data = vllm_v1.unreachable("multimodal data")


OFFLOAD_STUBS = {
    "vllm.distributed.kv_events": _stub_kv_events,
    "vllm.multimodal.utils": _stub_mm_utils,
    UTILS: _stub_connector_utils,
    "vllm.distributed.kv_transfer.kv_connector.v1.base": _stub_connector_base,
    "vllm.v1.outputs": _stub_outputs,
    "vllm.v1.simple_kv_offload.metrics": _stub_offload_metrics,
    "vllm.v1.simple_kv_offload.sizing": _stub_offload_sizing,
    "vllm.config.ec_manager_config": _stub_ec_manager_config,
}


@dataclass(frozen=True)
class Engine:
    """An engine line whose releases ship the connector: its install key and top package."""

    key: str
    top: str

    def name(self, real: str) -> str:
        return self.top + real[len("vllm"):] if real.startswith("vllm") else real


VLLM = Engine("vllm-v1", "vllm")
APHRODITE = Engine("aphrodite", "aphrodite")


def load(engine: Engine = VLLM, version: str | None = None) -> Loaded:
    dist = install.select(engine.key, version)
    root = _loader.require(dist)
    if engine is APHRODITE:
        from . import aphrodite

        base_files, base_stubs = aphrodite.FILES, aphrodite.STUBS
    else:
        base_files, base_stubs = vllm_v1.FILES, vllm_v1.STUBS
    files = tuple(f for f in base_files if (root / (f.replace(".", "/") + ".py")).is_file())
    manager = engine.name("vllm.v1.simple_kv_offload.manager")
    if not (root / (manager.replace(".", "/") + ".py")).is_file():
        raise MisuseError(f"{dist.dist} {dist.version} has no {manager} (SimpleCPUOffload "
                          f"ships from vLLM 0.20 / aphrodite 0.20.0)")
    files += tuple(engine.name(f) for f in OFFLOAD_FILES)
    stubs = {**base_stubs, **{engine.name(k): v for k, v in OFFLOAD_STUBS.items()}}
    return _loader.load(dist, files, stubs,
                        entry=(engine.name("vllm.v1.core.kv_cache_manager"), manager))


def _settings(block_size: int) -> Any:
    """The ``VllmConfig`` fields the connector reads (module docstring): a
    ``_loader.Settings``, so a setting a later release reads and this one lacks ends the
    run with one line and exit 2 (``StandInMissing``), never a crash blamed on vLLM."""
    def ns(path: str, **values) -> _loader.Settings:
        return _loader.Settings(path, WHERE, **values)

    return ns("vllm_config", kv_events_config=None,
              cache_config=ns("vllm_config.cache_config", block_size=block_size),
              parallel_config=ns("vllm_config.parallel_config",
                                 decode_context_parallel_size=1,
                                 prefill_context_parallel_size=1, world_size=1,
                                 data_parallel_size=1),
              model_config=ns("vllm_config.model_config", max_model_len=1 << 20),
              scheduler_config=ns("vllm_config.scheduler_config",
                                  max_num_batched_tokens=1 << 16),
              # (aphrodite 0.22.0: the CPU coordinator's; the GPU manager's default, None,
              # reads as max_model_len too)
              max_in_flight_tokens=1 << 20,
              speculative_config=None,  # (0.33.0: no speculative decoding)
              num_prefill_lookahead_tokens=0,
              # (0.34.0: tokens after a block its hash covers; 0 without EAGLE drafting,
              # as VllmConfig resolves it with no speculative config)
              num_hash_lookahead_tokens=0)


class SimpleOffloadTarget:
    """A tiers target over the release's ``KVCacheManager`` and ``SimpleCPUOffloadScheduler``
    (module docstring)."""

    capabilities = frozenset({"allocate", "append", "free", "store", "complete"})
    failures = frozenset()  # (the connector has no failed-store report)
    PAGE = 64  # bytes per block in the one KV-cache tensor (only scales the CPU pool)

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 engine: Engine = VLLM, version: str | None = None, lazy: bool = False):
        if num_blocks < 1 or block_size < 1 or host_blocks < 1:
            raise MisuseError("num_blocks, block_size and host_blocks must be positive")
        import dataclasses
        import inspect

        self.num_blocks, self.block_size, self.host_blocks = num_blocks, block_size, host_blocks
        self.window_tokens = max(2, 2 * block_size)
        mods = load(engine, version)
        self.version = mods.dist.version
        n = engine.name
        iface = mods[n("vllm.v1.kv_cache_interface")]
        utils = mods[n("vllm.v1.core.kv_cache_utils")]
        self._sched = mods[n("vllm.v1.core.sched.output")]
        self._meta = mods[n("vllm.v1.simple_kv_offload.metadata")]
        self._outputs = mods[n("vllm.v1.outputs")]
        hashing = mods[n("vllm.utils.hashing")] if n("vllm.utils.hashing") in mods.files \
            else None
        sha256 = hashing.sha256 if hashing is not None else vllm_v1.hash_fn(mods)
        torch = mods["torch"]
        extra = {"use_mla": False} if "use_mla" in {
            f.name for f in dataclasses.fields(iface.FullAttentionSpec)} else {}
        full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                       dtype=torch.float16, **extra)
        sliding = iface.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                          dtype=torch.float16, sliding_window=self.window_tokens,
                                          **extra)
        config = iface.KVCacheConfig(
            num_blocks=num_blocks + 1,
            kv_cache_tensors=[self._tensor(iface, num_blocks + 1)],
            kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full),
                             iface.KVCacheGroupSpec(["layer.1"], sliding)])
        utils.init_none_hash(sha256)
        cls = mods[n("vllm.v1.core.kv_cache_manager")].KVCacheManager
        kwargs = {"max_model_len": 1 << 20, "scheduler_block_size": block_size,
                  "hash_block_size": block_size, "enable_caching": True}
        params = inspect.signature(cls.__init__).parameters
        self.manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
        self._hasher = utils.get_request_block_hasher(block_size, sha256)
        self.pool = self.manager.block_pool
        offload = mods[n("vllm.v1.simple_kv_offload.manager")].SimpleCPUOffloadScheduler
        kwargs = {"scheduler_block_size": block_size, "hash_block_size": block_size,
                  "lazy_offload": lazy}
        params = inspect.signature(offload.__init__).parameters
        self.connector = offload(_settings(block_size), config,
                                 (host_blocks + 1) * self.PAGE,
                                 **{k: v for k, v in kwargs.items() if k in params})
        self.connector.bind_gpu_block_pool(self.pool)
        self.cpu = self.connector.cpu_block_pool
        if self.cpu.num_gpu_blocks != host_blocks + 1:
            raise MisuseError(f"the connector sized its CPU pool {self.cpu.num_gpu_blocks - 1},"
                              f" not {host_blocks}")
        self.requests: dict[int, Request] = {}
        self.finished: dict[int, Request] = {}
        self._unsent: dict[int, dict] = {}  # seq -> what its steps scheduled since a build
        self._jobs: dict[str, tuple[int, int]] = {}  # job id -> (seq, store event)
        self._ids = itertools.count()
        self._published: dict[int, int] = {}  # CPU block -> the store event that filled it

    def _tensor(self, iface, blocks: int):
        """The one KV-cache tensor, both layers in it (its sizes only scale the CPU pool):
        ``shared_by`` to 0.32, ``layers`` with strides from 0.33 (a layer-outermost
        layout)."""
        import dataclasses

        names = {f.name for f in dataclasses.fields(iface.KVCacheTensor)}
        if "shared_by" in names:
            return iface.KVCacheTensor(size=blocks * self.PAGE, shared_by=["layer.0", "layer.1"])
        page = self.PAGE // 2
        return iface.KVCacheTensor(size=blocks * self.PAGE, layers=["layer.0", "layer.1"],
                                   layer_stride=page * blocks, block_stride=page)

    # -- operations ---------------------------------------------------------------------
    def allocate(self, seq: int, tokens: Sequence[int]) -> None:
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a prompt has at least one token")
        req = Request(f"{seq}.{next(self._ids)}", tokens, self._hasher)
        req.skip_reading_prefix_cache = True
        req.num_output_placeholders = 0  # (async scheduling off)
        got = self.manager.get_computed_blocks(req)
        computed, num_computed = got[0], got[1]
        if num_computed:
            raise MisuseError("a request that skips the prefix cache found a hit")
        if self.manager.allocate_slots(req, len(tokens), 0, computed) is None:
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {len(tokens)} tokens")
        blocks = self.manager.get_blocks(req.request_id)
        self.connector.update_state_after_alloc(req, blocks, 0)
        req.num_computed_tokens = len(tokens)
        req.status = RequestStatus.RUNNING
        self.requests[seq] = req
        self.finished.pop(seq, None)
        self._unsent[seq] = {"new": True, "tokens": len(tokens),
                             "blocks": tuple(list(g) for g in blocks.get_block_ids())}

    def append(self, seq: int, token: int) -> tuple[int, int]:
        req = self._live(seq)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(token)
        new = self.manager.allocate_slots(req, 1)
        if new is None:
            req._all_token_ids.pop()
            req._output_token_ids.pop()
            del req.block_hashes[hashes_before:]
            raise OutOfBlocks("vLLM allocate_slots returned None for one decode token")
        req.num_computed_tokens = length + 1
        unsent = self._unsent[seq]
        unsent["tokens"] += 1
        ids = new.get_block_ids()
        for g, got in enumerate(ids):
            unsent["blocks"][g].extend(got)
        table = self.table(seq)[1]
        return table[length // self.block_size], length % self.block_size

    def store(self, seq: int):
        req = self._live(seq)
        unsent = self._unsent[seq]
        if not unsent["tokens"]:
            return None
        out = self._sched.SchedulerOutput.make_empty()
        rid = req.request_id
        blocks = tuple(list(g) for g in unsent["blocks"])
        if unsent["new"]:
            out.scheduled_new_reqs = [self._new_request_data(req, blocks)]
        else:
            cached = out.scheduled_cached_reqs
            cached.req_ids = [rid]
            cached.new_block_ids = [blocks if any(blocks) else None]
            cached.new_token_ids = [[]]
            cached.num_computed_tokens = [req.num_computed_tokens - unsent["tokens"]]
            if hasattr(cached, "num_output_tokens"):
                cached.num_output_tokens = [len(req._output_token_ids)]
        out.num_scheduled_tokens = {rid: unsent["tokens"]}
        out.total_num_scheduled_tokens = unsent["tokens"]
        self._unsent[seq] = {"new": False, "tokens": 0,
                             "blocks": tuple([] for _ in unsent["blocks"])}
        meta = self.connector.build_connector_meta(out)
        if meta.store_event < 0:
            return None
        job = f"store {meta.store_event}"
        self._jobs[job] = (seq, meta.store_event, self._split(seq, meta.store_event))
        return job

    def _new_request_data(self, req: Request, blocks: tuple) -> Any:
        import dataclasses

        cls = self._sched.NewRequestData
        values = {"req_id": req.request_id, "prompt_token_ids": list(req.prompt_token_ids),
                  "block_ids": blocks, "num_computed_tokens": 0, "mm_features": []}
        args = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                args[f.name] = values[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                args[f.name] = None
        return cls(**args)

    def complete(self, job, ok: bool) -> None:
        if job not in self._jobs:
            raise MisuseError(f"unknown job {job!r}")
        if not ok:
            raise MisuseError("SimpleCPUOffload reports no failed store")
        _, event, _ = self._jobs.pop(job)
        for c in self.connector._store_event_to_blocks[event].cpu_block_ids:
            self._published[c] = event  # (names the key the completion publishes)
        worker = self._meta.SimpleCPUOffloadWorkerMetadata(completed_store_events={event: 1})
        self.connector.update_connector_output(
            self._outputs.KVConnectorOutput(kv_connector_worker_meta=worker))

    def free(self, seq: int) -> None:
        req = self._live(seq)
        req.status = RequestStatus.FINISHED_ABORTED
        self.manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        self.connector.request_finished_all_groups(
            req, self.manager.get_block_ids(req.request_id))
        self.manager.free(req)
        del self.requests[seq]
        self._unsent.pop(seq, None)
        self.finished[seq] = req
        if getattr(self.connector, "_pending_finished_stores", None):
            self._final_flush()

    def _final_flush(self) -> None:
        """0.33.0: ``request_finished_all_groups`` queues a final store of the finished
        request's confirmed blocks (touched, CPU blocks taken), sent with the next step's
        metadata. The adapter runs that next step's ``build_connector_meta`` (nothing
        scheduled) and reports the event done at once, as a worker that copies it before
        anything else happens: the flush never stays pending (a stand-in: kvcheck's driver
        does not choose when it completes, nor may it fail)."""
        meta = self.connector.build_connector_meta(self._sched.SchedulerOutput.make_empty())
        if meta.store_event < 0:
            return
        for c in self.connector._store_event_to_blocks[meta.store_event].cpu_block_ids:
            self._published[c] = meta.store_event
        worker = self._meta.SimpleCPUOffloadWorkerMetadata(
            completed_store_events={meta.store_event: 1})
        self.connector.update_connector_output(
            self._outputs.KVConnectorOutput(kv_connector_worker_meta=worker))

    def _live(self, seq: int) -> Request:
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- observation ------------------------------------------------------------------------
    def pools(self) -> dict:
        return {"device": self.num_blocks, "host": self.host_blocks}

    def _pool(self, pool: str):
        return self.pool if pool == "device" else self.cpu

    def _cached_cpu(self) -> dict:
        out = {}
        for key, blk in vllm_v1.hash_map_blocks(self.cpu.cached_block_hash_to_block):
            out[blk.block_id] = (key, blk.block_id - 1, self._published.get(blk.block_id))
        return out

    def refcount(self, pool: str, b: int) -> int:
        blk = self._pool(pool).blocks[b + 1]
        extra = 1 if pool == "host" and blk.block_id in self._cached_cpu() else 0
        return blk.ref_cnt + extra

    def free_blocks(self, pool: str) -> Iterable[int]:
        got = [b.block_id for b in self._pool(pool).free_block_queue.get_all_free_blocks()]
        if pool == "host":
            cached = self._cached_cpu()
            got = [b for b in got if b not in cached]
        return [b - 1 for b in got]

    def num_free(self, pool: str) -> int | None:
        """The GPU pool's own count (``get_num_free_blocks``); None for the CPU pool, whose
        count includes its evictable cached blocks (not free in the tiers view)."""
        return self.pool.get_num_free_blocks() if pool == "device" else None

    def _group(self, seq: int, g: int) -> list:
        req = self.requests.get(seq) or self.finished[seq]
        table = self.manager.coordinator.single_type_managers[g].req_to_blocks.get(
            req.request_id)
        if table is None or (seq not in self.requests and not table):
            raise KeyError(seq)
        return table

    def table(self, seq: int):
        return "device", [b.block_id - 1 for b in self._group(seq, 0)]

    def window(self, seq: int):
        null = self.pool.null_block
        return "device", [None if b is null else b.block_id - 1 for b in self._group(seq, 1)]

    def live_seqs(self) -> list[int]:
        return list(self.requests)

    def _split(self, seq: int, event: int) -> tuple[list, list, list, list]:
        """A store event's pairs whose GPU block is in the request's full-attention table
        when the store starts (a block listed twice: twice), and its other entries (GPU,
        CPU): what the job reports, and the connector's other touches (pins). Fixed when
        the store starts."""
        transfer = self.connector._store_event_to_blocks[event]
        full = {b.block_id for b in self._group(seq, 0)}
        src, dst, gpu_rest, cpu_rest = [], [], [], []
        for g, c in zip(transfer.gpu_block_ids, transfer.cpu_block_ids, strict=True):
            if g in full:
                src.append(g - 1)
                dst.append(c - 1)
            else:
                gpu_rest.append(g - 1)
                cpu_rest.append(c - 1)
        return src, dst, gpu_rest, cpu_rest

    def pending_jobs(self) -> dict:
        out = {}
        for job, (seq, event, (src, dst, _, _)) in self._jobs.items():
            if event not in self.connector._store_event_to_blocks:
                continue
            out[job] = {"kind": "store", "seq": seq, "src": ("device", src),
                        "dst": ("host", dst)}
        return out

    def pins(self, pool: str) -> dict:
        out = {}
        for job, (_seq, event, (_, _, gpu_rest, cpu_rest)) in self._jobs.items():
            if event not in self.connector._store_event_to_blocks:
                continue
            rest = gpu_rest if pool == "device" else cpu_rest
            if rest:
                out[job] = rest
        return out

    def cache_entries(self, pool: str) -> list:
        if pool != "host":
            return []
        return [(key, b - 1) for b, key in self._cached_cpu().items()]  # (one key per block:
        # vLLM's map may name several blocks under one hash)

    def evictable_blocks(self, pool: str) -> list:
        if pool != "host":
            return []
        cached = self._cached_cpu()
        return [b.block_id - 1 for b in self.cpu.free_block_queue.get_all_free_blocks()
                if b.block_id in cached]

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, host_blocks: int,
         version: str | None = None) -> SimpleOffloadTarget:
    """vLLM's SimpleCPUOffload (eager) over a full-attention + sliding-window config."""
    return SimpleOffloadTarget(num_blocks, block_size, host_blocks, VLLM, version)


def make_lazy(num_blocks: int, block_size: int, host_blocks: int,
              version: str | None = None) -> SimpleOffloadTarget:
    """The same connector in lazy mode (``lazy_offload=True``): a step's store walks the GPU
    free queue from its cursor and copies cached blocks no request holds (near eviction)."""
    return SimpleOffloadTarget(num_blocks, block_size, host_blocks, VLLM, version, lazy=True)

