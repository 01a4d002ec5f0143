"""Adapter: vLLM v1's first ``KVCacheManager`` generations (vllm 0.6.4.post1 .. 0.10.1.1).

``vllm-v1@VERSION`` selects this module for a release in that range: ``vllm_v1.make``
(``loads_family``) asks ``install.select(..., with_family=True)``, which answers with the
``vllm-v1-early`` row of the ``vllm-v1`` family, and hands the release here;
``impl/thirdparty/vllm_v1.py`` itself loads 0.10.2 .. 0.33.0. What runs is the release's
own ``vllm/v1/core/{kv_cache_manager, kv_cache_utils, block_pool, specialized_manager, single_type_kv_cache_manager,
kv_cache_coordinator}.py`` and ``vllm/v1/kv_cache_interface.py`` (the files it has), driven
through the calls that release's ``Scheduler`` makes. Differences are detected by feature,
never by version number:

* **the manager's API** -- 0.6.4.post1 .. 0.7.1 have ``append_slots(req, n)`` for a running
  request and ``allocate_slots(req, n, computed_blocks)`` for a new one, and
  ``get_computed_blocks`` returns the blocks only; 0.7.2 .. 0.8.5 one
  ``allocate_slots(req, n, new_computed_blocks)`` and a ``(blocks, num_computed)`` lookup;
  0.9.0 on ``allocate_slots(req, num_new_tokens, num_new_computed_tokens,
  new_computed_blocks, [num_draft_tokens,] num_lookahead_tokens)`` and ``KVCacheBlocks``.
* **the constructor** -- ``(block_size, num_gpu_blocks, [max_model_len], ...)`` to 0.8.2, a
  ``KVCacheConfig`` of one ``FullAttentionSpec`` group from 0.8.3 (its fields inspected).
* **the pool** -- before 0.8.0 the manager itself holds the block list, the
  ``FreeKVCacheBlockQueue`` and the hash map; ``BlockPool`` from 0.8.0, with a *null
  block* (vLLM's block 0, outside the oracle's ids, which are then vLLM's minus one) from
  0.8.3. Tables: ``manager.req_to_blocks`` to 0.8.5, ``single_type_manager`` (0.9.0, 0.9.1),
  the coordinator's (0.9.2 on).
* **hashing** -- the manager hashes a block itself (from the request's tokens, with
  ``request.kv_block_hashes`` in 0.6.6.post1 .. 0.7.2, its own ``req_to_block_hashes``
  0.7.3 .. 0.10.0, dropped by ``free_block_hashes`` when the request finishes); 0.10.1 and
  0.10.1.1 give each request vLLM's ``get_request_block_hasher`` (``request.block_hashes``). The
  hash is Python's ``hash`` (``caching_hash_algo="builtin"``, the default of these releases).
* **a prompt wholly in the cache** -- what the release's *scheduler* does, read from its
  ``scheduler.py``: 0.6.4.post1 drops the last hit block and computes the last token only
  (``num_computed_tokens -= 1``); 0.6.5 .. 0.8.2 drop the last block and recompute it
  (``-= block_size``); from 0.8.3 the manager's lookup stops short by itself.
* **speculative decoding** -- from 0.7.3 (``request.spec_token_ids``, left out of the blocks
  the manager caches, ``num_draft_tokens`` 0.9.0 .. 0.9.2); lookahead slots
  (``num_lookahead_tokens``) from 0.8.4. Before, ``append_slots``/``rollback`` are not
  offered (``capabilities``), and without lookahead ``admits`` refuses a lookahead.

Operations: as ``vllm_v1.VllmV1Target`` (its docstring), with these calls. ``allocate`` =
the scheduler's waiting branch (lookup, the full-hit edge above, then
``allocate_slots``); a failure leaves the request waiting and the adapter abandons it as an
abort would (``free_block_hashes`` where the manager keeps hashes). ``append_slot`` = the
running branch for one decode token (``append_slots(req, 1)`` or ``allocate_slots(req, 1)``).
``append_slots(seq, n, lookahead)`` = a step with ``n - 1`` drafts (``spec_token_ids``);
``rollback`` = ``update_from_output``'s ``num_computed_tokens -= rejected``: these releases'
schedulers call no ``cache_blocks`` there (the next ``allocate_slots`` caches what is full).
``preempt`` = ``free(req)``, status PREEMPTED, ``num_computed_tokens = 0`` (hashes kept, as
the scheduler keeps them); its re-admission (the same length, and no tokens or its own
tokens named) resumes that very request; ``free_seq`` = ``free(req)`` then ``free_block_hashes(req)``
where it exists (``Scheduler._free_request``).

Preallocation (a deliberate deviation, stated here and in docs/thirdparty-notes.md): to
0.8.4 the manager takes ``num_preallocate_tokens`` (64, never set by the scheduler) and an
allocation that needs a new block takes ``min(needed + ceil(64 / B), free)`` blocks. The
spec's contracts name exactly the blocks an operation needs (``ceil(n/B)``, or the
``lookahead`` the *caller* asked for): an over-allocation the engine chooses by the number
of free blocks is not in its vocabulary, so the manager is built with
``num_preallocate_tokens=0``. Every other line runs as shipped. The raw replays
(benchmarks/historical/hist_replays.py) build the manager with the release's default,
and one of them shows what the preallocation itself did wrong in 0.6.4.post1 (vLLM PR
#10730: past the request's block-table width).

Stand-ins: as ``vllm_v1`` (logger, config, KV events, stats, torch, the multimodal
registry), plus the one ``vllm/utils/__init__.py`` of these releases (``cdiv``,
``GiB_bytes``, ``sha256``, ``get_dtype_size``; ``sha256_cbor_64bit`` raises) and a
``Request`` with every field these managers read (``kv_block_hashes`` and its setters,
``spec_token_ids``, ``sampling_params.prompt_logprobs = None``: caching applies).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import types
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, vllm_v1
from ._loader import Loaded

ENGINE_KEY = "vllm-v1-early"

FILES = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",  # 0.8.0 on
    "vllm.v1.core.specialized_manager",  # 0.8.3 .. 0.8.5
    "vllm.v1.core.single_type_kv_cache_manager",  # 0.9.0 on
    "vllm.v1.core.kv_cache_coordinator",  # 0.9.2 on
    "vllm.v1.kv_cache_interface",  # 0.7.0 on
)


class Request(vllm_v1.Request):
    """``vllm.v1.request.Request`` as these releases' managers read it."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int], block_hasher=None):
        super().__init__(request_id, prompt_token_ids, block_hasher)
        self.sampling_params = types.SimpleNamespace(prompt_logprobs=None)
        self._kv_block_hashes: list = []

    @property
    def kv_block_hashes(self) -> list:  # 0.6.6.post1 .. 0.7.2
        return list(self._kv_block_hashes)

    def set_kv_block_hashes(self, value: list) -> None:
        self._kv_block_hashes = value

    def append_kv_block_hashes(self, block_hash) -> None:
        self._kv_block_hashes.append(block_hash)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)


