"""Adapter: vLLM v1 ``KVCacheManager`` / ``BlockPool`` (vllm 0.10.2 .. 0.34.0) as a ``Target``.

Releases: 0.33.0 by default; ``vllm-v1@VERSION`` loads another of 0.10.2 .. 0.34.0
(``kvcheck install vllm-v1==VERSION``); a release of 0.6.4.post1 .. 0.10.1.1 is built by
``vllm_v1_early`` (``make`` dispatches on ``install.select``), and a plain ``vllm-v1`` loads the vLLM of this
environment when its version is in that range (``install.select``; ``vllm-v1@pinned``
forces 0.33.0). Differences are detected by feature: files a release lacks are not
loaded, ``KVCacheManager``'s keyword ``scheduler_block_size`` is passed only where it
exists, ``get_computed_blocks`` returns two items (to 0.20.x) or three; 0.10.x's
KV-cache modules import their helpers from the one ``vllm/utils/__init__.py`` (which
imports torch and the engine: stood in below, ``vllm.utils``), its
``kv_cache_interface`` imports ``vllm.multimodal`` and its ``FullAttentionSpec`` has a
``use_mla`` field. Releases before 0.10.2 are another generation (the manager hashes blocks
itself to 0.10.0, preallocates to 0.8.4, has no ``BlockPool`` before 0.8 or coordinator
before 0.9.2; the v1 manager exists from 0.6.4.post1): ``vllm_v1_early``.

What runs is vLLM's own code, executed from the installed wheel's files (see
``_loader``): ``vllm/v1/core/{kv_cache_manager, kv_cache_coordinator,
block_pool, kv_cache_utils, single_type_kv_cache_manager, kv_cache_metrics}.py``,
``vllm/v1/{kv_cache_interface, kv_cache_spec_registry, kv_cache_layout}.py``,
``vllm/v1/hisparse/block_pool.py``, ``vllm/utils/{math_utils, hashing}.py``.
One KV-cache group of ``FullAttentionSpec`` (a decoder-only model without
sliding window), prefix caching on by default, hash ``sha256`` (vLLM's default
``prefix_caching_hash_algo``), events, metrics and stats off (their defaults).

Stand-ins (every other ``vllm.*`` import raises, see ``_loader``):

``vllm.logger``
    ``init_logger`` returns a stdlib logger. Logging only reports.
``vllm.envs``
    Only ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (its default, True) is read, and
    only when converting hashes for KV events, which are off.
``vllm.config``
    ``VllmConfig`` (annotation only) and ``get_current_vllm_config_or_none``
    returning ``None``: the spec registry passes it to the platform hook below.
``vllm.platforms``
    ``current_platform.register_custom_kv_cache_specs`` is a no-op, as it is in
    vLLM's base ``Platform`` (no platform in 0.33.0 overrides it).
``vllm.distributed.kv_events``
    Event record classes and the ``MEDIUM_*`` names. Events are only built when
    ``enable_kv_cache_events`` (off); the real module needs zmq and msgspec.
``vllm.multimodal.utils`` / ``vllm.v1.utils``
    ``get_mm_features_in_window`` / ``tensor_data`` raise: they are only reached
    for multimodal or prompt-embedding requests, which we never create.
``vllm.v1.metrics.stats``
    ``PrefixCacheStats`` / ``KVCacheEvictionEvent`` records; only built with
    ``log_stats`` or a metrics collector (both off).
``vllm.v1.request``
    ``RequestStatus`` (same members and values as vLLM's) and ``Request``, a
    plain object with exactly the fields the manager reads (``request_id``,
    token ids, ``num_computed_tokens``, ``block_hashes`` kept up to date by vLLM's
    own ``get_request_block_hasher`` as ``Request.append_output_token_ids`` does,
    ``status``, and neutral values for LoRA / multimodal / salt / prompt embeds).
    The real one drags in sampling, pooling, structured output and torch.
``torch``, ``vllm.utils.torch_utils``, ``vllm.v1.attention.backends.registry``
    ``kv_cache_interface`` names ``torch.dtype`` and computes page sizes in bytes
    (``get_dtype_size``) -- memory sizing, never a block decision. A ``dtype``
    placeholder and a 2-byte ``get_dtype_size``; ``MambaAttentionBackendEnum``
    is an empty enum (Mamba specs are not used).
``vllm.v1.hisparse.layout`` (0.30 .. 0.32)
    HiSparse's sizing helpers, imported by ``kv_cache_utils`` for turning a HiSparse
    ``VllmConfig`` into a KV-cache config only: they raise.
``vllm.envs``, 0.23 .. 0.28
    also ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``, read by the coordinator: ``None``, its
    value when the variable is unset.
``vllm.utils`` and ``vllm.multimodal`` (0.10.x only)
    0.10.x's KV-cache modules import ``cdiv``, ``GiB_bytes``, ``sha256`` and
    ``get_dtype_size`` from the one ``vllm/utils/__init__.py`` (torch and the engine
    behind it): re-implemented with the same results (``sha256`` is SHA-256 of the
    pickled input, vLLM's block-hash function). Its ``kv_cache_interface`` imports
    ``MULTIMODAL_REGISTRY`` only to size encoder pages: a stand-in that raises. The
    ``Request`` stand-in also carries 0.10.x's names ``mm_positions``, ``mm_hashes`` and
    ``sampling_params`` (``None``: no prompt logprobs, caching applies).
``cbor2``
    Imported by ``vllm/utils/hashing.py`` for the ``*_cbor`` hash functions only;
    we use ``sha256`` (pickle + SHA-256), which does not touch it.

Block ids. ``BlockPool`` reserves its block 0 as the *null block* (a placeholder
for skipped sliding-window / Mamba slots) at construction: it is popped from
the free queue, is never handed out by ``get_new_blocks``, and its ``ref_cnt``
is not maintained. ``make(num_blocks, ...)`` therefore builds a pool of
``num_blocks + 1`` vLLM blocks and the oracle's id ``b`` is vLLM's ``b + 1``;
the null block is outside the oracle's id space. (Consequence, documented in
docs/thirdparty-notes.md: a vLLM deployment with ``num_gpu_blocks = N`` has
``N - 1`` usable blocks.)

Operations, as vLLM's v1 scheduler drives the manager:

``allocate(seq, n)``
    a new request of ``n`` prompt tokens (status WAITING): ``get_computed_blocks``
    (prefix-cache lookup), then ``allocate_slots(req, n - hits, hits,
    computed_blocks)``; ``None`` (too few free blocks) -> ``OutOfBlocks``. Then,
    as ``Scheduler._update_after_schedule`` does, ``num_computed_tokens = n`` and
    status RUNNING. Token ids are fresh and distinct per sequence unless the
    caller passes ``token_ids`` (for prefix-cache hits).
``append_slot(seq)``
    one decode step: the sampled token is appended (``append_output_token_ids``
    -- this is also when vLLM hashes a block the token completes), then
    ``allocate_slots(req, 1)`` reserves its slot; ``None`` -> ``OutOfBlocks``
    after popping the token again (in vLLM the scheduler would preempt instead,
    with the token kept). On success ``num_computed_tokens += 1``. The slot of
    token ``L`` (0-based) is ``(blocks[L // block_size], L % block_size)``.
    ``cow_src`` is always ``None``: v1 shares only full, hashed blocks through
    the prefix cache and never writes into a block it does not own alone (the
    block a prompt fully hits is recomputed, ``max_cache_hit_length = n - 1``).
``append_slots(seq, n, lookahead)``
    one scheduler step of speculative decoding (or, with ``n == 1``, a decode step
    with lookahead slots): the token sampled last step is appended
    (``append_output_token_ids``), ``n - 1`` fresh draft tokens become the
    request's ``spec_token_ids`` (not in its token ids: vLLM never hashes or
    caches a draft), then ``allocate_slots(req, n, num_lookahead_tokens=
    lookahead)``, as ``Scheduler.schedule`` calls it for a running request with
    ``num_new_tokens = 1 + len(spec_token_ids)``; ``None`` -> ``OutOfBlocks``
    with the token popped again. On success ``num_computed_tokens += n`` (as
    ``_update_after_schedule``) and the drafts stay *pending* until the step's
    verification (below). Returns ``[]``: v1 never copies a block.
``rollback(seq, k)``
    the step's verification rejecting the last ``k`` drafts, as
    ``Scheduler.update_from_output`` does: ``num_computed_tokens -= k``, the
    accepted drafts are appended to the request's output
    (``append_output_token_ids``, which hashes a block they complete), then
    ``cache_blocks(req, num_computed_tokens)``. The blocks are kept (v1 frees
    nothing on a rejection): they are reservation for the next step. v1 rolls
    back only the pending drafts of the request's last step, so the adapter
    ``admits`` a rollback of at most that many tokens and no other: a rollback
    of verified tokens has no v1 equivalent and is never issued. Any other
    operation on the request first verifies its pending drafts as all accepted.
``preempt(seq)``
    ``Scheduler._preempt_request``: pending drafts verified (all accepted), then
    ``KVCacheManager.free(req)``, status PREEMPTED, ``num_computed_tokens = 0``,
    ``spec_token_ids`` cleared, ``num_preemptions += 1``; the request is kept.
    Re-admission is ``allocate(seq, n)`` of the same sequence with ``n`` its
    prompt plus output tokens: the same ``Request`` goes through
    ``get_computed_blocks`` (prefix caching may serve its own freed, still cached
    blocks) and ``allocate_slots``, as the scheduler resumes a preempted request
    from the waiting queue. (An ``allocate`` of that id with another ``n`` is a
    new request.)
``free_seq(seq)``
    ``KVCacheManager.free(req)`` (blocks return in reverse order; hashed ones
    stay in the cache as eviction candidates at the free queue's tail).
``fork``, ``rebase``
    not supported: v1 has no fork and no copy-on-write (parallel sampling runs
    independent requests sharing a prefix-cache hit; beam search runs outside
    the KV-cache manager). ``capabilities`` excludes them.

No deliberate refusals: ``allocate_slots`` can also return ``None`` by policy (a
watermark for WAITING / PREEMPTED requests when others are scheduled,
``reserved_blocks`` kept for async KV-connector loads, ``full_sequence_must_fit``),
but the manager is built with vLLM's default ``watermark=0.0`` (also
``SchedulerConfig.watermark``'s) and none of the others is passed, so ``None``
means exactly "fewer free blocks than ``get_num_blocks_to_allocate``" and is
out-of-blocks (the spec's out-of-blocks clauses hold on every v1 run). The adapter
has no ``is_refusal``. With a watermark, ``None`` would not say which it was.

Observation: ``block_table`` = the request's block ids (minus one);
``refcount`` = ``KVCacheBlock.ref_cnt``; ``free_blocks`` walks the doubly linked
``FreeKVCacheBlockQueue`` (which also holds cached, evictable blocks: they have
``ref_cnt == 0``); ``num_free`` = ``BlockPool.get_num_free_blocks()``;
``table_identity`` = the manager's per-request block list; ``seq_len`` =
``num_computed_tokens``. The prefix cache (the public observation every prefix-model
target offers): ``cache_entries`` = ``BlockPool.cached_block_hash_to_block``;
``evictable_blocks`` / ``free_list_blocks`` = the free queue's blocks with / without a
block hash.
"""

