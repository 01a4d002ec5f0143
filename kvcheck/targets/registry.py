"""Registered TARGET names for ``kvcheck verify`` / ``kvcheck prove``.

Each entry maps a short name to ``module:attr`` of a factory called as
``factory(num_blocks, block_size)``; the module is imported only when used.
A third-party adapter whose module names an ``ENGINE_KEY`` (a row of
``impl/thirdparty/install.py``'s ``ENGINES``) also takes ``NAME@VERSION``
(``vllm-v0@0.4.2``, ``@pinned``, ``@installed``): ``factory(n, b, version=...)``.
"""

TARGETS: dict[str, tuple[str, str]] = {
    # name: ("module:attr", one-line description)
    "reference": ("kvcheck.impl.block_manager:BlockManager",
                  "the bundled reference block manager (the seed's four operations)"),
    "reference-engine": ("kvcheck.impl.block_manager:EngineBlockManager",
                         "the reference with append_slots (lookahead), rollback, rebase, preempt"),
    "reference-eager": ("kvcheck.impl.block_manager:EagerForkBlockManager",
                        "reference-engine with eager copy-on-write at fork and rebase"),
    "reference-window": ("kvcheck.impl.block_manager:WindowBlockManager",
                         "reference-engine with sliding-window drops (null blocks behind a window)"),
    "vllm-v1": ("kvcheck.impl.thirdparty.vllm_v1:make",
                "vLLM v1 KVCacheManager/BlockPool (0.33.0; @0.10.2..0.33.0), prefix caching, no fork"),
    "vllm-v0": ("kvcheck.impl.thirdparty.vllm_v0:make",
                "vLLM v0 BlockTable (0.8.5; @0.4.2..0.8.5), naive allocator, copy-on-write fork"),
    "vllm-v0-prefix": ("kvcheck.impl.thirdparty.vllm_v0:make_prefix",
                       "vLLM v0 BlockTable (0.8.5; @0.4.2..0.8.5), prefix-caching allocator"),
    "nano-vllm": ("kvcheck.impl.thirdparty.nano_vllm:make",
                  "nano-vllm-fork 20260210 BlockManager, xxhash prefix caching (no fork)"),
    "device": ("kvcheck.impl.device.manager:make",
               "paged K/V on torch (cuda if present, else cpu), Triton kernels or torch fallback"),
    "prefix": ("kvcheck.impl.prefix_cache:PrefixCachingBlockManager",
               "the bundled reference prefix-caching block manager (hash-chained blocks, LRU)"),
    "prefix-commit": ("kvcheck.impl.prefix_cache:CommittingPrefixCachingBlockManager",
                      "the reference prefix cache with the prompt's write deferred to commit(seq): "
                      "keys published after the write"),
}