def _stub_request(mod: types.ModuleType, _: Loaded) -> None:
    mod.Request = Request
    mod.RequestStatus = vllm_v1.RequestStatus


def _stub_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    vllm_v1.ONE_UTILS_STUBS["vllm.utils"](mod, loaded)
    mod.sha256_cbor_64bit = vllm_v1.unreachable("cbor hashing")


STUBS = {
    "vllm.logger": _loader.stub_logger,
    "vllm.utils": _stub_utils,
    "vllm.config": vllm_v1.STUBS["vllm.config"],
    "vllm.distributed.kv_events": vllm_v1.STUBS["vllm.distributed.kv_events"],
    "vllm.multimodal": vllm_v1.ONE_UTILS_STUBS["vllm.multimodal"],
    "vllm.v1.metrics.stats": vllm_v1.STUBS["vllm.v1.metrics.stats"],
    "vllm.v1.request": _stub_request,
    "torch": vllm_v1.STUBS["torch"],
}


def load(version: str | None = None) -> Loaded:
    """The release's v1 KV-cache modules (those it has), as ``vllm_v1.load``."""
    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    files = tuple(f for f in FILES if (root / (f.replace(".", "/") + ".py")).is_file())
    return _loader.load(dist, files, STUBS, entry=("vllm.v1.core.kv_cache_manager",))