from __future__ import annotations

import enum
import itertools
import types
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install
from ._loader import Loaded

FILES = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.hisparse.block_pool",
    "vllm.utils.math_utils",
    "vllm.utils.hashing",
    "vllm.utils.mem_constants",  # 0.11.x .. 0.12.x (GiB_bytes, for log messages)
    "vllm.utils.gc_utils",  # 0.34.0 on: lists the cyclic GC skips (the release's, real)
    "vllm.v1.token_buffer",  # 0.34.0 on: token ids in an int32 array (TokenBuffer; numpy)
    "vllm.utils.collection_utils",  # (token_buffer's as_list)
)


# -- stand-ins ------------------------------------------------------------------
class RequestStatus(enum.IntEnum):
    """Same members, order and values as ``vllm.v1.request.RequestStatus``."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    """The fields of ``vllm.v1.request.Request`` that the KV-cache manager reads."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int], block_hasher=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._all_token_ids = list(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.lora_request = None
        self.cache_salt = None
        self.mm_features: list = []
        self.mm_positions: list = []  # 0.10.x: its names of the multimodal inputs, and
        self.mm_hashes: list = []
        self.sampling_params = None  # its prompt-logprobs check (None: caching applies)
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = None
        self.session_id = None
        self.shared_prefix_boundary = 0
        self.prefix_cache_hit_limit = None  # 0.34.0 on: no bound (no prompt logprobs)
        self.block_hashes: list = []
        self.spec_token_ids: list[int] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """No local prefix-cache lookup (a request asking prompt logprobs): the flag to
        0.33.0; from 0.34.0 the release reads ``prefix_cache_hit_limit == 0`` instead, so
        setting the flag sets that limit (0, or None: no bound), and both agree on every
        release."""
        return self.prefix_cache_hit_limit == 0

    @skip_reading_prefix_cache.setter
    def skip_reading_prefix_cache(self, skip: bool) -> None:
        self.prefix_cache_hit_limit = 0 if skip else None

    @property
    def skip_reading_external_kv(self) -> bool:
        """0.34.0 on: a connector's lookup is skipped for a request with any hit limit."""
        return self.prefix_cache_hit_limit is not None

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        """0.34.0 on: the longest hit allowed (the last token is recomputed; no prompt
        logprobs, so no limit of the request's own), tightened by ``bound``."""
        return min(n for n in (self.num_tokens - 1, self.prefix_cache_hit_limit, bound)
                   if n is not None)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))


