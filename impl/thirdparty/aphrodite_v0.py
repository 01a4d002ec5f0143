"""Adapter: aphrodite-engine 0.6.x's v0 block manager v2 (a vLLM v0 fork) as a ``Target``.

aphrodite-engine 0.6.0 .. 0.6.5 (PyPI; 0.10.0 on carry vLLM v1's manager, see
``aphrodite.py``) carry vLLM v0's block manager v2 under ``aphrodite/processing/``:
``block/{block_table, common, interfaces, naive_block, prefix_caching_block,
cpu_gpu_block_allocator}.py`` and ``evictor_v2.py``, the classes and calls of vLLM
0.5.3 .. 0.6.1 (``block/prefix_caching_block.py`` of 0.6.0 .. 0.6.3.post1 reads as
vLLM 0.5.3.post1's but for its imports; 0.6.5's as vLLM 0.6.0's), with aphrodite's
own module names (``aphrodite.common.utils`` for ``vllm.utils``). So the adapter *is*
``vllm_v0.VllmV0Target`` (operations, guard, prefix-caching count: its docstring), on
aphrodite's files, loaded through ``vllm_v0.load(version, "aphrodite-v0")``
(``vllm_v0.LAYOUTS``: the module names; the stand-ins are ``vllm_v0``'s, under
aphrodite's names: ``Device`` / ``cdiv`` / ``chunk_list`` of ``aphrodite.common.utils``,
the only names the block files import from it).

``kvcheck install aphrodite-engine==VERSION`` (``aphrodite-v0``: 0.6.0 .. 0.6.5; only the
wheel's ``*.py`` files are kept); ``TARGET@VERSION`` picks the release
(``kvcheck.impl.thirdparty.aphrodite_v0:make_guarded@0.6.5``), 0.6.5 by default.
``aphrodite_v0_sliding`` is the same with aphrodite's sliding window.
"""

from __future__ import annotations

from .vllm_v0 import VllmV0Target

ENGINE_KEY = "aphrodite-v0"  # its row in install.ENGINES


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """aphrodite v0, naive allocator (no prefix caching), unguarded."""
    return VllmV0Target(num_blocks, block_size, "naive", version=version, engine=ENGINE_KEY)


def make_prefix(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """aphrodite v0, prefix-caching allocator, unguarded."""
    return VllmV0Target(num_blocks, block_size, "prefix_caching", version=version,
                        engine=ENGINE_KEY)


def make_guarded(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """aphrodite v0 naive behind its ``BlockSpaceManagerV2``'s capacity checks (the
    refusals are ``vllm_v0``'s ``EngineGuardRefused``)."""
    return VllmV0Target(num_blocks, block_size, "naive", guard="engine", version=version,
                        engine=ENGINE_KEY)


def make_chunked(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """``make_guarded`` with chunked prefill, one block per chunk (``vllm_v0.make_chunked``:
    the allocation, then each later chunk's ``append_slots`` with no unseen tokens)."""
    return VllmV0Target(num_blocks, block_size, "naive", guard="engine", version=version,
                        engine=ENGINE_KEY, prefill_chunk=block_size)


def make_prefix_guarded(num_blocks: int, block_size: int,
                        version: str | None = None) -> VllmV0Target:
    """aphrodite v0 prefix caching behind its block manager's capacity checks."""
    return VllmV0Target(num_blocks, block_size, "prefix_caching", guard="engine",
                        version=version, engine=ENGINE_KEY)


def make_sliding_guarded(num_blocks: int, block_size: int,
                         version: str | None = None):
    """``vllm_v0_sliding.make_guarded`` on aphrodite's files: a sliding window of one block
    (``BlockSpaceManagerV2(sliding_window=block_size)``: ``max_block_sliding_window =
    sliding_window // block_size + 2``, the null block taken at construction), behind its
    ``can_allocate``, which caps the required blocks at ``max_block_sliding_window`` as
    vLLM's does (vLLM #11168; aphrodite 0.6.0 .. 0.6.5 alike)."""
    from .vllm_v0_sliding import VllmV0SlidingTarget

    return VllmV0SlidingTarget(num_blocks, block_size, block_size, guard="engine",
                               fork_after_drop=False, version=version, engine=ENGINE_KEY)