def full_hit_edge(mods: Loaded) -> str | None:
    """What the release's scheduler does with a prompt wholly in the cache: ``"token"``
    (drop the last hit block, compute the last token), ``"block"`` (drop it and recompute
    the block), or ``None`` (the manager's lookup never returns the whole prompt)."""
    for sub in ("vllm/v1/core/scheduler.py", "vllm/v1/core/sched/scheduler.py"):
        path = mods.root / sub
        if path.is_file():
            text = path.read_text()
            break
    else:
        return None
    if re.search(r"num_computed_tokens -= 1\s+num_new_tokens = 1\s+computed_blocks\.pop\(\)",
                 text):
        return "token"
    if re.search(r"num_computed_tokens -= self\.block_size\s+num_new_tokens = self\.block_size"
                 r"\s+computed_blocks\.pop\(\)", text):
        return "block"
    return None


def build_manager(mods: Loaded, num_blocks: int, block_size: int, enable_caching: bool,
                  preallocate_tokens: int = 0):
    """The release's ``KVCacheManager`` with ``num_blocks`` usable blocks (plus the null
    block where the pool has one). Returns ``(manager, block_hasher or None)``."""
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    params = inspect.signature(cls.__init__).parameters
    utils = mods["vllm.v1.core.kv_cache_utils"]
    kwargs: dict[str, Any] = {"enable_caching": enable_caching}
    if "max_model_len" in params:
        kwargs["max_model_len"] = 1 << 40
    if "num_preallocate_tokens" in params:
        kwargs["num_preallocate_tokens"] = preallocate_tokens
    if "kv_cache_config" in params:  # 0.8.3 on: one full-attention group
        iface = mods["vllm.v1.kv_cache_interface"]
        torch = mods["torch"]
        values = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
                  "dtype": torch.float16, "use_mla": False, "sliding_window": None,
                  "attention_chunk_size": None}
        fields = {f.name for f in dataclasses.fields(iface.FullAttentionSpec)}
        spec = iface.FullAttentionSpec(**{k: v for k, v in values.items() if k in fields})
        group = iface.KVCacheGroupSpec(["layer.0"], spec)
        cfg_fields = {f.name for f in dataclasses.fields(iface.KVCacheConfig)}
        cfg = {"num_blocks": num_blocks + 1, "tensors": {}, "kv_cache_tensors": [],
               "kv_cache_groups": [group]}
        config = iface.KVCacheConfig(**{k: v for k, v in cfg.items() if k in cfg_fields})
        manager = cls(config, **kwargs)
    else:
        manager = cls(block_size=block_size, num_gpu_blocks=num_blocks, **kwargs)
    hasher = None
    if enable_caching and hasattr(utils, "get_request_block_hasher"):  # 0.10.1, 0.10.1.1
        utils.init_none_hash(hash)
        hasher = utils.get_request_block_hasher(block_size, hash)
    return manager, hasher


class _Pool:
    """The block list, free queue and hash map, wherever the release keeps them."""

    def __init__(self, manager):
        owner = manager.block_pool if hasattr(manager.block_pool, "free_block_queue") else manager
        self.blocks = manager.block_pool.blocks if owner is not manager else manager.block_pool
        self.free_block_queue = owner.free_block_queue
        self.owner = owner
        self.null_block = getattr(owner, "null_block", None)
        self.offset = 0 if self.null_block is None else self.null_block.block_id + 1

    @property
    def cached_block_hash_to_block(self):
        return self.owner.cached_block_hash_to_block