def hash_map_blocks(cached: Any) -> list[tuple[Any, Any]]:
    """``(key, KVCacheBlock)`` for every block of a ``BlockPool``'s hash map
    (``cached_block_hash_to_block``), in each release's layout: a dict of dicts (before
    0.11); a ``BlockHashToBlockMap`` whose ``_cache`` holds a block, or a dict of blocks
    when several share a key (0.11 .. 0.33); one whose ``_cache`` holds one block id per key
    and ``_dup_ids`` all the ids of a key cached by several blocks, read through the pool's
    ``_blocks`` (0.34.0 on)."""
    if hasattr(cached, "_dup_ids"):
        return [(key, cached._blocks[i])
                for key, first in cached._cache.items()
                for i in cached._dup_ids.get(key, (first,))]
    return [(key, blk) for key, val in getattr(cached, "_cache", cached).items()
            for blk in (val.values() if isinstance(val, dict) else (val,))]


def _stub_envs(mod: types.ModuleType, _: Loaded) -> None:
    mod.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    # 0.23 .. 0.28: the coordinator reads it (unset: None, every replay boundary kept)
    mod.VLLM_PREFIX_CACHE_RETENTION_INTERVAL = None


def _stub_config(mod: types.ModuleType, _: Loaded) -> None:
    class VllmConfig:  # annotation only
        pass

    mod.VllmConfig = VllmConfig
    mod.get_current_vllm_config_or_none = lambda: None


