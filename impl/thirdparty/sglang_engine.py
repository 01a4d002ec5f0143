"""Adapter: SGLang's scheduling policy as an engine core (``sglang-engine[@VERSION]``,
0.5.19 .. 0.5.23; issue 34 §1) -- the release's own ``Req``, ``SchedulePolicy``,
``PrefillAdder`` with its ``PrefillBudget``, ``RadixCache``, paged token-to-KV allocator and
``ReqToTokenPool``, and the scheduler's own allocation and release functions, driven step by
step with no model.

Releases: the module doc names 0.5.23's functions; where the scheduler's calls differ in an
earlier release the adapter calls that release's own, read from it (``RENAMED``, and the
signatures it inspects), nothing re-enacted:

* 0.5.22 .. 0.5.23: ``checkpoint_kv_cache`` (stash and unfinished prefill),
  ``release_kv_cache(req, tree, checkpoint=True)``, ``alloc_for_decode_default``; 0.5.23's
  ``get_num_allocatable_reqs`` also counts the rows admitted requests hold
  (``num_held_rows``), 0.5.22's does not;
* 0.5.21: ``maybe_cache_unfinished_req(req, tree[, chunked=True])`` (the tree's
  ``cache_unfinished_req``), ``release_kv_cache(req, tree)`` (``is_insert`` defaults to
  True), ``alloc_for_decode``; ``Req`` matches its prefix in ``init_next_round_input`` and
  keeps ``prefix_indices`` / ``extend_range`` where 0.5.22 keeps ``prefix_len`` /
  ``extend_end`` (``_prefix_len``, ``_extend_end`` read whichever the release has, as its
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

What runs, executed from the installed wheel (``_loader``; nothing rewritten):

* ``managers/schedule_batch.py``: ``Req`` (its ``__init__``, ``init_next_round_input`` --
  the prefix match through ``match_kv_cache`` --, ``update_finish_state`` (EOS and
  ``max_new_tokens``), ``reset_for_retract``, ``finished``, ``extend_len``), ``ReqKvInfo``,
  the finish reasons, the module function ``release_req`` (retraction), and these
  ``ScheduleBatch`` methods, compiled onto the stand-in batch below:
  ``check_decode_mem``, ``new_tokens_required_next_decode``, ``retract_decode``,
  ``_get_decode_retraction_order``, ``release_req``, ``batch_size``, ``is_empty``;
* ``managers/schedule_policy.py``: ``SchedulePolicy`` (``calc_priority``: FCFS, or
  priority then queue entry: ``time_stats.wait_queue_entry_time``, a counter of entries in
  order, stamped at arrival and again when a retracted request re-enters, as
  ``_add_request_to_queue`` stamps it) and ``PrefillAdder`` (``add_chunked_req``, ``add_one_req``,
  ``budget_state``, the token and memory budget);
* ``mem_cache/prefill_budget.py`` (``PrefillBudget``, via the allocator's own
  ``create_prefill_budget``), ``mem_cache/allocation.py`` (``alloc_for_extend``,
  ``alloc_for_decode_default``, ``alloc_req_slots``, ``alloc_token_slots``,
  ``alloc_paged_token_slots_extend`` / ``_decode``, ``write_cache_indices``' torch path),
  ``mem_cache/common.py`` (``match_kv_cache``, ``checkpoint_kv_cache``,
  ``release_kv_cache``, ``_release_overallocated_kv_indices``, ``evict_from_tree_cache``);
* at arrival, ``handle_generate_request``'s checks: ``Scheduler.init_req_max_new_tokens``
  (compiled from the class: ``max_new_tokens`` clipped to ``max_req_len`` and to the pool
  through the allocator's ``max_new_tokens_for_memory``) and ``managers/utils.py``'s
  ``validate_input_length`` (a prompt of ``max_req_input_len`` or more is aborted with
  ``Req.set_finish_with_abort``); ``max_req_len`` is ``TpModelWorker``'s
  ``min(context_len - 1, pool tokens - 1)``, ``max_req_input_len = max_req_len - 5``;
* the radix cache, allocators and ``ReqToTokenPool`` exactly as ``sglang-radix`` loads them
  (``sglang_radix.py``: ``PagedTokenToKVPoolAllocator`` with ``page_size = block_size``,
  ``TokenToKVPoolAllocator`` at block size 1).

What the adapter plays -- the scheduler's loop (``Scheduler`` itself needs a process group,
a tokenizer, a model worker and ZMQ sockets; its methods read dozens of those members), in
the order of ``event_loop_normal`` (no overlap) of the release:

1. ``get_next_batch_to_run``: the chunked request is checkpointed
   (``checkpoint_kv_cache``, what ``stash_chunked_request`` calls); the last prefill batch
   minus the chunked request and finished requests joins the running batch; then
   ``_get_new_batch_prefill_raw``'s admission loop: ``policy.calc_priority(waiting)``, a
   ``PrefillAdder`` (page size, tree, allocator, running batch, the new-token ratio,
   ``max_prefill_tokens`` = ``chunked_prefill_size`` = the run's ``budget``),
   ``add_chunked_req`` for the chunked request (after its ``init_next_round_input``), then
   for each waiting request: stop on ``budget_state() == OTHER``, stop when the running
   requests plus those admitted reach ``max_running_requests`` (``max_seqs``) or the
   release's own ``get_num_allocatable_reqs`` (``ReqToTokenPool`` 's free rows, sized
   ``max_seqs + 1`` rows as the release sizes it; no admission at all, and no
   ``calc_priority``, when it is 0 and no request is chunked, as the release returns
   early), ``req.init_next_round_input(tree)``, ``adder.add_one_req(req,
   has_chunked_req, None)``, stop unless ``CONTINUE``. The admitted requests leave the
   waiting queue; ``adder.new_chunked_req`` becomes the chunked request; the batch's
   fields that ``prepare_for_extend`` sets before allocating (``prefix_lens``,
   ``extend_lens``, ``seq_lens``, ``extend_num_tokens``) are set as it sets them and
   ``alloc_for_extend(batch)`` runs;
2. with no prefill batch, ``update_running_batch``: ``batch.check_decode_mem()``, else
   ``batch.retract_decode()`` (the release's method: retraction order, ``release_req``:
   ``release_kv_cache(checkpoint=False)`` and ``reset_for_retract``), the retracted
   requests back to the end of the waiting queue (their entry time stamped anew), the
   ratio as ``retract_decode`` returns it; then ``prepare_for_decode``'s allocation:
   ``alloc_for_decode_default(batch, 1)`` (the last sampled token's slot);
3. the model output (kvcheck's engine model generates it): one token per request whose
   prefill is complete after this batch (``STOP``, the EOS id in ``eos_token_ids``, with
   probability 0.08, a function of ``gen`` and the request's id); a chunk samples nothing;
4. ``process_batch_result_prefill`` / ``_decode``: the token appended to ``output_ids``,
   ``update_finish_state()``; a finished request ``release_kv_cache(req, tree,
   checkpoint=True)``; an unfinished prefilled one ``checkpoint_kv_cache`` (the release's
   ``cache_unfinished_req`` path); ``kv_committed_len`` is advanced by the allocation
   functions themselves.

Aborts: a waiting request leaves the queue; a running or chunked one is marked
``to_finish = FINISH_ABORT()`` and released with ``release_kv_cache(checkpoint=True)``
between steps (what ``abort_request`` followed by the next result does, collapsed).

Stand-ins, in one place:

``ScheduleBatch``
    a record ``_Batch`` with the fields the run's functions read (``reqs``, the pools,
    ``tree_cache``, ``device = "cpu"``, ``seq_lens`` / ``seq_lens_cpu``,
    ``req_pool_indices``, ``spec_algorithm`` with ``is_none()``, ``model_config`` with
    ``is_encoder_decoder = False``, ``hisparse_coordinator = None``,
    ``maybe_evict_swa()`` a no-op: no sliding window); the methods listed above are the
    release's own, compiled from its class body. ``filter_batch(keep_indices=)`` is the
    adapter's (the release's rebuilds the forward tensors); ``init_new``,
    ``prepare_for_extend`` (its tensors for the forward pass, sampling info) and
    ``prepare_for_decode`` (the same) are not run beyond their allocation calls above.
``SamplingParams``
    a record of what ``Req`` and the adder read: ``max_new_tokens``, ``ignore_eos =
    False``, ``stop_strs`` / ``stop_token_ids`` empty, ``custom_params = None``
    (``sampling_params.py`` needs ``msgspec`` and the watermarking package).
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
``Scheduler.get_num_allocatable_reqs``' members
    the release's method, compiled from the class, reads ``req_to_token_pool`` (the run's)
    and ``beam_coordinator.pending_member_rows`` (0: no beam search).
The tokenizer and detokenizer
    none: prompts are token ids; ``Req.tokenizer`` stays ``None`` (no stop strings).
The model worker
    the generated output above (no forward pass; the oracle's ghost records the writes).
Time statistics, metrics, logprobs, grammars, LoRA, multimodal inputs, sessions, hicache
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
    CUDA, HIP, NPU or XPU; no pinned memory); ``CaptureHiddenMode`` its three names (no
    hidden states returned); ``CacheRequestHandle`` inert (``_Inert``).

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
``retract_decode`` runs (about a third of the seeded runs at 8 blocks x 4, one to two
retractions a run). ``stats`` counts ``retractions`` (requests ``retract_decode``
returned, back to the waiting queue: the oracle counts each as a preemption),
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
from . import _loader, install, sglang, sglang_radix
from ._loader import exec_definitions, exec_methods
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
    "disagg": _rec(disaggregation_mode="null", disaggregation_decode_retraction_backup="none"),
    "memory": _rec(radix_eviction_policy="lru"),
    "schedule": _rec(schedule_policy="fcfs", schedule_low_priority_values_first=True,
                     schedule_conservativeness=1.0,
                     retraction_policy="fcfs", prefill_max_requests=None),
    "parallel": _rec(dcp_enabled=False, attn_dcp_size=1, pp_max_micro_batch_size=1 << 30, tp_size=1,
                     tp_rank=0),
    "exec": _rec(mamba=_rec(enable_mamba_extra_buffer=False),
                 features=_rec(enable_encoder_swa_bounded_replay=False)),
    "spec": _rec(speculative_algorithm=None),
    "serving": _rec(strip_thinking_cache=False),
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
                 "alloc_for_decode_default", "alloc_for_decode", "write_cache_indices"),
}
BATCH_METHODS = ("check_decode_mem", "new_tokens_required_next_decode", "retract_decode",
                 "_get_decode_retraction_order", "release_req", "batch_size", "is_empty")

# classes ``isinstance`` checks ask about, which no object here is an instance of (no SWA,
# HiSparse, Mamba or unified cache): stand-in classes
NOT_INSTANCES = ("SWATokenToKVPoolAllocator", "DeepSeekV4HiSparseTokenToKVPoolAllocator",
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
    key = (dist.version, str(dist.root))
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
        "ReqDllmMixin": _ReqDllmMixin, "SchedulerReqTimeStats": _Inert,
        **{n: type(n, (), {}) for n in NOT_INSTANCES},
        "CaptureHiddenMode": _rec(NULL="NULL", FULL="FULL", LAST="LAST"),
        "CacheRequestHandle": _Inert, "_Inert": _Inert,
        "get_context": lambda: _rec(is_config_namespace_published=lambda _n: True),
        **{f"get_{k}": _getter(v) for k, v in CONFIG.items()},
    })
    # what the release's files import from base_prefix_cache besides the above, where the
    # release has it (0.5.21's Req unlocks with DecLockRefParams)
    ns.update({n: getattr(base, n) for n in ("DecLockRefParams", "IncLockRefParams",
                                             "zero_match_result", "MatchResult")
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
    ns["BatchMethods"] = exec_methods(root / SB, "ScheduleBatch", BATCH_METHODS, ns)
    ns["SchedulerMethods"] = exec_methods(root / SCHEDULER, "Scheduler",
                                          ("init_req_max_new_tokens",
                                           "get_num_allocatable_reqs"), ns)
    # calc_priority's processed_tokens (hrrn's, not offered) from 0.5.20
    ns["__priority_kw__"] = ({"processed_tokens": 0} if "processed_tokens" in
                             inspect.signature(ns["SchedulePolicy"].calc_priority).parameters
                             else {})
    # 0.5.23's counts the rows the admitted requests already hold (num_held_rows)
    ns["__held_rows__"] = "num_held_rows" in inspect.signature(
        ns["SchedulerMethods"]["get_num_allocatable_reqs"]).parameters
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


def _extend_end(req) -> int:
    """``Req.extend_end`` (0.5.22 on); 0.5.19 .. 0.5.21's ``req.extend_range.end``."""
    return req.extend_end if hasattr(req, "extend_end") else req.extend_range.end


