"""Adapter: SGLang's scheduler as an engine core (``sglang-engine[@VERSION]``, 0.5.19 ..
0.5.23; issue 34 §1) -- the release's own ``Scheduler`` loop (``get_next_batch_to_run``,
``update_running_batch``, ``process_batch_result``, ...), ``ScheduleBatch``, ``Req``,
``SchedulePolicy``, ``PrefillAdder`` with its ``PrefillBudget``, ``RadixCache``, paged
token-to-KV allocator and ``ReqToTokenPool``, and the scheduler's own allocation and release
functions, driven step by step with no model.

Releases: each release runs its own scheduler loop, which calls its own functions; the
module doc names 0.5.23's. Where they differ in an earlier release (``RENAMED``; the
adapter reads them only to load them, to observe -- ``_prefix_len``,
``_prefix_kv_indices`` -- and to release an aborted request, ``__release_kw__``):

* 0.5.22 .. 0.5.23: ``checkpoint_kv_cache`` (stash and unfinished prefill),
  ``release_kv_cache(req, tree, checkpoint=True)``, ``alloc_for_decode_default``; 0.5.23's
  ``get_num_allocatable_reqs`` also counts the rows admitted requests hold
  (``num_held_rows``), 0.5.22's does not;
* 0.5.21: ``maybe_cache_unfinished_req(req, tree[, chunked=True])`` (the tree's
  ``cache_unfinished_req``), ``release_kv_cache(req, tree)`` (``is_insert`` defaults to
  True), ``alloc_for_decode``; ``Req`` matches its prefix in ``init_next_round_input`` and
  keeps ``prefix_indices`` / ``extend_range`` where 0.5.22 keeps ``prefix_len`` /
  ``extend_end`` (``_prefix_len`` reads whichever the release has, as its
  ``prepare_for_extend`` does); the paged allocator runs its Triton kernels under Triton's
  CPU interpreter (``sglang.py``);
* 0.5.19 .. 0.5.20: as 0.5.21, and no ``mem_cache/prefill_budget.py``: ``PrefillAdder``
  keeps its budget itself (``_update_prefill_budget``; 0.5.20's reads ``is_swa_req_ring``
  directly); 0.5.19's radix cache is built as ``sglang-radix``'s loader builds it (its
  ``disaggregation/kv_events`` metadata classes, no ``allocator/page_interleave.py``, a
  ``mem_cache/common.py`` without ``_evict_until_allocatable``);
* before 0.5.19 the request's KV record is created at allocation (0.5.18) and the
  allocator modules import ``debug_utils/cuda_coredump`` (to 0.5.17): the range stops at
  0.5.19 (``install.ENGINES["sglang-engine"]``'s note).

Policies (``--policy``): ``fcfs``; ``priority`` (fcfs with ``enable_priority_scheduling``:
priority, then queue entry); SGLang's ``lpm``, ``dfs-weight`` (cache-aware: the release's
``calc_priority`` matches every waiting request against the tree, with its in-batch
prefix deprioritisation) and ``lof``, ``random`` -- each the server's
``--schedule-policy``, passed to the release's ``SchedulePolicy`` and published as
``get_schedule().schedule_policy``. None of the engine oracle's rules assumes an FCFS order
(liveness's bound holds for any order that drains a finite queue). Not offered: ``hrrn``
(reads the scheduler's processed-token counter), ``shortest-prefill-first`` (the scheduler's
chunk limit), ``routing-key`` (requests' routing keys): refused in one line.

What runs, executed from the installed wheel (``_loader``, ``sglang_loop``; nothing rewritten):

* the scheduler's loop -- ``managers/scheduler.py``'s ``Scheduler`` methods, each compiled
  from the release's class body onto a shell whose members are this run's objects
  (``sglang_loop.compile_class``): ``get_next_batch_to_run`` (``process_pending_chunked_abort``,
  ``stash_chunked_request``, the last prefill batch filtered and merged into the running
  batch, ``get_new_batch_prefill`` / ``_get_new_batch_prefill_raw``: ``calc_priority``, the
  ``PrefillAdder``, ``get_num_allocatable_reqs``, ``batch_is_full``, priority preemption
  where priority scheduling is on, ``ScheduleBatch.init_new`` and ``prepare_for_extend``;
  else ``update_running_batch``: ``check_decode_mem``, ``retract_decode``, the retracted
  requests back through ``_add_request_to_queue``, ``prepare_for_decode``),
  ``process_batch_result`` -> the release's ``SchedulerBatchResultProcessor``'s
  ``process_batch_result_prefill`` / ``_decode`` (the token appended,
  ``update_finish_state``, ``release_kv_cache`` / ``checkpoint_kv_cache``, a chunk's
  ``inflight_middle_chunks``), ``on_idle`` (the new-token ratio reset when fully idle),
  ``_add_request_to_queue`` (arrivals), ``abort_request``, ``init_req_max_new_tokens``;
  the adapter calls them in ``event_loop_normal``'s order (no overlap): ``plan =
  get_next_batch_to_run(running_batch, last_batch)``, then ``process_batch_result(batch,
  run_batch(batch))`` or ``on_idle()``, then ``last_batch = batch`` (the loop's
  ``while True`` and its ``ingest_requests``: ``add`` / ``abort`` between steps);
* ``managers/schedule_batch.py``: ``ScheduleBatch`` itself (the dataclass: ``init_new``,
  ``prepare_for_extend``, ``prepare_for_decode``, ``filter_batch``, ``merge_batch``,
  ``check_decode_mem``, ``retract_decode``, ``release_req``, ...) on CPU torch tensors;
  ``Req`` (its ``__init__``, ``init_next_round_input`` -- the prefix match through
  ``match_kv_cache`` --, ``update_finish_state`` (EOS and ``max_new_tokens``),
  ``reset_for_retract``, ``finished``, ``extend_len``), ``ReqKvInfo``, the finish reasons,
  ``release_req``; ``model_executor/forward_batch_info.py``'s ``ForwardMode`` and
  ``CaptureHiddenMode``; ``managers/utils.py``'s ``GenerationBatchResult`` and
  ``validate_input_length``;
* ``managers/schedule_policy.py``: ``SchedulePolicy`` (``calc_priority``: FCFS, or
  priority then queue entry ``time_stats.wait_queue_entry_time``) and ``PrefillAdder``
  (``add_chunked_req``, ``add_one_req``, ``budget_state``, ``preempt_to_schedule``, the
  token and memory budget); ``scheduler_components/new_token_ratio_tracker.py``;
* ``mem_cache/prefill_budget.py`` (``PrefillBudget``, via the allocator's own
  ``create_prefill_budget``), ``mem_cache/allocation.py`` (``alloc_for_extend``,
  ``alloc_for_decode`` / ``alloc_for_decode_default``, ``alloc_req_slots``,
  ``alloc_token_slots``, ``alloc_paged_token_slots_extend`` / ``_decode``,
  ``write_cache_indices``' torch path), ``mem_cache/common.py`` (``match_kv_cache``,
  ``checkpoint_kv_cache``, ``release_kv_cache``, ``_release_overallocated_kv_indices``,
  ``evict_from_tree_cache``);
* the radix cache, allocators and ``ReqToTokenPool`` exactly as ``sglang-radix`` loads them
  (``sglang_radix.py``: ``PagedTokenToKVPoolAllocator`` with ``page_size = block_size``,
  ``TokenToKVPoolAllocator`` at block size 1); the row pool sized as the server sizes it
  (``resolve_max_num_reqs``: ``min(--max-running-requests, token capacity // 2)`` rows),
  ``max_req_len`` as ``TpModelWorker``'s ``min(context_len - 1, pool tokens - 1)``,
  ``max_req_input_len = max_req_len - 5``.

The scheduler's members are the server's at its defaults (``--schedule-policy`` the run's
policy; ``--enable-priority-scheduling`` for ``priority``, with priority preemption on
and its threshold 10 as by default; ``--max-running-requests`` = ``max_seqs``;
``--chunked-prefill-size`` = ``--max-prefill-tokens`` = ``budget``; no mixed chunks, no
prefill delayer, no dynamic chunking, no queue limit, no LoRA, no overlap).

Aborts: ``abort_request`` (a waiting request leaves the queue; a chunked one is marked for
``process_pending_chunked_abort``; a running one gets ``to_finish = FINISH_ABORT()``).
The release frees a running request's KV at its next result and a chunked one's at the
next step's start; the engine oracle's abort frees at once, so the adapter then does
what those do -- ``process_pending_chunked_abort()``, or ``update_finish_state()`` and
``release_kv_cache(req, tree, checkpoint=True)`` -- and leaves the finished request in its
batch, which the release's next ``filter_batch`` drops (clearing ``batch_is_full`` as
it would). A waiting request's ``finished_reason`` is set to ``FINISH_ABORT()`` (what the
tokenizer makes of ``send_abort_output``).

Stand-ins, in one place:

The model worker (``run_batch``, ``TpModelWorker``, its model runner)
    no forward pass: ``_run_batch`` builds the release's ``GenerationBatchResult`` with
    ``next_token_ids`` drawn per request (``STOP``, the EOS id in ``eos_token_ids``, with
    probability 0.08, else a token in 2 .. ``VOCAB``; a function of the step's ``gen`` and
    the request's id; a chunk's token is drawn and the release discards it); the
    scheduler reads of the worker only its attention backend (no Triton tile size: 64) and
    ``prefill_aware_swa`` False (``_ModelWorker``, a ``StandIn``); ``ModelConfig`` a record
    of a decoder-only text model of ``VOCAB + 1`` ids (``_MODEL_CONFIG``).
``SamplingBatchInfo`` (``sglang_loop``)
    the sampler's tensors for the forward pass: built, filtered and merged with the batch,
    no penalizer (there is no sampler).
``SamplingParams``
    a record of what ``Req`` and the adder read: ``max_new_tokens``, ``ignore_eos =
    False``, ``stop_strs`` / ``stop_token_ids`` empty, ``custom_params = None``
    (``sampling_params.py`` needs ``msgspec`` and the watermarking package).
``msgspec`` structs
    ``NextBatchPlan`` and ``io_struct.AbortReq`` (``sglang_loop``): records of their
    fields (msgspec is not installed).
The detokenizer and its sockets, health checks, load publishing
    inert: ``send_abort_output``, ``ipc_channels``, ``output_streamer`` (``stream_output``),
    ``maybe_send_health_check_signal``, ``publish_load_snapshot``, ``load_publisher``,
    ``load_inquirer``, ``maybe_sleep_on_idle``.
Metrics, time statistics, tracing, stage timings
    record nothing (``sglang_loop.Inert``, ``MetricsReporter``: its counters are plain
    numbers; the ``SCHEDULER_STAGE_*`` labels are their names; ``_record_step_counters``,
    wall-clock step timings, inert; the ``scheduler_stage_method`` / ``scheduler_nvtx_method``
    decorators, profiler ranges, and ``DynamicGradMode`` are left off the compiled
    methods), except ``update_running_batch``'s ``num_retracted_reqs``, counted into
    ``stats``; and a request's ``time_stats`` (``_TimeStats``): its
    ``wait_queue_entry_time``, which priority scheduling sorts equal priorities by, is a
    logical clock (the number of queue entries before it), stamped where the release
    stamps ``time.perf_counter()`` -- time never decides a verdict. ``on_idle`` reads the
    wall clock only to throttle its load publishing (inert).
``SchedulerInvariantChecker``
    the server's own idle self-checks of its pools (``_InvariantChecker``: no leak
    reported); kvcheck's oracle checks the pools after every operation.
Components of features that are off
    the DP-attention adapter and the ngram embedding manager hand the batch back
    unchanged (``sglang_loop.PassThrough``); no grammar (``_GrammarManager``), no beam
    search (``_BeamCoordinator``: no member rows), no speculation
    (``_SpeculativeAlgorithm``), no diffusion LLM (``dllm_config`` None), no HiCache,
    HiSparse, LMCache, disaggregation, pipeline parallelism (``ps``: one process), LoRA,
    mamba or SWA; the routed-experts and indexer capturers none. The ``Scheduler``'s
    mixins (disaggregation, multiplexing, PP, dLLM, MLX) are not its bases here;
    ``ScheduleBatch``'s ``ScheduleBatchDisaggregationDecodeMixin`` is an empty class.
``sglang.srt.runtime_context`` (``get_context``, ``get_exec``, ``get_disagg``,
``get_memory``, ``get_schedule``, ``get_parallel``, ``get_spec``, ``get_serving``)
    the server configuration, published by the launcher: records of its defaults
    (disaggregation off, LRU eviction, no speculation, no DCP, no mamba, no encoder SWA
    replay, fcfs retraction policy, low priority values first).
``envs`` (``sglang.srt.environ``)
    the release's own ``Envs`` (every variable at its default unless set).
``random`` (the module ``schedule_policy.py`` shuffles the queue with, policy ``random``)
    a ``random.Random`` seeded by the step's ``gen`` (``_publish``): the process's global
    generator would make a run unrepeatable; seeded so, a run and its replay shuffle alike.
The tokenizer
    none: prompts are token ids; ``Req.tokenizer`` stays ``None`` (no stop strings).
Logprobs, grammars, LoRA, multimodal inputs, sessions, hicache
    off, as by default; the objects ``Req`` builds for them are stand-ins that record
    nothing (``_Inert``).
The release's other imports (the names ``load`` sets in the release's namespace)
    each the answer for a feature this run has off: ``ReqDllmMixin`` (``_ReqDllmMixin``:
    no diffusion LLM); the classes ``isinstance`` tests ask about (``NOT_INSTANCES``, and
    ``allocator/swa.py``'s ``SWATokenToKVPoolAllocator`` in ``_stub_swa``: no SWA,
    HiSparse, Mamba or unified cache, no hybrid row pool), classes nothing here is an
    instance of; ``page_interleave_shard_size`` 1 (no interleaved pages); context
    parallelism off (``is_dsa_prefill_cp_in_seq_split``,
    ``is_prefill_context_parallel_enabled``); no beam search (``num_beam_member_rows`` 0,
    ``beam_retraction_order`` the order given); the torch-native attention backends
    (``attention_backends``, ``support_triton`` False); a CPU device (``_is_cpu``; no
    CUDA, HIP, NPU or XPU; no pinned memory); ``CacheRequestHandle`` inert (``_Inert``);
    the ``runtime_context`` settings the loop reads (``CONFIG``: no FlexKV, no metrics,
    no hidden states returned, the mamba buffer off).

Retraction: ``schedule_conservativeness`` (the server argument, default 1.0) is published
to the release's ``NewTokenRatioTracker.from_config()``: the new-token ratio starts at
``SGLANG_INIT_NEW_TOKEN_RATIO`` (0.7) x it, decays to 0.14 x that over 600 decode steps
whose ``check_decode_mem`` held, is set by ``retract_decode`` after a retraction and reset
by ``on_idle`` when the engine is fully idle. A new request is admitted against its whole
``max_new_tokens`` (plus a page), a running one only against the ratio x its remaining
tokens. At 1.0 kvcheck's workloads (``max_new`` at most 3 blocks, runs of a few hundred
steps) leave less than a page of slack and ``check_decode_mem`` never fails;
``make_optimistic`` sets 0.05, what SGLang's own ``test/cache_consistency_jitter.py`` sets
to force retraction into an undersized pool: decode then outgrows the pool and
``retract_decode`` runs (0.5.23 at the defaults, 8 blocks x 4, six policies x seeds 0..9:
6 of 60 runs, one retraction each; 0.5.22 and 0.5.19, seeds 0..4: 5 of 30 each).
``stats`` counts ``retractions`` (requests ``retract_decode`` returned, back to the
waiting queue: the oracle counts each as a preemption),
``retract_steps`` (steps whose ``check_decode_mem`` failed) and ``retract_aborts`` (the
last request aborted as out of memory: not reached, the driver only draws requests the
pool holds whole).

Refused in one line: speculative decoding (``--spec-tokens``), prefix caching off (SGLang's
``ChunkCache``, another cache, not driven), a policy not offered (above), a release outside
0.5.19 .. 0.5.23 (``install.ENGINES["sglang-engine"]``; see Releases).

Observation -- SGLang keeps no refcounts: a page's refcount is the number of running
requests whose ``req_to_token`` row names it (its tree lock is not a holder): the tables
are the rows as pages (``sglang.row_pages``); the free list is the allocator's free pages
plus the tree's evictable (unlocked) pages, as for ``sglang-radix``; the cache entries are
every page the tree holds, keyed by the token path up to the page's end. KV calls
recorded at the boundary: ``alloc_for_extend`` per request as a ``get_computed_blocks``
(the prefix pages it was matched) and an ``allocate_slots`` (the pages appended);
``alloc_for_decode_default`` as ``allocate_slots``; ``release_kv_cache`` as ``free``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
import sys
import types
from array import array
from typing import Any

from ..errors import MisuseError
from . import _loader, install, sglang, sglang_loop, sglang_radix
from ._loader import exec_definitions
from .vllm_v1_engine import KVCall, StepResult

ENGINE_KEY = "sglang-engine"  # install.ENGINES row: 0.5.19 .. 0.5.23
STOP = 1  # the EOS id the generated output samples rarely
VOCAB = 8
SB = "sglang/srt/managers/schedule_batch.py"
SP = "sglang/srt/managers/schedule_policy.py"
ALLOCATION = "sglang/srt/mem_cache/allocation.py"
COMMON = "sglang/srt/mem_cache/common.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
TRACKER = "sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py"


class _Inert:
    """A stand-in that accepts any call and attribute and records nothing (time stats,
    metrics, the storage-prefetch accounting of a cache without storage)."""

    def __init__(self, *_a, **_k):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *_a, **_k):
        return None

    def __bool__(self):
        return False


class _TimeStats(_Inert):
    """``SchedulerReqTimeStats``: a request's time statistics record nothing, except the
    one time the scheduler decides by -- ``wait_queue_entry_time``, which priority
    scheduling sorts equal priorities by: ``set_wait_queue_entry_time()`` (what
    ``_add_request_to_queue`` calls at arrival and when a retracted request re-enters)
    stamps the target's logical clock, the number of queue entries before this one, in
    place of ``time.perf_counter()`` (time never decides a kvcheck verdict)."""

    def __init__(self, *_a, **_k):
        self.wait_queue_entry_time = 0.0

    def set_wait_queue_entry_time(self, ts=None) -> None:
        target = _ACTIVE[0]
        self.wait_queue_entry_time = target._tick() if target is not None else 0

    def __bool__(self):
        return True


def _rec(**fields) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


class _ReqDllmMixin:
    """``ReqDllmMixin`` (``dllm/mixin/req.py``: diffusion LLMs) with diffusion off: what
    ``Req`` calls of it when ``dllm_config`` is None."""

    def init_diffusion_llm(self, dllm_config) -> None:
        self.dllm_config = dllm_config

    def is_dllm(self) -> bool:
        return False


class SamplingParams:
    """What ``Req`` and ``PrefillAdder`` read of ``SamplingParams`` (see the stand-ins)."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = False
        self.stop_strs = []  # what normalize() makes of no stop strings
        self.stop_regex_strs = []
        self.stop_token_ids = None
        self.stop_str_max_len = 0
        self.custom_params = None
        self.min_new_tokens = 0
        self.no_stop_trim = False
        self.logit_bias = None
        self.json_schema = self.regex = self.ebnf = self.structural_tag = None
        self.n = 1