def _stub_platforms(mod: types.ModuleType, _: Loaded) -> None:
    class _Platform:
        @classmethod
        def register_custom_kv_cache_specs(cls, vllm_config: Any) -> None:
            pass

    mod.current_platform = _Platform()


def _stub_kv_events(mod: types.ModuleType, _: Loaded) -> None:
    class KVCacheEvent:
        def __init__(self, **fields: Any):
            self.__dict__.update(fields)

    for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        setattr(mod, name, type(name, (KVCacheEvent,), {}))
    mod.KVCacheEvent = KVCacheEvent
    mod.MEDIUM_GPU = "GPU"
    mod.MEDIUM_CPU = "CPU"


def unreachable(what: str):
    def fail(*_a: Any, **_k: Any):
        raise NotImplementedError(f"kvcheck stand-in: {what} is not supported by the adapter")

    return fail


def _stub_mm_utils(mod: types.ModuleType, _: Loaded) -> None:
    mod.get_mm_features_in_window = unreachable("multimodal features")


def _stub_v1_utils(mod: types.ModuleType, _: Loaded) -> None:
    mod.tensor_data = unreachable("prompt embeddings")


def _stub_stats(mod: types.ModuleType, _: Loaded) -> None:
    class PrefixCacheStats:
        def __init__(self) -> None:
            self.reset = False
            self.requests = self.queries = self.hits = 0

        def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    class KVCacheEvictionEvent:
        def __init__(self, *args: Any, **kwargs: Any):
            self.args, self.kwargs = args, kwargs

    mod.PrefixCacheStats = PrefixCacheStats
    mod.KVCacheEvictionEvent = KVCacheEvictionEvent


