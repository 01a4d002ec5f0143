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
    "reference-cyclic": ("kvcheck.impl.block_manager:CyclicBlockManager",
                         "the seed's four operations under a cyclic sliding window of 2 blocks "
                         "(tables reuse their blocks cyclically, as vLLM's BlockSpaceManager v1)"),
    "vllm-v1": ("kvcheck.impl.thirdparty.vllm_v1:make",
                "vLLM v1 KVCacheManager/BlockPool (0.33.0; @0.6.4.post1..0.34.0), prefix caching, no fork"),
    "vllm-v1-lifecycle": ("kvcheck.impl.thirdparty.vllm_v1_lifecycle:make",
                          "vLLM 0.33.0 v1 KVCacheManager as vllm-v1, the prompt's forward pass "
                          "as commit(seq) (allocate_slots publishes hashes before it)"),
    "vllm-v1-sliding": ("kvcheck.impl.thirdparty.vllm_v1_sliding:make",
                        "vLLM 0.33.0 v1 KVCacheManager, one sliding-window group (window B+1)"),
    "vllm-v0": ("kvcheck.impl.thirdparty.vllm_v0:make",
                "vLLM v0 BlockTable (0.8.5; @0.4.2..0.9.2), naive allocator, copy-on-write fork"),
    "vllm-v0-prefix": ("kvcheck.impl.thirdparty.vllm_v0:make_prefix",
                       "vLLM v0 BlockTable (0.8.5; @0.4.2..0.9.2), prefix-caching allocator"),
    "vllm-v0-sliding": ("kvcheck.impl.thirdparty.vllm_v0_sliding:make",
                        "vLLM 0.8.5 v0 BlockTable with a sliding window (naive allocator)"),
    "vllm-v0-legacy": ("kvcheck.impl.thirdparty.vllm_v0_legacy:make",
                       "vLLM v0 BlockSpaceManager v1 (0.4.0; @0.3.3..0.6.2), a cyclic sliding "
                       "window of 2 blocks, beam-search forks, copy-on-write"),
    "nano-vllm": ("kvcheck.impl.thirdparty.nano_vllm:make",
                  "nano-vllm-fork 20260210 BlockManager, xxhash prefix caching (no fork)"),
    "sglang-token": ("kvcheck.impl.thirdparty.sglang:make_token",
                     "SGLang TokenToKVPoolAllocator (0.5.23; @0.4.8..0.5.23; page size 1; "
                     "no refcounts, no fork)"),
    "sglang-paged": ("kvcheck.impl.thirdparty.sglang:make_paged",
                     "SGLang PagedTokenToKVPoolAllocator (0.5.23; @0.4.8..0.5.23), page size = "
                     "block size (no fork)"),
    "sglang-radix": ("kvcheck.impl.thirdparty.sglang_radix:make",
                     "SGLang RadixCache (0.5.23; @0.5.22..0.5.23) over its allocator: tree locks, "
                     "LRU eviction (no fork)"),
    "aphrodite": ("kvcheck.impl.thirdparty.aphrodite:make",
                  "aphrodite-engine 0.24.1 v1 KVCacheManager (a vLLM v1 fork), prefix caching"),
    "device": ("kvcheck.impl.device.manager:make",
               "paged K/V on torch (cuda if present, else cpu), Triton kernels or torch fallback"),
    "prefix": ("kvcheck.impl.prefix_cache:PrefixCachingBlockManager",
               "the bundled reference prefix-caching block manager (hash-chained blocks, LRU)"),
    "prefix-commit": ("kvcheck.impl.prefix_cache:CommittingPrefixCachingBlockManager",
                      "the reference prefix cache with the prompt's write deferred to commit(seq): "
                      "keys published after the write"),
    "prefix-engine": ("kvcheck.impl.prefix_cache:EnginePrefixCachingBlockManager",
                      "the reference prefix cache with append_slots, rollback, rebase, preempt "
                      "(keys dropped from the blocks a rollback makes partial)"),
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