class VllmV1EarlyTarget:
    """``Target`` over an early vLLM v1 ``KVCacheManager`` (see module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 version: str | None = None, preallocate_tokens: int = 0):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        mods = load(version)
        self.version = mods.dist.version
        self.manager, self._hasher = build_manager(mods, num_blocks, block_size, enable_caching,
                                                   preallocate_tokens)
        self.pool = _Pool(self.manager)
        self._off = self.pool.offset
        m = self.manager
        self._g1 = hasattr(m, "append_slots")  # 0.6.4.post1 .. 0.7.1
        alloc = inspect.signature(m.allocate_slots).parameters
        self._g3 = "num_new_computed_tokens" in alloc  # 0.9.0 on
        self._drafts_param = "num_draft_tokens" in alloc
        self._lookahead = "num_lookahead_tokens" in alloc
        src = inspect.getsource(type(m))
        self._spec = "spec_token_ids" in src or self._g3  # 0.7.3 on
        self._edge = full_hit_edge(mods)
        caps = {"allocate", "append_slot", "free_seq", "preempt"}
        if self._spec:
            caps |= {"append_slots", "rollback"}
        self.capabilities = frozenset(caps)
        self.requests: dict[int, Request] = {}
        self.preempted: dict[int, Request] = {}
        self.drafts: dict[int, list[int]] = {}
        self._tokens = itertools.count(1)

    # -- the manager's calls ---------------------------------------------------
    def _lookup(self, req: Request):
        got = self.manager.get_computed_blocks(req)
        if isinstance(got, tuple):
            return got[0], got[1]
        return got, len(got) * self.block_size  # 0.6.x .. 0.7.1: the blocks only

    def _grow(self, req: Request, n: int, lookahead: int = 0):
        """The running branch: slots for ``n`` more tokens (drafts in ``spec_token_ids``)."""
        m = self.manager
        if self._g1:
            return m.append_slots(req, n)
        kw: dict[str, Any] = {}
        if self._lookahead:
            kw["num_lookahead_tokens"] = lookahead
        if self._drafts_param:
            kw["num_draft_tokens"] = len(req.spec_token_ids)
        return m.allocate_slots(req, n, **kw)

    def _forget(self, req: Request) -> None:
        f = getattr(self.manager, "free_block_hashes", None)
        if f is not None:
            f(req)

    # -- operations ------------------------------------------------------------
    def _fresh_tokens(self, n: int) -> list[int]:
        return [next(self._tokens) for _ in range(n)]

    def admits(self, op) -> bool:
        if op.kind == "rollback":
            return op.n_tokens <= len(self.drafts.get(op.seq, ()))
        if op.kind == "append_slots":
            return op.lookahead == 0 or self._lookahead
        return True

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """The scheduler's waiting branch; returns the prompt tokens it skips computing."""
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        req = self.preempted.get(seq)
        resume = req is not None and req.num_tokens == n_tokens and (
            token_ids is None or list(token_ids) == req.all_token_ids)
        if not resume:  # a new request (the prefix model may name the preempted one's tokens:
            # then it is the same request resumed, hashes and all, as the scheduler resumes it)
            tokens = list(token_ids) if token_ids is not None else self._fresh_tokens(n_tokens)
            if len(tokens) != n_tokens:
                raise MisuseError("len(token_ids) != n_tokens")
            if req is not None:
                self._forget(req)
                self.preempted.pop(seq)
            req = Request(str(seq), tokens, self._hasher)
        computed, num_computed = self._lookup(req)
        if num_computed == req.num_tokens and self._edge is not None:
            num_computed -= 1 if self._edge == "token" else self.block_size
            blocks = getattr(computed, "blocks", computed)
            blocks.pop()
        if self._g3:
            new = self.manager.allocate_slots(req, n_tokens - num_computed, num_computed,
                                              computed)
        else:
            new = self.manager.allocate_slots(req, n_tokens - num_computed, computed)
        if new is None:
            if seq not in self.preempted:
                self._forget(req)  # abandoned while waiting: as an abort
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n_tokens} tokens")
        self.preempted.pop(seq, None)
        req.num_computed_tokens = n_tokens
        req.status = vllm_v1.RequestStatus.RUNNING
        self.requests[seq] = req
        return num_computed

    def _undo_token(self, req: Request, hashes_before: int) -> None:
        req._all_token_ids.pop()
        req._output_token_ids.pop()
        del req.block_hashes[hashes_before:]

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        req = self._live(seq)
        self._verify(seq, req, 0)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(next(self._tokens) if token_id is None else token_id)
        if self._grow(req, 1) is None:
            self._undo_token(req, hashes_before)
            raise OutOfBlocks("vLLM returned None for one decode token")
        req.num_computed_tokens = length + 1
        block = self._vllm_blocks_of(req)[length // self.block_size]
        return block.block_id - self._off, length % self.block_size, None

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0) -> list[tuple[int, int]]:
        req = self._live(seq)
        if n_tokens < 1 or lookahead < 0:
            raise MisuseError(f"append_slots({n_tokens}, {lookahead}): bad counts")
        if not self._spec or (lookahead and not self._lookahead):
            raise MisuseError(f"vLLM {self.version} has no speculative slots or lookahead")
        self._verify(seq, req, 0)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(next(self._tokens))
        req.spec_token_ids = self._fresh_tokens(n_tokens - 1)
        if self._grow(req, n_tokens, lookahead) is None:
            self._undo_token(req, hashes_before)
            req.spec_token_ids = []
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n_tokens} new and "
                              f"{lookahead} lookahead tokens")
        req.num_computed_tokens = length + n_tokens
        if req.spec_token_ids:
            self.drafts[seq] = req.spec_token_ids
        return []

    def rollback(self, seq: int, n_tokens: int) -> None:
        req = self._live(seq)
        if not 1 <= n_tokens <= len(self.drafts.get(seq, ())):
            raise MisuseError(f"vLLM v1 rolls back only pending drafts, not {n_tokens} tokens")
        self._verify(seq, req, n_tokens)

    def _verify(self, seq: int, req: Request, rejected: int) -> None:
        """``update_from_output``: rejected drafts roll ``num_computed_tokens`` back, the
        accepted ones join the output; these releases cache nothing here."""
        drafts = self.drafts.pop(seq, None)
        if drafts is None:
            return
        req.num_computed_tokens -= rejected
        accepted = drafts[: len(drafts) - rejected]
        req.spec_token_ids = []
        if accepted:
            req.append_output_token_ids(accepted)

    def preempt(self, seq: int) -> None:
        req = self._live(seq)
        self._verify(seq, req, 0)
        self.manager.free(req)
        req.status = vllm_v1.RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        del self.requests[seq]
        self.preempted[seq] = req

    def fork(self, parent: int, child: int) -> None:
        raise NotImplementedError("vLLM v1 has no fork")

    def free_seq(self, seq: int) -> None:
        req = self._live(seq)
        self._verify(seq, req, 0)
        req.status = vllm_v1.RequestStatus.FINISHED_STOPPED
        self.manager.free(req)
        self._forget(req)
        del self.requests[seq]

    def _live(self, seq: int) -> Request:
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- observation -----------------------------------------------------------
    def _tables(self) -> dict:
        m = self.manager
        if hasattr(m, "req_to_blocks"):
            return m.req_to_blocks
        if hasattr(m, "single_type_manager"):
            return m.single_type_manager.req_to_blocks
        return m.coordinator.single_type_managers[0].req_to_blocks

    def _vllm_blocks_of(self, req: Request) -> list:
        return self._tables().get(req.request_id, [])

    def _vllm_blocks(self, seq: int) -> list:
        return self._vllm_blocks_of(self.requests[seq])

    def block_table(self, seq: int) -> Sequence[int]:
        return [b.block_id - self._off for b in self._vllm_blocks(seq)]

    def refcount(self, block: int) -> int:
        return self.pool.blocks[block + self._off].ref_cnt

    def _queue(self) -> list:
        null = self.pool.null_block
        return [b for b in self.pool.free_block_queue.get_all_free_blocks() if b is not null]

    def free_blocks(self) -> Iterable[int]:
        return [b.block_id - self._off for b in self.pool.free_block_queue.get_all_free_blocks()]

    def num_free(self) -> int:
        return self.pool.free_block_queue.num_free_blocks

    def table_identity(self, seq: int) -> object | None:
        return self._vllm_blocks(seq)

    def seq_len(self, seq: int) -> int | None:
        return self.requests[seq].num_computed_tokens

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)

    # -- the prefix cache, for kvcheck verify-prefix ------------------------------
    def token_ids(self, seq: int) -> list[int]:
        return list(self.requests[seq].all_token_ids)

    def cache_entries(self) -> list[tuple[Any, int]]:
        """(key, block) for every entry of the hash map (a dict of dicts in these releases)."""
        null = self.pool.null_block
        out = []
        for key, val in self.pool.cached_block_hash_to_block.items():
            for blk in (val.values() if isinstance(val, dict) else (val,)):
                if blk is not null:
                    out.append((key, blk.block_id - self._off))
        return out

    def evictable_blocks(self) -> list[int]:
        return [b.block_id - self._off for b in self._queue() if b.block_hash is not None]

    def free_list_blocks(self) -> list[int]:
        return [b.block_id - self._off for b in self._queue() if b.block_hash is None]

    def cached_blocks(self) -> set[int]:
        null = self.pool.null_block
        return {b.block_id - self._off for b in self.pool.blocks
                if b is not null and b.block_hash is not None}


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV1EarlyTarget:
    """Early vLLM v1 with prefix caching (its default), no preallocation (see docstring)."""
    return VllmV1EarlyTarget(num_blocks, block_size, enable_caching=True, version=version)


def make_no_cache(num_blocks: int, block_size: int,
                  version: str | None = None) -> VllmV1EarlyTarget:
    """Early vLLM v1 with prefix caching disabled."""
    return VllmV1EarlyTarget(num_blocks, block_size, enable_caching=False, version=version)
