"""Adapter: vLLM v0 ``BlockTable`` (vllm==0.8.5; 0.5.0.post1 .. 0.9.2) with a sliding window.

The same files, stand-ins and operations as ``vllm_v0`` (see its docstring), with
every table built as ``SelfAttnBlockSpaceManager(sliding_window=S)`` builds it:
``BlockTable(block_size, allocator, max_block_sliding_window=M)`` where
``M = S // block_size + 2`` (``SelfAttnBlockSpaceManager.__init__``: "+1 because
// rounds down", "+1 because the last block may not be full"). The naive
allocator only: v0 refuses prefix caching with a sliding window
(``CacheConfig._verify_prefix_caching``: "Prefix caching is not supported with
sliding window").

The window. ``BlockTable.append_token_ids(tokens, num_lookahead_slots,
num_computed_slots=c)`` first replaces every entry before block ``c // B - M`` by
the allocator's ``NullBlock`` and frees the block (``SelfAttnBlockSpaceManager.
append_slots`` passes ``c = seq.data.get_num_computed_tokens()``, the tokens
before the one appended). That is the spec's ``drop_behind_window(seq, M * B)``:
``floor((c - M * B) / B)`` blocks behind. ``make(num_blocks, B)`` uses ``S = B``
(``M = 3``, the spec's window ``3B``), ``make_window(S)`` any ``S >= 1``.

Who drops. As in vLLM v1 the engine drops by itself, at the start of each
``append_token_ids``; the spec keeps the drop its own operation, so the adapter
splits the call there:

``drop_behind_window(seq, M * B)``
    ``append_token_ids([], num_lookahead_slots=0, num_computed_slots=len)``: the
    call ``SelfAttnBlockSpaceManager.append_slots`` makes for a sequence with no
    unseen tokens (a chunked-prefill step over a prompt already allocated): it
    drops and appends nothing. Admitted only for this window (``admits``).
``append_slot`` / ``append_slots``
    as in ``vllm_v0``, with ``num_computed_slots`` = the length before, admitted
    only when their own drop would release nothing (the blocks behind the window
    are null already); the adapter names the window in ``drop_window`` for the
    driver and ``prove``'s exploration.
``allocate`` (``BlockTable.allocate``) drops nothing and takes every prompt block;
``fork``, ``free_seq``, ``preempt`` as in ``vllm_v0`` (``free`` skips the null
block: ``CpuGpuBlockAllocator.free`` returns on a ``NullBlock``).

The null block. v0 has no reserved null block: ``allocate_or_get_null_block``
takes an ordinary block from the GPU allocator the first time any table appends
with a window (every ``append_token_ids`` asks for it, dropping or not) and keeps
it for the allocator's life (refcount 1, in no table). ``make`` builds a pool of
``num_blocks + 1`` and takes that block at construction, before any operation
(vLLM's block id 0, outside the oracle's id space: oracle id ``b`` is vLLM's
``b + 1``, as vLLM v1 reserves its block 0): the state the engine is in after its
first windowed append, so every later operation is checked. ``make_lazy`` runs
the engine exactly as constructed (``num_blocks`` blocks, the null block taken
lazily): kvcheck reports that first append taking a block that no table names
(docs/findings.md, F8).

Other releases (``make_guarded@VERSION``, and ``aphrodite_v0:make_sliding_guarded``):
0.5.0 on (a ``NullBlock`` and ``BlockTable.blocks``; an older release is a one-line
error). Where the release refuses chunked prefill with a sliding window (vLLM 0.4.3 ..
0.6.2, aphrodite-engine 0.6.x: read from its engine-argument file,
``chunked_with_window``) its engine never calls ``append_token_ids([])`` with a window:
``drop_behind_window`` is not admitted there (nor, so, an append whose own drop would
release a block), and the window never drops in those runs.

Deliberate refusals (``make_guarded``): as ``vllm_v0.make_guarded``, with
``can_allocate`` as 0.8.5 has it under a window: the required blocks capped at
``M`` (``num_required_blocks = min(num_required_blocks,
self.max_block_sliding_window)``) while ``BlockTable.allocate`` still takes every
prompt block (vLLM #11168, F7).

Observation: a ``NullBlock`` entry reads as ``spec.state.NULL``; every other id
as in ``vllm_v0`` (minus one with the null block reserved).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvcheck.spec.state import NULL

from ..errors import MisuseError
from . import _loader, install
from .vllm_v0 import VllmV0Target, free_block_ids, load

ENGINE_KEY = "vllm-v0"  # the sources vllm_v0.load picks (the engine line); make_guarded takes a version


class VllmV0SlidingTarget(VllmV0Target):
    """``Target`` over vLLM v0 ``BlockTable``s with a sliding window (see module docstring)."""

    capabilities = VllmV0Target.capabilities | {"drop_behind_window"}

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int,
                 guard: str | None = None, lazy_null: bool = False,
                 fork_after_drop: bool = True, version: str | None = None,
                 engine: str = ENGINE_KEY):
        if sliding_window is None or sliding_window < 1:
            raise MisuseError(f"sliding_window must be at least 1, got {sliding_window!r}")
        if num_blocks < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self._base = 0 if lazy_null else 1  # vLLM id of oracle block 0
        super().__init__(num_blocks + self._base, block_size, "naive", guard, version=version,
                         engine=engine)
        self.num_blocks = num_blocks
        self.sliding_window = sliding_window
        self.max_block_sliding_window = sliding_window // block_size + 2
        self.drop_window = self.max_block_sliding_window * block_size
        self.fork_after_drop = fork_after_drop
        mods = load(self.version, engine)
        self._NullBlock = getattr(mods["vllm.core.block.cpu_gpu_block_allocator"], "NullBlock",
                                  None)
        if self._NullBlock is None or not hasattr(self._BlockTable, "blocks"):
            raise MisuseError(f"{mods.dist.dist} {self.version}: no windowed BlockTable "
                              f"(NullBlock, BlockTable.blocks: vLLM 0.5.0 on)")
        # Whether the release's engine makes the call the adapter's window drop is: a
        # chunked-prefill step's append_token_ids([]) (see the module docstring). vLLM
        # 0.4.3 .. 0.6.2 and aphrodite 0.6.x refuse chunked prefill with a sliding window
        # (their engine arguments: "Chunked prefill is not supported with sliding window"),
        # so there a window drops only inside a decode append: drop_behind_window is not
        # admitted, nor is an append whose own drop would release a block.
        root = _loader.require(install.select(engine, self.version))
        args = [root / "vllm/engine/arg_utils.py", root / "aphrodite/engine/args_tools.py"]
        self.chunked_with_window = not any(
            f.is_file() and "Chunked prefill is not supported with sliding window" in
            f.read_text() for f in args)
        if not lazy_null:
            null = self.allocator.allocate_or_get_null_block()
            assert null.block_id == 0, null.block_id

    # -- the engine's calls ----------------------------------------------------------
    def _new_table(self) -> Any:
        return self._BlockTable(self.block_size, self.allocator,
                                max_block_sliding_window=self.max_block_sliding_window)

    def _required_blocks(self, tokens: list[int]) -> int:
        """``can_allocate`` under a window: capped at ``max_block_sliding_window``."""
        return min(super()._required_blocks(tokens), self.max_block_sliding_window)

    def _would_drop(self, table: Any) -> bool:
        """Whether ``append_token_ids``' own drop would release a block now."""
        end = table.num_full_slots // self.block_size - self.max_block_sliding_window
        blocks = table.blocks
        return end > 0 and not isinstance(blocks[min(end, len(blocks)) - 1], self._NullBlock)

    def admits(self, op) -> bool:
        """The configured window only; an append only when the engine would drop
        nothing first; a preemption as in ``vllm_v0``."""
        if op.kind == "drop_behind_window":
            return op.n_tokens == self.drop_window and self.chunked_with_window
        if op.kind in ("append_slot", "append_slots"):
            table = self.tables.get(op.seq)
            return table is not None and not self._would_drop(table)
        if op.kind == "fork" and not self.fork_after_drop:
            table = self.tables.get(op.seq)
            return table is not None and not any(isinstance(b, self._NullBlock)
                                                 for b in table.blocks)
        return super().admits(op)

    def drop_behind_window(self, seq: int, window: int) -> None:
        """``append_token_ids([], num_computed_slots=len)``: the drop, nothing appended."""
        table = self._live(seq)
        if window != self.drop_window:
            raise MisuseError(f"this engine's window keeps {self.drop_window} tokens "
                              f"(sliding_window={self.sliding_window}), not {window}")
        table.append_token_ids([], num_lookahead_slots=0,
                               num_computed_slots=table.num_full_slots)
        self._engine_step()

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        block, offset, cow = super().append_slot(seq, token_id)
        return self._id(block), offset, None if cow is None else self._id(cow)

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0) -> list[tuple[int, int]]:
        return [(self._id(s), self._id(d)) for s, d in super().append_slots(seq, n_tokens,
                                                                             lookahead)]

    # -- observation -----------------------------------------------------------------
    def _id(self, vllm_id: int) -> int:
        return vllm_id - self._base

    def block_table(self, seq: int) -> Sequence[int]:
        # (a block whose id vLLM cleared reads as None, as ``physical_block_ids`` gives it)
        return [NULL if isinstance(b, self._NullBlock) else
                None if b.block_id is None else b.block_id - self._base
                for b in self._observed(seq).blocks]

    def refcount(self, block: int) -> int:
        return self.gpu._refcounter.get(block + self._base)

    def free_blocks(self) -> Iterable[int]:
        return [b - self._base for b in free_block_ids(self.gpu)]