CONFIG = {  # runtime_context's published configuration, at the launcher's defaults
    "disagg": _rec(disaggregation_mode="null", disaggregation_decode_retraction_backup="none",
                   disaggregation_decode_enable_offload_kvcache=False),
    "memory": _rec(radix_eviction_policy="lru", enable_flexkv=False, enable_hisparse=False,
                   disable_radix_cache=False),
    "schedule": _rec(schedule_policy="fcfs", schedule_low_priority_values_first=True,
                     schedule_conservativeness=1.0,
                     retraction_policy="fcfs", prefill_max_requests=None),
    "parallel": _rec(dcp_enabled=False, attn_dcp_size=1, pp_max_micro_batch_size=1 << 30, tp_size=1,
                     pp_size=1, attn_tp_rank=0,
                     tp_rank=0),
    "exec": _rec(mamba=_rec(enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False,
                            mamba_radix_cache_strategy="no_buffer"),
                 features=_rec(enable_encoder_swa_bounded_replay=False,
                               return_hidden_states_mode=None,
                               enable_return_hidden_states=False)),
    "spec": _rec(speculative_algorithm=None),
    "serving": _rec(strip_thinking_cache=False, weight_version="default"),
    "observability": _rec(enable_metrics=False),
}


def _getter(value):
    def get():
        return value
    return get


