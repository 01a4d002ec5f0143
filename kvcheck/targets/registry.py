"""Registered TARGET names for ``kvcheck verify`` / ``kvcheck prove``.

Each entry maps a short name to ``module:attr`` of a factory called as
``factory(num_blocks, block_size)``; the module is imported only when used.
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
                "vLLM 0.33.0 v1 KVCacheManager/BlockPool, prefix caching (no fork)"),
    "vllm-v0": ("kvcheck.impl.thirdparty.vllm_v0:make",
                "vLLM 0.8.5 v0 BlockTable on the naive allocator, copy-on-write fork"),
    "vllm-v0-prefix": ("kvcheck.impl.thirdparty.vllm_v0:make_prefix",
                       "vLLM 0.8.5 v0 BlockTable on the prefix-caching allocator"),
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

# Targets of the hybrid-pool model (``kvcheck verify-hybrid``): KV-cache groups sharing one pool.
HYBRID_TARGETS: dict[str, tuple[str, str]] = {
    "reference-hybrid": ("kvcheck.impl.hybrid_manager:HybridBlockManager",
                         "the reference hybrid pool: a full-attention and a sliding-window "
                         "group (window 2 x block size) sharing one pool, prefix caching"),
    "vllm-v1-hybrid": ("kvcheck.impl.thirdparty.vllm_v1_hybrid:make",
                       "vLLM 0.33.0 v1 KVCacheManager, HybridKVCacheCoordinator: full attention "
                       "+ sliding window 2 x block size sharing one pool, prefix caching"),
    "vllm-v1-hybrid-odd": ("kvcheck.impl.thirdparty.vllm_v1_hybrid:make_odd_window",
                           "vllm-v1-hybrid with a sliding window of block size + 1 tokens"),
}
