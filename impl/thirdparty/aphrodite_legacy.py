"""Adapter: aphrodite-engine's BlockSpaceManager v1 (0.5.0 .. 0.6.5), as ``vllm-v0-legacy``.

aphrodite-engine forked vLLM's block manager: 0.5.x ``aphrodite/processing/block_manager.py``
(vLLM's from before PR #3347: ``fork`` adds a reference per entry, ``_free_block_table``
frees ``set(block_table)``), 0.6.x ``block_manager_v1.py`` (PR #3347's ``set``s, and F10).
``impl/thirdparty/vllm_v0_legacy.py`` loads them (engine ``aphrodite-legacy``, its stand-ins
``APHRODITE_STUBS``) and drives them with the same ``VllmV0LegacyTarget`` (a cyclic window
of ``W`` blocks; see that module). One difference in what it observes: 0.5.x's
``BlockAllocator`` makes a block only when it first hands it out (``current_num_blocks``)
and keeps freed ones in an evictor (FIFO without caching), so the target reads a block not
made yet as free with refcount 0 and the free list as those numbers plus the evictor's.
"""

from __future__ import annotations

from .vllm_v0_legacy import APHRODITE_KEY, VllmV0LegacyTarget

ENGINE_KEY = APHRODITE_KEY  # its row in install.ENGINES: the releases this adapter loads


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0LegacyTarget:
    """A window of two blocks (``sliding_window = 2 * block_size``)."""
    return VllmV0LegacyTarget(num_blocks, block_size, 2, version, engine=APHRODITE_KEY)


def make_one_block(num_blocks: int, block_size: int,
                   version: str | None = None) -> VllmV0LegacyTarget:
    """A window of one block: the shape of aphrodite-1556's raw replay."""
    return VllmV0LegacyTarget(num_blocks, block_size, 1, version, engine=APHRODITE_KEY)