def make_window(num_blocks: int, block_size: int, sliding_window: int) -> VllmV0SlidingTarget:
    return VllmV0SlidingTarget(num_blocks, block_size, sliding_window)


def make(num_blocks: int, block_size: int) -> VllmV0SlidingTarget:
    """Sliding window ``S = block_size``, the null block taken at construction."""
    return VllmV0SlidingTarget(num_blocks, block_size, block_size)


def make_guarded(num_blocks: int, block_size: int,
                 version: str | None = None) -> VllmV0SlidingTarget:
    """``make`` behind ``SelfAttnBlockSpaceManager``'s checks, ``can_allocate`` capped by
    the window as in 0.8.5 (a no is a declared refusal, as ``vllm_v0.make_guarded``);
    ``version``: another release of the v0 line (``make_guarded@0.6.3.post1``; the cap is
    read as every block manager v2 from 0.5.x to 0.8.5 has it)."""
    return VllmV0SlidingTarget(num_blocks, block_size, block_size, guard="engine",
                               fork_after_drop=False, version=version)


def make_lazy(num_blocks: int, block_size: int) -> VllmV0SlidingTarget:
    """``make`` with the null block taken when the engine takes it (first windowed append)."""
    return VllmV0SlidingTarget(num_blocks, block_size, block_size, lazy_null=True)


def make_lazy_guarded(num_blocks: int, block_size: int) -> VllmV0SlidingTarget:
    """``make_lazy`` behind the engine's checks (as ``make_guarded``)."""
    return VllmV0SlidingTarget(num_blocks, block_size, block_size, guard="engine",
                               lazy_null=True, fork_after_drop=False)