def _stub_request(mod: types.ModuleType, _: Loaded) -> None:
    mod.Request = Request
    mod.RequestStatus = RequestStatus


def _stub_torch(mod: types.ModuleType, _: Loaded) -> None:
    class dtype:  # noqa: N801 - mirrors torch.dtype
        def __init__(self, name: str):
            self.name = name

        def __repr__(self) -> str:
            return f"torch.{self.name}"

    mod.dtype = dtype
    for name in ("float16", "bfloat16", "float32", "uint8", "int8"):
        setattr(mod, name, dtype(name))


def _stub_torch_utils(mod: types.ModuleType, _: Loaded) -> None:
    mod.get_dtype_size = lambda _dtype: 2
    # 0.20.x: the page size of an NVFP4 KV cache (a dtype we never build)
    mod.nvfp4_kv_cache_full_dim = unreachable("NVFP4 KV-cache sizing")


def _stub_utils_module(mod: types.ModuleType, _: Loaded) -> None:
    """To 0.10.x ``vllm/utils/__init__.py`` is one module holding the helpers the KV-cache
    modules import (later releases split them into ``vllm/utils/*.py``); it imports torch
    and much of the engine. Re-implemented, not copied, with the same results: ``cdiv``
    (ceiling division), ``GiB_bytes``, ``sha256`` (SHA-256 of the pickled input, vLLM's
    block-hash function), ``get_dtype_size`` (page sizing only, as above); the
    ``*_cbor`` hashes are never selected."""
    import hashlib
    import pickle

    mod.cdiv = lambda a, b: -(a // -b)
    mod.GiB_bytes = 1 << 30
    mod.sha256 = lambda value: hashlib.sha256(
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    mod.sha256_cbor = unreachable("cbor hashing")
    mod.get_dtype_size = lambda _dtype: 2


def _stub_multimodal(mod: types.ModuleType, _: Loaded) -> None:
    """0.10.x ``kv_cache_interface`` imports ``MULTIMODAL_REGISTRY`` to size a
    cross-attention (encoder) spec's pages, which we never build."""

    class _Registry:
        def __getattr__(self, name: str):
            raise NotImplementedError("kvcheck stand-in: the multimodal registry is not "
                                      "supported by the adapter")

    mod.MULTIMODAL_REGISTRY = _Registry()


def _stub_hisparse_layout(mod: types.ModuleType, _: Loaded) -> None:
    """0.30 .. 0.32 ``kv_cache_utils`` imports HiSparse's sizing helpers, used only when a
    ``VllmConfig`` with HiSparse is turned into a KV-cache config (never here)."""
    for name in ("get_hisparse_gpu_memory_usage", "get_hisparse_host_pool_bytes",
                 "get_hisparse_kv_cache_config", "get_hisparse_kv_cache_groups"):
        setattr(mod, name, unreachable("HiSparse KV-cache sizing"))


def _stub_mem_utils(mod: types.ModuleType, _: Loaded) -> None:
    """0.20.x ``kv_cache_utils`` formats memory sizes for its log messages only."""
    mod.format_gib = lambda b: f"{b / (1 << 30):.2f}"


def _stub_backend_registry(mod: types.ModuleType, _: Loaded) -> None:
    class MambaAttentionBackendEnum(enum.Enum):
        MAMBA2 = "mamba2"

    mod.MambaAttentionBackendEnum = MambaAttentionBackendEnum


def _stub_cbor2(mod: types.ModuleType, _: Loaded) -> None:
    mod.dumps = unreachable("cbor2 hashing")


STUBS = {
    "vllm.logger": _loader.stub_logger,
    "vllm.envs": _stub_envs,
    "vllm.config": _stub_config,
    "vllm.platforms": _stub_platforms,
    "vllm.distributed.kv_events": _stub_kv_events,
    "vllm.multimodal.utils": _stub_mm_utils,
    "vllm.v1.utils": _stub_v1_utils,
    "vllm.v1.metrics.stats": _stub_stats,
    "vllm.v1.request": _stub_request,
    "vllm.utils.torch_utils": _stub_torch_utils,
    "vllm.utils.mem_utils": _stub_mem_utils,
    "vllm.v1.hisparse.layout": _stub_hisparse_layout,
    "vllm.v1.attention.backends.registry": _stub_backend_registry,
    "torch": _stub_torch,
    "cbor2": _stub_cbor2,
}


ENGINE_KEY = "vllm-v1"  # its row in install.ENGINES: the releases this adapter loads


# The stand-ins of a release whose ``vllm.utils`` is one module (no ``utils/math_utils.py``:
# 0.10.x, 0.11.x): its utilities and the multimodal package it imports.
ONE_UTILS_STUBS = {"vllm.utils": _stub_utils_module, "vllm.multimodal": _stub_multimodal}


def load(version: str | None = None) -> Loaded:
    """vLLM's v1 KV-cache modules at ``version`` (see ``install.select``: default the vLLM
    installed in this environment if it is in range, else 0.33.0); ``ThirdPartyMissing``
    if not installed. Files a release does not have (0.20.x has no ``kv_cache_spec_registry``,
    ``kv_cache_layout`` or ``hisparse`` and imports none of them; ``mem_constants`` is
    imported by 0.11.x-0.12.x only) are left out."""
    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    files = tuple(f for f in FILES if (root / (f.replace(".", "/") + ".py")).is_file())
    stubs = STUBS
    if not (root / "vllm/utils/math_utils.py").is_file():  # 0.10.x: one vllm.utils module
        stubs = {**STUBS, **ONE_UTILS_STUBS}
    return _loader.load(dist, files, stubs, entry=("vllm.v1.core.kv_cache_manager",))


def hash_fn(mods: Loaded):
    """vLLM's ``sha256`` block-hash function (``vllm.utils.hashing`` from 0.11, the
    ``vllm.utils`` module before)."""
    if mods.has("vllm.utils.hashing"):
        return mods["vllm.utils.hashing"].sha256
    return mods["vllm.utils"].sha256


def computed_blocks(manager: Any, req: Any) -> tuple[Any, int]:
    """``get_computed_blocks(req)`` as ``(blocks, num_computed)``: 0.20.x returns those two,
    later releases a third item too."""
    got = manager.get_computed_blocks(req)
    return got[0], got[1]


def build_manager(num_blocks: int, block_size: int, enable_caching: bool = True,
                  mods: Loaded | None = None):
    """A real ``KVCacheManager`` with ``num_blocks`` *usable* blocks (plus vLLM's null block).

    Returns ``(manager, block_hasher)``; ``block_hasher`` is vLLM's
    ``get_request_block_hasher(block_size, sha256)``, to give each ``Request``.
    """
    mods = mods or load()
    iface = mods["vllm.v1.kv_cache_interface"]
    utils = mods["vllm.v1.core.kv_cache_utils"]
    sha256 = hash_fn(mods)
    torch = mods["torch"]
    import dataclasses

    extra = {"use_mla": False} if "use_mla" in {  # a field of the spec to 0.10.x
        f.name for f in dataclasses.fields(iface.FullAttentionSpec)} else {}
    spec = iface.FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16, **extra
    )
    config = iface.KVCacheConfig(
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)],
    )
    utils.init_none_hash(sha256)
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    kwargs = {"max_model_len": 1 << 40, "scheduler_block_size": block_size,
              "hash_block_size": block_size, "enable_caching": enable_caching}
    import inspect

    params = inspect.signature(cls.__init__).parameters  # scheduler_block_size: 0.2x on
    manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
    hasher = utils.get_request_block_hasher(block_size, sha256) if enable_caching else None
    return manager, hasher