class _Page:
    """A page as the engine oracle's KV calls name it (``block_id``: kvcheck's block)."""

    __slots__ = ("block_id",)

    def __init__(self, block_id: int):
        self.block_id = block_id


class _Batch:
    """``ScheduleBatch``'s stand-in record (see the module doc); the release's methods
    ``BATCH_METHODS`` are set on a subclass per release."""

    def __init__(self, reqs, target):
        import torch

        self.reqs = list(reqs)
        self.req_to_token_pool = target.pool
        self.token_to_kv_pool_allocator = target.alloc
        self.tree_cache = target.tree
        self.device = "cpu"
        self.hisparse_coordinator = None
        self.spec_algorithm = _rec(is_none=lambda: True)
        self.model_config = _rec(is_encoder_decoder=False)
        self.dllm_config = None
        self._torch = torch

    def maybe_evict_swa(self) -> None:  # no sliding window
        return None

    def is_dllm(self) -> bool:
        return False

    def filter_batch(self, keep_indices=None) -> None:
        """The adapter's: keep ``reqs[keep_indices]`` (the release's rebuilds the forward
        tensors too)."""
        if keep_indices is not None:
            self.reqs = [self.reqs[i] for i in keep_indices]

    def set_decode_fields(self) -> None:
        """What ``prepare_for_decode`` sets before ``alloc_for_decode``."""
        t = self._torch
        lens = [r.kv.kv_committed_len for r in self.reqs]
        self.seq_lens = t.tensor(lens, dtype=t.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        self.req_pool_indices = t.tensor([r.kv.req_pool_idx for r in self.reqs],
                                         dtype=t.int64)
        self.req_pool_indices_cpu = self.req_pool_indices.clone()

    def set_extend_fields(self) -> None:
        """What ``prepare_for_extend`` sets before ``alloc_for_extend``."""
        t = self._torch
        self.prefix_lens = [_prefix_len(r) for r in self.reqs]
        seq = [_extend_end(r) for r in self.reqs]
        self.extend_lens = [e - p for e, p in zip(seq, self.prefix_lens, strict=True)]
        self.seq_lens = t.tensor(seq, dtype=t.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        self.extend_num_tokens = sum(self.extend_lens)


class SglangEngineTarget:
    """SGLang's scheduling policy, radix cache and allocator as an engine core (see the
    module doc). ``add`` / ``abort`` / ``step(gen)`` and the engine oracle's observation."""

    block_offset = 0  # the KV calls and writes name kvcheck blocks (SGLang page - 1)

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
        self.schedule = types.SimpleNamespace(**{**vars(CONFIG["schedule"]),
                                                 "schedule_policy": self.policy_name})
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
        self.pool = mods[f"{mem}.memory_pool"].ReqToTokenPool(max_seqs + 1, context, "cpu",
                                                              False)
        params = mods[f"{mem}.cache_init_params"].CacheInitParams(
            disable=False, req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc,
            page_size=block_size)
        self.tree = mods[f"{mem}.radix_cache"].RadixCache(params)
        self._publish()
        self.policy = ns["SchedulePolicy"](self.policy_name, self.tree, False,
                                           policy == "priority", True)
        self.ratio = _ratio_tracker(ns, schedule_conservativeness)
        self.Batch = type("ScheduleBatch", (_Batch,), dict(ns["BatchMethods"]))
        self.waiting_queue: list = []
        self.running_batch = self.Batch([], self)
        self.last_batch: list = []  # the last prefill batch's requests (not yet merged)
        self.chunked_req = None
        self.requests: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(Req) -> request id
        self.arrivals = 0  # the queue-entry clock: wait_queue_entry_time, in entry order
        self.kv_calls: list[KVCall] = []
        # update_running_batch's retractions: the requests retract_decode returned, and
        # the steps whose check_decode_mem failed (SGLang's num_retracted_reqs, summed)
        self.stats = {"retractions": 0, "retract_steps": 0, "retract_aborts": 0}
        self._ran_last = False  # the loop's last_batch was not None
        self._epoch = 0  # bumped by every operation (the observation's memo, _observed)
        self._memo: tuple = (None, {}, {})
        # what Scheduler.init_req_max_new_tokens reads (TpModelWorker's limits: max_req_len =
        # min(context_len - 1, max_total_num_tokens - 1))
        self.scheduler = type("Scheduler", (), dict(ns["SchedulerMethods"]))()
        sch = self.scheduler
        sch.max_new_tokens_limit = None
        sch.max_total_num_tokens = size
        sch.max_req_len = min((max_model_len or size + 1) - 1, size - 1)
        sch.max_req_input_len = sch.max_req_len - 5
        sch.kv_shard_widening, sch.page_size = 1, block_size
        sch.token_to_kv_pool_allocator = self.alloc
        sch.sliding_window_size, sch.chunked_prefill_size = None, budget
        # what get_num_allocatable_reqs reads: the row pool, and no beam search (no rows
        # promised to beam members)
        sch.req_to_token_pool = self.pool
        sch.beam_coordinator = _rec(pending_member_rows=lambda _batch: 0)

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

    def add(self, seq: int, tokens: list[int], max_new: int, priority: int = 0) -> None:
        self._epoch += 1
        ns = self.ns
        self._publish()
        req = ns["Req"](str(seq), "", array("q", tokens), SamplingParams(max_new),
                        eos_token_ids={STOP}, vocab_size=VOCAB + 1, priority=priority)
        req.time_stats = _rec(wait_queue_entry_time=self.arrivals)
        # handle_generate_request: the release's clipping and prompt validation (a prompt
        # too long for the pool is aborted: queued as one token with to_finish set)
        self.scheduler.init_req_max_new_tokens(req)
        error = self.ns["validate_input_length"](req, self.scheduler.max_req_input_len, False)
        if error:
            req.set_finish_with_abort(error)
        self.arrivals += 1
        self.requests[seq] = req
        self.ids[id(req)] = seq
        self.waiting_queue.append(req)

    def abort(self, seq: int) -> None:
        self._epoch += 1
        self._publish()
        req = self.requests[seq]
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)
            req.finished_reason = self.ns["FINISH_ABORT"]()
            return
        req.to_finish = self.ns["FINISH_ABORT"]()
        req.update_finish_state()
        self._release(req)
        if req is self.chunked_req:
            self.chunked_req = None
        self.running_batch.reqs = [r for r in self.running_batch.reqs if r is not req]
        self.last_batch = [r for r in self.last_batch if r is not req]

    def _release(self, req) -> None:
        before = self._pages(req)
        free_before = self.num_free()
        self.ns["release_kv_cache"](req, self.tree, **self.ns["__release_kw__"])
        self._call("free", req, None, before, free_before)

    def step(self, gen: int) -> StepResult:
        self._epoch += 1
        del self.kv_calls[:]
        ns = self.ns
        self._publish(gen)
        batch, prefill = self._next_batch()
        calls_in_schedule = list(self.kv_calls)
        scheduled, writes, sampled = {}, {}, {}
        ran_last, self._ran_last = self._ran_last, batch is not None
        if batch is None:
            # on_idle: is_fully_idle (no running, chunked, waiting request, nor a batch run
            # the iteration before) resets the new-token ratio to its initial value
            if not (self.waiting_queue or self._live() or ran_last):
                self.ratio.reset()
            return StepResult({}, {}, {}, {}, {}, calls_in_schedule, [])
        for req in batch.reqs:
            q = self.ids[id(req)]
            pages = self._pages(req)
            if prefill:
                start = self._starts[id(req)]
                toks = list(req.full_untruncated_fill_ids[start:_extend_end(req)])
            else:
                start = req.kv.kv_committed_len - 1
                toks = [req.output_ids[-1]] if req.output_ids else \
                    [req.origin_input_ids[-1]]
            scheduled[q] = len(toks)
            writes[q] = (start, toks, pages)
        # the model output and process_batch_result
        for req in batch.reqs:
            q = self.ids[id(req)]
            if prefill and req is self.chunked_req:
                continue  # a chunk samples nothing
            rng = random.Random(gen * 1_000_003 + q)
            tok = STOP if rng.random() < 0.08 else rng.randint(2, VOCAB)
            sampled[q] = [tok]
            req.output_ids.append(tok)
            req.update_finish_state()
            if req.finished():
                self._release(req)
            elif prefill:
                ns["__checkpoint__"](req, self.tree)
        self.last_batch = list(batch.reqs) if prefill else []
        if not prefill:
            batch.filter_batch([i for i, r in enumerate(batch.reqs) if not r.finished()])
        return StepResult(scheduled, {}, sampled, {}, writes, calls_in_schedule,
                          list(self.kv_calls[len(calls_in_schedule):]))

    def _next_batch(self):
        """``get_next_batch_to_run`` (see the module doc): (batch, is_prefill)."""
        ns = self.ns
        AddReqResult = ns["AddReqResult"]
        if self.chunked_req is not None and _extend_end(self.chunked_req) > \
                _prefix_len(self.chunked_req):
            self._stash(self.chunked_req)
        merged = [r for r in self.last_batch if r is not self.chunked_req and not r.finished()]
        self.running_batch.reqs = [r for r in self.running_batch.reqs + merged
                                   if not r.finished()]
        self.last_batch = []
        running = self.running_batch
        if (self.waiting_queue or self.chunked_req is not None) and (
                self.chunked_req is not None or self._allocatable(running, 0) > 0):
            self.policy.calc_priority(self.waiting_queue, running, **ns["__priority_kw__"])
            adder = ns["PrefillAdder"](self.block_size, self.tree, self.alloc, running,
                                       self.ratio.current, self.budget, self.budget,
                                       0, 0, max_prefill_bs=0,
                                       max_running_requests=self.max_seqs,
                                       prefill_max_requests=None,
                                       prefill_delayer_single_pass=None, dllm_config=None,
                                       waiting_queue_len=len(self.waiting_queue))
            if self.chunked_req is not None:
                self.chunked_req.init_next_round_input()
                self.chunked_req = adder.add_chunked_req(self.chunked_req)
            for req in self.waiting_queue:
                if adder.budget_state() == AddReqResult.OTHER:
                    break
                held = sum(r.kv.holds_kv for r in adder.can_run_list)
                if len(adder.can_run_list) >= self._allocatable(running, held):
                    break
                req.init_next_round_input(self.tree)
                res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                                        truncation_align_size=None)
                if res != AddReqResult.CONTINUE:
                    break
            if adder.can_run_list:
                admitted = set(map(id, adder.can_run_list))
                self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
                if adder.new_chunked_req is not None:
                    self.chunked_req = adder.new_chunked_req
                batch = self.Batch(adder.can_run_list, self)
                self._extend(batch)
                return batch, True
        if running.is_empty():
            return None, False
        if not running.check_decode_mem():
            held = {id(r): self._pages(r) for r in running.reqs}
            free_before = self.num_free()
            retracted, ratio, aborted = running.retract_decode()
            self.ratio.current = ratio
            self.stats["retract_steps"] += 1
            self.stats["retractions"] += len(retracted)
            self.stats["retract_aborts"] += len(aborted)
            for r in retracted + aborted:  # release_req's release_kv_cache
                self._call("free", r, None, held[id(r)], free_before)
            for r in retracted:  # _add_request_to_queue(is_retracted=True): the queue entry
                r.time_stats.wait_queue_entry_time = self.arrivals  # time is stamped anew
                self.arrivals += 1
            self.waiting_queue.extend(retracted)
            for r in aborted:
                r.update_finish_state()
        else:
            self.ratio.decay_step()
        if running.is_empty():
            return None, False
        self._decode(running)
        return running, False

    def _allocatable(self, running, held: int) -> int:
        """How many more requests admission may take: the release's
        ``Scheduler.get_num_allocatable_reqs`` (the free ``ReqToTokenPool`` rows, plus from
        0.5.23 the rows the admitted requests already hold), capped by
        ``max_running_requests`` less the running requests."""
        more = {"num_held_rows": held} if self.ns["__held_rows__"] else {}
        rows = self.scheduler.get_num_allocatable_reqs(len(running.reqs),
                                                       running_batch=running, **more)
        return min(self.max_seqs - len(running.reqs), rows)

    def _extend(self, batch) -> None:
        """``prepare_for_extend``'s allocation; each request's KV calls recorded: a new
        one's match (``get_computed_blocks``: its prefix pages) and its pages appended."""
        ns = self.ns
        batch.set_extend_fields()
        self._starts = {id(r): _prefix_len(r) for r in batch.reqs}
        before, new = {}, {}
        for r in batch.reqs:
            ids = (ns["_prefix_kv_indices"](batch, r) if "_prefix_kv_indices" in ns
                   else r.prefix_indices).tolist()
            before[id(r)] = sglang.row_pages(ids, self.block_size) if ids else []
            new[id(r)] = not r.kv.holds_kv
        free_before = self.num_free()
        ns["alloc_for_extend"](batch)
        for r in batch.reqs:
            hits = before[id(r)]
            if new[id(r)]:
                self._call("get_computed_blocks", r, ([_Page(b) for b in hits], _prefix_len(r)),
                           [], free_before)
            after = self._pages(r)
            self._call("allocate_slots", r, [_Page(b) for b in after[len(hits):]], hits,
                       free_before)

    def _stash(self, req) -> None:
        """``stash_chunked_request``'s caching of the chunked request: 0.5.22 on
        ``checkpoint_kv_cache(req, tree)``, 0.5.19 .. 0.5.21
        ``maybe_cache_unfinished_req(req, tree, chunked=True)``."""
        if "checkpoint_kv_cache" in self.ns:
            self.ns["checkpoint_kv_cache"](req, self.tree)
        else:
            self.ns["maybe_cache_unfinished_req"](req, self.tree, chunked=True)

    def _decode(self, batch) -> None:
        batch.set_decode_fields()
        before = {id(r): self._pages(r) for r in batch.reqs}
        free_before = self.num_free()
        self.ns["__decode__"](batch, 1)
        for r in batch.reqs:
            b = before[id(r)]
            self._call("allocate_slots", r, [_Page(x) for x in self._pages(r)[len(b):]], b,
                       free_before)

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

    def _live(self) -> list:
        out = list(self.running_batch.reqs)
        out += [r for r in self.last_batch if r not in out]
        if self.chunked_req is not None and self.chunked_req not in out:
            out.append(self.chunked_req)
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