# Targets of the tiers model (``kvcheck verify-tiers``): a device pool and a host pool,
# transfers in flight; a factory called as ``factory(num_blocks, block_size, host_blocks)``.
TIERS_TARGETS: dict[str, tuple[str, str]] = {
    "reference-tiers": ("kvcheck.impl.tiered_cache:TieredCache",
                        "the reference tiered store: a device pool, a host pool with an LRU "
                        "cache of stored prefixes, stores and loads in flight, vLLM v0 swaps"),
    "vllm-v0-swap": ("kvcheck.impl.thirdparty.vllm_v0_swap:make",
                     "vLLM v0 block manager v2 with its CPU pool (0.8.5; @0.5.0.post1..0.9.2): "
                     "swap_out / swap_in through the release's own manager"),
    "vllm-v0-swap-prefix": ("kvcheck.impl.thirdparty.vllm_v0_swap:make_prefix",
                            "vllm-v0-swap with prefix caching (evictor blocks count as room)"),
    "vllm-v0-swap-lookahead": ("kvcheck.impl.thirdparty.vllm_v0_swap:make_lookahead",
                               "vllm-v0-swap, every swap-in with one block of lookahead slots"),
    "reference-tiers-data": ("kvcheck.impl.tiered_data:DataTieredCache",
                             "reference-tiers with its K/V (torch; the device pool on CUDA when "
                             "there is one): every copy moves real data, read back each step"),
    "sglang-hicache": ("kvcheck.impl.thirdparty.sglang_hicache:make",
                       "SGLang HiRadixCache with its host pool and HiCacheController (0.4.5; "
                       "@0.4.4.post2..0.5.20; block size 1, host >= device): write backups, "
                       "load-back, host eviction; completions delivered by the driver"),
    "sglang-hicache-storage": ("kvcheck.impl.thirdparty.sglang_hicache:make_storage",
                               "sglang-hicache with the storage tier on (0.5.6; "
                               "@0.5.3..0.5.18; host well above device): prefetches "
                               "filled partly by a stand-in backend, backups acked"),
    "reference-swa": ("kvcheck.impl.swa_cache:SWACache",
                      "the reference full-attention pool with a sliding-window pool behind a "
                      "mapping (SGLang's SWA allocator): slide releases tokens behind the window"),
    "sglang-swa": ("kvcheck.impl.thirdparty.sglang_swa:make",
                   "SGLang SWATokenToKVPoolAllocator (0.5.23; @0.5.13..0.5.23), page size = block "
                   "size > 1: the full pool and the SWA pool behind full_to_swa_index_mapping"),
    "vllm-v1-simple-offload": ("kvcheck.impl.thirdparty.vllm_v1_offload:make",
                               "vLLM v1 SimpleCPUOffloadConnector, scheduler side, eager (0.33.0; "
                               "@0.20.2..0.34.0) over the release's KVCacheManager, full attention "
                               "+ sliding window 2 x block size; stores completed by the driver"),
    "vllm-v1-simple-offload-lazy": ("kvcheck.impl.thirdparty.vllm_v1_offload:make_lazy",
                                    "vllm-v1-simple-offload in lazy mode: a step's store copies "
                                    "cached GPU blocks near eviction from the free queue"),
    "aphrodite-simple-offload": ("kvcheck.impl.thirdparty.aphrodite_offload:make",
                                 "aphrodite-engine's SimpleCPUOffloadConnector (vLLM's, inherited; "
                                 "0.24.1; @0.20.0..0.24.1), as vllm-v1-simple-offload"),
    "vllm-v1-native-offload": ("kvcheck.impl.thirdparty.vllm_v1_native_offload:make",
                               "vLLM v1 OffloadingConnector, scheduler side, with its "
                               "CPUOffloadingManager (LRU; 0.33.0; @0.11.0..0.34.0; to 0.20.2 jobs "
                               "keyed by request, stored at a request's end) over the release's "
                               "KVCacheManager: stores, final stores, loads, flushes; completions by the "
                               "driver"),
    "vllm-v1-native-offload-arc": ("kvcheck.impl.thirdparty.vllm_v1_native_offload:make_arc",
                                   "vllm-v1-native-offload with the CPU manager's ARC policy"),
    "vllm-v1-pd": ("kvcheck.impl.thirdparty.vllm_v1_pd:make",
                   "vLLM v1 disaggregated prefill, prefill side: the NIXL connector's scheduler "
                   "half (0.33.0; @0.33.0..0.34.0) with the release's Scheduler delayed free over its "
                   "KVCacheManager: a finished prefill's blocks held until finished_sending"),
    "vllm-v1-pd-early-free": ("kvcheck.impl.thirdparty.vllm_v1_pd:make_early_free",
                              "vllm-v1-pd deliberately broken: blocks freed at request_finished, "
                              "before the send completes (caught)"),
    "vllm-v1-pd-recv": ("kvcheck.impl.thirdparty.vllm_v1_pd_recv:make",
                        "vLLM v1 disaggregated prefill, decode side: the NIXL connector's "
                        "scheduler half receiving a remote prefill (0.33.0; @0.33.0..0.34.0) with "
                        "the release's Scheduler wait, promotion and abort over its "
                        "KVCacheManager: blocks held while WAITING_FOR_REMOTE_KVS"),
    "vllm-v1-pd-recv-abort-frees": ("kvcheck.impl.thirdparty.vllm_v1_pd_recv:make_abort_frees",
                                    "vllm-v1-pd-recv deliberately broken: an abort while "
                                    "receiving frees the blocks before the receive completes "
                                    "(caught)"),
}

