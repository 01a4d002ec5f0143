"""Adapter: vLLM v1 ``KVCacheManager`` (vllm==0.33.0) with one sliding-window group.

The same modules, stand-ins, ``Request`` and operations as ``vllm_v1`` (see its
docstring), with the one KV-cache group a ``SlidingWindowSpec(sliding_window=W)``
instead of ``FullAttentionSpec``: ``KVCacheManager`` then builds a
``UnitaryKVCacheCoordinator`` over one ``SlidingWindowManager`` (a model whose
layers all use sliding-window attention, e.g. a Mistral-7B-v0.1-style decoder).
Prefix caching on, hash ``sha256``, ``extra_retained_tokens = 0`` (no
multi-module MTP), no KV connector and no async scheduling
(``num_in_flight_tokens = 0``): vLLM's defaults.

The window. ``SlidingWindowManager.get_num_skipped_tokens(c) = max(0, c - W + 1)``:
the token the next step computes (position ``c``) attends to the ``W`` tokens
``c - W + 1 .. c``, so of the ``c`` tokens already computed it keeps the last
``W - 1`` (``SlidingWindowSpec.num_retained_tokens``) and the blocks wholly
before them are released, their entries vLLM's null block. That is the spec's
``drop_behind_window(seq, window)`` with ``window = W - 1``: ``floor((c - (W - 1))
/ B)`` blocks behind. ``make(num_blocks, B)`` uses ``W = B + 1`` (a window of
one block's worth of tokens), ``make_wide`` ``W = 2B + 1``, ``make_window(W)``
any ``W >= 2``.

Who drops. The engine drops by itself: ``KVCacheManager.allocate_slots`` first
calls ``coordinator.remove_skipped_blocks(request_id, total_computed_tokens -
num_in_flight_tokens)`` ("we can do this even if we cannot schedule this
request"), then counts and allocates; the scheduler calls
``kv_cache_manager.remove_skipped_blocks`` itself only when a request finishes
with a KV connector. The spec keeps the drop its own operation, so the adapter
splits ``allocate_slots`` at its first statement:

``drop_behind_window(seq, W - 1)``
    ``KVCacheManager.remove_skipped_blocks(request_id, num_computed_tokens)``:
    exactly the call ``allocate_slots`` makes first (pending drafts are verified
    before, as the next step's ``allocate_slots`` follows ``update_from_output``).
    Admitted only for the configured window (``admits``): the engine drops
    behind no other.
``append_slot`` / ``append_slots``
    ``allocate_slots`` as in ``vllm_v1``, admitted only when its own
    ``remove_skipped_blocks`` would release nothing (the blocks behind the
    window are null already). So every state the engine reaches is observed and
    checked: after ``allocate_slots``' drop (which stays even when it then
    returns ``None``) and after its allocation, each against its own contract.
    An append that the engine would precede by a drop is preceded by one: the
    adapter names the window in ``drop_window``, which the random driver draws
    and ``prove``'s exploration tries.
``allocate``
    a new request as in ``vllm_v1``: nothing is computed yet, so nothing is
    dropped and every prompt block is allocated (the next step drops the blocks
    behind the window). Both a new request whose prompt the cache knows (the
    prefix model names its tokens) and a *re-admission* after ``preempt`` go
    through ``get_computed_blocks``; a sliding-window hit there is padded with null
    blocks for the positions behind the window (``add_local_computed_blocks``):
    a table the spec's ``allocate`` (ceil(n/B) blocks, each a hit holding the
    prefix or taken from the free list) does not describe -- a gap of the spec,
    not of vLLM -- so such an allocation is not admitted (``admits`` asks
    ``get_computed_blocks``, a pure lookup); one whose hit has no null entry is.
``free_seq`` / ``preempt``
    ``KVCacheManager.free``: the null head is trimmed (``trim_null_head``) and the
    rest freed in reverse.

Observation: a null entry (``KVCacheBlock.is_null``, vLLM's block 0 taken at
construction) reads as ``spec.state.NULL``; every other id is vLLM's minus one,
as in ``vllm_v1``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from kvcheck.spec.state import NULL

from ..errors import MisuseError
from .vllm_v1 import Request, VllmV1Target, hash_fn, load

ENGINE_KEY = "vllm-v1"  # the releases of vllm_v1's range (TARGET@VERSION), as vllm-v1


def build_manager(num_blocks: int, block_size: int, sliding_window: int,
                  enable_caching: bool = True, version: str | None = None):
    """A real ``KVCacheManager`` over one ``SlidingWindowSpec`` group, with
    ``num_blocks`` usable blocks (plus vLLM's null block). ``(manager, hasher)``.
    ``version``: the vLLM release (``vllm_v1.load``; keywords a release lacks are not
    passed, as in ``vllm_v1.build_manager``)."""
    import dataclasses
    import inspect

    mods = load(version)
    iface = mods["vllm.v1.kv_cache_interface"]
    utils = mods["vllm.v1.core.kv_cache_utils"]
    sha256 = hash_fn(mods)
    extra = {"use_mla": False} if "use_mla" in {
        f.name for f in dataclasses.fields(iface.SlidingWindowSpec)} else {}
    spec = iface.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=mods["torch"].float16, sliding_window=sliding_window,
                                   **extra)
    config = iface.KVCacheConfig(
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)],
    )
    utils.init_none_hash(sha256)
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    kwargs = {"max_model_len": 1 << 40, "scheduler_block_size": block_size,
              "hash_block_size": block_size, "enable_caching": enable_caching}
    params = inspect.signature(cls.__init__).parameters
    manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
    hasher = utils.get_request_block_hasher(block_size, sha256) if enable_caching else None
    return manager, hasher, mods.dist.version


class VllmV1SlidingTarget(VllmV1Target):
    """``Target`` over a real vLLM v1 ``KVCacheManager`` with one sliding-window group."""

    capabilities = VllmV1Target.capabilities | {"drop_behind_window"}

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int,
                 enable_caching: bool = True, version: str | None = None):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        if sliding_window < 2:
            raise MisuseError(f"sliding_window must be at least 2, got {sliding_window!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.drop_window = sliding_window - 1  # the spec's window (see module docstring)
        self.manager, self._hasher, self.version = build_manager(
            num_blocks, block_size, sliding_window, enable_caching, version)
        self.pool = self.manager.block_pool
        self.swa = self.manager.coordinator.single_type_managers[0]
        if not (hasattr(self.manager, "remove_skipped_blocks")
                and hasattr(self.swa, "get_num_skipped_tokens")):  # both from 0.14.0
            raise MisuseError(f"vLLM {self.version}: the sliding-window adapter drives "
                              f"KVCacheManager.remove_skipped_blocks and SlidingWindowManager."
                              f"get_num_skipped_tokens, which this release lacks (0.14.0 on)")
        self.requests: dict[int, Request] = {}
        self.preempted: dict[int, Request] = {}
        self.drafts: dict[int, list[int]] = {}
        self._tokens = itertools.count(1)

    # -- what the engine can express ---------------------------------------------
    def _would_drop(self, req: Request) -> bool:
        """Whether ``allocate_slots``' own ``remove_skipped_blocks`` would release a
        block now (computed the engine's way: ``get_num_skipped_tokens``)."""
        blocks = self.swa.req_to_blocks.get(req.request_id, [])
        skip = min(self.swa.get_num_skipped_tokens(req.num_computed_tokens) // self.swa.block_size,
                   len(blocks))
        return skip > 0 and not blocks[skip - 1].is_null

    def admits(self, op) -> bool:
        """The configured window only; an append only when the engine would drop
        nothing first; a re-admission only when its prefix hit has no null entry;
        a rollback as in ``vllm_v1`` (pending drafts only)."""
        kind = op.kind
        if kind == "drop_behind_window":
            return op.n_tokens == self.drop_window
        if kind in ("append_slot", "append_slots"):
            req = self.requests.get(op.seq)
            return req is not None and not self._would_drop(req)
        if kind == "allocate":
            req = self.preempted.get(op.seq)
            tokens = getattr(op, "tokens", None)  # the prefix model's prompts name theirs
            if tokens and (req is None or list(tokens) != req.all_token_ids):
                req = Request(str(op.seq), list(tokens), self._hasher)  # a lookup only
            elif req is None or req.num_tokens != op.n_tokens:
                return True  # fresh tokens: no hit
            computed = self.manager.get_computed_blocks(req)[0]  # 2 or 3 items
            return not any(b.is_null for b in computed.blocks[0])
        return super().admits(op)

    # -- operations ----------------------------------------------------------------
    def drop_behind_window(self, seq: int, window: int) -> None:
        """``remove_skipped_blocks(request_id, num_computed_tokens)``, the first call
        of the next step's ``allocate_slots``."""
        req = self._live(seq)
        if window != self.drop_window:
            raise MisuseError(f"this engine's window keeps {self.drop_window} tokens "
                              f"(sliding_window={self.sliding_window}), not {window}")
        self._verify(seq, req, 0)
        import inspect

        extra = {"num_prompt_tokens": req.num_prompt_tokens} if "num_prompt_tokens" in (
            inspect.signature(self.manager.remove_skipped_blocks).parameters) else {}  # later
        self.manager.remove_skipped_blocks(req.request_id, req.num_computed_tokens, **extra)

    # -- observation ---------------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        return [NULL if b.is_null else b.block_id - 1 for b in self._vllm_blocks(seq)]

    def refcount(self, block: int) -> int:
        return self.pool.blocks[block + 1].ref_cnt


def make_window(num_blocks: int, block_size: int, sliding_window: int,
                version: str | None = None) -> VllmV1SlidingTarget:
    """vLLM v1, one sliding-window group of ``sliding_window`` tokens, prefix caching on."""
    return VllmV1SlidingTarget(num_blocks, block_size, sliding_window, version=version)


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV1SlidingTarget:
    """Sliding window ``W = block_size + 1`` (the spec's window: one block of tokens)."""
    return VllmV1SlidingTarget(num_blocks, block_size, block_size + 1, version=version)


def make_wide(num_blocks: int, block_size: int,
              version: str | None = None) -> VllmV1SlidingTarget:
    """Sliding window ``W = 2 * block_size + 1`` (the spec's window: two blocks)."""
    return VllmV1SlidingTarget(num_blocks, block_size, 2 * block_size + 1, version=version)


def make_no_cache(num_blocks: int, block_size: int,
                  version: str | None = None) -> VllmV1SlidingTarget:
    """``make`` with prefix caching disabled."""
    return VllmV1SlidingTarget(num_blocks, block_size, block_size + 1, enable_caching=False,
                               version=version)
