"""Adapter: vLLM v1 ``KVCacheManager`` with a *hybrid* KV-cache config, as a target of the
hybrid-pool model (``kvcheck verify-hybrid``). Any release of ``vllm_v1``'s range
(``TARGET@VERSION``; default as ``vllm-v1``: the installed vLLM if in range, else 0.33.0):
keywords and return values a release lacks are handled as in ``vllm_v1``.

What runs is vLLM's own code, loaded from the installed wheel exactly as for ``vllm-v1``
(``impl/thirdparty/vllm_v1.py``: the same files, the same stand-ins, the same
``Request``). The ``KVCacheConfig`` has two KV-cache groups sharing one pool of
``num_blocks + 1`` blocks (vLLM's block 0 is the null block): group 0 a
``FullAttentionSpec`` layer, group 1 a ``SlidingWindowSpec`` layer of window ``W``
(default ``2 x block_size``, at least 2), both of ``block_size`` tokens per block, so
``get_kv_cache_coordinator`` builds a ``HybridKVCacheCoordinator`` (prefix caching on,
``sha256``, no EAGLE, no connector, watermark 0), whose ``find_longest_cache_hit`` finds
the longest hit common to both groups and whose ``SlidingWindowManager`` replaces the
blocks behind the window by the null block.

Operations, as vLLM's v1 scheduler drives the manager (see ``vllm_v1`` for the details
they share):

``allocate(seq, tokens)``
    a new request with these prompt tokens: ``get_computed_blocks`` (its
    ``shared_prefix_boundary`` stored on the request, as ``Scheduler.schedule`` does),
    then ``allocate_slots(req, n - hit, hit, computed)``; ``None`` -> ``OutOfBlocks``;
    then ``num_computed_tokens = n``, status RUNNING. Returns the cached tokens *per
    group* as vLLM's lookup served them: ``len(computed.blocks[g]) * block_size`` (each
    group's list covers every position of the hit, null blocks included), so a group
    served a hit of another length than the count the scheduler is given would show.
``append_slot(seq, token)``
    one decode step: the token is appended (``append_output_token_ids``, which hashes a
    block it completes), then ``allocate_slots(req, 1)`` (which first runs
    ``remove_skipped_blocks``); ``None`` -> ``OutOfBlocks`` with the token popped again.
``append_tokens(seq, tokens)``
    a step computing several tokens, as chunked prefill schedules the next chunk of a
    request whose tokens are known: they join the request (``append_output_token_ids``),
    then ``allocate_slots(req, n)``; ``None`` -> ``OutOfBlocks`` with them removed again.
``free_seq(seq)``
    ``KVCacheManager.free(req)``.

Observation: ``windows = (0, W)``; ``block_table(seq, g)`` = the ids of
``coordinator.single_type_managers[g].req_to_blocks[request_id]`` minus one, vLLM's null
block read as ``None`` (the null placeholder); ``table_identity(seq, g)`` = that list;
``refcount(b)`` = ``ref_cnt``; ``free_blocks()`` walks the free queue (cached, evictable
blocks included: ``ref_cnt == 0``); ``num_free()`` = ``get_num_free_blocks()``;
``seq_len`` = ``num_computed_tokens``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from ..errors import MisuseError, OutOfBlocks
from .vllm_v1 import Request, RequestStatus, hash_fn, load

ENGINE_KEY = "vllm-v1"  # the releases of vllm_v1's range (TARGET@VERSION), as vllm-v1

ENGINE_KEY = "vllm-v1"  # the sources vllm_v1.load picks (the engine line); make takes no version


def build_hybrid_manager(num_blocks: int, block_size: int, window: int,
                         version: str | None = None):
    """A real ``KVCacheManager`` over a full-attention and a sliding-window group sharing
    ``num_blocks`` usable blocks (plus vLLM's null block); ``(manager, block_hasher,
    version)``."""
    import dataclasses
    import inspect

    mods = load(version)
    iface = mods["vllm.v1.kv_cache_interface"]
    utils = mods["vllm.v1.core.kv_cache_utils"]
    sha256 = hash_fn(mods)
    torch = mods["torch"]
    extra = {"use_mla": False} if "use_mla" in {  # a field of the specs to 0.10.x
        f.name for f in dataclasses.fields(iface.FullAttentionSpec)} else {}
    full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=torch.float16, **extra)
    sliding = iface.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                      dtype=torch.float16, sliding_window=window, **extra)
    config = iface.KVCacheConfig(
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full),
                         iface.KVCacheGroupSpec(["layer.1"], sliding)],
    )
    utils.init_none_hash(sha256)
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    kwargs = {"max_model_len": 1 << 40, "scheduler_block_size": block_size,
              "hash_block_size": block_size, "enable_caching": True}
    params = inspect.signature(cls.__init__).parameters
    manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
    return manager, utils.get_request_block_hasher(block_size, sha256), mods.dist.version


class VllmV1HybridTarget:
    """A hybrid-pool target over a real vLLM v1 ``KVCacheManager`` (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "append_tokens", "free_seq"})

    def __init__(self, num_blocks: int, block_size: int, window: int | None = None,
                 version: str | None = None):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.window = window if window is not None else max(2, 2 * block_size)
        self.windows = (0, self.window)
        self.manager, self._hasher, self.version = build_hybrid_manager(
            num_blocks, block_size, self.window, version)
        self.pool = self.manager.block_pool
        self.requests: dict[int, Request] = {}
        self.finished: dict[int, Request] = {}  # freed requests (their tables read as gone)
        self._ids = itertools.count()

    # -- operations ---------------------------------------------------------------
    def allocate(self, seq: int, tokens: Sequence[int]) -> list[int]:
        if seq in self.requests:
            raise MisuseError(f"sequence {seq!r} already exists")
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a prompt has at least one token")
        # a fresh request id per admission: vLLM never reuses one
        req = Request(f"{seq}.{next(self._ids)}", tokens, self._hasher)
        got = self.manager.get_computed_blocks(req)  # a third item from 0.2x on
        computed, num_computed = got[0], got[1]
        if len(got) > 2:
            req.shared_prefix_boundary = got[2]
        per_group = [len(blocks) * self.block_size for blocks in computed.blocks]
        if self.manager.allocate_slots(req, len(tokens) - num_computed, num_computed,
                                       computed) is None:
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {len(tokens)} tokens")
        req.num_computed_tokens = len(tokens)
        req.status = RequestStatus.RUNNING
        self.requests[seq] = req
        self.finished.pop(seq, None)
        return per_group

    def append_slot(self, seq: int, token: int) -> None:
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

    def append_tokens(self, seq: int, tokens: Sequence[int]) -> None:
        """A step computing ``len(tokens)`` new tokens (the next chunk of a streamed
        prompt): the tokens join the request, then ``allocate_slots(req, n)``, as the
        scheduler schedules a running request's next chunk."""
        req = self._live(seq)
        tokens = list(tokens)
        if not tokens:
            raise MisuseError("a step appends at least one token")
        length = req.num_computed_tokens
        hashes_before = len(req.block_hashes)
        req.append_output_token_ids(tokens)
        if self.manager.allocate_slots(req, len(tokens)) is None:
            del req._all_token_ids[length:]
            del req._output_token_ids[len(req._output_token_ids) - len(tokens):]
            del req.block_hashes[hashes_before:]
            raise OutOfBlocks(f"vLLM allocate_slots returned None for {len(tokens)} tokens")
        req.num_computed_tokens = length + len(tokens)

    def free_seq(self, seq: int) -> None:
        req = self._live(seq)
        req.status = RequestStatus.FINISHED_STOPPED
        self.manager.free(req)
        del self.requests[seq]
        self.finished[seq] = req

    def _live(self, seq: int) -> Request:
        req = self.requests.get(seq)
        if req is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return req

    # -- observation ----------------------------------------------------------------
    def _blocks(self, seq: int, group: int) -> list:
        """The request's vLLM block list in ``group``; ``KeyError`` if vLLM holds none (a
        freed request's list is looked up too, so one a free left behind is seen)."""
        req = self.requests.get(seq) or self.finished[seq]
        table = self.manager.coordinator.single_type_managers[group].req_to_blocks.get(
            req.request_id)  # (a defaultdict: never index it)
        if table is None or (seq not in self.requests and not table):
            raise KeyError(seq)
        return table

    def block_table(self, seq: int, group: int) -> list:
        null = self.pool.null_block
        return [None if b is null else b.block_id - 1 for b in self._blocks(seq, group)]

    def table_identity(self, seq: int, group: int) -> object:
        return self._blocks(seq, group)

    def refcount(self, block: int) -> int:
        return self.pool.blocks[block + 1].ref_cnt

    def free_blocks(self) -> Iterable[int]:
        return [b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks()]

    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    def seq_len(self, seq: int) -> int:
        return (self.requests.get(seq) or self.finished[seq]).num_computed_tokens

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV1HybridTarget:
    """Full attention + a sliding window of 2 x block_size tokens (at least 2)."""
    return VllmV1HybridTarget(num_blocks, block_size, version=version)


def make_odd_window(num_blocks: int, block_size: int,
                    version: str | None = None) -> VllmV1HybridTarget:
    """Full attention + a sliding window of block_size + 1 tokens (not a block multiple)."""
    return VllmV1HybridTarget(num_blocks, block_size, window=block_size + 1, version=version)