RELEASE = {  # the release's top-level definitions executed (see the module doc)
    SB: ("ReqLogprob", "ReqKvInfo", "BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_LENGTH",
         "FINISH_ABORT", "Req", "release_req", "get_return_hidden_states_mode",
         "split_cached_prefix_by_tier"),
    SP: ("CLIP_MAX_NEW_TOKENS", "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
         "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD", "IGNORE_EOS_RESERVE_TOKENS",
         "WAITING_QUEUE_PREFIX_MATCH_MAX", "WAITING_PREFIX_REFRESH_INTERVAL", "_ceil_div",
         "estimate_prefill_extend_tile_metrics", "_use_exact_chunk_fill",
         "match_prefix_for_req", "CacheAwarePolicy",
         "CacheAgnosticPolicy", "SchedulePolicy", "AddReqResult", "_PrefillAdmission",
         "mamba_prefill_chunk_grid", "PrefillAdder"),
    TRACKER: ("NewTokenRatioTracker",),
    "sglang/srt/utils/common.py": ("Range",),  # 0.5.21's Req.set_extend_range
    "sglang/srt/managers/utils.py": ("validate_input_length",),
    "sglang/srt/disaggregation/utils.py": ("FAKE_BOOTSTRAP_HOST", "DisaggregationMode"),
    COMMON: ("match_kv_cache", "touch_waiting_prefix", "_req_radix_key", "checkpoint_kv_cache",
             "maybe_cache_unfinished_req", "release_kv_cache",
             "_release_overallocated_kv_indices"),
    ALLOCATION: ("_EMPTY_PREFIX", "get_last_loc_torch", "alloc_token_slots", "alloc_paged_token_slots_extend",
                 "ensure_mamba_capacity", "alloc_req_slots", "_alloc_page_size",
                 "_prefix_kv_indices", "alloc_for_extend", "alloc_paged_token_slots_decode",
                 "alloc_for_decode_default", "alloc_for_decode", "write_cache_indices",
                 "ALLOC_FOR_DECODE_FUNCS", "_device_type"),
}
# ModelConfig: what the scheduler and ScheduleBatch read of the model (a decoder-only text
# model of VOCAB + 1 ids; no model is loaded)
_MODEL_CONFIG = _rec(is_encoder_decoder=False, vocab_size=VOCAB + 1, is_multimodal=False,
                     is_multimodal_gen=False, num_key_value_heads=1, context_len=1 << 30,
                     self_opened_think_start_ids=None, think_end_ids=None)

