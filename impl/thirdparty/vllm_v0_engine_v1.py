"""Adapter: vLLM v0's engine core on block manager v1 -- the release's own ``Scheduler``
with its own ``BlockSpaceManagerV1`` (``vllm/core/block_manager_v1.py``), the block manager
the scheduler builds by default to 0.6.2 (``SchedulerConfig.use_v2_block_manager``
defaults to False there; 0.6.3 made v2 the default and removed v1).

``vllm-v0-engine-v1[@VERSION]`` (chunked prefill off) and ``vllm-v0-engine-v1-chunked``:
``vllm_v0_engine.VllmV0EngineTarget`` (the driver, the generated model output, the stand-ins
and the KV calls: its docstring) with ``use_v2_block_manager=False``, so the scheduler's
``BlockSpaceManager.get_block_space_manager_class("v1")`` builds ``BlockSpaceManagerV1``
from the release's file, with its ``vllm/block.py`` (``PhysicalTokenBlock``,
``LogicalTokenBlock``; ``BlockTable`` a class from 0.5.5) and ``vllm/core/evictor_v1.py``.
Every release with ``vllm/core/interfaces.py`` and ``block_manager_v1.py`` runs: 0.4.0 ..
0.6.2, from the ``vllm-v0-legacy`` install row (``ENGINE_KEY``: 0.3.3 .. 0.6.2, pinned 0.4.0,
the default here; ``kvcheck install vllm-v0-legacy==0.4.1``; the folders are the same as
``vllm-v0``'s); 0.3.3 (no such interface) and 0.6.3 on (no v1, outside the row): one line,
exit 2. 0.4.0 and 0.4.1 name the evictor ``vllm/core/evictor.py``; 0.4.0 has no
``vllm/core/block/`` (block manager v2's files), which this target does not need, names the
manager's methods ``can_append_slot`` / ``append_slot`` (recorded as the plural ones) and has
no chunked prefill (``-chunked`` refused in one line); 0.4.0 and 0.4.1 have no
``SequenceGroupMetadata.do_sample``: the engine processes a group's outputs once its
sequences are in their DECODE stage (0.4.1, ``LLMEngine._process_model_outputs``), every
scheduled group's (0.4.0), as the driver does there.

Observation (instead of block manager v2's): a table is the ``block_number`` of each
``PhysicalTokenBlock`` in ``block_tables[seq_id]``; a block's refcount is its own
``ref_count`` (the ``UncachedBlockAllocator`` makes every GPU block at start-up: they are
kept by number); the free blocks are the allocator's ``free_blocks``.

Prefix caching is refused in one line: v1's ``CachedBlockAllocator`` keys a prompt's last
block by ``Sequence.hash_of_block`` over ``num_hashed_tokens_of_block`` = ``(i + 1) *
block_size`` tokens, which for a partial last block hashes the tokens it holds: a partial
block is cached and shared by an identical prompt, and copied on its next write. kvcheck's
prefix-cache rules read only full blocks as cached (``no_partial_cached``): a verdict there
would be the spec's reading, not the release's bug, so it is not given.
"""

from __future__ import annotations

from typing import Any

from ..errors import MisuseError
from .vllm_v0_engine import VllmV0EngineTarget

ENGINE_KEY = "vllm-v0-legacy"  # the install row of 0.3.3 .. 0.6.2, pinned 0.4.0 (the releases
# with block manager v1; vllm-v0's row starts at 0.4.2)
LOW = "0.4.0"  # the first with vllm/core/interfaces.py (BlockSpaceManager.get_..._class)


class VllmV0EngineV1Target(VllmV0EngineTarget):
    """vLLM v0's ``Scheduler`` with ``BlockSpaceManagerV1`` (see the module doc)."""

    block_manager_v2 = False

    def __init__(self, num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 max_model_len: int = 0, chunked: bool = False,
                 version: str | None = None, engine: str = ENGINE_KEY):
        if caching:
            raise MisuseError("vllm-v0-engine-v1 runs BlockSpaceManagerV1 without prefix "
                              "caching only: its CachedBlockAllocator caches and shares a "
                              "partial last block (hashed over the tokens it holds), which "
                              "kvcheck's prefix-cache rules do not model; run it with "
                              "--no-prefix-caching, or vllm-v0-engine (block manager v2)")
        from . import install
        from .vllm_v0_engine import load

        dist = install.select(engine, version)  # (before loading: 0.3.3 has other files)
        if install.version_key(dist.version) < install.version_key(LOW):
            raise MisuseError(f"vllm-v0-engine-v1 runs vLLM {LOW} .. 0.6.2, not "
                              f"{dist.version} (before 0.4.0 the scheduler has no "
                              f"BlockSpaceManager interface: vllm-v0-legacy drives its block "
                              f"manager)")
        mods = load(version, engine)
        if not mods.has("vllm.core.block_manager_v1"):
            raise MisuseError(f"vllm {mods.dist.version} has no block manager v1 "
                              f"(vllm/core/block_manager_v1.py: 0.4.0 .. 0.6.2); run "
                              f"vllm-v0-engine (block manager v2)")
        if chunked and not hasattr(mods["vllm.core.scheduler"].Scheduler,
                                   "_schedule_chunked_prefill"):
            raise MisuseError(f"vllm {mods.dist.version}'s scheduler has no chunked prefill "
                              f"(Scheduler._schedule_chunked_prefill: 0.4.1 on)")
        super().__init__(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                         max_model_len, chunked, version, engine)
        manager = type(self.manager)  # (the scheduler's own choice of class)
        if manager.__name__ != "BlockSpaceManagerV1":
            raise MisuseError(f"vllm {self.version}'s scheduler built {manager.__name__}, "
                              f"not BlockSpaceManagerV1")
        self._blocks = {b.block_number: b for b in self.gpu.free_blocks}

    def _gpu_allocator(self) -> Any:
        return self.manager.gpu_allocator

    def _table(self, s: Any) -> list[int]:
        t = self.manager.block_tables.get(s.seq_id)
        return [b.block_number for b in t] if t is not None else []

    def refcount(self, block: int) -> int:
        return self._blocks[block].ref_count

    def free_blocks(self) -> list[int]:
        return [b.block_number for b in self.gpu.free_blocks]

    def num_free(self) -> int:
        return self.gpu.get_num_free_blocks()


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> VllmV0EngineV1Target:
    """vLLM v0's scheduler on block manager v1, chunked prefill off."""
    return VllmV0EngineV1Target(num_blocks, block_size, budget, max_seqs, policy, caching,
                                spec, max_model_len or 0, False, version)


def make_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 version: str | None = None,
                 max_model_len: int | None = None) -> VllmV0EngineV1Target:
    """vLLM v0's scheduler on block manager v1 with chunked prefill."""
    return VllmV0EngineV1Target(num_blocks, block_size, budget, max_seqs, policy, caching,
                                spec, max_model_len or 0, True, version)
