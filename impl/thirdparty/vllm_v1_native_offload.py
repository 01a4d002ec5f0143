"""Adapter: the scheduler side of vLLM v1's native ``OffloadingConnector`` with its CPU
offloading manager, over the release's own ``KVCacheManager``, as a target of the tiers
model (``kvcheck verify-tiers vllm-v1-native-offload``; protocol: docs/tiers.md).

Releases: vLLM 0.21.0 .. 0.34.0 (``vllm-v1-native-offload@0.33.0``, the default; run on
every release of the range: 0.21.0, 0.22.0, 0.22.1, 0.23.0, 0.24.0, 0.25.0, 0.25.1, 0.26.0,
0.27.0, 0.27.1, 0.28.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0, 0.34.0). The connector's scheduler
lives in ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`` in all of
them, its jobs keyed by job id (``store_jobs``, ``OffloadingWorkerMetadata``). 0.26.0
fails, in one operation: an admission refused for room, then the request aborted (a
queued request, never scheduled), and the next step's store scan trips the release's
``assert len(offload_keys) == len(offload_block_ids)`` (vLLM #49118, fixed in 0.27.0 by
PRs #49146 / #49285: an aborted request's scan stops at its computed tokens).

The connector first ships in 0.11.0; 0.11.0 .. 0.18.1 (one file, ``offloading_connector.py``,
with ``kv_offload/lru_manager.py``) and 0.19.0 .. 0.20.2 (the ``offloading/`` package with
``kv_offload/abstract.py``, ``spec.py``, ``mediums.py`` and ``cpu/manager.py``) key their
jobs by request (``reqs_to_store``; the worker reports ``finished_sending`` for a request
only once it has finished and all its stores landed, and the scheduler keeps its blocks
until then). They run as ``RequestKeyedTarget`` (below: every store is the one a
request's end starts). 0.11.0 .. 0.19.1 key a block by its hash alone and keep their scan
state in ``_requests`` / ``_next_stored_block_idx`` (``_scan_position``); 0.11.0 .. 0.18.1
load the scheduler class from the one file, whose worker-side imports are
annotation-only stand-ins (``WORKER_SIDE``, ``_stub_names``; the config's
``get_layers_from_vllm_config``, the worker's), with the release's LRU / ARC manager
over its ``CPUBackend`` (``ONE_FILE_FILES``).

The releases differ by feature, each read from the release's files, never from its
version number:

``kv_offload/config.py`` (0.26.0 on)
    the spec is built from an ``OffloadingConfig`` whose records (``_record``: by field
    name; 0.26.0 .. 0.29.0's have no group id, 0.33.0's model record a length) the
    adapter fills, and the scheduler takes ``(spec, vllm_config, kv_cache_config)``.
    Without it (0.21.0 .. 0.25.1, ``_legacy_connector``; ``self.legacy``):
    ``OffloadingSpec(vllm_config, kv_cache_config)`` reads the connector's
    ``extra_config`` from ``_settings``' ``kv_transfer_config`` and the scheduler takes the
    spec alone.
``kv_offload/worker/worker.py`` (0.21.0 .. 0.24.0, ``LEGACY_FILES``)
    ``offloading/common.py`` imports ``TransferSpec`` from it.
``kv_offload/cpu/policies/factory.py`` (0.27.0 on)
    the CPU manager asks the factory for its policy (``load``); before, it imports its
    LRU / ARC policies itself.
the CPU manager's keywords and records
    ``num_blocks`` and ``BlockStatus`` records (``block_id``, the policy's ``blocks``,
    ``_num_allocated_blocks``) to 0.29.0, ``num_chunks`` and ``ChunkStatus`` from 0.30.0;
    a ``store_threshold`` (passed as 0) from 0.23.0 -- 0.21.0 / 0.22.x store every key
    they are asked to, threshold 0's behaviour.
``TransferJob.sync`` (0.33.0; ``self._sync_loads``)
    a load with a token left to compute is synchronous. Without it every hit is an
    asynchronous load: a partial hit waits with blocks for its hit tokens alone, which
    kvcheck's load (a request holding all its blocks) does not model, so only misses and
    whole hits are issued there (``admits``).
``TransferJob``'s ``transfer_spec`` pair (to 0.24.0, ``_specs``), ``KVCacheTensor``'s
``shared_by`` (to 0.28.0, ``_kv_tensor``)
    the same records in their earlier shape.
``skip_reading_prefix_cache`` in the scheduler (0.24.0 .. 0.33.0; 0.34.0 reads
``skip_reading_external_kv``, which the stand-in request answers from the same flag)
    0.21.0 .. 0.23.0's lookup ignores it: an ``allocate`` whose lookup would hit, or
    defer, is not issued there.
``offloading/events.py``'s ``msgspec`` (0.34.0)
    its event-payload snapshot is a ``msgspec.Struct``: ``vllm_v1_engine``'s stand-in
    (``_stub_msgspec``; events are off, no payload is built).
``on_new_request`` (0.23.0 on)
    0.21.0 / 0.22.x have none: the lookup records a new request.
the store scan's loop (``_scan_names_all``)
    0.21.0 / 0.22.x's walks every request a step names (``yield_req_data``) reading each
    one's ``num_scheduled_tokens``; later ones the scheduled requests (and, from 0.26.0,
    the finished ones): ``_build_naming_all`` below.

What runs is the release's own code, loaded from its installed files by ``_loader`` (never
imported as ``vllm``): the KV-cache manager's files (``vllm_v1.FILES``), the connector's
scheduler half ``OffloadingConnectorScheduler`` (``offloading/scheduler.py``, with
``offloading/{common, config, events}.py``; ``OffloadingConnector``'s scheduler-side
methods call exactly it, the connector class itself imports the worker and torch), the CPU
offloading manager ``CPUOffloadingManager`` (``vllm/v1/kv_offload/cpu/manager.py``) with
its cache policy (LRU: ``cpu/policies/{base, lru, arc, factory}.py``), ``kv_offload/
{base, config}.py`` (``OffloadingSpec``, ``OffloadingConfig``: the release's own records)
and ``vllm/v1/core/sched/output.py`` (``SchedulerOutput``, ``NewRequestData``).

The configuration: one full-attention group (``FullAttentionSpec``) in a GPU pool of
``num_blocks + 1`` blocks (block 0 is vLLM's null block: kvcheck's block ``b`` is vLLM's
``b + 1``), GPU prefix caching off (``enable_caching=False``: the host cache is the only
cache, the device pool has no keys); one GPU block per offload chunk
(``blocks_per_chunk=1``, ``tokens_per_hash = block_size``), a CPU tier of
``host_blocks`` chunks (kvcheck's host block ``c`` is chunk ``c``), world size 1,
``offload_prompt_only=False`` (decode blocks are offloaded too; the release's default
offloads the prompt only) and ``sync_load_budget_bytes`` large (a load with a token left
to compute is synchronous: the worker copies it before the step's forward pass; a whole
hit, with no token left, is asynchronous, as the release decides).

Stand-ins, in one place (``NATIVE_STUBS`` on top of ``vllm_v1_offload.OFFLOAD_STUBS`` and
``vllm_v1.STUBS``, and the records below), each with why it cannot change what the
connector decides:

``torch`` (``vllm_v1``'s, plus ``Tensor``)
    an annotation of ``kv_offload/base.py``'s worker-side records, never built here.
``vllm.v1.kv_hints``
    ``KvHintsEnvelope``, the type of a request's KV hints; kvcheck's requests carry none.
``offloading/metrics.py``
    the connector's Prometheus stats: written (lookup delays, allocation failures,
    transfer sizes), read only by ``get_stats`` (logging), never called by kvcheck.
the policy factory's ``importlib``
    ``CachePolicyFactory`` imports its built-in policies by name; that module's
    ``importlib`` answers from the loaded files (the release's own ``lru`` module).
``CPUSpec`` (an ``OffloadingSpec``)
    ``CPUOffloadingSpec``'s scheduler half: ``get_manager`` builds the release's
    ``CPUOffloadingManager`` as the real one does (threshold 0, no events); the real class
    imports the platform and the GPU worker.
``VllmConfig`` (``_settings``)
    a ``_loader.Settings`` of the fields the connector reads (one it does not hold is
    kvcheck's gap: one line, exit 2): block size, prefix caching off, no retention
    interval, no speculative decoding, world size 1, and 0.34.0's
    ``num_hash_lookahead_tokens`` (0: no drafting).
``Request`` (``OffloadRequest``)
    ``vllm_v1``'s stand-in, plus ``is_finished()`` (vLLM's), no transfer params/hints and
    0.34.0's ``resumable`` (False: no streaming input); a ``_loader.StandIn``.
the worker
    not loaded: kvcheck's driver is the worker. A job's completion is
    ``update_connector_output`` with ``OffloadingWorkerMetadata({job: 1})`` (the release's
    record); a flush (``jobs_to_flush`` in a step's metadata) is the worker waiting for
    that copy before the step's forward pass: the job is marked ``flushed`` (its copy has
    landed) and reported when kvcheck's driver completes it.
the scheduler
    kvcheck's adapter calls the connector in ``Scheduler.schedule``'s order, one step per
    operation, each ending with ``build_connector_meta`` (below).

How the scheduler drives it, one tiers operation per engine step:

``allocate(seq, tokens)``
    ``on_new_request``; a request with ``skip_reading_prefix_cache`` (no lookup: the
    connector answers ``(0, False)``); ``allocate_slots``; ``update_state_after_alloc``;
    the step's ``build_connector_meta`` names it a new request with its block ids. Its
    tokens reach the store scan at the next ``store`` (kvcheck decides when a step's scan
    may store: the split keeps every store one kvcheck asked for, as the sibling adapter
    ``vllm_v1_offload`` does).
``load(seq, tokens)``
    the same with the lookup (``get_num_new_matched_tokens``): a hit is a load job
    (``update_state_after_alloc`` with the hit tokens; the job in the step's metadata).
    Sync: the request holds all its blocks and runs; async (a whole hit): it holds blocks
    for every token (the hit covers them) and waits; when the driver completes the load,
    the scheduler's ``_update_waiting_for_remote_kv`` (the last token recomputed) and the
    step that schedules it. The load's device blocks are the request's (the job holds
    only its host chunks: ``holds_dst`` False).
``append(seq, token)``
    ``allocate_slots(req, 1)``; the step's build names the request's new block ids (its
    token to the next ``store``), so a block a finished request's store still reads is
    flushed when re-allocated. (0.21.0 / 0.22.x, whose scan reads every named request:
    such a request is given no scheduled token and, for that build, the tokens its scan
    already covered as computed, so the scan finds nothing new, as 0.23.0's, which does
    not scan it; the same for ``allocate`` and ``load``'s step.)
``store(seq)``
    the step that schedules ``seq``'s tokens since its last store: the build's store scan
    (``_build_store_jobs``, ``prepare_store``: the CPU manager evicts for room) may start
    a store job. The connector takes no GPU reference for it (``holds_src`` False): the
    request's own references keep the sources; once the request ends, re-allocating one
    flushes the store (``spec.tiers.unheld_sources_kept``).
``complete(job, ok)``
    the worker's report. To 0.33.0 there is no failed-job report (``failures`` empty);
    0.34.0's worker names a failed job in ``failed_jobs`` and the scheduler drops a failed
    store's chunks (``complete_store(success=False)``): store failures are driven there
    (``failures = {"store"}``). A failed load is not: the scheduler then recomputes the
    request's invalid blocks (``Scheduler._handle_invalid_blocks``), which this adapter
    does not run.
``free(seq)``
    ``request_finished`` (FINISHED_ABORTED), ``KVCacheManager.free``, then the next step
    (nothing scheduled, the request in ``finished_req_ids``): its final store scan may
    start a store job, which ``free`` returns (``spec.tiers.free``). A request waiting for
    its asynchronous load keeps its blocks until the load reports (``finish_requests``'
    ``delay_free_blocks``; then ``_free_blocks`` on the worker's ``finished_recving``):
    the scheduler's pin ``delayed free <request>`` meanwhile.

Not issued (``admits``): a store of a request whose load is pending (its request waits,
unscheduled, or its sync load completes before the step runs), the free of one whose load
is synchronous (the worker copies it before the step's forward pass and reports it in
that step's output: no finish comes in between); a load whose lookup would
meet a chunk still being stored among its leading hits (it defers -- ``None`` -- and the
scheduler retries the request later; kvcheck's load cannot wait: ``_probe``).

Observation: ``table`` the request's GPU blocks; ``refcount`` GPU ``ref_cnt``; a CPU
chunk: 1 (a pending store's destination: the job's) or 1 + its ``ref_cnt`` (the cache's,
and one per load reading it); ``free_blocks`` the GPU free queue, the CPU manager's free
list and its never-allocated chunks; ``cache_entries(host)`` the policy's ready chunks
(``(offload key, store job)``, the job that filled it making each publication a new
key); ``evictable_blocks(host)`` the ready chunks no load reads.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, vllm_v1
from . import vllm_v1_offload as simple
from ._loader import Loaded
from .vllm_v1 import Request, RequestStatus

CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
WHERE = "impl/thirdparty/vllm_v1_native_offload.py"  # (names this adapter in a stand-in's gap)
NATIVE_FILES = (
    "vllm.v1.core.sched.output",
    CONNECTOR + ".scheduler", CONNECTOR + ".common", CONNECTOR + ".events",
    CONNECTOR + ".config",
    "vllm.v1.kv_offload.base", "vllm.v1.kv_offload.config",
    "vllm.v1.kv_offload.cpu.manager", "vllm.v1.kv_offload.cpu.common",
    "vllm.v1.kv_offload.cpu.policies.base", "vllm.v1.kv_offload.cpu.policies.lru",
    "vllm.v1.kv_offload.cpu.policies.arc", "vllm.v1.kv_offload.cpu.policies.factory",
    "vllm.v1.metrics.cache_hit_source",
)

# 0.19.0 .. 0.20.2 (``RequestKeyedTarget``): the connector keyed by request, its CPU manager
# with the policy records of ``cpu/policies/abstract.py``; ``offloading/common.py``
# imports ``TransferSpec`` from ``worker.py``, ``kv_offload/spec.py`` the worker's handler.
KEYED_BY_REQUEST_FILES = (
    "vllm.v1.core.sched.output",
    CONNECTOR + ".scheduler", CONNECTOR + ".common",
    "vllm.v1.kv_offload.abstract", "vllm.v1.kv_offload.mediums", "vllm.v1.kv_offload.spec",
    "vllm.v1.kv_offload.worker.worker", "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.policies.abstract", "vllm.v1.kv_offload.cpu.policies.lru",
    "vllm.v1.kv_offload.cpu.policies.arc",
)

# 0.11.0 .. 0.18.1 (``RequestKeyedTarget``, ``ONE_FILE``): the connector in one file, its
# scheduler class beside the worker's and the connector's; the LRU / ARC managers over a
# CPU backend (``backend.py``, ``backends/cpu.py``).
ONE_FILE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector"
ONE_FILE_FILES = (
    "vllm.v1.core.sched.output", ONE_FILE,
    "vllm.v1.kv_offload.abstract", "vllm.v1.kv_offload.mediums", "vllm.v1.kv_offload.spec",
    "vllm.v1.kv_offload.worker.worker", "vllm.v1.kv_offload.factory",
    "vllm.v1.kv_offload.backend", "vllm.v1.kv_offload.backends.cpu",
    "vllm.v1.kv_offload.lru_manager", "vllm.v1.kv_offload.arc_manager",
)
# What the one file imports for its worker and connector classes alone (names kvcheck
# never calls: the scheduler class uses none of them): annotation-only stand-ins.
WORKER_SIDE = (
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics",
    "vllm.forward_context", "vllm.attention", "vllm.attention.backends.abstract",
    "vllm.attention.layer", "vllm.model_executor.layers.attention",
    "vllm.model_executor.layers.attention_layer_base", "vllm.v1.attention.backend",
)


def _stub_names(mod: types.ModuleType, _: Loaded) -> None:
    """A module of the worker's and the connector's imports (``WORKER_SIDE``): every name
    is a class of its own, a base or an annotation; nothing the scheduler class calls."""
    made: dict[str, type] = {}

    def __getattr__(name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return made.setdefault(name, type(name, (), {}))

    mod.__getattr__ = __getattr__


def _stub_bc_linter(mod: types.ModuleType, _: Loaded) -> None:
    """0.11.x .. 0.14.x: ``sched/output.py``'s records are marked for vLLM's
    backward-compatibility linter (a decorator that returns its class unchanged)."""
    def mark(obj=None, **_kw):
        return obj if obj is not None else (lambda o: o)

    mod.bc_linter_include = mod.bc_linter_skip = mark


def _stub_config_one_file(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm_v1``'s config stand-in, and ``get_layers_from_vllm_config`` (the worker's, to
    find attention layers; never called here)."""
    vllm_v1.STUBS["vllm.config"](mod, loaded)
    mod.get_layers_from_vllm_config = vllm_v1.unreachable("the worker's layer lookup")