# classes ``isinstance`` checks ask about, which no object here is an instance of (no SWA,
# HiSparse, Mamba or unified cache): stand-in classes
NOT_INSTANCES = ("BaseSpecWorker", "SWATokenToKVPoolAllocator", "DeepSeekV4HiSparseTokenToKVPoolAllocator",
                 "UnifiedMambaTokenToKVPoolAllocator", "UnifiedMambaSWATokenToKVPoolAllocator",
                 "UnifiedRadixCache", "HybridReqToTokenPool", "PureSWATokenToKVPoolAllocator")

# definitions a release of the range may not have (0.5.22 has no mamba chunk grid): what
# the release does not define, its code does not call
OPTIONAL = frozenset({"mamba_prefill_chunk_grid", "touch_waiting_prefix", "_req_radix_key",
                      "_use_exact_chunk_fill", "estimate_prefill_extend_tile_metrics",
                      "_PrefillAdmission", "WAITING_QUEUE_PREFIX_MATCH_MAX",
                      "WAITING_PREFIX_REFRESH_INTERVAL", "_ceil_div",
                      "IGNORE_EOS_RESERVE_TOKENS", "split_cached_prefix_by_tier",
                      "_EMPTY_PREFIX", "ensure_mamba_capacity",  # 0.5.22 on
                      "ALLOC_FOR_DECODE_FUNCS", "_device_type",  # alloc_for_decode's dispatch
                      "Range",  # to 0.5.21
                      "match_prefix_for_req",  # to 0.5.21 (calc_priority's match)
                      # the scheduler's calls by release (RENAMED): one of each pair
                      "match_kv_cache", "checkpoint_kv_cache", "maybe_cache_unfinished_req",
                      "_prefix_kv_indices", "alloc_for_decode_default", "alloc_for_decode"})

# the scheduler's calls whose name changed within the range, read from the release: the
# first name it defines (0.5.22 on | 0.5.19 .. 0.5.21). ``checkpoint``: what
# stash_chunked_request and process_batch_result_prefill call for an unfinished request
# (to 0.5.21 maybe_cache_unfinished_req -> RadixCache.cache_unfinished_req); ``decode``:
# what prepare_for_decode calls to allocate (0.5.22 also defines alloc_for_decode, its
# dispatcher to alloc_for_decode_default, so the latter is asked first). To 0.5.21 Req
# matches its prefix in init_next_round_input itself (0.5.22 on: through match_kv_cache) and
# alloc_for_extend reads req.prefix_indices (0.5.22 on: _prefix_kv_indices).
RENAMED = {"checkpoint": ("checkpoint_kv_cache", "maybe_cache_unfinished_req"),
           "decode": ("alloc_for_decode_default", "alloc_for_decode")}

_cache: dict = {}

# the policies the target drives: fcfs, priority (fcfs with priority scheduling on), and
# SchedulePolicy's others that need nothing the adapter does not keep (hrrn reads the
# scheduler's processed-token counter, shortest-prefill-first its chunk limit, routing-key
# the requests' routing keys: not offered)
POLICIES = ("fcfs", "priority", "lpm", "dfs-weight", "lof", "random")


def _stub_swa(mod: types.ModuleType, loaded) -> None:
    """``allocator/swa.py`` (the SWA allocators) is read by ``prefill_budget.py`` for
    ``is_swa_req_ring`` only: the real function, with ``SWATokenToKVPoolAllocator`` a class
    no allocator here is an instance of (no sliding window)."""
    sglang.real_functions(mod, loaded, "sglang/srt/mem_cache/allocator/swa.py",
                          ("is_swa_req_ring",),
                          {"SWATokenToKVPoolAllocator": type("SWATokenToKVPoolAllocator",
                                                             (), {})})