# Engine cores (``kvcheck verify-engine``): the engine's own scheduler with its own KV-cache
# manager, driven by engine steps whose model output kvcheck generates (the engine model).
ENGINE_TARGETS: dict[str, tuple[str, str]] = {
    "vllm-v1-engine": ("kvcheck.impl.thirdparty.vllm_v1_engine:make",
                       "vLLM v1's real Scheduler, KVCacheManager and Request (0.33.0; "
                       "@0.6.4.post1..0.34.0), no model: add_request, schedule, a generated "
                       "ModelRunnerOutput, update_from_output"),
    "nano-vllm-engine": ("kvcheck.impl.thirdparty.nano_vllm_engine:make",
                         "nano-vllm's real Scheduler, BlockManager and Sequence "
                         "(nano-vllm-fork 20260210), no model: add, schedule, generated "
                         "tokens, postprocess; no aborts, fcfs, prefix caching always on"),
    "nano-vllm-npu-engine": ("kvcheck.impl.thirdparty.nano_vllm_npu_engine:make",
                             "upstream nano-vllm's Scheduler as nano-vllm-npu carries it "
                             "(0.0.2; @0.0.1.post1..0.0.2), driven as nano-vllm-engine"),
    "vllm-v0-engine": ("kvcheck.impl.thirdparty.vllm_v0_engine:make",
                       "vLLM v0's real Scheduler, SelfAttnBlockSpaceManager and "
                       "SequenceGroup (0.8.5; @0.4.2..0.9.2), no model: add_seq_group, schedule, "
                       "generated "
                       "tokens, free_finished_seq_groups; chunked prefill off"),
    "vllm-v0-engine-chunked": ("kvcheck.impl.thirdparty.vllm_v0_engine:make_chunked",
                               "vllm-v0-engine with chunked prefill on "
                               "(enable_chunked_prefill)"),
    "vllm-v0-engine-window": ("kvcheck.impl.thirdparty.vllm_v0_engine_window:make",
                              "vllm-v0-engine with a sliding window of one block's tokens "
                              "(CacheConfig.sliding_window, as the engine sets it for a "
                              "sliding-window model): the release's windowed can_allocate, "
                              "allocate and append_slots; prefix caching off"),
    "vllm-v0-engine-window-chunked": ("kvcheck.impl.thirdparty.vllm_v0_engine_window:"
                                      "make_chunked",
                                      "vllm-v0-engine-window with chunked prefill on "
                                      "(@0.4.3..0.9.2: accepted with block manager v2)"),
    "vllm-v0-engine-v1": ("kvcheck.impl.thirdparty.vllm_v0_engine_v1:make",
                          "vllm-v0-engine on the release's BlockSpaceManagerV1, the block "
                          "manager its scheduler builds by default to 0.6.2 "
                          "(0.4.0; @0.4.0..0.6.2): prefix caching off"),
    "vllm-v0-engine-v1-chunked": ("kvcheck.impl.thirdparty.vllm_v0_engine_v1:make_chunked",
                                  "vllm-v0-engine-v1 with chunked prefill on"),
    "aphrodite-v0-engine": ("kvcheck.impl.thirdparty.aphrodite_v0_engine:make",
                            "vllm-v0-engine on aphrodite-engine 0.6.x's own Scheduler, "
                            "BlockSpaceManagerV2 and SequenceGroup (0.6.5; @0.6.0..0.6.5)"),
    "aphrodite-v0-engine-chunked": ("kvcheck.impl.thirdparty.aphrodite_v0_engine:make_chunked",
                                    "aphrodite-v0-engine with chunked prefill on "
                                    "(enable_chunked_prefill)"),
    "aphrodite-v0-engine-window": ("kvcheck.impl.thirdparty.aphrodite_v0_engine:make_window",
                                   "aphrodite-v0-engine with a sliding window of one block's "
                                   "tokens, as vllm-v0-engine-window"),
    "aphrodite-v0-engine-window-chunked": ("kvcheck.impl.thirdparty.aphrodite_v0_engine:"
                                           "make_window_chunked",
                                           "aphrodite-v0-engine-window with chunked prefill "
                                           "on"),
    "aphrodite-v1-engine": ("kvcheck.impl.thirdparty.aphrodite_v1_engine:make",
                            "vllm-v1-engine on aphrodite-engine's own v1 Scheduler, "
                            "KVCacheManager and Request (0.24.1; @0.20.0..0.24.1)"),
    "sglang-engine": ("kvcheck.impl.thirdparty.sglang_engine:make",
                      "SGLang's own Scheduler loop, ScheduleBatch, Req, SchedulePolicy, "
                      "PrefillAdder, RadixCache, paged allocator and allocation/release "
                      "functions (0.5.23; @0.5.19..0.5.23), no model; radix cache on; "
                      "--policy also lpm, dfs-weight, lof, random (its calc_priority)"),
    "sglang-engine-optimistic": ("kvcheck.impl.thirdparty.sglang_engine:make_optimistic",
                                 "sglang-engine with --schedule-conservativeness 0.05 (SGLang's "
                                 "own retraction test setting): decode outgrows the pool and "
                                 "retract_decode runs"),
}