# 0.21.0 .. 0.24.0 (``LEGACY_FILES``): ``offloading/common.py`` imports ``TransferSpec`` (a type
# alias of two ``LoadStoreSpec``) from the worker's ``worker.py``, the release's own file.
LEGACY_FILES = ("vllm.v1.kv_offload.worker.worker",)


def _stub_torch(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm_v1``'s stand-in, and ``Tensor`` (an annotation of ``kv_offload/base.py``'s
    worker-side records, never built here)."""
    vllm_v1.STUBS["torch"](mod, loaded)

    class Tensor:  # annotation only
        pass

    mod.Tensor = Tensor


def _stub_kv_hints(mod: types.ModuleType, _: Loaded) -> None:
    """``KvHintsEnvelope``: the type of a request's KV hints (an annotation; kvcheck's
    requests carry none). The real package's ``__init__`` imports msgspec protocols."""
    class KvHintsEnvelope:  # annotation only
        pass

    mod.KvHintsEnvelope = KvHintsEnvelope


def _stub_offload_metrics(mod: types.ModuleType, _: Loaded) -> None:
    """The connector's Prometheus metrics: a stats record whose counters and histograms
    are written (lookup delays, allocation failures, transfer sizes) and read only by
    ``get_stats`` (logging), which kvcheck never calls; the metric names are only its
    keys. The real module imports prometheus_client and the connector factory."""
    class _Names:
        def __getattr__(self, name: str) -> str:
            return name

    class OffloadingConnectorStats:
        def increase_counter(self, *_a) -> None:
            pass

        observe_histogram = set_gauge = set_info = increase_counter

        def aggregate(self, _other) -> OffloadingConnectorStats:
            return self

        def is_empty(self) -> bool:
            return True

    mod.OffloadingConnectorStats = OffloadingConnectorStats
    mod._ConnectorMetricName = mod._TransferMetricName = _Names()


