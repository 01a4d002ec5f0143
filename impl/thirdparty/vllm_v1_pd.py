"""Adapter: the prefill side of vLLM v1's disaggregated prefill -- the NIXL connector's
scheduler half with the scheduler's delayed free, over the release's own
``KVCacheManager`` -- as a target of the tiers model (``kvcheck verify-tiers
vllm-v1-pd@0.33.0``; protocol: docs/tiers.md).

Releases: vLLM 0.33.0 and 0.34.0 (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``
with the pull scheduler ``pull_scheduler.py`` over ``base_scheduler.py``; earlier releases
keep the connector in one ``nixl_connector.py``, not adapted). 0.34.0's ``_free_request``
also calls ``_unreserve_parked`` (a parked async load's cached reservation, none on the
prefill side): the release's own method, loaded where it is defined
(``LATER_SCHEDULER_METHODS``).

Why NIXL: its scheduler half (``NixlPullConnectorScheduler``) is self-contained -- block
ids in, block ids and a send deadline out, no transport in the scheduler process (the
handshake listener thread starts only from ``set_xfer_handshake_metadata``, which kvcheck
never calls). The example connector never delays a free (the base class answers
``(False, None)``); Mooncake's and LMCache's scheduler halves carry a transfer engine or an
LMCache engine with them.

Who owns the delayed free, in 0.33.0: the *scheduler*. The connector only answers
``request_finished`` with ``delay_free_blocks`` (True for a prefill finished normally,
``FINISHED_LENGTH_CAPPED`` / ``STOPPED``, with blocks; False for an abort) and names the
request in the next step's ``reqs_to_send``; ``Scheduler._free_request`` then keeps the
request in ``self.requests`` with its blocks, and ``Scheduler._update_from_kv_xfer_finished``
frees them (``_free_blocks``) when the worker reports ``finished_sending``. So this adapter
runs the release's own ``Scheduler`` methods for it: ``_free_request``,
``_connector_finished``, ``_free_blocks``, ``_free_request_blocks``,
``_request_blocks_can_be_freed``, ``_set_kv_fetch_stage`` and
``_update_from_kv_xfer_finished`` are parsed from the release's
``vllm/v1/core/sched/scheduler.py`` (their ``def``s alone, nothing else of that module is
executed) and called on ``_SchedulerShell``, which holds exactly the attributes they read.

What runs (``_loader``, never imported as ``vllm``): ``vllm_v1.FILES`` (the KV-cache
manager), ``nixl/{base_scheduler, pull_scheduler, metadata}.py``, ``sched/output.py``, and
the scheduler methods above.

Stand-ins, in one place (``PD_STUBS`` on top of the sibling adapters' ``vllm_v1.STUBS``,
``vllm_v1_offload.OFFLOAD_STUBS`` and ``vllm_v1_native_offload.NATIVE_STUBS``; and the
objects below), each with why it cannot change what is decided about a block:

``msgspec``, ``zmq``, ``nixl/utils.py``'s ``zmq_ctx``, ``utils/network_utils``
    the handshake listener's serialisation and sockets (``_nixl_handshake_listener``,
    started only by ``set_xfer_handshake_metadata``, never called): unreachable here.
``vllm.envs`` (``vllm_v1``'s, plus)
    ``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``PORT``: copied into the returned transfer params.
``vllm.platforms``
    ``current_platform.device_type = "cuda"`` (with ``kv_buffer_device = "cuda"``: no host
    buffer, the worker reads GPU blocks directly -- the common deployment).
``kv_connector/utils.py`` (``vllm_v1_offload``'s, plus)
    ``BlockIds``, ``EngineId`` (type aliases) and ``clip_ssm_state_blocks`` (the
    release's own function, executed alone); the real module imports torch and the
    attention backends.
``kv_connector/v1/base.py`` (``vllm_v1_offload``'s, plus)
    ``KVConnectorHandshakeMetadata``: a base class of the handshake record.
``VllmConfig`` (``_settings``)
    a ``_loader.Settings`` (one it does not hold is kvcheck's gap: one line, exit 2):
    world size 1, block size, a KV producer (``is_kv_producer``), every extra config at
    the connector's defaults (lease 30 s), no hash lookahead tokens, hybrid allocator
    allowed.
``Request`` (``vllm_v1_native_offload.OffloadRequest``)
    plus ``kv_transfer_params = {"do_remote_decode": True}`` (every request is a prefill
    for a remote decoder: the proxy's first leg).
the connector (``_NixlConnector``)
    ``NixlConnector``'s scheduler-side methods, each of which only forwards to its
    ``connector_scheduler`` (``nixl/connector.py``: a ``SupportsHMA`` connector, so the
    scheduler calls ``request_finished_all_groups``); the real class's ``__init__`` builds
    the worker half (torch, the NIXL agent).
the scheduler's other parts (``_SchedulerShell``, a ``_loader.StandIn``)
    no encoder cache (``encoder_cache_manager.free`` a no-op: no multimodal input), no aux
    output or EC connector, no fetch-stage metrics, no deferred block free
    (``defer_block_free`` False: no async scheduling), no per-client finished sets, no
    async load parked or aborted (0.34.0's ``_parked_reservations``, ``_aborted_kv_loads``:
    a prefill loads nothing).
the worker, the NIXL agent and the remote decoder
    kvcheck's driver: ``complete(job, ok)`` is the worker's ``finished_sending`` report in
    a ``KVConnectorOutput``. ``ok``: the decoder read the blocks (its notification);
    ``not ok``: it never did and the lease (``kv_lease_duration``) expired -- the worker
    reports the request in ``finished_sending`` then too (``pull_worker``'s expiry), so
    both are the same report to the scheduler.

How the scheduler drives it, one tiers operation per engine step:

``allocate(seq, tokens)``
    ``on_new_request``; the lookup (``get_num_new_matched_tokens``: a prefill has no
    remote tokens, ``(0, False)``); ``allocate_slots``; ``update_state_after_alloc`` (the
    request joins ``reqs_in_batch``); the step's ``build_connector_meta``. Its tokens are
    computed.
``append(seq, token)``
    a generated token: ``allocate_slots(req, 1)``, the step's ``build_connector_meta``.
``free(seq)``
    the request ends: ``FINISHED_LENGTH_CAPPED`` once it generated a token (the proxy's
    ``max_tokens=1`` prefill), ``FINISHED_ABORTED`` before that (a client abort during
    prefill). The release's ``Scheduler._free_request``: ``request_finished_all_groups``
    with the computed tokens' block ids; a delayed free keeps the blocks, and the finish
    step's ``build_connector_meta`` names the request in ``reqs_to_send``: the send job
    ``free`` returns (kind ``send``: sources the ``remote_block_ids`` the connector
    returned, held by the job until the worker reports; the request's other blocks, if
    any, by the scheduler's pin ``delayed free <request>``).
``complete(job, ok)``
    ``Scheduler._update_from_kv_xfer_finished(KVConnectorOutput(finished_sending=
    {request}))``: ``_free_blocks``.

No store, load or host pool: the send's destination is the remote decoder's memory, which
kvcheck does not see (the job's ``dst`` is ``("remote", [])``). The decode side (a remote
prefill's receive, ``finished_recving``) is ``vllm_v1_pd_recv``: a load from the
``remote`` pseudo pool, over this class.

``broken=True`` (``make_early_free``): the delayed free ignored -- the blocks go back to
the pool at ``request_finished`` while the send still reads them (the bug family's "read
after reuse"); ``tests/thirdparty/test_vllm_v1_pd.py`` shows it caught.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections.abc import Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, vllm_v1
from . import vllm_v1_native_offload as native
from . import vllm_v1_offload as simple
from ._loader import Loaded
from .vllm_v1 import RequestStatus

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
SCHEDULER = "vllm.v1.core.sched.scheduler"
PD_FILES = ("vllm.v1.core.sched.output", NIXL + ".base_scheduler", NIXL + ".pull_scheduler",
            NIXL + ".metadata", "vllm.v1.metrics.cache_hit_source")
# The release's own Scheduler methods the delayed free runs through (module doc).
SCHEDULER_METHODS = ("_free_request", "_connector_finished", "_free_blocks",
                     "_free_request_blocks", "_request_blocks_can_be_freed",
                     "_set_kv_fetch_stage", "_update_from_kv_xfer_finished")
# ... and those a later release's ``_free_request`` calls too, loaded where the release
# defines them: 0.34.0's ``_unreserve_parked`` (drops a parked async load's cached block
# reservation; the prefill side parks none, so it drops nothing here, as in the engine).
LATER_SCHEDULER_METHODS = ("_unreserve_parked",)
WHERE = "impl/thirdparty/vllm_v1_pd.py"  # (names this adapter in a stand-in's gap)


def _unreachable_module(what: str):
    def build(mod: types.ModuleType, _: Loaded) -> None:
        def __getattr__(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return vllm_v1.unreachable(f"{what} ({name})")

        mod.__getattr__ = __getattr__
    return build


def _stub_envs(mod: types.ModuleType, loaded: Loaded) -> None:
    vllm_v1.STUBS["vllm.envs"](mod, loaded)
    mod.VLLM_NIXL_SIDE_CHANNEL_HOST = "localhost"
    mod.VLLM_NIXL_SIDE_CHANNEL_PORT = 5600


def _stub_platforms(mod: types.ModuleType, loaded: Loaded) -> None:
    vllm_v1.STUBS["vllm.platforms"](mod, loaded)
    mod.current_platform.device_type = "cuda"


def _stub_connector_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    simple.OFFLOAD_STUBS[simple.UTILS](mod, loaded)
    mod.EngineId = str
    mod.BlockIds = tuple[list[int], ...] | list[list[int]]
    ns = {"__builtins__": mod.__dict__["__builtins__"], "__name__": mod.__name__}
    mod.clip_ssm_state_blocks = simple.release_function(
        loaded, mod.__kvcheck_real_name__, "clip_ssm_state_blocks", ns)


def _stub_connector_base(mod: types.ModuleType, loaded: Loaded) -> None:
    simple.OFFLOAD_STUBS["vllm.distributed.kv_transfer.kv_connector.v1.base"](mod, loaded)

    class KVConnectorHandshakeMetadata:  # a base class of the handshake record
        pass

    mod.KVConnectorHandshakeMetadata = KVConnectorHandshakeMetadata


PD_STUBS = {
    "msgspec": _unreachable_module("the handshake listener's msgspec"),
    "zmq": _unreachable_module("the handshake listener's zmq"),
    NIXL + ".utils": _unreachable_module("the handshake listener's sockets"),
    "vllm.utils.network_utils": _unreachable_module("the handshake listener's address"),
    "vllm.envs": _stub_envs,
    "vllm.platforms": _stub_platforms,
    simple.UTILS: _stub_connector_utils,
    "vllm.distributed.kv_transfer.kv_connector.v1.base": _stub_connector_base,
}


def load(version: str | None = None) -> Loaded:
    dist = install.select(simple.ENGINE_KEY, version)
    root = _loader.require(dist)
    if not (root / (NIXL.replace(".", "/") + "/pull_scheduler.py")).is_file():
        raise MisuseError(f"{dist.dist} {dist.version}: the NIXL connector is adapted in "
                          f"0.33.0's layout only ({NIXL}.pull_scheduler)")
    files = tuple(f for f in vllm_v1.FILES + PD_FILES
                  if (root / (f.replace(".", "/") + ".py")).is_file())
    stubs = {**vllm_v1.STUBS, **simple.OFFLOAD_STUBS, **native.NATIVE_STUBS, **PD_STUBS}
    return _loader.load(dist, files, stubs,
                        entry=("vllm.v1.core.kv_cache_manager", NIXL + ".pull_scheduler"))


def _scheduler_methods(loaded: Loaded, namespace: dict,
                       required: Sequence[str] = SCHEDULER_METHODS,
                       later: Sequence[str] | None = None) -> dict:
    """The release's own ``Scheduler`` methods named in ``required`` (``SCHEDULER_METHODS``;
    and those of ``later``, ``LATER_SCHEDULER_METHODS``, it defines): their ``def``s alone,
    parsed from its ``scheduler.py`` (once per release and process: parsing it was nine
    tenths of building a target, and a shrink builds hundreds) and executed in
    ``namespace`` (``_loader.exec_methods``)."""
    later = LATER_SCHEDULER_METHODS if later is None else later
    path = loaded.root / (SCHEDULER.replace(".", "/") + ".py")
    return _loader.exec_methods(path, "Scheduler", required, namespace, optional=later)


def _settings(block_size: int, producer: bool = True) -> Any:
    """The ``VllmConfig`` fields the connector and the scheduler methods read: a
    ``_loader.Settings``, so a setting a later release reads and this one lacks ends the
    run with one line and exit 2 (``StandInMissing``), never a crash blamed on vLLM.
    ``producer``: a prefill instance (``kv_producer``), else a decode one (``kv_consumer``,
    vllm_v1_pd_recv)."""
    def ns(path: str, **values) -> _loader.Settings:
        return _loader.Settings(path, WHERE, **values)

    transfer = ns("vllm_config.kv_transfer_config", is_kv_producer=producer,
                  kv_buffer_device="cuda",
                  kv_role="kv_producer" if producer else "kv_consumer",
                  get_from_extra_config=lambda _key, default: default)
    return ns("vllm_config", cache_config=ns("vllm_config.cache_config", block_size=block_size),
              parallel_config=ns("vllm_config.parallel_config", tensor_parallel_size=1,
                                 decode_context_parallel_size=1, data_parallel_index=0,
                                 pipeline_parallel_size=1, world_size=1),
              scheduler_config=ns("vllm_config.scheduler_config",
                                  disable_hybrid_kv_cache_manager=False),
              kv_transfer_config=transfer, num_prefill_lookahead_tokens=1,
              # (0.34.0: read where a prefill's prompt is truncated for the decoder; 0
              # without EAGLE drafting, as VllmConfig resolves it)
              num_hash_lookahead_tokens=0)


class _EncoderCache(_loader.StandIn):
    """The scheduler's encoder cache manager: ``free`` does nothing (kvcheck's requests
    carry no multimodal input)."""

    WHERE = WHERE

    def free(self, _request) -> None:
        pass


class PDTarget:
    """A tiers target over the release's ``KVCacheManager``, ``NixlPullConnectorScheduler``
    and the ``Scheduler``'s delayed free (module docstring)."""

    capabilities = frozenset({"allocate", "append", "free", "complete"})
    failures = frozenset({"send"})  # (the lease expired unread: the same report)
    PRODUCER = True  # (the prefill instance; vllm_v1_pd_recv's decode instance: False)
    METHODS: tuple[str, ...] = SCHEDULER_METHODS  # (the release's Scheduler methods run)
    LATER_METHODS: tuple[str, ...] | None = None  # (None: LATER_SCHEDULER_METHODS)

    def __init__(self, num_blocks: int, block_size: int, version: str | None = None,
                 broken: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size, self.broken = num_blocks, block_size, broken
        mods = load(version)
        self.version = mods.dist.version
        iface = mods["vllm.v1.kv_cache_interface"]
        utils = mods["vllm.v1.core.kv_cache_utils"]
        self._sched = mods["vllm.v1.core.sched.output"]
        self._outputs = mods["vllm.v1.outputs"]
        sha256 = mods["vllm.utils.hashing"].sha256
        torch = mods["torch"]
        full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                       dtype=torch.float16)
        page = 2 * block_size * 2
        config = iface.KVCacheConfig(
            num_blocks=num_blocks + 1,
            kv_cache_tensors=[iface.KVCacheTensor(size=(num_blocks + 1) * page,
                                                  layers=["layer.0"], layer_stride=0,
                                                  block_stride=page)],
            kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full)])
        utils.init_none_hash(sha256)
        cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
        kwargs = {"max_model_len": 1 << 20, "scheduler_block_size": block_size,
                  "hash_block_size": block_size, "enable_caching": False}
        import inspect

        params = inspect.signature(cls.__init__).parameters
        self.manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
        self._hasher = utils.get_request_block_hasher(block_size, sha256)
        self.pool = self.manager.block_pool
        settings = _settings(block_size, self.PRODUCER)
        pull = mods[NIXL + ".pull_scheduler"].NixlPullConnectorScheduler

        class SupportsHMA:  # (the scheduler's isinstance test: NixlConnector is one)
            pass

        class _NixlConnector(SupportsHMA):
            """``NixlConnector``'s scheduler-side methods: each forwards to its
            ``connector_scheduler`` (nixl/connector.py)."""

            def __init__(c):
                c.connector_scheduler = pull(settings, "kvcheck-prefill", config)

            def get_num_new_matched_tokens(c, request, num_computed_tokens):
                return c.connector_scheduler.get_num_new_matched_tokens(
                    request, num_computed_tokens)

            def update_state_after_alloc(c, request, blocks, num_external_tokens):
                return c.connector_scheduler.update_state_after_alloc(
                    request, blocks, num_external_tokens)

            def build_connector_meta(c, scheduler_output):
                return c.connector_scheduler.build_connector_meta(scheduler_output)

            def on_new_request(c, request):
                c.connector_scheduler.on_new_request(request)

            def update_connector_output(c, connector_output):
                c.connector_scheduler.update_connector_output(connector_output)

            def request_finished(c, request, block_ids):
                return c.connector_scheduler.request_finished(request, (block_ids,))

            def request_finished_all_groups(c, request, block_ids):
                return c.connector_scheduler.request_finished(request, block_ids)

        namespace = {"__builtins__": __builtins__, "__name__": SCHEDULER, "Any": Any,
                     "Request": Any, "KVConnectorOutput": Any, "SupportsHMA": SupportsHMA,
                     "RequestStatus": RequestStatus,
                     "KV_FETCH_COMPLETED_WAITING": "completed_waiting",
                     "logger": mods["vllm.logger"].init_logger(SCHEDULER)}
        self._extend_namespace(mods, namespace)
        shell = type("_SchedulerShell", (_loader.StandIn,),
                     {**_scheduler_methods(mods, namespace, self.METHODS,
                                           self.LATER_METHODS), "WHERE": WHERE})()
        shell.connector = self.connector = _NixlConnector()
        shell.requests = {}
        shell.kv_cache_manager = self.manager
        shell.vllm_config = settings
        shell.kv_cache_config = config
        shell.aux_output_connector = shell.ec_connector = None
        shell._inflight_prefills = set()
        shell._kv_fetch_stages = None
        shell.encoder_cache_manager = _EncoderCache()
        # (0.34.0: no async load parked nor aborted -- a prefill loads nothing)
        shell._parked_reservations, shell._parked_reserved_blocks = {}, 0
        shell._aborted_kv_loads = set()
        shell._pending_encoder_input_ids = {}
        shell.finished_req_ids = set()
        shell.finished_req_ids_dict = None
        shell.defer_block_free = False
        shell.finished_recving_kv_req_ids = set()
        self.shell = shell
        self.requests: dict[int, Any] = {}
        self._jobs: dict[str, tuple[int, Any, list[int]]] = {}  # job -> seq, request, src
        self._ids = itertools.count()

    def _extend_namespace(self, mods: Loaded, namespace: dict) -> None:
        """Names the release's methods read beyond the send side's (vllm_v1_pd_recv)."""

    # -- operations ---------------------------------------------------------------------
    def _step(self) -> Any:
        meta = self.connector.build_connector_meta(self._sched.SchedulerOutput.make_empty())
        self.shell.finished_req_ids.clear()  # (the step's output named them)
        return meta

    def allocate(self, seq: int, tokens: Sequence[int]) -> None:
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a prompt has at least one token")
        req = native.OffloadRequest(f"{seq}.{next(self._ids)}", tokens, self._hasher)
        req.num_output_placeholders = 0
        req.kv_transfer_params = {"do_remote_decode": True}
        self.connector.on_new_request(req)
        hit, is_async = self.connector.get_num_new_matched_tokens(req, 0)
        if hit or is_async:
            raise MisuseError(f"a prefill's lookup answered {(hit, is_async)}")
        n = len(req.prompt_token_ids)
        if self.manager.allocate_slots(req, n) is None:
            self._step()  # (left waiting; kvcheck's request is gone: nothing changed)
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n} tokens")
        self.connector.update_state_after_alloc(req, self.manager.get_blocks(req.request_id),
                                                0)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = n
        self.shell.requests[req.request_id] = req
        self.requests[seq] = req
        self._step()

    def append(self, seq: int, token: int) -> tuple[int, int]:
        req = self._live(seq)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(token)
        if self.manager.allocate_slots(req, 1) is None:
            req._all_token_ids.pop()
            req._output_token_ids.pop()
            del req.block_hashes[hashes_before:]
            raise OutOfBlocks("vLLM allocate_slots returned None for one decode token")
        req.num_computed_tokens = length + 1
        self._step()
        table = self.table(seq)[1]
        return table[length // self.block_size], length % self.block_size

    def free(self, seq: int):
        """The request ends (module doc): the release's ``Scheduler._free_request``; a
        delayed free's send is named in the finish step's ``reqs_to_send``."""
        req = self._live(seq)
        req.status = (RequestStatus.FINISHED_LENGTH_CAPPED if req._output_token_ids
                      else RequestStatus.FINISHED_ABORTED)
        params, _ = self.shell._free_request(req)
        del self.requests[seq]
        delayed = req.request_id in self.shell.requests
        meta = self._step()
        if delayed != (req.request_id in meta.reqs_to_send):
            raise MisuseError("the scheduler's delayed free disagrees with the connector's "
                              "reqs_to_send")
        if not delayed:
            return None
        (src,) = params["remote_block_ids"]
        job = f"send {req.request_id}"
        self._jobs[job] = (seq, req, [int(b) - 1 for b in src])
        if self.broken:  # the delayed free ignored: the blocks back to the pool now
            self.manager.free(req)
        return job

    def complete(self, job, ok: bool) -> None:
        """The worker's ``finished_sending`` (read, or the lease expired: module doc)."""
        if job not in self._jobs:
            raise MisuseError(f"unknown job {job!r}")
        _, req, _ = self._jobs.pop(job)
        out = self._outputs.KVConnectorOutput(finished_sending={req.request_id})
        self.shell._update_from_kv_xfer_finished(out)

    def _live(self, seq: int):
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- observation ------------------------------------------------------------------------
    def pools(self) -> dict:
        return {"device": self.num_blocks}

    def _blocks_of(self, req) -> list[int]:
        got = self.manager.coordinator.single_type_managers[0].req_to_blocks.get(
            req.request_id, [])
        return [b.block_id - 1 for b in got if not b.is_null]

    def refcount(self, pool: str, b: int) -> int:
        return self.pool.blocks[b + 1].ref_cnt

    def free_blocks(self, pool: str) -> list[int]:
        return [b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks()]

    def num_free(self, pool: str) -> int | None:
        return self.pool.get_num_free_blocks()

    def table(self, seq: int):
        req = self.requests.get(seq)
        if req is None:
            raise KeyError(seq)
        return "device", self._blocks_of(req)

    def pins(self, pool: str) -> dict:
        """The scheduler's delayed free: a finished request's blocks kept until its send
        reports, but for those its send job lists (the job's own references)."""
        out = {}
        for _, req, src in self._jobs.values():
            rest = self._blocks_of(req)
            for b in src:
                with contextlib.suppress(ValueError):
                    rest.remove(b)
            out[f"delayed free {req.request_id}"] = rest
        return out

    def live_seqs(self) -> list[int]:
        return list(self.requests)

    def pending_jobs(self) -> dict:
        return {job: {"kind": "send", "seq": seq, "src": ("device", list(src)),
                      "dst": ("remote", []), "holds_src": True}
                for job, (seq, _, src) in self._jobs.items()}

    def cache_entries(self, pool: str) -> list:
        return []

    def evictable_blocks(self, pool: str) -> list:
        return []

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, host_blocks: int = 0,
         version: str | None = None) -> PDTarget:
    """vLLM's NIXL connector (prefill side, scheduler half) with the delayed free."""
    return PDTarget(num_blocks, block_size, version)


def make_early_free(num_blocks: int, block_size: int, host_blocks: int = 0,
                    version: str | None = None) -> PDTarget:
    """A deliberately broken variant: blocks freed at ``request_finished``, before the
    send completes (module doc)."""
    return PDTarget(num_blocks, block_size, version, broken=True)