def load(version: str | None = None) -> dict:
    """The release's objects (see the module doc), executed once per release."""
    import torch

    dist = install.select(ENGINE_KEY, version)  # 0.5.19 .. 0.5.23
    key = (dist.version, str(_loader.install_dir(dist)))  # a scratch install is another
    if key in _cache:
        return _cache[key]
    # mem_cache/prefill_budget.py (the allocator's create_prefill_budget) from 0.5.21; before,
    # PrefillAdder keeps its budget itself (_update_prefill_budget)
    budget = (f"{sglang_radix.MEM}.prefill_budget",) if (
        _loader.install_dir(dist) / "sglang/srt/mem_cache/prefill_budget.py").is_file() else ()
    mods = sglang.load_dist(dist, (*sglang_radix.FILES, *budget),
                            {**sglang_radix.STUBS, f"{sglang.ALLOCATOR}.swa": _stub_swa},
                            (*sglang.FILES, f"{sglang_radix.MEM}.radix_cache",
                             f"{sglang_radix.MEM}.common", f"{sglang_radix.MEM}.memory_pool",
                             *budget))
    root = mods.root
    radix = mods[f"{sglang_radix.MEM}.radix_cache"]
    base = mods[f"{sglang_radix.MEM}.base_prefix_cache"]
    common = mods[f"{sglang_radix.MEM}.common"]
    env_mod = mods["sglang.srt.environ"]
    name = f"kvcheck_tp_sglang_engine_{dist.version.replace('.', '_')}"
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look the module up
    ns = mod.__dict__
    from http import HTTPStatus
    from typing import Optional, Union

    ns.update({
        "torch": torch, "dataclasses": dataclasses, "array": array, "sys": sys,
        "logging": logging, "logger": logging.getLogger("kvcheck.thirdparty.sglang_engine"),
        "HTTPStatus": HTTPStatus, "Optional": Optional, "List": list, "Dict": dict,
        "Tuple": tuple, "Union": Union, "Set": set, "Any": Any,
        "envs": env_mod.envs, "os": __import__("os"), "random": random,
        "Enum": __import__("enum").Enum, "auto": __import__("enum").auto,
        "dataclass": dataclasses.dataclass, "lru_cache": __import__("functools").lru_cache,
        "contextmanager": __import__("contextlib").contextmanager,
        "nullcontext": __import__("contextlib").nullcontext,
        "Counter": __import__("collections").Counter,
        "defaultdict": __import__("collections").defaultdict,
        "is_hip": lambda: False, "is_gfx95_supported": lambda: False,
        # context parallelism off, as by default (to 0.5.19 PrefillAdder asks these)
        "is_dsa_prefill_cp_in_seq_split": lambda: False,
        "is_prefill_context_parallel_enabled": lambda: False,
        "_IS_HIP": False, "PREFILL_TILE_BUDGET": 0, "PREFILL_TILE_BUDGET_MODE": "compact",
        "_ROUTING_KEY_POLICY_DEBUG_LOG": False, "_is_npu": False, "_is_cuda": False, "_is_hip": False,
        "_is_xpu": False, "_is_cpu": True,
        "is_pin_memory_available": lambda *_a: False, "num_beam_member_rows": lambda _r: 0,
        "beam_retraction_order": lambda order, _reqs: order,
        "attention_backends": lambda: ("torch_native", "torch_native"),
        "support_triton": lambda _backend: False,
        "available_and_evictable_str": lambda tree: (
            f"available {tree.token_to_kv_pool_allocator.available_size()}, evictable "
            f"{tree.evictable_size()}"),
        "NamedTuple": __import__("typing").NamedTuple,
        "Sequence": __import__("typing").Sequence, "copy": __import__("copy"), "weakref": __import__("weakref"),
        "RadixCache": radix.RadixCache, "RadixKey": radix.RadixKey, "TreeNode": radix.TreeNode,
        "MatchPrefixParams": base.MatchPrefixParams, "InsertParams": base.InsertParams,
        "EvictParams": base.EvictParams, "BasePrefixCache": base.BasePrefixCache,
        "evict_from_tree_cache": common.evict_from_tree_cache,
        "ceil_align": mods["sglang.srt.utils.common"].ceil_align,
        "ceil_div": mods["sglang.srt.utils.common"].ceil_div,
        "page_interleave_shard_size": lambda _alloc: 1,
        "ReqDllmMixin": _ReqDllmMixin, "SchedulerReqTimeStats": _TimeStats,
        **{n: type(n, (), {}) for n in NOT_INSTANCES},
        "CaptureHiddenMode": _rec(NULL="NULL", FULL="FULL", LAST="LAST"),
        "CacheRequestHandle": _Inert, "_Inert": _Inert,
        "get_context": lambda: _rec(is_config_namespace_published=lambda _n: True),
        **{f"get_{k}": _getter(v) for k, v in CONFIG.items()},
    })
    # what the release's files import from base_prefix_cache besides the above, where the
    # release has it (0.5.21's Req unlocks with DecLockRefParams)
    ns.update({n: getattr(base, n) for n in ("DecLockRefParams", "IncLockRefParams",
                                             "zero_match_result", "MatchResult",
                                             "CacheRequestOutcome")
               if hasattr(base, n)})
    if not budget and "\ndef is_swa_req_ring(" in (
            root / "sglang/srt/mem_cache/allocator/swa.py").read_text():
        # 0.5.20's PrefillAdder reads is_swa_req_ring itself (see _stub_swa)
        swa = types.ModuleType(f"{sglang.ALLOCATOR}.swa")
        _stub_swa(swa, mods)
        ns["is_swa_req_ring"] = swa.is_swa_req_ring
    for rel, names in RELEASE.items():
        found = exec_definitions(root / rel, ns, names)
        missing = [n for n in names if n not in found and n not in OPTIONAL]
        if missing:
            raise ImportError(f"{rel} of sglang {dist.version} has no {', '.join(missing)}")
    for role, names in RENAMED.items():
        found = [n for n in names if n in ns]
        if not found:
            raise ImportError(f"sglang {dist.version} defines none of {', '.join(names)}")
        ns[f"__{role}__"] = ns[found[0]]
    # release_kv_cache(req, tree, *, checkpoint) from 0.5.22; 0.5.19 .. 0.5.21's take is_insert
    # (default True: the tree keeps what it can key, what checkpoint=True does)
    ns["__release_kw__"] = ({"checkpoint": True} if "checkpoint" in
                            inspect.signature(ns["release_kv_cache"]).parameters else {})
    # the scheduler's loop: the release's Scheduler, SchedulerBatchResultProcessor and
    # ScheduleBatch (sglang_loop), and the KV calls observed at the boundary
    ns["__loop__"] = sglang_loop.build(ns, root)
    for fn, role in (("alloc_for_extend", "extend"), ("alloc_for_decode", "decode"),
                     ("release_kv_cache", "free")):
        ns[fn] = _observing(role, ns[fn])
    ns["__mods__"], ns["__sglang_version__"] = mods, dist.version
    _cache[key] = ns
    return ns


def _ratio_tracker(ns: dict, conservativeness: float):
    """The release's ``NewTokenRatioTracker.from_config()`` with the launcher's
    ``schedule_conservativeness`` published (``get_schedule()`` while it reads it)."""
    schedule = types.SimpleNamespace(**{**vars(CONFIG["schedule"]),
                                        "schedule_conservativeness": conservativeness})
    published = ns["get_schedule"]
    ns["get_schedule"] = _getter(schedule)
    try:
        return ns["NewTokenRatioTracker"].from_config()
    finally:
        ns["get_schedule"] = published


def _prefix_len(req) -> int:
    """``Req.prefix_len`` (0.5.22 on); 0.5.19 .. 0.5.21's scheduler reads ``len(req.prefix_indices)``
    where 0.5.22's reads ``prefix_len``."""
    return req.prefix_len if hasattr(req, "prefix_len") else len(req.prefix_indices)