def _stub_msgspec(mod: types.ModuleType, loaded: Loaded) -> None:
    """0.34.0: ``offloading/events.py`` makes its event-payload snapshot a
    ``msgspec.Struct`` (``_OffloadEventMetadata``, built only when KV events are on: off
    here). msgspec is not a kvcheck dependency: ``vllm_v1_engine``'s stand-in (a plain
    record with the annotated fields, in one place)."""
    from . import vllm_v1_engine

    vllm_v1_engine.STUBS["msgspec"](mod, loaded)


NATIVE_STUBS = {
    CONNECTOR + ".metrics": _stub_offload_metrics,
    "msgspec": _stub_msgspec,
    "torch": _stub_torch,
    "vllm.v1.kv_hints": _stub_kv_hints,
}


def keyed_by_request(root) -> bool:
    """0.19.0 .. 0.20.2's layout (the ``offloading/`` package over
    ``kv_offload/abstract.py`` and ``cpu/manager.py``) or 0.11.0 .. 0.18.1's (one file over
    ``abstract.py``, ``lru_manager.py`` and ``backends/cpu.py``)."""
    kv = root / "vllm/v1/kv_offload"
    return (kv / "abstract.py").is_file() and (all((root / f).is_file() for f in (
        CONNECTOR.replace(".", "/") + "/scheduler.py", "vllm/v1/kv_offload/cpu/manager.py"))
        or _one_file(root))


def _one_file(root) -> bool:
    kv = root / "vllm/v1/kv_offload"
    return ((root / (ONE_FILE.replace(".", "/") + ".py")).is_file()
            and (kv / "lru_manager.py").is_file() and (kv / "backends/cpu.py").is_file())


def load(version: str | None = None) -> Loaded:
    dist = install.select(simple.ENGINE_KEY, version)
    root = _loader.require(dist)
    if keyed_by_request(root):
        one = _one_file(root)
        files = tuple(f for f in vllm_v1.FILES + (ONE_FILE_FILES if one else
                                                  KEYED_BY_REQUEST_FILES)
                      if (root / (f.replace(".", "/") + ".py")).is_file())
        stubs = {**vllm_v1.STUBS, **simple.OFFLOAD_STUBS, **NATIVE_STUBS}
        if one:
            stubs.update({name: _stub_names for name in WORKER_SIDE},
                         **{"vllm.config": _stub_config_one_file,
                            "vllm._bc_linter": _stub_bc_linter})
        if not (root / "vllm/utils/math_utils.py").is_file():  # (as vllm_v1.load: 0.11.x)
            stubs.update(vllm_v1.ONE_UTILS_STUBS)
        entry = (ONE_FILE, "vllm.v1.kv_offload.lru_manager") if one else (
            CONNECTOR + ".scheduler", "vllm.v1.kv_offload.cpu.manager")
        return _loader.load(dist, files, stubs,
                            entry=("vllm.v1.core.kv_cache_manager",) + entry)
    sched = root / (CONNECTOR.replace(".", "/") + "/scheduler.py")
    factory = root / "vllm/v1/kv_offload/cpu/policies/factory.py"
    keyed_by_job = all((root / f"vllm/v1/kv_offload/{f}.py").is_file()
                       for f in ("base", "cpu/manager", "cpu/policies/base"))
    if not sched.is_file() or not keyed_by_job:
        keyed = " (its jobs keyed by request: reqs_to_store, finished_sending)" if (
            root / "vllm/v1/kv_offload/abstract.py").is_file() else ""
        raise MisuseError(f"{dist.dist} {dist.version}: the native offloading connector is "
                          f"adapted in the layouts of 0.11.0 .. 0.33.0 ({CONNECTOR}.scheduler "
                          f"with kv_offload/base.py, or abstract.py, and cpu/manager.py; "
                          f"offloading_connector.py with lru_manager.py); this release has "
                          f"neither{keyed}")
    files = tuple(f for f in vllm_v1.FILES + NATIVE_FILES + LEGACY_FILES
                  if (root / (f.replace(".", "/") + ".py")).is_file())
    stubs = {**vllm_v1.STUBS, **simple.OFFLOAD_STUBS, **NATIVE_STUBS}
    loaded = _loader.load(dist, files, stubs,
                          entry=("vllm.v1.core.kv_cache_manager", CONNECTOR + ".scheduler",
                                 "vllm.v1.kv_offload.cpu.manager"))
    if not factory.is_file():  # (to 0.26.0: the manager imports its policies itself)
        return loaded
    # The policy factory imports its built-in policies by name (``importlib.import_module``,
    # which the loader's import table does not see): that module's ``importlib`` answers
    # from the loaded files instead (the same ``lru`` / ``arc`` modules, the release's own).
    factory = loaded["vllm.v1.kv_offload.cpu.policies.factory"]
    factory.importlib = types.SimpleNamespace(import_module=lambda name: loaded[name])
    return loaded


