"""vLLM v1 (0.10.2 .. 0.34.0) for adapters built on kvcheck's (``kvcheck.engines``).

``VllmV1Target`` is kvcheck's adapter over a real ``KVCacheManager``
(``impl/thirdparty/vllm_v1.py`` documents every operation, stand-in and observation):
subclass it to add a plugin's behaviour, the engine's operations unchanged. ``load(version)``
loads vLLM's KV-cache files (``FILES``, with the stand-ins ``STUBS``: module name -> builder)
at ``version`` (``None``: this environment's vLLM when in range, else the pinned 0.33.0);
``build_manager(num_blocks, block_size, enable_caching, mods)`` builds the manager over
``num_blocks`` usable blocks and returns it with vLLM's request block hasher; ``Request`` and
``RequestStatus`` stand in for ``vllm.v1.request``'s (the fields the manager reads);
``computed_blocks(manager, request)`` is ``get_computed_blocks`` as ``(blocks,
num_computed)`` on every release. Block ids: the adapter's id ``b`` is vLLM's ``b + 1``
(``NULL_BLOCK_OFFSET``: vLLM's pool keeps block 0 as its null block).
"""

from __future__ import annotations

from kvcheck.impl.thirdparty.vllm_v1 import (
    ENGINE_KEY,
    FILES,
    STUBS,
    Request,
    RequestStatus,
    VllmV1Target,
    build_manager,
    computed_blocks,
    hash_fn,
    load,
    make,
    make_no_cache,
)

NULL_BLOCK_OFFSET = 1
"""vLLM's block id of the adapter's block 0 (``kvcheck.engines.copies(pairs, offset=...)``)."""

__all__ = ["ENGINE_KEY", "FILES", "NULL_BLOCK_OFFSET", "STUBS", "Request", "RequestStatus",
           "VllmV1Target", "build_manager", "computed_blocks", "hash_fn", "load", "make",
           "make_no_cache"]
