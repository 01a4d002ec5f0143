"""Adapter: the decode side of vLLM v1's disaggregated prefill -- the NIXL connector's
scheduler half receiving a remote prefill's KV, with the release's own ``Scheduler``
methods for the wait, the promotion and an abort mid-receive, over its ``KVCacheManager``
-- as a target of the tiers model (``kvcheck verify-tiers vllm-v1-pd-recv@0.33.0``;
protocol: docs/tiers.md). The send side is ``vllm_v1_pd`` (same releases, same loader,
same stand-ins: this module only adds what the receive path reads).

Releases: vLLM 0.33.0 and 0.34.0 (the layout ``vllm_v1_pd`` adapts).

How the scheduler drives it, one tiers operation per engine step:

``load(seq, tokens)``
    a decode request whose ``kv_transfer_params`` name a remote prefill
    (``do_remote_prefill``, the remote engine, request, host, port and block ids; no
    ``tp_size``: no heartbeat to the prefill instance). The connector's
    ``get_num_new_matched_tokens`` says the external tokens (every prompt token: no
    backoff without Mamba, DSV4 or MTP) and that they load asynchronously; the
    scheduler's ``allocate_slots(req, 0, num_external_computed_tokens=n,
    delay_cache_blocks=True)``; ``update_state_after_alloc`` (the request's unhashed
    blocks into ``_reqs_need_recv``); the request parks in ``WAITING_FOR_REMOTE_KVS``
    with ``num_computed_tokens = n`` (0.34.0: ``_reserve_parked``, the release's own);
    the step's ``build_connector_meta`` names it in ``reqs_to_recv``: the load job, kind
    ``load``, reading the ``remote`` pseudo pool (no blocks: the prefill instance's memory)
    into ``local_block_ids``, the request's own blocks (the job holds no reference of its
    own: ``holds_dst`` False). No room: ``allocate_slots`` answers None, nothing changed.
``allocate(seq, tokens)``
    a request with no remote prefill (the lookup answers ``(0, False)``): a local prefill.
``append(seq, token)``
    a generated token (never while the request waits for its KV: the model's rule).
``complete(job, ok)``
    the worker's ``finished_recving`` in a ``KVConnectorOutput``:
    ``Scheduler._update_from_kv_xfer_finished``; then the next step:
    ``_handle_blocked_waiting_request`` (``_update_waiting_for_remote_kv``: the blocks
    cached, the last prompt token to recompute) promotes it, and the step schedules it:
    ``allocate_slots`` for that token (0.34.0: ``_unreserve_parked``), RUNNING. For a
    request aborted while receiving the same report frees its blocks (``_free_blocks``).
    ``ok`` False: the receive failed (the NIXL worker names the request in both
    ``failed_recving`` and ``finished_recving``): ``_handle_failed_recving`` first, as
    ``update_from_output`` orders them (the recompute policy, the default: no computed
    tokens), then the same report; ``_update_waiting_for_remote_kv`` frees the request's
    blocks and the step schedules its whole prompt again (``allocate_slots``: as many
    blocks as it just freed, so it always fits; they may be other blocks), computed
    locally. The block-id report (``invalid_block_ids``, which the worker sends too) is
    not passed: the request-keyed one decides the same here (one group, one request).
``free(seq)``
    the client's end: the release's ``Scheduler.finish_requests`` (``FINISHED_ABORTED``
    while the request waits for its KV or has generated nothing, else
    ``FINISHED_LENGTH_CAPPED``). Aborted while receiving, it computes
    ``delay_free_blocks`` itself: the request stays in ``requests`` with its blocks
    (reported as the pin ``delayed free <request>``) until the receive reports.

Stand-ins, beyond ``vllm_v1_pd``'s, in one place (each cannot change what is decided
about a block):

the scheduler's queues (``_Queue``)
    ``waiting``, ``kv_holding_waiting``, 0.34.0's ``async_kv_waiting``: lists with
    ``add_request`` / ``remove_requests`` (the release's are ordered by policy; kvcheck
    schedules one request per step, so the order never matters); ``running`` a list,
    ``deferred_waiting`` a set, ``deferred_loads`` empty (no load deferred:
    ``max_num_inflight_kv_loads`` unset).
``remove_all`` (``vllm.v1.core.sched.utils``)
    the release's own function, executed alone (its module imports the sampling params).
the scheduler's other parts
    no prefix replay (``prefix_replay_tokens`` 0: no DSV4 sliding window), no KV zeroing
    (``needs_kv_cache_zeroing`` False), no spec tokens, failures recomputed
    (``recompute_kv_load_failures``, the default).
the remote prefill instance
    kvcheck's driver: a load's completion is its KV arriving; the data level takes it to be
    the request's prompt KV (the peer computed that prompt).

``broken=True`` (``make_abort_frees``): an abort while receiving frees the blocks at once
although the receive still writes them (vLLM's ``delay_free_blocks`` ignored);
``tests/thirdparty/test_vllm_v1_pd_recv.py`` shows it caught when a new request takes one.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

from ..errors import MisuseError, OutOfBlocks
from . import _loader
from . import vllm_v1_native_offload as native
from . import vllm_v1_offload as simple
from . import vllm_v1_pd as pd
from ._loader import Loaded
from .vllm_v1 import RequestStatus

WHERE = "impl/thirdparty/vllm_v1_pd_recv.py"
# The release's own Scheduler methods the receive runs through (module doc).
RECV_METHODS = pd.SCHEDULER_METHODS + (
    "finish_requests", "_update_waiting_for_remote_kv", "_handle_blocked_waiting_request",
    "_mark_prefix_replay", "_load_restores_replay_window", "_handle_failed_recving")
# ... and those 0.34.0 adds on that path: a parked load's cached reservation.
LATER_RECV_METHODS = pd.LATER_SCHEDULER_METHODS + ("_reserve_parked",
                                                   "_request_remaining_blocks")


class _Queue(_loader.StandIn):
    """A scheduler request queue (module doc): a list."""

    WHERE = WHERE

    def __init__(self):
        self.items: list = []

    def add_request(self, request) -> None:
        self.items.append(request)

    def remove_requests(self, requests) -> None:
        gone = {id(r) for r in requests}
        self.items = [r for r in self.items if id(r) not in gone]


class PDRecvTarget(pd.PDTarget):
    """A tiers target over the release's ``KVCacheManager``, ``NixlPullConnectorScheduler``
    (a decode instance) and the ``Scheduler``'s receive path (module docstring)."""

    capabilities = frozenset({"allocate", "load", "append", "free", "complete"})
    failures = frozenset({"load"})  # (the worker's failed_recving: recomputed locally)
    load_from = "remote"  # (spec.tiers.REMOTE: its loads read the prefill instance)
    PRODUCER = False
    METHODS = RECV_METHODS
    LATER_METHODS = LATER_RECV_METHODS

    def __init__(self, num_blocks: int, block_size: int, version: str | None = None,
                 broken: bool = False):
        super().__init__(num_blocks, block_size, version, broken)
        shell = self.shell
        shell.running = []
        shell.waiting, shell.kv_holding_waiting = _Queue(), _Queue()
        shell.async_kv_waiting = _Queue()
        shell.deferred_waiting = set()
        shell.deferred_loads = {}
        shell.failed_recving_kv_req_ids = set()
        shell.num_waiting_for_streaming_input = 0
        shell.needs_kv_cache_zeroing = False
        shell.prefix_replay_tokens = 0
        shell.prefix_replay_group_ids = []
        shell.recompute_kv_load_failures = True
        shell.max_model_len = 1 << 20
        shell.num_spec_tokens = shell.num_lookahead_tokens = 0
        self._remote = itertools.count()

    def _extend_namespace(self, mods: Loaded, namespace: dict) -> None:
        ns = {"__builtins__": __builtins__, "__name__": "vllm.v1.core.sched.utils",
              "contextlib": contextlib}
        namespace["remove_all"] = simple.release_function(
            mods, "vllm.v1.core.sched.utils", "remove_all", ns)
        namespace["Iterable"] = Sequence

    # -- operations ---------------------------------------------------------------------
    def _new(self, seq: int, tokens: Sequence[int], params: dict | None):
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a prompt has at least one token")
        req = native.OffloadRequest(f"{seq}.{next(self._ids)}", tokens, self._hasher)
        req.num_output_placeholders = 0
        req.kv_transfer_params = params
        self.connector.on_new_request(req)
        return req

    def _run(self, seq: int, req) -> None:
        req.status = RequestStatus.RUNNING
        self.shell.requests[req.request_id] = req
        self.shell.running.append(req)
        self.requests[seq] = req

    def allocate(self, seq: int, tokens: Sequence[int]) -> None:
        req = self._new(seq, tokens, None)
        hit, is_async = self.connector.get_num_new_matched_tokens(req, 0)
        if hit or is_async:
            raise MisuseError(f"a local request's lookup answered {(hit, is_async)}")
        n = len(req.prompt_token_ids)
        if self.manager.allocate_slots(req, n) is None:
            self._step()
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n} tokens")
        self.connector.update_state_after_alloc(req, self.manager.get_blocks(req.request_id),
                                                0)
        req.num_computed_tokens = n
        self._run(seq, req)
        self._step()

    def load(self, seq: int, tokens: Sequence[int]):
        """A decode request for a remote prefill (module doc): its receive job."""
        params = {"do_remote_prefill": True, "remote_engine_id": "kvcheck-prefill",
                  "remote_request_id": f"remote-{next(self._remote)}",
                  "remote_host": "localhost", "remote_port": 5600,
                  "remote_block_ids": [list(range(-(-len(tokens) // self.block_size)))]}
        req = self._new(seq, tokens, params)
        n, is_async = self.connector.get_num_new_matched_tokens(req, 0)
        if not (is_async and 0 < n <= len(req.prompt_token_ids)):
            raise MisuseError(f"a remote prefill's lookup answered {(n, is_async)}")
        kwargs = {"num_external_computed_tokens": n, "delay_cache_blocks": True}
        if self.manager.allocate_slots(req, 0, **kwargs) is None:
            self._step()
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n} external tokens")
        rid = req.request_id
        self.connector.update_state_after_alloc(req, self.manager.get_blocks(rid), n)
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        req.num_computed_tokens = n
        self.shell.requests[rid] = req
        if hasattr(self.shell, "_reserve_parked"):  # (0.34.0's schedule, when it parks)
            self.shell._reserve_parked(req)
        self.shell.kv_holding_waiting.add_request(req)
        self.shell.deferred_waiting.add(req)
        self.requests[seq] = req
        meta = self._step()
        if rid not in meta.reqs_to_recv:
            raise MisuseError("the connector's reqs_to_recv does not name a parked request")
        (dst,) = meta.reqs_to_recv[rid].local_block_ids
        job = f"recv {rid}"
        self._jobs[job] = (seq, req, [int(b) - 1 for b in dst])
        return job

    def free(self, seq: int):
        """The client's end: the release's ``finish_requests`` (module doc)."""
        req = self._live(seq)
        waiting = req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        status = (RequestStatus.FINISHED_LENGTH_CAPPED
                  if req._output_token_ids and not waiting else RequestStatus.FINISHED_ABORTED)
        self.shell.finish_requests(req.request_id, status)
        del self.requests[seq]
        if self.broken and req.request_id in self.shell.requests:
            self.manager.free(req)  # the delayed free ignored: blocks back while receiving
        self._step()
        return None

    def complete(self, job, ok: bool) -> None:
        """The worker's ``finished_recving`` and the next step's promotion (module doc)."""
        if job not in self._jobs:
            raise MisuseError(f"unknown job {job!r}")
        _, req, _ = self._jobs.pop(job)
        rid = req.request_id
        out = self._outputs.KVConnectorOutput(finished_recving={rid})
        if not ok:  # (the worker names a failed receive in both sets; the scheduler's
            # update_from_output handles failed_recving before finished_recving)
            out.failed_recving = {rid}
            self.shell._handle_failed_recving(out.failed_recving)
        self.shell._update_from_kv_xfer_finished(out)
        if rid not in self.shell.requests:  # (aborted while receiving: freed now)
            self._step()
            return
        if not self.shell._handle_blocked_waiting_request(req):
            raise MisuseError("the scheduler did not promote a request whose KV arrived")
        self.shell.kv_holding_waiting.remove_requests([req])
        self.shell.deferred_waiting.discard(req)
        if hasattr(self.shell, "_unreserve_parked"):  # (0.34.0's schedule, at admission)
            self.shell._unreserve_parked(req)
        todo = req.num_tokens - req.num_computed_tokens
        if todo and self.manager.allocate_slots(req, todo) is None:
            # (a failed receive freed the request's blocks a moment ago: as many are free)
            raise MisuseError(f"vLLM allocate_slots returned None for the {todo} recomputed "
                              f"token(s) of a request that held their blocks a step ago")
        req.num_computed_tokens = req.num_tokens
        seq = next(q for q, r in self.requests.items() if r is req)
        del self.requests[seq]
        self._run(seq, req)
        self._step()

    # -- observation ------------------------------------------------------------------------
    def pins(self, pool: str) -> dict:
        """The scheduler's delayed free of a request aborted while receiving: its blocks,
        kept until the receive reports."""
        return {f"delayed free {req.request_id}": self._blocks_of(req)
                for seq, req, _ in self._jobs.values()
                if self.requests.get(seq) is not req and req.request_id in self.shell.requests}

    def pending_jobs(self) -> dict:
        return {job: {"kind": "load", "seq": seq, "src": ("remote", []),
                      "dst": ("device", list(dst)), "holds_src": False, "holds_dst": False}
                for job, (seq, _, dst) in self._jobs.items()}


def make(num_blocks: int, block_size: int, host_blocks: int = 0,
         version: str | None = None) -> PDRecvTarget:
    """vLLM's NIXL connector (decode side, scheduler half) receiving remote prefills."""
    return PDRecvTarget(num_blocks, block_size, version)


def make_abort_frees(num_blocks: int, block_size: int, host_blocks: int = 0,
                     version: str | None = None) -> PDRecvTarget:
    """A deliberately broken variant: an abort while receiving frees the blocks at once,
    before the receive completes (module doc)."""
    return PDRecvTarget(num_blocks, block_size, version, broken=True)