class OffloadRequest(Request, _loader.StandIn):
    """``vllm_v1``'s stand-in for ``vllm.v1.request.Request``, with the fields and the
    method the connector reads too: ``is_finished()`` (vLLM's: its status is a finished
    one), ``kv_transfer_params`` and ``kv_hints`` (None: no per-request offload limits,
    tier filters or hints), ``resumable`` (0.34.0's lookup and events read it: False, no
    streaming input). A ``_loader.StandIn``: a field a later release reads and this one
    lacks ends the run with one line and exit 2, not a crash blamed on vLLM."""

    WHERE = "impl/thirdparty/vllm_v1_native_offload.py"
    kv_transfer_params = None
    kv_hints = None
    resumable = False

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


def _settings(block_size: int, extra_config: dict | None = None) -> Any:
    """The ``VllmConfig`` fields the connector reads (module docstring); 0.21.0 .. 0.25.1's
    ``OffloadingSpec`` reads the connector's ``extra_config`` from it too (and no KV
    events config: events off). A ``_loader.Settings``: a setting a later release reads
    and this one lacks ends the run with one line and exit 2, never a crash FAIL."""
    def ns(path: str, **values) -> _loader.Settings:
        return _loader.Settings(path, WHERE, **values)

    return ns("vllm_config",
              cache_config=ns("vllm_config.cache_config", block_size=block_size,
                              prefix_cache_retention_interval=None,
                              enable_prefix_caching=False, hash_block_size=None),
              parallel_config=ns("vllm_config.parallel_config",
                                 decode_context_parallel_size=1,
                                 prefill_context_parallel_size=1, world_size=1),
              speculative_config=None, kv_events_config=None,
              kv_transfer_config=ns("vllm_config.kv_transfer_config",
                                    kv_connector_extra_config=extra_config or {}),
              # (0.34.0: tokens after a block its hash covers; 0 with no speculative
              # config, as VllmConfig resolves it)
              num_hash_lookahead_tokens=0)


def _kv_tensor(iface, size: int, page: int) -> Any:
    """The pool's one ``KVCacheTensor``: 0.33.0 names its ``layers`` (with strides),
    0.21.0 .. 0.28.0 the layers it is ``shared_by``."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(iface.KVCacheTensor)}
    if "shared_by" in names:  # (0.23.0 has no block_stride)
        stride = {"block_stride": page} if "block_stride" in names else {}
        return iface.KVCacheTensor(size=size, shared_by=["layer.0"], **stride)
    return iface.KVCacheTensor(size=size, layers=["layer.0"], layer_stride=0,
                               block_stride=page)


def _record(cls, **values) -> Any:
    """One of ``kv_offload/config.py``'s records, given the values of the fields it has
    (0.26.0 .. 0.32.0's have fewer than 0.33.0's: no group id before 0.30.0, no model
    length before 0.33.0; a field left out keeps its default)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _cpu_spec(base, cpu, args: dict) -> type:
    """``CPUOffloadingSpec``'s scheduler half, a subclass of the release's
    ``OffloadingSpec``: its ``get_manager`` builds the release's ``CPUOffloadingManager``
    with ``args`` (store threshold 0 where it has one, no events); the real class imports
    the platform and the GPU worker."""

    class CPUSpec(base.OffloadingSpec):
        def get_manager(spec_self):
            if getattr(spec_self, "_manager", None) is None:
                spec_self._manager = cpu.CPUOffloadingManager(**args)
            return spec_self._manager

        def get_worker(spec_self, *_args):
            raise NotImplementedError("kvcheck's driver is the worker")

        get_handlers = get_worker  # (its name to 0.24.0)

    return CPUSpec


def _specs(transfer) -> tuple:
    """A ``TransferJob``'s (source, destination) specs: 0.33.0's ``src_spec`` and
    ``dst_spec``, 0.21.0 .. 0.24.0's ``transfer_spec`` pair."""
    if hasattr(transfer, "transfer_spec"):
        return tuple(transfer.transfer_spec)
    return transfer.src_spec, transfer.dst_spec