class _Page:
    """A page as the engine oracle's KV calls name it (``block_id``: kvcheck's block)."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int):
        self.block_id = block_id


_ACTIVE: list = [None]  # the target whose operation is running (the boundary's observer)


def _observing(role: str, real):
    """The release's allocation / release function ``real`` with the active target
    recording the KV call at the boundary (``SglangEngineTarget._observe``)."""
    def call(*args, **kwargs):
        target = _ACTIVE[0]
        if target is None:
            return real(*args, **kwargs)
        return target._observe(role, real, args, kwargs)
    call.__wrapped__ = real
    return call


class _SpeculativeAlgorithm:
    """``SpeculativeAlgorithm.NONE`` (``speculative/spec_info.py``): no speculation."""

    def is_none(self) -> bool:
        return True

    def __bool__(self):
        return False


class _GrammarManager:
    """``GrammarManager``: no request has a grammar (``grammar_queue`` empty)."""

    grammar_queue: list = []

    def has_waiting_grammars(self) -> bool:
        return False

    def abort_requests(self, _recv_req) -> None:
        return None


class _BeamCoordinator:
    """``BeamCoordinator``: no beam search (no rows promised to members, no groups)."""

    def pending_member_rows(self, _batch) -> int:
        return 0

    def retire_group(self, _req) -> None:
        return None

    def commit_decode(self, _batch) -> set:
        return set()


class _ModelWorker(_loader.StandIn):
    """The model worker (``TpModelWorker`` and its model runner): no forward pass. What
    the scheduler reads of it: the attention backend (no Triton tile size), no
    prefill-aware SWA; its output is generated by the target (``_run_batch``)."""

    WHERE = "impl/thirdparty/sglang_engine.py"

    def __init__(self):
        self.model_runner = _rec(attn_backend=_rec(), prefill_aware_swa=False)


class _InvariantChecker:
    """``SchedulerInvariantChecker``: the server's own idle self-checks of its pools (a
    leak is logged, not acted on); kvcheck's oracle checks the pools after every
    operation instead."""

    def _check_all_pools(self, _stats):
        return False, []

    def _check_req_pool(self) -> None:
        return None

    def _check_tree_cache(self) -> None:
        return None

    def self_check_during_busy(self) -> None:
        return None


class _StageMetrics:
    """``scheduler_stage_metrics``: records no stage time."""

    def record(self, _stage):
        import contextlib
        return contextlib.nullcontext()


def _shell_class(ns: dict, key: str) -> type:
    cls = ns["__loop__"][key]
    cls.WHERE = "impl/thirdparty/sglang_engine.py"
    return cls


class SglangEngineTarget:
    """SGLang's scheduler, scheduling policy, radix cache and allocator as an engine core
    (see the module doc). ``add`` / ``abort`` / ``step(gen)`` and the engine oracle's
    observation."""

    block_offset = 0  # the KV calls and writes name kvcheck blocks (SGLang page - 1)
    # the ScheduleBatch class the scheduler builds its batches of: the release's (a test
    # plants a bug in a subclass of it, ``release_batch_class``)
    batch_class: type | None = None

    def __init__(self, num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 max_model_len: int = 0, version: str | None = None,
                 schedule_conservativeness: float = 1.0):
        import torch

        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        if spec:
            raise MisuseError("sglang-engine does not drive speculative decoding")
        if not caching:
            raise MisuseError("sglang-engine drives the radix cache: prefix caching off is "
                              "SGLang's ChunkCache, not driven")
        if policy not in POLICIES:
            raise MisuseError(f"sglang-engine has no {policy} policy (it drives "
                              f"{', '.join(POLICIES)})")
        if not schedule_conservativeness >= 0:  # the release's validation_hook asserts it
            raise MisuseError("schedule_conservativeness must be non-negative")
        ns = load(version)
        self.ns = ns
        self.version = ns["__sglang_version__"]
        # the server's --schedule-policy (priority: fcfs with --enable-priority-scheduling),
        # one of the release's CacheAwarePolicy / CacheAgnosticPolicy values
        self.policy_name = "fcfs" if policy == "priority" else policy
        offered = {p.value for p in ns["CacheAwarePolicy"]} | \
            {p.value for p in ns["CacheAgnosticPolicy"]}
        if self.policy_name not in offered:
            raise MisuseError(f"sglang {self.version}'s SchedulePolicy has no "
                              f"{self.policy_name} policy")
        priority = policy == "priority"
        self.schedule = types.SimpleNamespace(**{**vars(CONFIG["schedule"]),
                                                 "schedule_policy": self.policy_name,
                                                 "enable_priority_scheduling": priority})
        self.torch = torch
        self.num_blocks, self.block_size = num_blocks, block_size
        self.budget, self.max_seqs = budget, max_seqs
        self.max_model_len = max_model_len
        mods = ns["__mods__"]
        allocators, size = mods[sglang.ALLOCATOR], num_blocks * block_size
        if block_size > 1:
            self.alloc = allocators.PagedTokenToKVPoolAllocator(size, block_size, torch.float16,
                                                                "cpu", None, False)
        else:
            self.alloc = allocators.TokenToKVPoolAllocator(size, torch.float16, "cpu", None,
                                                           False)
        context = (max_model_len or size) + block_size
        mem = sglang_radix.MEM
        # the server's row pool: KVCacheConfigurator.resolve_max_num_reqs' min(
        # --max-running-requests, token capacity // 2) rows (the pool adds its padding row)
        rows = max(1, min(max_seqs, size // 2))
        self.pool = mods[f"{mem}.memory_pool"].ReqToTokenPool(rows, context, "cpu", False)
        params = mods[f"{mem}.cache_init_params"].CacheInitParams(
            disable=False, req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc,
            page_size=block_size)
        self.tree = mods[f"{mem}.radix_cache"].RadixCache(params)
        self._publish()
        self.requests: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(Req) -> request id
        self.kv_calls: list[KVCall] = []
        self.arrivals = 0  # the queue-entry clock: wait_queue_entry_time, in entry order
        # update_running_batch's retractions: the requests retract_decode returned, and
        # the steps whose check_decode_mem failed (SGLang's num_retracted_reqs, summed)
        self.stats = {"retractions": 0, "retract_steps": 0, "retract_aborts": 0}
        self._epoch = 0  # bumped by every operation (the observation's memo, _observed)
        self._memo: tuple = (None, {}, {})
        self.scheduler = self._scheduler(ns, priority, schedule_conservativeness)
        self.policy = self.scheduler.policy
        self.ratio = self.scheduler.new_token_ratio_tracker

    def _scheduler(self, ns: dict, priority: bool, conservativeness: float):
        """The release's ``Scheduler`` methods on a shell whose members are the run's
        objects, each as the server's ``__init__`` sets it at its defaults, or the
        stand-ins the module doc lists."""
        sch = _shell_class(ns, "Scheduler")()
        size = self.num_blocks * self.block_size
        target = self

        class Metrics(sglang_loop.MetricsReporter):
            """update_running_batch's ``num_retracted_reqs = len(retracted_reqs)``,
            counted into the target's ``stats``."""

            @property
            def num_retracted_reqs(self):
                return 0

            @num_retracted_reqs.setter
            def num_retracted_reqs(self, n):
                target.stats["retract_steps"] += 1
                target.stats["retractions"] += n

        metrics = Metrics()
        members = dict(
            # run configuration (server arguments at their defaults, the run's limits)
            schedule_policy=self.policy_name, enable_priority_scheduling=priority,
            abort_on_priority_when_disabled=False, schedule_low_priority_values_first=True,
            priority_scheduling_preemption_threshold=10,
            enable_priority_preemption=priority,  # not --disable-priority-preemption
            enable_lora=False, enable_lora_overlap_loading=False, enable_overlap=False,
            enable_overlap_mlx=False, is_generation=True,
            disaggregation_mode=ns["DisaggregationMode"].NULL,
            page_size=self.block_size, max_running_requests=self.max_seqs,
            chunked_prefill_size=self.budget, max_prefill_tokens=self.budget,
            prefill_decode_interval=0, _prefill_decode_interval_remaining=0,
            prefill_decode_interval_min_bs=0, is_mixed_chunk=False, dynamic_chunk_sizer=None,
            enable_dynamic_chunking=False,
            prefill_delayer=None, max_prefill_bs=0, min_free_slots_delayer=None,
            truncation_align_size=None, max_queued_requests=None, processed_tokens_counter=0,
            forward_ct=0, is_hybrid_swa=False, require_mlp_sync=False,
            enable_hisparse=False, hisparse_coordinator=None, enable_hierarchical_cache=False,
            enable_hicache_storage=False, enable_lmcache=False,
            enable_unified_cache_external_linker=False, enable_unified_memory=False,
            enable_fpm=False, decode_offload_manager=None, mm_receiver=None,
            dllm_config=None, dllm_manager=_rec(any_staging_reqs=lambda: False),
            spec_algorithm=_SpeculativeAlgorithm(),
            enable_continuous_input_polling=False, enable_skip_finishing_decode=False,
            result_queue=__import__("collections").deque(), _engine_paused=False,
            # the run's objects
            tree_cache=self.tree, token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, model_config=_MODEL_CONFIG,
            policy=ns["SchedulePolicy"](self.policy_name, self.tree, False, priority, True),
            new_token_ratio_tracker=_ratio_tracker(ns, conservativeness),
            waiting_queue=[], chunked_req=None, _pending_chunked_abort_req=None,
            last_batch=None,
            # what Scheduler.init_req_max_new_tokens reads (TpModelWorker's limits:
            # max_req_len = min(context_len - 1, max_total_num_tokens - 1))
            max_new_tokens_limit=None, max_total_num_tokens=size,
            max_req_len=min((self.max_model_len or size + 1) - 1, size - 1),
            kv_shard_widening=1, sliding_window_size=None,
            # stand-ins (the module doc)
            tp_worker=_ModelWorker(), model_worker=_ModelWorker(), draft_worker=None,
            grammar_manager=_GrammarManager(), beam_coordinator=_BeamCoordinator(),
            dp_attn_adapter=sglang_loop.PassThrough(),
            ngram_embedding_manager=sglang_loop.PassThrough(),
            metrics_reporter=metrics, metrics_collector=sglang_loop.Inert(),
            output_streamer=sglang_loop.Inert(), ipc_channels=sglang_loop.Inert(),
            load_inquirer=sglang_loop.Inert(),
            load_publisher=sglang_loop.Inert(), invariant_checker=_InvariantChecker(),
            pool_stats_observer=sglang_loop.Inert(), kv_events_publisher=sglang_loop.Inert(),
            scheduler_stage_metrics=_StageMetrics(), _last_stall_publish_ts=0.0,
            # one process: no tensor, pipeline, data or context parallelism (0.5.19 ..
            # 0.5.20's ParallelState)
            ps=_rec(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dp_rank=0, dp_size=1,
                    attn_tp_rank=0, attn_tp_size=1, attn_cp_rank=0, attn_cp_size=1,
                    attn_dp_rank=0, attn_dcp_rank=0, attn_dcp_size=1, gpu_id=0),
        )
        members["max_req_input_len"] = members["max_req_len"] - 5
        for k, v in members.items():
            setattr(sch, k, v)
        sch.running_batch = self.ns["ScheduleBatch"](reqs=[], batch_is_full=False)
        # stand-ins for the scheduler's own sends: the detokenizer's sockets, health
        # checks, the load snapshot file
        sch.send_abort_output = lambda *_a, **_k: None
        sch.maybe_send_health_check_signal = lambda: None
        sch.publish_load_snapshot = lambda force=False: None
        sch.maybe_sleep_on_idle = lambda: None
        sch._record_step_counters = lambda *_a, **_k: None  # step timings (wall clock)
        proc = _shell_class(ns, "Processor")()
        for k in ("is_generation", "disaggregation_mode", "enable_overlap", "enable_overlap_mlx",
                  "model_config", "token_to_kv_pool_allocator", "tree_cache",
                  "hisparse_coordinator", "req_to_token_pool", "decode_offload_manager",
                  "metrics_collector", "metrics_reporter", "draft_worker", "model_worker",
                  "output_streamer", "beam_coordinator"):
            setattr(proc, k, getattr(sch, k))
        proc.logprob_result_processor = sglang_loop.Inert()
        proc.abort_request = sch.abort_request
        sch.batch_result_processor = proc
        return sch

    # -- operations ---------------------------------------------------------------------
    def _publish(self, gen: int = 0) -> None:
        """What the launcher publishes for this server (``get_schedule()``: its
        ``--schedule-policy``), and the ``random`` module the release's
        ``SchedulePolicy._sort_randomly`` shuffles with: a ``random.Random`` seeded by the
        step's ``gen`` (a stand-in for the process's global generator, so that a run and its
        replay shuffle alike). The release's namespace is shared by the targets of one
        release: each publishes its own before it runs the release's code."""
        self.ns["get_schedule"] = _getter(self.schedule)
        self.ns["random"] = random.Random(f"sglang-engine random policy, step {gen}")
        self.ns["ScheduleBatch"] = self.batch_class or self.ns["__loop__"]["ScheduleBatch"]
        _ACTIVE[0] = self

    def _tick(self) -> int:
        """The queue-entry clock (``_TimeStats``): entries so far, in order."""
        self.arrivals += 1
        return self.arrivals - 1

    def _rid(self, seq: int) -> str:
        """The request's ``rid``: fixed width, as ``abort_request`` matches a prefix
        (the server's are uuids)."""
        return f"{seq:012d}"

    def add(self, seq: int, tokens: list[int], max_new: int, priority: int = 0) -> None:
        self._epoch += 1
        ns = self.ns
        self._publish()
        req = ns["Req"](self._rid(seq), "", array("q", tokens), SamplingParams(max_new),
                        eos_token_ids={STOP}, vocab_size=VOCAB + 1, priority=priority)
        self.requests[seq] = req
        self.ids[id(req)] = seq
        sch = self.scheduler
        # handle_generate_request: the release's clipping and prompt validation (a prompt
        # too long for the pool is aborted: queued as one token with to_finish set)
        sch.init_req_max_new_tokens(req)
        error = ns["validate_input_length"](req, sch.max_req_input_len, False)
        if error:
            req.set_finish_with_abort(error)
        sch._add_request_to_queue(req)

    def abort(self, seq: int) -> None:
        """The release's ``abort_request``; a running request's release, which the
        release does at its next result (``to_finish`` set), is done now
        (``process_batch_result_decode``'s ``update_finish_state`` and
        ``release_kv_cache``), and a chunked one's (``process_pending_chunked_abort``,
        the next step's first call) too: the oracle's abort frees at once."""
        self._epoch += 1
        self._publish()
        req = self.requests[seq]
        sch = self.scheduler
        waiting = any(r is req for r in sch.waiting_queue)
        sch.abort_request(self.ns["AbortReq"](rid=self._rid(seq)))
        if waiting:  # the tokenizer's side finishes it (send_abort_output)
            if req.finished_reason is None:
                req.finished_reason = self.ns["FINISH_ABORT"]()
            return
        if sch._pending_chunked_abort_req is req:
            sch.process_pending_chunked_abort()
        elif not req.finished() and req.to_finish is not None:
            req.update_finish_state()
            self.ns["release_kv_cache"](req, self.tree, **self.ns["__release_kw__"])
        # the finished request stays in its batch: the release's next step filters it
        # out (filter_batch), which is also what clears the batch's batch_is_full

    def step(self, gen: int) -> StepResult:
        self._epoch += 1
        del self.kv_calls[:]
        self._publish(gen)
        sch = self.scheduler
        # event_loop_normal's iteration (requests are added between steps)
        plan = sch.get_next_batch_to_run(running_batch=sch.running_batch,
                                         last_batch=sch.last_batch)
        sch.running_batch = plan.running_batch
        batch = plan.batch_to_run
        calls_in_schedule = list(self.kv_calls)
        if not batch:
            sch._sched_idled = True
            sch.on_idle()
            sch.last_batch = batch
            return StepResult({}, {}, {}, {}, {}, calls_in_schedule, [])
        scheduled, writes = self._writes(batch)
        before = {id(r): len(r.output_ids) for r in batch.reqs}
        result = self._run_batch(batch, gen)
        sch.process_batch_result(batch, result)
        sch.last_batch = batch
        sampled = {self.ids[id(r)]: list(r.output_ids[before[id(r)]:])
                   for r in batch.reqs if len(r.output_ids) > before[id(r)]}
        return StepResult(scheduled, {}, sampled, {}, writes, calls_in_schedule,
                          list(self.kv_calls[len(calls_in_schedule):]))

    def _writes(self, batch) -> tuple[dict, dict]:
        """What the forward pass writes: per request, the slots from its prefix to its
        sequence length (``prepare_for_extend``'s ``prefix_lens`` / ``seq_lens``), or the
        last sampled token's slot (``prepare_for_decode``)."""
        scheduled, writes = {}, {}
        lens = batch.seq_lens_cpu.tolist()
        extend = batch.forward_mode.is_extend()
        for i, req in enumerate(batch.reqs):
            q = self.ids[id(req)]
            if extend:
                start = batch.prefix_lens[i]
                toks = list(req.full_untruncated_fill_ids[start:lens[i]])
            else:
                start = lens[i] - 1
                toks = [req.output_ids[-1]] if req.output_ids else [req.origin_input_ids[-1]]
            scheduled[q] = len(toks)
            writes[q] = (start, toks, self._pages(req))
        return scheduled, writes

    def _run_batch(self, batch, gen: int):
        """``run_batch``'s stand-in (no model): the release's ``GenerationBatchResult``
        whose ``next_token_ids`` are the engine model's tokens -- per request ``STOP``
        with probability 0.08, else a token in 2 .. VOCAB, a function of ``gen`` and the
        request's id (a chunk's token is drawn too; the release discards it)."""
        toks = []
        for req in batch.reqs:
            rng = random.Random(gen * 1_000_003 + self.ids[id(req)])
            toks.append(STOP if rng.random() < 0.08 else rng.randint(2, VOCAB))
        self.scheduler.forward_ct += 1
        return self.ns["GenerationBatchResult"](
            next_token_ids=self.torch.tensor(toks, dtype=self.torch.int64),
            extend_input_len_per_req=(list(batch.extend_lens)
                                      if batch.forward_mode.is_extend() else None),
            can_run_cuda_graph=False)

    def _observe(self, role: str, real, args, kwargs):
        """A KV call at the boundary (see the module doc), recorded around the release's
        function ``real``."""
        if role == "free":
            req = args[0]
            before, free_before = self._pages(req), self.num_free()
            out = real(*args, **kwargs)
            if id(req) in self.ids:
                self._call("free", req, None, before, free_before)
            return out
        batch = args[0]
        reqs = list(batch.reqs)
        if role == "extend":
            hits_of, new = {}, {}
            for r in reqs:
                ids = (self.ns["_prefix_kv_indices"](batch, r) if "_prefix_kv_indices"
                       in self.ns else r.prefix_indices).tolist()
                hits_of[id(r)] = sglang.row_pages(ids, self.block_size) if ids else []
                new[id(r)] = not r.kv.holds_kv
            free_before = self.num_free()
            out = real(*args, **kwargs)
            for r in reqs:
                hits = hits_of[id(r)]
                if new[id(r)]:
                    self._call("get_computed_blocks", r,
                               ([_Page(b) for b in hits], _prefix_len(r)), [], free_before)
                after = self._pages(r)
                self._call("allocate_slots", r, [_Page(b) for b in after[len(hits):]], hits,
                           free_before)
            return out
        before = {id(r): self._pages(r) for r in reqs}
        free_before = self.num_free()
        out = real(*args, **kwargs)
        for r in reqs:
            b = before[id(r)]
            self._call("allocate_slots", r, [_Page(x) for x in self._pages(r)[len(b):]], b,
                       free_before)
        return out

    def _call(self, name, req, result, before, free_before) -> None:
        q = self.ids[id(req)]
        self.kv_calls.append(KVCall(name, str(q), (), {}, result, list(before),
                                    self._pages(req), free_before, self.num_free(),
                                    self.block_hashes(q), self.token_ids(q)))

    # -- observation -----------------------------------------------------------------
    def _pages(self, req) -> list[int]:
        if not req.kv.holds_kv:
            return []
        n = req.kv.kv_allocated_len
        row = self.pool.req_to_token[req.kv.req_pool_idx, :n].tolist()
        return sglang.row_pages(row, self.block_size)

    @property
    def waiting_queue(self) -> list:
        return self.scheduler.waiting_queue

    @property
    def chunked_req(self):
        return self.scheduler.chunked_req

    def _live(self) -> list:
        sch = self.scheduler
        out = list(sch.running_batch.reqs)
        if sch.last_batch is not None:
            out += [r for r in sch.last_batch.reqs if r not in out]
        if sch.chunked_req is not None and sch.chunked_req not in out:
            out.append(sch.chunked_req)
        return [r for r in out if not r.finished()]

    def status(self, seq: int) -> str:
        req = self.requests[seq]
        if req.finished():
            return "FINISHED"
        if any(r is req for r in self._live()):
            return "RUNNING"
        return "WAITING"

    def is_finished(self, seq: int) -> bool:
        return self.requests[seq].finished()

    def computed(self, seq: int) -> int:
        req = self.requests[seq]
        return req.kv.kv_allocated_len if req.kv.holds_kv else 0

    def blocks(self, seq: int) -> list[int]:
        return self._pages(self.requests[seq])

    def running(self) -> list[int]:
        return [self.ids[id(r)] for r in self._live()]

    def waiting(self) -> list[int]:
        return [self.ids[id(r)] for r in self.waiting_queue]

    def _observed(self) -> tuple[dict, dict]:
        """(page -> running requests whose row names it, page -> the first key the tree
        walk gives it), kept until the next operation: the engine oracle asks
        ``refcount`` and ``block_hash`` of every block in each check."""
        if self._memo[0] != self._epoch:
            refs: dict = {}
            for r in self._live():
                for b in set(self._pages(r)):
                    refs[b] = refs.get(b, 0) + 1
            keys: dict = {}
            for b, key, _node in self._tree_pages():
                keys.setdefault(b, key)
            self._memo = (self._epoch, refs, keys)
        return self._memo[1], self._memo[2]

    def refcount(self, block: int) -> int:
        return self._observed()[0].get(block, 0)

    def _tree_pages(self):
        ps = self.block_size
        stack = [(c, ()) for c in self.tree.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + tuple(node.key.token_ids[: len(node.key)])
            if node.value is not None:
                values = node.value.tolist()
                start = len(path) - len(values)
                for i in range(0, len(values), ps):
                    yield values[i] // ps - 1, path[: start + i + ps], node
            stack.extend((c, path) for c in node.children.values())

    def free_blocks(self) -> list[int]:
        free = [p - 1 for p in sglang.free_pages_of(self.alloc)]
        return free + [b for b, _k, node in self._tree_pages() if node.lock_ref == 0]

    def num_free(self) -> int:
        return (int(self.alloc.available_size()) + int(self.tree.evictable_size())) \
            // self.block_size

    def token_ids(self, seq: int) -> list[int]:
        req = self.requests[seq]
        return list(req.origin_input_ids) + list(req.output_ids)

    def block_hashes(self, seq: int) -> list:
        toks, bs = tuple(self.token_ids(seq)), self.block_size
        return [toks[: (i + 1) * bs] for i in range(len(toks) // bs)]

    def cached_entries(self) -> list[tuple[Any, int]]:
        return [(key, b) for b, key, _node in self._tree_pages()]

    def block_hash(self, block: int):
        return self._observed()[1].get(block)


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> SglangEngineTarget:
    """The engine target: SGLang's scheduling policy over ``num_blocks`` pages of
    ``block_size`` tokens, a step's token budget ``budget`` (``max_prefill_tokens`` and
    ``chunked_prefill_size``) and ``max_seqs`` running requests (see the module doc)."""
    return SglangEngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, version)


OPTIMISTIC = 0.05  # sglang/test/cache_consistency_jitter.py's schedule_conservativeness


def make_optimistic(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                    policy: str = "fcfs", caching: bool = True, spec: int = 0,
                    version: str | None = None,
                    max_model_len: int | None = None) -> SglangEngineTarget:
    """``kvcheck.impl.thirdparty.sglang_engine:make_optimistic`` (an engine TARGET as
    ``module:attr``): ``make`` with ``--schedule-conservativeness 0.05``, the
    optimistic admission SGLang's own retraction test configures (its
    ``cache_consistency_jitter.py``: "optimistic admission into the deliberately
    undersized pool ... verify that retraction occurred"): the new-token ratio starts at
    0.7 x 0.05, so running requests' remaining tokens are barely reserved and decode
    outgrows the pool -- ``check_decode_mem`` fails and ``retract_decode`` runs."""
    return SglangEngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, version, schedule_conservativeness=OPTIMISTIC)