class VllmV1Target:
    """``Target`` over a real vLLM v1 ``KVCacheManager`` (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "free_seq", "append_slots", "rollback",
                              "preempt"})

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 version: str | None = None):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        mods = load(version)  # not kept: the module table is shared, never copied
        self.version = mods.dist.version
        self.manager, self._hasher = build_manager(num_blocks, block_size, enable_caching, mods)
        self.pool = self.manager.block_pool
        self.requests: dict[int, Request] = {}
        self.preempted: dict[int, Request] = {}  # preempted requests, waiting to resume
        self.drafts: dict[int, list[int]] = {}  # seq -> its last step's unverified drafts
        self._tokens = itertools.count(1)

    # -- operations ---------------------------------------------------------
    def _fresh_tokens(self, n: int) -> list[int]:
        return [next(self._tokens) for _ in range(n)]

    def admits(self, op) -> bool:
        """A rollback only of the pending drafts of the request's last step (v1 rolls
        back nothing else); every other operation its precondition allows."""
        if op.kind == "rollback":
            return op.n_tokens <= len(self.drafts.get(op.seq, ()))
        return True

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """Admit a request: ``get_computed_blocks`` then ``allocate_slots`` for the rest.
        Returns ``num_computed``, the prompt tokens the scheduler skips computing."""
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        req = self.preempted.get(seq)
        if req is None or token_ids is not None or req.num_tokens != n_tokens:
            tokens = list(token_ids) if token_ids is not None else self._fresh_tokens(n_tokens)
            if len(tokens) != n_tokens:
                raise MisuseError("len(token_ids) != n_tokens")
            req = Request(str(seq), tokens, self._hasher)
        computed, num_computed = computed_blocks(self.manager, req)
        new = self.manager.allocate_slots(
            req, n_tokens - num_computed, num_computed, computed
        )
        if new is None:
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n_tokens} tokens")
        self.preempted.pop(seq, None)
        req.num_computed_tokens = n_tokens
        req.status = RequestStatus.RUNNING
        self.requests[seq] = req
        return num_computed

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        req = self._live(seq)
        self._verify(seq, req, 0)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(next(self._tokens) if token_id is None else token_id)
        if self.manager.allocate_slots(req, 1) is None:
            req._all_token_ids.pop()
            req._output_token_ids.pop()
            del req.block_hashes[hashes_before:]
            raise OutOfBlocks("vLLM allocate_slots returned None for one decode token")
        req.num_computed_tokens = length + 1
        blocks = self.manager.coordinator.single_type_managers[0].req_to_blocks[req.request_id]
        return blocks[length // self.block_size].block_id - 1, length % self.block_size, None

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0) -> list[tuple[int, int]]:
        """One step with ``n_tokens - 1`` drafts (see module docstring); no copies."""
        req = self._live(seq)
        if n_tokens < 1 or lookahead < 0:
            raise MisuseError(f"append_slots({n_tokens}, {lookahead}): bad counts")
        self._verify(seq, req, 0)
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(next(self._tokens))  # sampled last step
        req.spec_token_ids = self._fresh_tokens(n_tokens - 1)
        if self.manager.allocate_slots(req, n_tokens, num_lookahead_tokens=lookahead) is None:
            req._all_token_ids.pop()
            req._output_token_ids.pop()
            del req.block_hashes[hashes_before:]
            req.spec_token_ids = []
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {n_tokens} new and "
                              f"{lookahead} lookahead tokens")
        req.num_computed_tokens = length + n_tokens
        if req.spec_token_ids:
            self.drafts[seq] = req.spec_token_ids
        return []

    def rollback(self, seq: int, n_tokens: int) -> None:
        """Verification rejects the last ``n_tokens`` pending drafts (see module docstring)."""
        req = self._live(seq)
        if not 1 <= n_tokens <= len(self.drafts.get(seq, ())):
            raise MisuseError(f"vLLM v1 rolls back only pending drafts, not {n_tokens} tokens")
        self._verify(seq, req, n_tokens)

    def _verify(self, seq: int, req: Request, rejected: int) -> None:
        """The step's verification, as ``update_from_output``: the last ``rejected``
        pending drafts roll ``num_computed_tokens`` back, the others join the output,
        and the verified tokens' full blocks are cached. Blocks are kept."""
        drafts = self.drafts.pop(seq, None)
        if drafts is None:
            return
        req.num_computed_tokens -= rejected
        accepted = drafts[: len(drafts) - rejected]
        if accepted:
            req.append_output_token_ids(accepted)
        req.spec_token_ids = []
        self.manager.cache_blocks(req, req.num_computed_tokens - req.num_in_flight_tokens)

    def preempt(self, seq: int) -> None:
        """``Scheduler._preempt_request``: free the request, keep it to resume."""
        req = self._live(seq)
        self._verify(seq, req, 0)
        self.manager.free(req)
        req.status = RequestStatus.PREEMPTED
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
        req.status = RequestStatus.FINISHED_STOPPED
        self.manager.free(req)
        del self.requests[seq]

    def _live(self, seq: int) -> Request:
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- for a subclass adding a plugin's operations (``kvcheck.engines.vllm_v1``) -------
    def running(self, seq: int) -> Request:
        """The running request ``seq`` (``MisuseError`` if none), its last step's pending
        drafts first verified as all accepted, as every operation but a rollback does."""
        req = self._live(seq)
        self._verify(seq, req, 0)
        return req

    @property
    def block_hasher(self):
        """vLLM's request block hasher the manager was built with (``None`` without
        prefix caching): the one to give each new ``Request``."""
        return self._hasher

    def _observed(self, seq: int):
        """Observation of an unknown sequence raises ``KeyError`` (the oracle's "no table")."""
        return self.requests[seq]

    # -- observation --------------------------------------------------------
    def _vllm_blocks(self, seq: int) -> list:
        req = self._observed(seq)
        return self.manager.coordinator.single_type_managers[0].req_to_blocks.get(
            req.request_id, []
        )

    def block_table(self, seq: int) -> Sequence[int]:
        return [b.block_id - 1 for b in self._vllm_blocks(seq)]

    def refcount(self, block: int) -> int:
        return self.pool.blocks[block + 1].ref_cnt

    def free_blocks(self) -> Iterable[int]:
        return [b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks()]

    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    def table_identity(self, seq: int) -> object | None:
        return self._vllm_blocks(seq)

    def seq_len(self, seq: int) -> int | None:
        return self._observed(seq).num_computed_tokens

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)

    # -- extra observation for prefix-cache oracles ----------------------------
    def token_ids(self, seq: int) -> list[int]:
        return list(self._observed(seq).all_token_ids)

    # the prefix cache, as the prefix model reads any target (``kvcheck.engines``: the public
    # observation methods): BlockPool's hash map and its one free queue, which holds both the
    # evictable blocks (a hash) and the free ones (none); vLLM's null block is left out
    def cache_entries(self) -> list[tuple[Any, int]]:
        """``(key, block)`` for every block of the pool's hash map (``hash_map_blocks``)."""
        return [(key, blk.block_id - 1)
                for key, blk in hash_map_blocks(self.pool.cached_block_hash_to_block)
                if blk.block_id != 0]

    def _queued(self) -> list:
        return [b for b in self.pool.free_block_queue.get_all_free_blocks() if b.block_id != 0]

    def evictable_blocks(self) -> list[int]:
        """The free queue's blocks that keep a hash: cached, unreferenced, evictable."""
        return [b.block_id - 1 for b in self._queued() if b.block_hash is not None]

    def free_list_blocks(self) -> list[int]:
        """The free queue's blocks without a hash."""
        return [b.block_id - 1 for b in self._queued() if b.block_hash is None]

    def cached_blocks(self) -> set[int]:
        """Oracle ids of blocks that currently carry a prefix-cache hash."""
        return {b.block_id - 1 for b in self.pool.blocks[1:] if b.block_hash is not None}

    def null_block(self):
        """vLLM's null block (id 0 in vLLM, outside the oracle's id space)."""
        return self.pool.null_block


def _early(version: str | None) -> bool:
    """Whether ``version`` (as ``install.select`` reads it, the family included) is a release
    before 0.10.2, which ``vllm_v1_early`` adapts (the ``vllm-v1-early`` row)."""
    return install.select(ENGINE_KEY, version, with_family=True).key != ENGINE_KEY


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV1Target:
    """vLLM v1 with prefix caching (its default); a release before 0.10.2 is built by
    ``vllm_v1_early.make``."""
    if _early(version):
        from . import vllm_v1_early

        return vllm_v1_early.make(num_blocks, block_size, version=version)
    return VllmV1Target(num_blocks, block_size, enable_caching=True, version=version)


make.loads_family = True  # TARGET@VERSION reaches install.family(ENGINE_KEY) (kvcheck.targets)


def make_no_cache(num_blocks: int, block_size: int, version: str | None = None) -> VllmV1Target:
    """vLLM v1 with prefix caching disabled (``vllm_v1_early`` before 0.10.2)."""
    if _early(version):
        from . import vllm_v1_early

        return vllm_v1_early.make_no_cache(num_blocks, block_size, version=version)
    return VllmV1Target(num_blocks, block_size, enable_caching=False, version=version)


make_no_cache.loads_family = True