class NativeOffloadTarget:
    """A tiers target over the release's ``KVCacheManager``, ``OffloadingConnectorScheduler``
    and ``CPUOffloadingManager`` (module docstring)."""

    capabilities = frozenset({"allocate", "append", "free", "store", "load", "complete"})
    failures = frozenset()  # (to 0.33.0 a worker reports a job done, never failed; 0.34.0:
    # failed stores, set in __init__)
    recomputes_last_token = True  # (a whole hit loads every block; the last token is
    # recomputed once the load lands: spec.tiers.load)

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 version: str | None = None, policy: str = "lru",
                 prompt_only: bool = False):
        if num_blocks < 1 or block_size < 1 or host_blocks < 1:
            raise MisuseError("num_blocks, block_size and host_blocks must be positive")
        import inspect

        self.num_blocks, self.block_size, self.host_blocks = num_blocks, block_size, host_blocks
        mods = load(version)
        self.version = mods.dist.version
        iface = mods["vllm.v1.kv_cache_interface"]
        utils = mods["vllm.v1.core.kv_cache_utils"]
        self._sched = mods["vllm.v1.core.sched.output"]
        self._common = mods[CONNECTOR + ".common"]
        self._outputs = mods["vllm.v1.outputs"]
        base = mods["vllm.v1.kv_offload.base"]
        self._make_key = base.make_offload_key
        sha256 = mods["vllm.utils.hashing"].sha256
        torch = mods["torch"]
        full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                       dtype=torch.float16)
        page = 2 * block_size * 2  # (K and V, one head of size 1, float16)
        config = iface.KVCacheConfig(
            num_blocks=num_blocks + 1,
            kv_cache_tensors=[_kv_tensor(iface, (num_blocks + 1) * page, page)],
            kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full)])
        utils.init_none_hash(sha256)
        cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
        kwargs = {"max_model_len": 1 << 20, "scheduler_block_size": block_size,
                  "hash_block_size": block_size, "enable_caching": False}
        params = inspect.signature(cls.__init__).parameters
        self.manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
        self._hasher = utils.get_request_block_hasher(block_size, sha256)
        self.pool = self.manager.block_pool

        extra = {"offload_prompt_only": prompt_only, "sync_load_budget_bytes": 1 << 40}
        # each difference read from the release's files: ``kv_offload/config.py`` (the
        # spec built from an ``OffloadingConfig``: 0.26.0 on), sync loads (a
        # ``TransferJob`` with ``sync``: 0.33.0), the CPU manager's keywords and records
        self.legacy = "vllm.v1.kv_offload.config" not in mods.files
        fields = getattr(self._common.TransferJob, "__dataclass_fields__", {})
        self._sync_loads = "sync" in fields
        # 0.34.0: the worker reports a failed job (``failed_jobs``); a failed store's chunks
        # are dropped, not published. (A failed load is not driven: the scheduler recomputes
        # the request's invalid blocks, which this adapter does not run.)
        report = getattr(self._common.OffloadingWorkerMetadata, "__dataclass_fields__", {})
        if "failed_jobs" in report:
            self.failures = frozenset({"store"})
        cpu = mods["vllm.v1.kv_offload.cpu.manager"]
        params = inspect.signature(cpu.CPUOffloadingManager.__init__).parameters
        size = "num_chunks" if "num_chunks" in params else "num_blocks"  # (to 0.29.0)
        self._cpu_args = {size: host_blocks, "cache_policy": policy, "enable_events": False,
                          **({"store_threshold": 0} if "store_threshold" in params else {})}
        source = _loader.require(mods.dist) / (CONNECTOR.replace(".", "/") + "/scheduler.py")
        text = source.read_text()
        # 0.21.0 .. 0.23.0's lookup ignores ``skip_reading_prefix_cache`` (0.24.0 answers 0;
        # 0.34.0 reads ``skip_reading_external_kv``, which the stand-in request derives
        # from the same flag)
        self._lookup_skips = ("skip_reading_prefix_cache" in text
                              or "skip_reading_external_kv" in text)
        # 0.21.0 / 0.22.x's store scan walks every request a step names (yield_req_data)
        # and reads each one's ``num_scheduled_tokens``; later ones the scheduled ones
        scan = text[text.find("def _build_store_jobs"):]
        scan = scan[:scan.find("\n    def ", 1)]
        self._scan_names_all = "yield_req_data(" in scan
        if self.legacy:
            self._legacy_connector(mods, base, config, block_size, extra)
            return
        cfg = mods["vllm.v1.kv_offload.config"]
        offload_config = _record(
            cfg.OffloadingConfig,
            groups=(_record(cfg.OffloadingGroupConfig, tokens_per_block=block_size,
                            layer_names=("layer.0",), group_id=0),),
            worker_kv_bytes_per_block=page, enable_kv_cache_events=False,
            extra_config={"offload_prompt_only": prompt_only,
                          "sync_load_budget_bytes": 1 << 40},
            engine_id="kvcheck", model=_record(cfg.OffloadingModelConfig, name="kvcheck",
                                               dtype="float16", max_model_len=1 << 20),
            cache=cfg.OffloadingCacheConfig(tokens_per_hash=block_size, blocks_per_chunk=1),
            parallel=_record(cfg.OffloadingParallelConfig, rank=0, world_size=1, tp_size=1,
                             pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
                             data_parallel_size=1, data_parallel_rank_local=0,
                             is_parallelism_agnostic=False))

        sched = mods[CONNECTOR + ".scheduler"].OffloadingConnectorScheduler
        self.connector = sched(_cpu_spec(base, cpu, self._cpu_args)(offload_config),
                               _settings(block_size), config)
        self._init_state()

    def _legacy_connector(self, mods, base, config, block_size: int, extra: dict) -> None:
        """0.21.0 .. 0.25.1 (no ``kv_offload/config.py``): ``OffloadingSpec(vllm_config,
        kv_cache_config)`` reads the connector's ``extra_config`` from the config
        (``_settings``) and the scheduler takes the spec alone."""
        cpu = mods["vllm.v1.kv_offload.cpu.manager"]
        sched = mods[CONNECTOR + ".scheduler"].OffloadingConnectorScheduler
        self.connector = sched(_cpu_spec(base, cpu, self._cpu_args)(
            _settings(block_size, extra), config))
        self._init_state()

    _lookup_skips = True
    _scan_names_all = False
    _sync_loads = True

    def _init_state(self) -> None:
        self.cpu = self.connector.manager
        self.requests: dict[int, Any] = {}
        self.finished: dict[int, Any] = {}
        self._unsent: dict[int, int] = {}  # seq -> tokens its steps scheduled since a store
        self._flushed: set[int] = set()  # jobs the worker has flushed, not yet reported
        self._step_meta = None
        self._waiting: dict[int, int] = {}  # seq -> hit tokens of its asynchronous load
        self._delayed: dict[int, Any] = {}  # seq -> a finished request whose blocks wait
        self._jobs: dict[str, tuple[int, int, str, list, list]] = {}
        self._ids = itertools.count()
        self._published: dict[int, int] = {}  # CPU chunk -> the job that filled it

    # -- operations ---------------------------------------------------------------------
    def _new_request(self, seq: int, tokens) -> Any:
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a prompt has at least one token")
        req = OffloadRequest(f"{seq}.{next(self._ids)}", tokens, self._hasher)
        req.num_output_placeholders = 0
        on_new = getattr(self.connector, "on_new_request", None)
        if on_new is not None:  # (0.21.0 / 0.22.x: none; the lookup records it)
            on_new(req)
        return req

    def _admit(self, seq: int, req, lookup: bool) -> int:
        """The scheduler's admission of a waiting request: the connector's lookup (skipped
        for ``allocate``: ``skip_reading_prefix_cache``), ``allocate_slots`` for the rest,
        ``update_state_after_alloc``; the step ends (``_end_step``) with the request's
        block ids (as a new request), its tokens left to the next ``store``. Returns the
        hit tokens."""
        req.skip_reading_prefix_cache = not lookup
        computed, num_local = self.manager.get_computed_blocks(req)[:2]
        n = len(req.prompt_token_ids)
        try:
            hit, is_async = self.connector.get_num_new_matched_tokens(req, num_local)
            if hit is None:
                raise MisuseError("the connector deferred its lookup (it has no async one)")
            # an asynchronous load (a whole hit: no token left to compute with it) waits
            # for its copy with blocks for its hit tokens, nothing scheduled
            new = 0 if is_async else n - num_local - hit
            if _loader.takes(type(self.manager).allocate_slots, "num_external_computed_tokens"):
                got = self.manager.allocate_slots(
                    req, new, num_local, computed, num_external_computed_tokens=hit,
                    delay_cache_blocks=is_async)
            else:  # (to 0.13.x the scheduler adds the external tokens to the new ones)
                got = self.manager.allocate_slots(req, new + hit, num_local, computed,
                                                  delay_cache_blocks=is_async)
            if got is None:
                raise OutOfBlocks(f"vLLM allocate_slots returned None for {n} tokens")
        except OutOfBlocks:
            # The scheduler leaves it waiting and its step ends with nothing scheduled;
            # kvcheck's request is gone (nothing changed), as when the client aborts a
            # queued request: finish_requests (request_finished, free), and the next step
            # names it finished.
            self._end_step(self._empty_output())
            req.status = RequestStatus.FINISHED_ABORTED
            self.connector.request_finished(req)
            self.manager.free(req)
            out = self._empty_output()
            out.finished_req_ids = {req.request_id}
            if self._end_step(out).store_jobs:
                raise MisuseError("the end of a request that was never scheduled started a "
                                  "store") from None
            raise
        blocks = self.manager.get_blocks(req.request_id)
        self.connector.update_state_after_alloc(req, blocks, hit)
        self.requests[seq] = req
        self.finished.pop(seq, None)
        if is_async:
            req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            self._step_meta = self._end_step(self._empty_output())
            self._waiting[seq] = hit
            return hit
        req.status = RequestStatus.RUNNING
        self._step_meta = self._schedule_new(seq, req, n)
        return hit

    def _empty_output(self) -> Any:
        """A step's ``SchedulerOutput`` with nothing scheduled (``make_empty``; 0.11.x has
        none: its fields empty, as the scheduler builds an idle step's)."""
        cls = self._sched.SchedulerOutput
        if hasattr(cls, "make_empty"):
            return cls.make_empty()
        import dataclasses

        empty = {"scheduled_cached_reqs": self._sched.CachedRequestData.make_empty(),
                 "total_num_scheduled_tokens": 0, "finished_req_ids": set()}
        args = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            kind = str(f.type)
            args[f.name] = empty.get(f.name, {} if kind.startswith("dict") else
                                     [] if kind.startswith("list") else None)
        return cls(**args)

    def _schedule_new(self, seq: int, req, n: int) -> Any:
        """The step that schedules ``req`` (its prefill, or its remaining token once an
        asynchronous load landed): the build names it a new request with all its block
        ids; its tokens reach the store scan at the next ``store``."""
        out = self._empty_output()
        ids = self.manager.get_blocks(req.request_id).get_block_ids()
        out.scheduled_new_reqs = [simple.SimpleOffloadTarget._new_request_data(
            self, req, tuple(list(g) for g in ids))]
        meta = self._end_step(out)
        self._unsent[seq] = n - req.num_computed_tokens
        req.num_computed_tokens = n
        return meta

    def _resume(self, seq: int, hit: int) -> None:
        """An asynchronous load landed (the worker's report: ``finished_recving``): the
        scheduler's ``_update_waiting_for_remote_kv`` -- its hit tokens computed, the last
        one recomputed when the hit is whole -- then the step that schedules the rest."""
        req = self.requests[seq]
        n = req.num_tokens
        req.num_computed_tokens = min(hit, n - 1)
        req.status = RequestStatus.RUNNING
        if self.manager.allocate_slots(req, n - req.num_computed_tokens) is None:
            raise MisuseError("no room for the token a whole hit recomputes (its blocks "
                              "are allocated)")
        self._schedule_new(seq, req, n)

    def _end_step(self, out) -> Any:
        """The step's ``build_connector_meta``; the worker flushes what it names
        (``jobs_to_flush``: it waits for those copies before the step's forward pass,
        reported later, when kvcheck's driver completes them)."""
        if self._scan_names_all:
            meta = self._build_naming_all(out)
        else:
            meta = self.connector.build_connector_meta(out)
        for event in meta.jobs_to_flush or ():
            self._flushed.add(event)
        return meta

    def _build_naming_all(self, out) -> Any:
        """0.21.0 / 0.22.x's ``build_connector_meta``, whose store scan reads the scheduled tokens
        of every request the step names. A request named only for its new block ids (an
        admission, an append: kvcheck leaves their tokens to the next ``store``) is
        given none, and the tokens the scan already covered (its next block to store):
        the scan finds nothing new, as 0.23.0's, which skips it."""
        reqs = {r.req_id for r in out.scheduled_new_reqs}
        reqs.update(out.scheduled_cached_reqs.req_ids or ())
        kept = {}
        for rid in reqs - set(out.num_scheduled_tokens):
            req, stored = self._scan_position(rid)
            if req is None:
                continue
            kept[rid] = (req, req.num_computed_tokens)
            req.num_computed_tokens = stored * self.block_size
            out.num_scheduled_tokens[rid] = 0
        try:
            return self.connector.build_connector_meta(out)
        finally:
            for req, n in kept.values():
                req.num_computed_tokens = n

    def _scan_position(self, rid: str) -> tuple:
        """The connector's request ``rid`` and the next block its scan would store (None,
        0 for one it does not track): its offloading state's (0.20.0 on), or 0.19.x's
        ``_requests`` / ``_next_stored_block_idx``."""
        statuses = getattr(self.connector, "_req_status", None)
        if statuses is None:
            return (self.connector._requests.get(rid),
                    self.connector._next_stored_block_idx.get(rid, 0))
        status = statuses.get(rid)
        if status is None:
            return None, 0
        return status.req, status.group_states[0].next_stored_block_idx

    def allocate(self, seq: int, tokens: Sequence[int]) -> None:
        req = self._new_request(seq, tokens)
        self._admit(seq, req, lookup=False)

    def load(self, seq: int, tokens: Sequence[int]):
        req = self._new_request(seq, tokens)
        hit = self._admit(seq, req, lookup=True)
        if not hit:
            return None
        meta = self._step_meta
        (event,) = meta.load_jobs  # (one request admitted: one load job)
        transfer = meta.load_jobs[event]
        if getattr(transfer, "sync", False) == (seq in self._waiting):
            raise MisuseError("a load's sync flag disagrees with the scheduler's answer")
        job = f"load {event}"
        src, dst = _specs(transfer)
        self._jobs[job] = (seq, event, "load", [int(c) for c in src.block_ids],
                           [int(b) - 1 for b in dst.block_ids])
        return job

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
        ids = tuple(list(g) for g in new.get_block_ids())
        out = self._empty_output()
        if any(ids):  # (the step's new block ids; its token to the next store)
            cached = out.scheduled_cached_reqs
            cached.req_ids = [req.request_id]
            cached.new_block_ids = [ids]
            cached.new_token_ids = [[]]
            cached.num_computed_tokens = [length - self._unsent[seq]]
            if hasattr(cached, "num_output_tokens"):
                cached.num_output_tokens = [len(req._output_token_ids)]
            if hasattr(cached, "resumed_from_preemption"):  # (0.11.x: a flag per request)
                cached.resumed_from_preemption = [False]
        self._end_step(out)
        req.num_computed_tokens = length + 1
        self._unsent[seq] += 1
        table = self.table(seq)[1]
        return table[length // self.block_size], length % self.block_size

    def store(self, seq: int):
        """A step that schedules ``seq`` alone, its tokens since the last store: its
        ``build_connector_meta``, whose store scan may start a store job."""
        req = self._live(seq)
        tokens = self._unsent[seq]
        if not tokens:
            return None
        out = self._empty_output()
        rid = req.request_id
        req.num_computed_tokens -= tokens  # (the scheduler's view before the step)
        cached = out.scheduled_cached_reqs
        cached.req_ids = [rid]
        cached.new_block_ids = [None]
        cached.new_token_ids = [[]]
        cached.num_computed_tokens = [req.num_computed_tokens]
        if hasattr(cached, "num_output_tokens"):
            cached.num_output_tokens = [len(req._output_token_ids)]
        if hasattr(cached, "resumed_from_preemption"):  # (0.11.x)
            cached.resumed_from_preemption = [False]
        out.num_scheduled_tokens = {rid: tokens}
        out.total_num_scheduled_tokens = tokens
        try:
            meta = self._end_step(out)
        finally:
            req.num_computed_tokens += tokens
        self._unsent[seq] = 0
        return self._take_store(meta, seq)

    def complete(self, job, ok: bool) -> None:
        if job not in self._jobs:
            raise MisuseError(f"unknown job {job!r}")
        if not ok and "store" not in self.failures:
            raise MisuseError("the offloading worker reports no failed job")
        if not ok and self._jobs[job][2] != "store":
            raise MisuseError("a failed load is not driven (the scheduler's recompute)")
        seq, event, kind, _, dst = self._jobs.pop(job)
        self._flushed.discard(event)
        self._report(event, ok)  # (and the request in the worker's finished_recving:)
        if kind == "load" and seq in self._waiting:
            self._resume(seq, self._waiting.pop(seq))
        elif kind == "load" and seq in self._delayed:  # a finished request: _free_blocks
            self.manager.free(self._delayed.pop(seq))
        if kind == "store" and ok:
            for c in dst:
                self._published[c] = event

    def _report(self, event: int, ok: bool = True) -> None:
        """The worker's report: ``OffloadingWorkerMetadata({event: 1})`` (one worker); a
        failed job (0.34.0) in its ``failed_jobs`` too."""
        failed = {} if ok else {"failed_jobs": {event}}
        worker = self._common.OffloadingWorkerMetadata(completed_jobs={event: 1}, **failed)
        self.connector.update_connector_output(
            self._outputs.KVConnectorOutput(kv_connector_worker_meta=worker))

    def admits(self, op) -> bool:
        """Everything but (module doc): a store of a request whose load is still pending,
        the end of one whose load is synchronous, and a load while a store is pending."""
        loading = any(kind == "load" and s == op.seq for s, _, kind, _, _ in self._jobs.values())
        if op.kind == "store":
            return not loading
        if op.kind == "free":
            return not loading or op.seq in self._waiting
        if op.kind == "load":
            hits, wait = self._probe(op.tokens)
            # before 0.33.0: every hit loads asynchronously, a partial one with blocks
            # for its hit tokens alone while it waits (kvcheck's load holds them all)
            return not wait and (self._sync_loads or not hits
                                 or hits * self.block_size == len(op.tokens))
        if op.kind == "allocate" and not self._lookup_skips:
            # 0.23.0 looks up even a request that skips the prefix cache: kvcheck's
            # allocate is one whose lookup finds nothing
            return self._probe(op.tokens) == (0, False)
        return True

    def _probe(self, tokens) -> tuple[int, bool]:
        """The connector's lookup of a request of ``tokens``, read-only: its leading
        ready chunks, and whether it could defer (a chunk among them still being
        stored: ``HIT_PENDING``, 0.21.0 .. 0.24.0's ``None``). The request's keys (the
        release's block hasher, ``make_offload_key``) against the CPU manager's policy,
        up to its first miss (where ``_maximal_prefix_lookup`` stops)."""
        if not tokens:
            return 0, False
        probe = OffloadRequest("probe", list(tokens), self._hasher)
        chunks = dict(self._chunks().values())  # key -> ChunkStatus
        for hits, block_hash in enumerate(probe.block_hashes):
            chunk = chunks.get(self._make_key(block_hash, 0))
            if chunk is None:
                return hits, False
            if chunk.ref_cnt < 0:
                return hits, True
        return len(probe.block_hashes), False

    def free(self, seq: int):
        """``finish_requests``: ``request_finished`` and the blocks freed -- or, for a
        request waiting for its asynchronous load, kept until the load reports
        (``delay_free_blocks``: the scheduler's pin, ``pins``) -- then the finish step."""
        req = self._live(seq)
        req.status = RequestStatus.FINISHED_ABORTED
        self.connector.request_finished(req)
        if self._waiting.pop(seq, None) is not None:
            self._delayed[seq] = req
        else:
            self.manager.free(req)
        del self.requests[seq]
        self._unsent.pop(seq, None)
        self.finished[seq] = req
        # The next step (nothing scheduled) names it finished: its final store scan.
        out = self._empty_output()
        out.finished_req_ids = {req.request_id}
        return self._take_store(self._end_step(out), seq)

    def _take_store(self, meta, seq: int):
        got = None
        for event, transfer in meta.store_jobs.items():
            if got is not None:
                raise MisuseError("one step's build started two store jobs for one request")
            got = f"store {event}"
            src, dst = _specs(transfer)
            self._jobs[got] = (seq, event, "store", [int(b) - 1 for b in src.block_ids],
                               [int(c) for c in dst.block_ids])
        return got

    def _live(self, seq: int):
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- observation ------------------------------------------------------------------------
    def pools(self) -> dict:
        return {"device": self.num_blocks, "host": self.host_blocks}

    def _chunks(self) -> dict:
        """CPU chunk id -> (key, ChunkStatus) of every chunk the policy holds."""
        policy = self.cpu._policy
        held = (policy.chunks if hasattr(policy, "chunks") else policy.blocks
                if hasattr(policy, "blocks") else {**policy.t1, **policy.t2})
        # (LRU: chunks, 0.21.0 .. 0.24.0: blocks; ARC: T1, T2)
        return {(c.chunk_id if hasattr(c, "chunk_id") else c.block_id): (k, c)
                for k, c in held.items()}  # (to 0.29.0: BlockStatus records)

    def refcount(self, pool: str, b: int) -> int:
        if pool == "device":
            return self.pool.blocks[b + 1].ref_cnt
        got = self._chunks().get(b)
        if got is None:
            return 0
        _, chunk = got
        # a pending store's destination: the job's reference; a ready one: the cache's
        # and one per load reading it
        return 1 if chunk.ref_cnt < 0 else 1 + chunk.ref_cnt

    def free_blocks(self, pool: str) -> list[int]:
        if pool == "device":
            return [b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks()]
        cpu = self.cpu
        fresh = range(cpu._num_allocated_chunks if hasattr(cpu, "_num_allocated_chunks")
                      else cpu._num_allocated_blocks, self.host_blocks)
        return list(self.cpu._free_list) + list(fresh)

    def num_free(self, pool: str) -> int | None:
        return self.pool.get_num_free_blocks() if pool == "device" else None

    def table(self, seq: int):
        req = self.requests.get(seq)
        if req is None:
            raise KeyError(seq)
        blocks = self.manager.coordinator.single_type_managers[0].req_to_blocks.get(
            req.request_id, [])
        return "device", [b.block_id - 1 for b in blocks]

    def pins(self, pool: str) -> dict:
        """The scheduler's delayed frees: a finished request's blocks kept until its
        asynchronous load reports."""
        if pool != "device":
            return {}
        coord = self.manager.coordinator.single_type_managers[0].req_to_blocks
        return {f"delayed free {req.request_id}": [b.block_id - 1 for b in
                                                   coord.get(req.request_id, [])]
                for req in self._delayed.values()}

    def live_seqs(self) -> list[int]:
        return list(self.requests)

    def pending_jobs(self) -> dict:
        out = {}
        for job, (seq, _event, kind, src, dst) in self._jobs.items():
            if kind == "store":
                out[job] = {"kind": "store", "seq": seq, "src": ("device", src),
                            "dst": ("host", dst), "holds_src": False,
                            "flushed": _event in self._flushed}
            else:
                out[job] = {"kind": "load", "seq": seq, "src": ("host", src),
                            "dst": ("device", dst), "holds_dst": False}
        return out

    def cache_entries(self, pool: str) -> list:
        if pool != "host":
            return []
        return [((key, self._published.get(c)), c) for c, (key, chunk) in self._chunks().items()
                if chunk.ref_cnt >= 0]

    def evictable_blocks(self, pool: str) -> list:
        if pool != "host":
            return []
        return [c for c, (_, chunk) in self._chunks().items() if chunk.ref_cnt == 0]

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


class RequestKeyedTarget(NativeOffloadTarget):
    """0.11.0 .. 0.20.2: the connector keyed by request (module doc). The worker names a
    request in ``finished_sending`` only once the request has finished and all its stores
    landed, and only then does the scheduler publish the request's chunks and free the
    blocks it kept for them (``request_finished`` answers True: a delayed free). A store
    started while its request runs could not complete before the request's end, while
    kvcheck's driver completes a pending job whenever it chooses: ``store(seq)`` is never
    issued (``admits``), and every store is the scan of a request's last step, which
    ``free`` starts and returns -- one per request, which ``finished_sending`` completes
    exactly. Its job holds its sources (the request's references pass to it: the
    scheduler's delayed free); the request's other blocks (a partial last block, hits
    already cached) are the delayed free's pin (``pins``) until the same report. A load is
    one job per request (``reqs_to_load``), completed by ``finished_recving``; every hit is
    asynchronous. The lookup answers False for a chunk still being stored (a miss)."""
    capabilities = frozenset({"allocate", "append", "free", "store", "load", "complete"})

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 version: str | None = None, policy: str = "lru"):
        if num_blocks < 1 or block_size < 1 or host_blocks < 1:
            raise MisuseError("num_blocks, block_size and host_blocks must be positive")
        import inspect

        self.num_blocks, self.block_size, self.host_blocks = num_blocks, block_size, host_blocks
        mods = load(version)
        self.version = mods.dist.version
        iface = mods["vllm.v1.kv_cache_interface"]
        utils = mods["vllm.v1.core.kv_cache_utils"]
        self._sched = mods["vllm.v1.core.sched.output"]
        self._outputs = mods["vllm.v1.outputs"]
        abstract = mods["vllm.v1.kv_offload.abstract"]
        # (0.19.x: a block's key is its hash; 0.20.x: its hash and group, make_offload_key)
        self._make_key = getattr(abstract, "make_offload_key", lambda block_hash, _g: block_hash)
        sha256 = vllm_v1.hash_fn(mods)  # (0.11.0: the vllm.utils module's)
        torch = mods["torch"]
        full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                       dtype=torch.float16)
        page = 2 * block_size * 2
        config = iface.KVCacheConfig(
            num_blocks=num_blocks + 1,
            kv_cache_tensors=[_kv_tensor(iface, (num_blocks + 1) * page, page)],
            kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full)])
        utils.init_none_hash(sha256)
        cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
        kwargs = {"max_model_len": 1 << 20, "scheduler_block_size": block_size,
                  "hash_block_size": block_size, "enable_caching": False}
        params = inspect.signature(cls.__init__).parameters
        self.manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
        self._hasher = utils.get_request_block_hasher(block_size, sha256)
        self.pool = self.manager.block_pool
        self.legacy = True  # (the spec from vllm_config; BlockStatus records)
        self._lookup_skips = False  # (the lookup ignores skip_reading_prefix_cache)
        self._scan_names_all = True  # (the scan walks yield_req_data)
        self._sync_loads = False  # (every hit is an asynchronous load)
        if ONE_FILE in mods.files:  # (0.11.0 .. 0.18.1: a manager over a CPU backend)
            if policy != "lru" and "vllm.v1.kv_offload.arc_manager" not in mods.files:
                raise MisuseError(f"vllm {self.version} has no ARC offloading manager "
                                  f"(kv_offload/arc_manager.py, from 0.11.1)")
            backend = mods["vllm.v1.kv_offload.backends.cpu"].CPUBackend
            kind = ("vllm.v1.kv_offload.lru_manager", "LRUOffloadingManager") if (
                policy == "lru") else ("vllm.v1.kv_offload.arc_manager", "ARCOffloadingManager")
            cpu = types.SimpleNamespace(CPUOffloadingManager=lambda **a: getattr(
                mods[kind[0]], kind[1])(backend=backend(block_size=block_size,
                                                        num_blocks=host_blocks),
                                        enable_events=False))
            self._cpu_args = {}
            sched = mods[ONE_FILE].OffloadingConnectorScheduler
        else:
            cpu = mods["vllm.v1.kv_offload.cpu.manager"]
            params = inspect.signature(cpu.CPUOffloadingManager.__init__).parameters
            self._cpu_args = {"num_blocks": host_blocks, "cache_policy": policy,
                              "enable_events": False,  # (0.19.x: its offloaded block size)
                              **({"block_size": block_size} if "block_size" in params else {})}
            sched = mods[CONNECTOR + ".scheduler"].OffloadingConnectorScheduler
        spec = _cpu_spec(mods["vllm.v1.kv_offload.spec"], cpu, self._cpu_args)
        # (to 0.12.x the spec takes the engine's config alone: its KV-cache config is the
        # engine's, the block size the config's)
        takes_kv = "kv_cache_config" in inspect.signature(spec.__init__).parameters
        self.connector = sched(spec(_settings(block_size), *([config] if takes_kv else [])))
        # (``request_finished(request, block_ids)``: the scheduler passes the request's
        # block ids, ``_connector_finished``; the shared code below passes the request)
        finished = self.connector.request_finished
        self.connector.request_finished = lambda req, ids=None: finished(
            req, self.manager.get_block_ids(req.request_id)[0] if ids is None else ids)
        self._init_state()
        self._stored_by: dict[int, Any] = {}  # seq -> finished request its store keeps

    def _chunks(self) -> dict:
        """CPU block id -> (key, BlockStatus): the policy's (0.19.0 on) or the manager's
        own (0.11.0 .. 0.18.1: LRU ``blocks``, ARC ``t1`` / ``t2``)."""
        policy = getattr(self.cpu, "_policy", self.cpu)
        held = policy.blocks if hasattr(policy, "blocks") else {**policy.t1, **policy.t2}
        return {c.block_id: (k, c) for k, c in held.items()}

    def free_blocks(self, pool: str) -> list[int]:
        if pool == "device" or hasattr(self.cpu, "_free_list"):
            return super().free_blocks(pool)
        backend = self.cpu.backend  # (0.11.0 .. 0.18.1)
        return list(backend.allocated_blocks_free_list) + list(
            range(backend.num_allocated_blocks, self.host_blocks))

    def _end_step(self, out) -> Any:
        meta = self._build_naming_all(out)  # (reqs_to_flush: preempted requests only)
        meta.store_jobs, meta.load_jobs, meta.jobs_to_flush = (
            meta.reqs_to_store, meta.reqs_to_load, None)  # (NativeOffloadTarget's names)
        return meta

    def load(self, seq, tokens):
        req = self._new_request(seq, tokens)
        hit = self._admit(seq, req, lookup=True)
        if not hit:
            return None
        meta = self._step_meta
        (rid,) = meta.reqs_to_load
        src, dst = meta.reqs_to_load[rid]
        job = f"load {rid}"
        self._jobs[job] = (seq, rid, "load", [int(c) for c in src.block_ids],
                           [int(b) - 1 for b in dst.block_ids])
        return job

    def _take_store(self, meta, seq):
        got = None
        for rid, (src, dst) in meta.reqs_to_store.items():
            if got is not None:
                raise MisuseError("one step's build started two stores")
            got = f"store {rid}"
            self._jobs[got] = (seq, rid, "store", [int(b) - 1 for b in src.block_ids],
                               [int(c) for c in dst.block_ids])
        return got

    def free(self, seq):
        """The request's last step (its scan of the tokens since its admission: the store
        the job is), then ``request_finished`` (True while a store is pending: the
        scheduler keeps its blocks until ``finished_sending``), then the finish step."""
        req = self._live(seq)
        job = None
        if seq not in self._waiting:
            job = NativeOffloadTarget.store(self, seq)
        req.status = RequestStatus.FINISHED_ABORTED
        block_ids = self.manager.get_block_ids(req.request_id)[0]
        delay, _ = self.connector.request_finished(req, block_ids)
        if self._waiting.pop(seq, None) is not None:
            self._delayed[seq] = req
        elif delay:
            self._stored_by[seq] = req
        else:
            self.manager.free(req)
        del self.requests[seq]
        self._unsent.pop(seq, None)
        self.finished[seq] = req
        out = self._empty_output()
        out.finished_req_ids = {req.request_id}
        if self._end_step(out).reqs_to_store:
            raise MisuseError("the finish step started a store")
        return job

    def complete(self, job, ok):
        if job not in self._jobs:
            raise MisuseError(f"unknown job {job!r}")
        if not ok:
            raise MisuseError("the offloading worker reports no failed job")
        seq, rid, kind, _, dst = self._jobs.pop(job)
        if kind == "store":  # the worker's finished_sending {req}; the scheduler frees
            self.connector.update_connector_output(
                self._outputs.KVConnectorOutput(finished_sending={rid}))
            kept = self._stored_by.pop(seq, None)
            if kept is not None:
                self.manager.free(kept)
            for c in dst:
                self._published[c] = rid
            return
        self.connector.update_connector_output(
            self._outputs.KVConnectorOutput(finished_recving={rid}))
        if seq in self._waiting:
            self._resume(seq, self._waiting.pop(seq))
        elif seq in self._delayed:
            self.manager.free(self._delayed.pop(seq))

    def admits(self, op) -> bool:
        if op.kind == "store":
            return False  # (every store is the last step's, started by free: module doc)
        return super().admits(op)

    def _probe(self, tokens):
        """The lookup, read-only: leading ready chunks (a chunk still being stored is a
        miss here: ``lookup`` answers False, never None)."""
        if not tokens:
            return 0, False
        probe = OffloadRequest("probe", list(tokens), self._hasher)
        chunks = dict(self._chunks().values())
        for hits, block_hash in enumerate(probe.block_hashes):
            chunk = chunks.get(self._make_key(block_hash, 0))
            if chunk is None or chunk.ref_cnt < 0:
                return hits, False
        return len(probe.block_hashes), False

    def pending_jobs(self):
        out = super().pending_jobs()
        for d in out.values():
            if d["kind"] == "store":  # (the request's references, kept by the delayed free)
                d["holds_src"] = d["seq"] in self._stored_by
                d.pop("flushed", None)
        return out

    def pins(self, pool):
        out = super().pins(pool)
        if pool != "device":
            return out
        coord = self.manager.coordinator.single_type_managers[0].req_to_blocks
        srcs = {s: src for s, _e, kind, src, _d in self._jobs.values() if kind == "store"}
        for seq, req in self._stored_by.items():
            rest = [b.block_id - 1 for b in coord.get(req.request_id, [])]
            for b in srcs.get(seq, ()):
                rest.remove(b)
            if rest:
                out[f"delayed free {req.request_id}"] = rest
        return out


def make(num_blocks: int, block_size: int, host_blocks: int,
         version: str | None = None) -> NativeOffloadTarget:
    """vLLM's OffloadingConnector (scheduler side) with its CPU manager (LRU)."""
    return _target(version)(num_blocks, block_size, host_blocks, version)


def make_arc(num_blocks: int, block_size: int, host_blocks: int,
             version: str | None = None) -> NativeOffloadTarget:
    """The same with the CPU manager's ARC policy (``eviction_policy: arc``)."""
    return _target(version)(num_blocks, block_size, host_blocks, version, policy="arc")


def _target(version: str | None) -> type:
    """``RequestKeyedTarget`` for 0.11.0 .. 0.20.2's layouts, ``NativeOffloadTarget``
    otherwise (which refuses a release it does not adapt)."""
    root = _loader.require(install.select(simple.ENGINE_KEY, version))
    return RequestKeyedTarget if keyed_by_request(root) else NativeOffloadTarget
