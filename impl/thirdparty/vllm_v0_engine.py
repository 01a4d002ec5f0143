"""Adapter: vLLM v0's engine core -- the release's own ``Scheduler`` with its own
``SelfAttnBlockSpaceManager`` (block manager v2), ``Sequence``, ``SequenceGroup`` and
``SequenceData`` -- driven step by step with no model.

Issue 34 §1. ``vllm-v0-engine[@VERSION]`` (chunked prefill off, v0's default) and
``vllm-v0-engine-chunked[@VERSION]`` (``enable_chunked_prefill``); 0.8.5 by default, the
``vllm-v0`` install key (``kvcheck install vllm-v0==0.8.5``); every v0 release from 0.4.2 to
0.9.2 runs (0.4.2, 0.4.3, 0.5.0.post1, 0.5.1, 0.5.2, 0.5.3.post1, 0.5.4, 0.5.5, 0.6.0,
0.6.1.post2, 0.6.2, 0.6.3.post1, 0.6.4.post1, 0.6.5, 0.6.6.post1, 0.7.0 .. 0.7.3, 0.8.0 ..
0.8.5, 0.9.0 .. 0.9.2 checked; to 0.5.x: ``block_manager_v2.py``, ``BlockSpaceManagerV2``;
to 0.5.3.post1 the scheduler imports its ``vllm/core/policy.py``; to 0.5.0.post1
``sequence.py`` imports ``vllm/block.py`` (``LogicalTokenBlock``) and the scheduler
``vllm.utils.merge_dicts`` (executed from the release's own ``utils.py``); 0.4.2's
``Sequence`` takes the prompt text and token ids (no inputs dict) and its ``SequenceGroup``
``sampling_params`` before ``arrival_time`` (both passed by keyword); no ``priority`` before
0.6.3, no ``extra_hash`` before 0.6.4: all detected by signature). This target sets
``use_v2_block_manager``: block manager v2 is the scheduler's default only from 0.6.3; to
0.6.2 the default is ``BlockSpaceManagerV1``, run by ``vllm-v0-engine-v1``
(``vllm_v0_engine_v1``, prefix caching off). Chunked prefill with prefix
caching is refused in one line where the allocator's ``get_computed_block_ids`` takes
``skip_last_block_id`` (0.5.x .. 0.6.4.post1; detected by signature): the adapter's reading
of which blocks a chunked step skips is not verified there; and where the release's own model
runner refuses the combination (``worker/model_runner.py`` raises "chunked prefill cannot be
used with prefix caching now." on a chunked step with cached blocks: to 0.5.5, read from its
file; 0.4.2 .. 0.5.0.post1 have no ``skip_last_block_id`` to detect); 0.6.5 on carry 0.8.5's
allocator and tracker and run it. What runs is the release's
``vllm/core/scheduler.py``, ``interfaces.py``, ``block_manager.py``,
``placeholder_block_space_manager.py``, ``policy.py``, ``vllm/core/block/*`` (the block manager's files,
as ``vllm_v0`` loads them), ``vllm/block.py`` and ``vllm/sequence.py``, executed from the installed files
(``_loader``). The adapter plays ``LLMEngine.step`` (``vllm/engine/llm_engine.py``,
``output_processor/single_step.py``, ``stop_checker.py``) and the model runner:

1. a request arrives: ``Scheduler.add_seq_group(SequenceGroup(request_id,
   [Sequence(seq_id, {"type": "token", "prompt_token_ids": ...}, block_size, eos)],
   arrival_time, sampling_params))`` (``LLMEngine._add_processed_request``);
2. ``schedule()`` -> ``(seq_group_metadata_list, scheduler_outputs, _)``;
3. for each scheduled group, in order: ``seq_group.update_num_computed_tokens(
   token_chunk_size)``; if its metadata says ``do_sample`` (0.4.0, 0.4.1 have none: once
   its sequences are in their DECODE stage, 0.4.0 always, as their ``LLMEngine``), the
   generated token (``STOP``
   with probability 0.08, else 2 .. ``VOCAB``, a function of the step's ``gen`` and the
   request's id) is appended, ``seq.append_token_id(token, {token: Logprob})``, and the
   stop checker's rules that apply to token ids are played (EOS -> ``FINISHED_STOPPED``;
   ``get_len() > max_model_len`` -> ``FINISHED_LENGTH_CAPPED``; ``get_output_len() ==
   max_tokens`` -> ``FINISHED_LENGTH_CAPPED``), and a finished sequence is freed with
   ``scheduler.free_seq``; then ``scheduler.free_finished_seq_groups()``;
4. a prompt the scheduler ignores (``scheduler_outputs.ignored_seq_groups``: longer than
   its prompt limit) is finished as ``FINISHED_IGNORED`` by the release itself.

``abort(seq)`` is ``Scheduler.abort_seq_group(request_id)``. Preemption is the release's
own (``_preempt`` -> ``_preempt_by_recompute``: one sequence per group, so never swap).

Forks: ``load(version, engine)`` runs the same files of an engine that carries them under
other module names (``vllm_v0.LAYOUTS``: aphrodite-engine 0.6.x, ``aphrodite_v0_engine``);
the stand-ins below are then installed under the fork's names (``aphrodite.common.config``
for ``vllm.config``, ...), and the modules come back under vLLM's (``vllm_v0.Modules``).

Stand-ins, in one place (every other ``vllm.*`` import raises, see ``_loader``):

``vllm.config`` (``CacheConfig``, ``SchedulerConfig``, ``LoRAConfig``)
    the real module imports torch, transformers and the whole model registry; the
    scheduler only reads attributes. The stand-in classes are records of the settings
    ``Scheduler`` and its block manager read (``SCHEDULER_SETTINGS``): the run's
    ``budget`` (``max_num_batched_tokens``), ``max_seqs``, ``policy``, chunked prefill,
    ``max_model_len``; the rest at ``SchedulerConfig``'s defaults (``delay_factor`` 0,
    ``num_lookahead_slots`` 0, one scheduler step, one partial prefill, no preemption mode
    forced, ``send_delta_data`` False, runner ``generate`` (0.6.4.post1 reads it as
    ``task``), not attention-free: aphrodite 0.6.1 on reads ``is_attention_free`` here); the
    cache: ``block_size``,
    ``num_gpu_blocks`` = the pool, no CPU blocks, no sliding window, prefix caching on/off.
    What the real ``SchedulerConfig`` refuses at start-up is refused first, in the release's
    own words: its validation method, compiled from its own ``config.py``
    (``vllm_config.refusal``), runs on the settings (a budget below ``max_num_seqs``;
    without chunked prefill a budget below ``max_model_len``); then what its worker refuses
    of the pool (``vllm_config.check_pool``: ``raise_if_cache_size_invalid``, a
    ``max_model_len`` above ``block_size * num_gpu_blocks``; aphrodite 0.6.x's only logs).
    ``max_model_len`` unset: the largest the worker accepts on the pool, at most 65,536
    (``vllm_config.largest_len``), without chunked prefill at most the budget.
``vllm.utils``
    the real module imports torch; ``Device``, ``cdiv``, ``chunk_list`` as ``vllm_v0``
    re-implements them, and ``PyObjectCache``, the ``STR_NOT_IMPL_*`` messages and (to
    0.5.0.post1) ``merge_dicts`` executed from the release's own ``vllm/utils.py`` (their
    source, cut out by name).
``vllm.platforms``, ``vllm.logger``
    as ``vllm_v0`` (CUDA-like; a stdlib logger).
``msgspec``
    ``vllm/sequence.py`` declares ``SequenceData``, ``SequenceGroupMetadata`` and the
    outputs as ``msgspec.Struct`` (serialisation to workers); msgspec is not a kvcheck
    dependency. The stand-in is ``vllm_v1_engine``'s (its ``Struct`` gives a subclass the
    constructor msgspec would: the annotated fields, in order, positional or by keyword,
    defaults -- an empty list, dict or set copied per instance -- and
    ``field(default_factory=...)``, then ``__post_init__``); nothing is serialised here.
``torch``
    ``sequence.py`` names ``torch.Tensor`` in annotations (pooled data, hidden states),
    evaluated at class creation; a module with a ``Tensor`` class. No tensor is made.
``vllm.sampling_params``
    the real module imports pydantic and the tokenizers. ``SamplingParams`` is a record of
    the fields the engine reads for a token-id request (``n=1``, ``max_tokens``,
    ``min_tokens=0``, ``ignore_eos=False``, ``stop_token_ids=[]``, ...);
    ``RequestOutputKind`` an enum of its three members.
``time`` (the scheduler module's)
    ``schedule()`` stamps each step with ``time.time()``: the blocks' last access, which
    orders the evictor (LRU, then the longest prefix). The stand-in clock is a counter, a
    tick later at every reading, so the readings keep the order a real clock gives them
    without ties or wall-clock dependence (time never decides a verdict); with
    ``delay_factor`` 0 no other decision reads it.
``vllm.inputs.parse`` (0.5.5 .. 0.6.3.post1)
    ``is_valid_encoder_decoder_llm_inputs`` (0.6.3: ``is_encoder_decoder_inputs``), executed
    from the release's own file (cut out by name: the module imports ``vllm.utils`` and the
    input types), its annotations' names given as ``dict`` / ``Any``; the ``vllm.inputs``
    stand-in carries it too where the release defines it in ``inputs/data.py`` (aphrodite
    0.6.0.x's ``sequence.py`` imports it from the package).
``vllm.inputs`` (``SingletonInputsAdapter``, 0.6.4.post1 .. 0.8.4)
    the real package imports torch, the tokenizers and the preprocessors. ``Sequence`` reads
    its prompt through ``SingletonInputsAdapter`` (a dataclass of cached properties over the
    inputs dict): executed from the release's own ``inputs/data.py`` (cut out by name), with
    ``dataclass``, ``cached_property`` and ``typing_extensions.assert_never`` (not a kvcheck
    dependency: a function raising as it does) in its namespace.
``loguru`` (aphrodite)
    aphrodite's scheduler logs through ``loguru.logger``; not a kvcheck dependency. The
    stand-in formats the ``{}`` messages into a stdlib logger under ``kvcheck.thirdparty``
    (logging only reports; no decision reads it).
``vllm.inputs``, ``vllm.multimodal``, ``vllm.pooling_params``, ``vllm.lora.request``,
``vllm.prompt_adapter.request``, ``vllm.spec_decode.metrics``
    names ``sequence.py`` and ``scheduler.py`` import only for annotations or for
    requests kvcheck never makes (LoRA, prompt adapters, multimodal, pooling; 0.6.4.post1
    .. 0.8.4 import ``MultiModalDataDict``): empty ``dict`` subclasses
    (``Sequence.multi_modal_data`` returns ``MultiModalKwargs({})``).

KV calls, recorded at the ``SelfAttnBlockSpaceManager``'s boundary and given to the engine
oracle under the names whose contracts they satisfy (``KVCall``):

* ``can_allocate`` answering ``LATER`` / ``NEVER`` and ``can_append_slots`` answering
  ``False`` -- a refused ``allocate_slots`` (nothing may change);
* ``allocate(seq_group)`` -- a lookup and an allocation in one call: recorded (after
  ``schedule()`` returns, when the model runner's view is known) as a
  ``get_computed_blocks`` whose result is the blocks the model runner skips (the group
  metadata's ``computed_block_nums``, the release's ``get_common_computed_block_ids``:
  cached and computed, each must hold the requested prefix) and an ``allocate_slots`` from
  those to the whole table, the rest being the blocks the forward pass may write;
* ``append_slots(seq, lookahead)`` -- an ``allocate_slots`` returning the blocks it
  appended;
* ``free(seq)`` -- ``free``: the sequence holds nothing afterwards.

What the forward pass writes (the model runner's ``ModelInputForGPUBuilder`` imports
torch; its rule restated): the tokens from ``context_len`` = ``get_num_computed_tokens()``
to ``seq_len`` = ``min(get_len(), context_len + token_chunk_size)``, starting instead past
the skipped prefix (``len(computed_block_nums) * block_size``) when that is further, and
at ``seq_len - 1`` on a full hit ("Only compute the last token",
``_compute_for_prefix_cache_hit``). That last token's KV goes back into its slot of the
last hit block -- a cached block, shared: v0 recomputes it in place. The adapter counts
the token as scheduled but does not report that one write: it writes the request's own
token at its own position into a block the lookup returned as holding exactly that
prefix, which the oracle checks (``get_computed_blocks``' rule), so the block's content is
unchanged iff the hit was right; reported, it would read as a write into a cached block
(v1 instead leaves the last block out of the hits and recomputes it in a fresh block).

Observation: the scheduler's ``running`` and ``waiting`` deques (``swapped`` stays empty:
recompute only), each sequence's status, ``get_num_computed_tokens()`` (while running) and
token ids; the block manager's ``block_tables``; the GPU allocator's ``RefCounter``, free
blocks (hashless free deque plus evictor) and ``_cached_blocks``, the entries whose
block is computed (``block_is_computed``: what a lookup may skip; an entry for a block
allocated but not yet written is not a cache entry yet); a sequence's block
hashes are the release's own ``PrefixCachingBlock.hash_block_tokens`` chained over its full
blocks.
"""

from __future__ import annotations

import enum
import functools
import random
import types
from pathlib import Path
from typing import Any

from ..errors import MisuseError
from . import _loader, install, vllm_config
from .vllm_v0 import FILES, LAYOUTS, Modules, free_block_ids
from .vllm_v0 import STUBS as V0_STUBS
from .vllm_v1_engine import STUBS as V1_ENGINE_STUBS
from .vllm_v1_engine import KVCall, StepResult

ENGINE_KEY = "vllm-v0"
STOP = 1  # the end-of-sequence token the generated output samples rarely
VOCAB = 8  # generated tokens: 2 .. VOCAB, or STOP

ENGINE_FILES = ("vllm.core.scheduler", "vllm.core.interfaces", "vllm.core.block_manager",
                "vllm.core.block_manager_v2", "vllm.core.placeholder_block_space_manager",
                "vllm.core.block.utils", "vllm.core.policy",  # (to 0.5.3.post1)
                "vllm.block", "vllm.core.block_manager_v1", "vllm.core.evictor_v1",  # (to 0.6.2)
                "vllm.sequence")  # those the release has


def _rename(loaded):
    """The load's module names from vLLM's (``vllm_v0.LAYOUTS``: a fork's layout)."""
    return LAYOUTS.get(loaded.dist.key) or (lambda n: n)


def _from_source(mod: types.ModuleType, loaded, names: tuple[str, ...],
                 module: str = "vllm.utils") -> None:
    """Execute the release's own definitions of ``names`` (classes, functions, constants)
    cut out of its ``module`` file (vLLM's name; a fork's own under ``LAYOUTS``) into
    ``mod`` (the rest of that module imports torch); none if the release has no such
    file."""
    rel = _rename(loaded)(module).replace(".", "/")
    path = loaded.root / f"{rel}.py"
    if not path.is_file():  # 0.9.x: a package
        path = loaded.root / rel / "__init__.py"
    if path.is_file():
        _loader.exec_definitions(path, mod.__dict__, names)  # (those the release has)


RUNNER_REFUSAL = "chunked prefill cannot be used with prefix caching"


@functools.cache
def _runner_text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _has(mods, name: str) -> bool:
    """Whether the release ships module ``name`` (vLLM's name; a fork's own under
    ``LAYOUTS``) as a file."""
    return (Path(mods.root) / (_rename(mods)(name).replace(".", "/") + ".py")).is_file()


def runner_refuses_chunked_caching(mods) -> bool:
    """Whether the release's model runner (``vllm/worker/model_runner.py``, to 0.5.5) raises
    on a chunked prefill step that skips cached blocks (read from its file, once)."""
    rel = _rename(mods)("vllm.worker.model_runner").replace(".", "/")
    return RUNNER_REFUSAL in _runner_text(Path(mods.root) / f"{rel}.py")


def _stub_engine_utils(mod: types.ModuleType, loaded) -> None:
    import collections

    V0_STUBS["vllm.utils"](mod, loaded)
    # (to 0.5.0.post1 the scheduler imports merge_dicts: its annotations' names)
    mod.__dict__.update(defaultdict=collections.defaultdict, Dict=dict, List=list, Any=Any)
    _from_source(mod, loaded, ("PyObjectCache", "STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE",
                               "STR_NOT_IMPL_ENC_DEC_SWA", "merge_dicts"))


def _stub_inputs_parse(mod: types.ModuleType, loaded, module: str = "vllm.inputs.parse"
                       ) -> None:
    import typing

    mod.__dict__.update(Union=typing.Union, LLMInputs=dict, EncoderDecoderLLMInputs=dict,
                        DecoderOnlyInputs=dict, EncoderDecoderInputs=dict, TypeIs=typing.Any)
    # (0.6.3: is_encoder_decoder_inputs, the same test under its new name)
    _from_source(mod, loaded, ("is_valid_encoder_decoder_llm_inputs",
                               "is_encoder_decoder_inputs"), module)


def _assert_never(value: Any) -> None:  # (typing_extensions'; not a kvcheck dependency)
    raise AssertionError(f"Expected code to be unreachable, but got: {value!r}")


def _stub_inputs(mod: types.ModuleType, loaded) -> None:
    import dataclasses
    import functools

    _stub_names("SingletonInputs")(mod, loaded)
    # where the package itself exports it (aphrodite 0.6.0.x's sequence.py imports it from
    # ``aphrodite.inputs``, defined in ``inputs/data.py``): the release's own function
    _stub_inputs_parse(mod, loaded, "vllm.inputs.data")
    # 0.6.4 .. 0.8.4: Sequence reads its prompt through SingletonInputsAdapter (a dataclass
    # of cached properties over the inputs dict): the release's own class
    mod.__dict__.update(dataclass=dataclasses.dataclass,
                        cached_property=functools.cached_property, assert_never=_assert_never)
    _from_source(mod, loaded, ("SingletonInputsAdapter",), "vllm.inputs.data")


def _stub_loguru(mod: types.ModuleType, _) -> None:
    import logging

    class _Logger:
        """loguru's ``logger``: ``{}``-formatted messages, to a stdlib logger."""

        def __init__(self):
            self._log = logging.getLogger("kvcheck.thirdparty.loguru")

        def __getattr__(self, level: str):
            number = logging.getLevelName(level.upper())
            if not isinstance(number, int):
                raise AttributeError(level)

            def emit(message, *args, **kwargs):
                if self._log.isEnabledFor(number):
                    text = str(message)
                    try:
                        text = text.format(*args, **kwargs) if args or kwargs else text
                    except (IndexError, KeyError, ValueError):
                        pass
                    self._log.log(number, "%s", text)
            return emit

    mod.logger = _Logger()


def _stub_torch(mod: types.ModuleType, _) -> None:
    class Tensor:  # annotations only
        pass

    mod.Tensor = Tensor


def _stub_sampling_params(mod: types.ModuleType, _) -> None:
    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    class SamplingParams:
        """The fields the engine reads for a token-id request (module doc's stand-ins)."""

        def __init__(self, max_tokens: int):
            self.n = 1
            self.best_of = 1  # (the real __init__: n when not given)
            self.use_beam_search = False  # to 0.6.2
            self.max_tokens = max_tokens
            self.min_tokens = 0
            self.ignore_eos = False
            self.stop_token_ids: list[int] = []
            self.stop: list[str] = []
            self.detokenize = False
            self.output_kind = RequestOutputKind.CUMULATIVE
            self.prompt_logprobs = None
            self.logprobs = None

    mod.RequestOutputKind = RequestOutputKind
    mod.SamplingParams = SamplingParams


def _stub_names(*names: str):
    def build(mod: types.ModuleType, _) -> None:
        for n in names:  # a dict: what sequence.py makes of MultiModalKwargs({})
            setattr(mod, n, type(n, (dict,), {}))
    return build


def _stub_config(mod: types.ModuleType, _) -> None:
    for n in ("CacheConfig", "SchedulerConfig", "LoRAConfig"):
        setattr(mod, n, type(n, (types.SimpleNamespace,), {}))


def _stub_time(mod: types.ModuleType, _) -> None:
    import itertools

    ticks = itertools.count(1)

    def clock() -> float:
        return float(next(ticks))

    mod.time = mod.perf_counter = mod.monotonic = clock


STUBS = {
    "time": _stub_time,
    "vllm.utils": _stub_engine_utils,
    "vllm.platforms": V0_STUBS["vllm.platforms"],
    "vllm.logger": _loader.stub_logger,
    "vllm.config": _stub_config,
    "vllm.sampling_params": _stub_sampling_params,
    "vllm.inputs": _stub_inputs,
    "vllm.inputs.parse": _stub_inputs_parse,
    "vllm.spec_decode.metrics": _stub_names("SpecDecodeWorkerMetrics"),
    "vllm.multimodal": _stub_names("MultiModalKwargs", "MultiModalPlaceholderDict",
                                      "MultiModalDataDict"),
    "vllm.pooling_params": _stub_names("PoolingParams"),
    "vllm.lora.request": _stub_names("LoRARequest"),
    "vllm.prompt_adapter.request": _stub_names("PromptAdapterRequest"),
    "msgspec": V1_ENGINE_STUBS["msgspec"],  # (vllm_v1_engine's Struct record)
    "torch": _stub_torch,
    "loguru": _stub_loguru,
}


def load(version: str | None = None, engine: str = ENGINE_KEY):
    """The release's scheduler, block manager and sequence modules. ``engine``: another row
    of ``install.ENGINES`` whose releases carry vLLM v0's files under a fork's module names
    (``vllm_v0.LAYOUTS``: aphrodite-engine 0.6.x); its modules are then returned under
    vLLM's names (``vllm_v0.Modules``), the stand-ins ``STUBS`` under the fork's."""
    if engine not in LAYOUTS:
        raise ValueError(f"no v0 module layout for engine {engine!r}")
    rename = LAYOUTS[engine] or (lambda n: n)
    dist = install.select(engine, version)
    root = _loader.require(dist)

    def has(name: str) -> bool:
        return (root / (rename(name).replace(".", "/") + ".py")).is_file()

    evictor = "vllm.core.evictor" if has("vllm.core.evictor") else "vllm.core.evictor_v2"
    files = tuple(rename(f) for f in (*FILES[:-1], evictor,
                                      *(f for f in ENGINE_FILES if has(f))))
    stubs = {rename(k): v for k, v in STUBS.items()}
    loaded = _loader.load(dist, files, stubs,
                          entry=tuple(rename(n) for n in ("vllm.sequence",
                                                          "vllm.core.scheduler")))
    return loaded if LAYOUTS[engine] is None else Modules(loaded, rename)


def _refuses_chunk_size(mods, sched_cfg, cache_cfg, budget: int, max_seqs: int,
                        model_len: int) -> None:
    """0.6.5 .. 0.7.2 (``_chunk_new_tokens_to_schedule`` without a partial-prefill budget):
    with chunked prefill and prefix caching the scheduler raises ``ValueError`` ("chunk size
    must be dividable by block size") at the first prefill it chunks, whatever the request:
    the release refuses the settings, only late. Asked up front of the release's own static
    method, on the run's configs and a ``SchedulingBudget`` of the release, with one token
    more than the budget to chunk: its ``ValueError`` is the refusal, in its words (0.7.3
    on rounds the chunk down to a whole number of blocks instead, docs/findings.md E6;
    0.6.0 .. 0.6.4.post1 make the same check inline, but chunked prefill with prefix
    caching is refused there already)."""
    sched = mods["vllm.core.scheduler"]
    chunk = getattr(sched.Scheduler, "_chunk_new_tokens_to_schedule", None)
    if chunk is None or _loader.takes(chunk, "partial_prefill_metadata"):
        return
    try:
        chunk(sched_cfg, cache_cfg, sched.SchedulingBudget(token_budget=budget,
                                                           max_num_seqs=max_seqs),
              model_len, budget + 1)
    except ValueError as exc:
        dist = mods.dist
        raise MisuseError(f"{dist.dist} {dist.version} refuses these settings at its first "
                          f"chunked prefill (Scheduler._chunk_new_tokens_to_schedule): "
                          f"{exc}") from None


class KVCallRecorder:
    """One ``SelfAttnBlockSpaceManager`` method, recorded at the manager's boundary as the
    engine oracle's KV calls (see the module doc). A plain object, so a deep copy of the
    scheduler records into the copy."""

    def __init__(self, target: VllmV0EngineTarget, manager: Any, name: str):
        self.target, self.manager, self.name = target, manager, name
        self.method = getattr(type(manager), name)

    def __call__(self, *args, **kwargs):
        t, m = self.target, self.manager
        arg = args[0] if args else next(iter(kwargs.values()))  # seq_group= or seq=
        seq = arg.get_seqs()[0] if hasattr(arg, "get_seqs") else arg
        before, free_before = t._table(seq), t.num_free()
        result = self.method(m, *args, **kwargs)
        after, free_after = t._table(seq), t.num_free()
        rid = str(t.ids[seq.seq_id])

        def call(name, res, blocks_before, blocks_after=after):
            t.kv_calls.append(KVCall(name, rid, (), {}, res, blocks_before, blocks_after,
                                     free_before, free_after, t._hashes(seq),
                                     list(seq.get_token_ids())))

        if self.name == "can_allocate":
            if result.name != "OK":
                call("allocate_slots", None, before)
        elif self.name in ("can_append_slots", "can_append_slot"):
            if not result:
                call("allocate_slots", None, before)
        elif self.name == "allocate":  # split once the runner's view is known (step)
            t.pending[seq.seq_id] = (len(t.kv_calls), after, free_before, free_after)
            t.kv_calls.append(None)
        elif self.name in ("append_slots", "append_slot"):
            call("allocate_slots", [ResultBlock(b) for b in after[len(before):]], before)
        elif before or seq.seq_id in t.held:  # free (not a sequence holding no table)
            call("free", None, before)
        t.held.discard(seq.seq_id)
        if after:
            t.held.add(seq.seq_id)
        return result


class VllmV0EngineTarget:
    """vLLM v0's engine core on the release's own ``Scheduler`` (see the module doc)."""

    block_offset = 0  # the oracle's block ids are v0's (no null block)
    block_manager_v2 = True  # use_v2_block_manager (vllm_v0_engine_v1: BlockSpaceManagerV1)

    def _gpu_allocator(self) -> Any:
        return self.manager.block_allocator._allocators[self._mods["vllm.utils"].Device.GPU]

    def __init__(self, num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 max_model_len: int = 0, chunked: bool = False,
                 version: str | None = None, engine: str = ENGINE_KEY,
                 sliding_window: int | None = None):
        # sliding_window: CacheConfig.sliding_window (vllm_v0_engine_window; None: no window)
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("vLLM v0 needs num_blocks >= 1 and block_size >= 1")
        if spec:
            raise MisuseError("vllm-v0-engine drives no speculative decoding (v0's spec "
                              "decode worker needs a model)")
        if policy not in ("fcfs", "priority"):
            raise MisuseError(f"vLLM v0's scheduler has no {policy} scheduling")
        mods = load(version, engine)
        self.version = mods.dist.version
        self._mods = mods
        self.num_blocks, self.block_size, self.caching = num_blocks, block_size, caching
        # max_model_len unset: the largest the release's worker accepts on this pool
        # (vllm_config.largest_len: block_size * num_gpu_blocks, at most 65,536), without
        # chunked prefill at most the budget (its SchedulerConfig refuses more)
        model_len = max_model_len
        if not model_len:
            most = vllm_config.largest_len(mods, num_blocks, block_size)
            model_len = most if chunked else min(budget, most)
        # without chunked prefill a prompt (with its outputs, once preempted) is admitted
        # whole: the engine model draws requests that fit max_model_len (<= the budget)
        self.longest_request = 0 if chunked else model_len
        self.max_model_len = model_len
        # chunked prefill: admission allocates the whole prompt's blocks (BlockTable.allocate
        # of every prompt token), the chunks fill them; the table is bounded, not exact
        self.preallocate_blocks = num_blocks if chunked else 0
        # what the release's SchedulerConfig refuses at start-up, in its own words (without
        # chunked prefill a budget below max_model_len; a budget below max_num_seqs), then
        # what its worker refuses of the pool (a max_model_len above block_size * num_blocks)
        vllm_config.check(mods.dist, mods.root, budget=budget, max_seqs=max_seqs,
                          max_model_len=model_len, chunked=chunked)
        if max_model_len:
            vllm_config.check_pool(mods, num_blocks, block_size, max_model_len)
        config = mods["vllm.config"]
        sched_cfg = config.SchedulerConfig(
            runner_type="generate", task="generate",  # (0.6.4: task; 0.6.5 on: runner_type)
            max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=model_len,
            max_num_partial_prefills=1, max_long_partial_prefills=1, long_prefill_token_threshold=0,
            num_lookahead_slots=0, delay_factor=0.0,
            enable_chunked_prefill=chunked, chunked_prefill_enabled=chunked,
            is_multi_step=False, num_scheduler_steps=1, preemption_mode=None,
            send_delta_data=False, policy=policy, multi_step_stream_outputs=False,
            use_v2_block_manager=self.block_manager_v2,  # (to 0.6.2: v1 the default)
            embedding_mode=False,
            is_attention_free=False)  # (aphrodite 0.6.1 on reads it here, vLLM the cache's)
        cache_cfg = config.CacheConfig(
            block_size=block_size, num_gpu_blocks=num_blocks, num_cpu_blocks=0,
            sliding_window=sliding_window, enable_prefix_caching=caching,
            is_attention_free=False)
        self.scheduler = mods["vllm.core.scheduler"].Scheduler(sched_cfg, cache_cfg, None)
        if chunked and caching:
            _refuses_chunk_size(mods, sched_cfg, cache_cfg, budget, max_seqs, model_len)
        self.manager = self.scheduler.block_manager
        self.gpu = self._gpu_allocator()
        seqmod = mods["vllm.sequence"]
        self._Sequence, self._Group, self._Status = (seqmod.Sequence, seqmod.SequenceGroup,
                                                     seqmod.SequenceStatus)
        self._Logprob = seqmod.Logprob
        self._Params = mods["vllm.sampling_params"].SamplingParams
        # (vllm-v0-engine-v1 on 0.4.0: no vllm/core/block/, block manager v2's files)
        pcb = mods["vllm.core.block.prefix_caching_block"] if _has(
            mods, "vllm.core.block.prefix_caching_block") else None
        self._Block = getattr(pcb, "PrefixCachingBlock", None)
        allocator = getattr(pcb, "PrefixCachingBlockAllocator", None)
        computed_ids = getattr(allocator, "get_computed_block_ids", None)  # (to 0.6.4)
        if chunked and caching and computed_ids is not None and _loader.takes(
                computed_ids, "skip_last_block_id"):
            # (vLLM 0.5.x .. 0.6.4.post1, aphrodite 0.6.x) the runner's computed blocks leave
            # out the last full block, and with chunks that mark blocks computed before they
            # are written the adapter's reading of which blocks a step skips is not verified:
            # a FAIL there could be the adapter's. 0.6.5 on: 0.8.5's allocator and tracker
            # (no such parameter) and the same runner rule; the raw replays agree (E4)
            raise MisuseError(f"{self.version}: chunked prefill with prefix caching is not "
                              f"modelled on a release whose allocator skips the last computed "
                              f"block (get_computed_block_ids(skip_last_block_id)); run it with "
                              f"--no-prefix-caching, or without chunked prefill")
        if chunked and caching and runner_refuses_chunked_caching(mods):
            # (vLLM 0.4.2 .. 0.5.0.post1) the release's own model runner raises RuntimeError
            # ("chunked prefill cannot be used with prefix caching now.") on a chunked step
            # that skips computed blocks: a combination the release does not run
            raise MisuseError(f"{self.version}: chunked prefill with prefix caching is not "
                              f"modelled on a release whose model runner refuses it "
                              f"(worker/model_runner.py raises '{RUNNER_REFUSAL} now.' on a "
                              f"chunked step with cached blocks); run it with "
                              f"--no-prefix-caching, or without chunked prefill")
        self._extra = self._Block is not None and _loader.takes(  # 0.6.4 on
            self._Block.hash_block_tokens, "extra_hash")
        self._priority = _loader.takes(self._Group.__init__, "priority")  # 0.6.3 on
        self._bare_prompt = _loader.takes(self._Sequence.__init__, "prompt_token_ids")
        if policy != "fcfs" and not self._priority:
            raise MisuseError(f"vLLM {self.version}'s scheduler has no priority scheduling")
        self.kv_calls: list[KVCall] = []
        self.pending: dict[int, tuple] = {}  # seq_id -> its allocate, split after schedule
        self.held: set[int] = set()  # seq_ids holding a block table
        for name in ("can_allocate", "allocate", "can_append_slots", "append_slots", "free"):
            if not hasattr(type(self.manager), name):  # (0.4.0's v1: (can_)append_slot)
                name = name[:-1]
            setattr(self.manager, name, KVCallRecorder(self, self.manager, name))
        self.requests: dict[int, Any] = {}  # request -> its SequenceGroup (kept finished)
        self.ids: dict[int, int] = {}  # Sequence.seq_id -> request id
        self.clock = 0.0  # arrival times: the add order

    def __deepcopy__(self, memo):
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():  # the release's modules and classes: shared
            setattr(new, k, v if k in _SHARED else copy.deepcopy(v, memo))
        return new

    # -- operations ---------------------------------------------------------------------
    def add(self, seq: int, tokens: list[int], max_new: int, priority: int = 0) -> None:
        self.clock += 1.0
        if self._bare_prompt:  # (0.4.2: the prompt's text and token ids, no inputs dict)
            s = self._Sequence(seq, None, list(tokens), self.block_size, STOP)
        else:
            s = self._Sequence(seq, {"type": "token", "prompt_token_ids": list(tokens)},
                               self.block_size, STOP)
        more = {"priority": priority} if self._priority else {}
        # (0.4.2's SequenceGroup takes sampling_params before arrival_time: by keyword)
        g = self._Group(str(seq), [s], arrival_time=self.clock,
                        sampling_params=self._Params(max_new), **more)
        self.requests[seq] = g
        self.ids[s.seq_id] = seq
        self.scheduler.add_seq_group(g)

    def abort(self, seq: int) -> None:
        self.scheduler.abort_seq_group(str(seq))

    def step(self, gen: int) -> StepResult:
        del self.kv_calls[:]
        self.pending.clear()
        metas, outputs = self.scheduler.schedule()[:2]  # 0.6 on: a third item
        calls = list(self.kv_calls)
        bs = self.block_size
        scheduled, writes, sampled = {}, {}, {}
        for meta, sg in zip(metas, outputs.scheduled_seq_groups, strict=True):
            g = sg.seq_group
            s = g.get_seqs()[0]
            q = self.ids[s.seq_id]
            skip = len(meta.computed_block_nums or []) * bs
            if s.seq_id in self.pending:  # allocate: the runner's hits, then the rest
                at, table, fb, fa = self.pending.pop(s.seq_id)
                k = len(meta.computed_block_nums or [])
                hits = table[:k]
                toks, hashes = list(s.get_token_ids()), self._hashes(s)
                calls[at] = [KVCall("get_computed_blocks", str(q), (), {},
                                    ([ResultBlock(b) for b in hits], k * bs), [], [], fb, fb,
                                    hashes, toks),
                             KVCall("allocate_slots", str(q), (), {},
                                    [ResultBlock(b) for b in table[k:]], hits, table, fb, fa,
                                    hashes, toks)]
            ctx = s.data.get_num_computed_tokens()
            seq_len = min(s.get_len(), ctx + sg.token_chunk_size)
            start, full_hit = ctx, False
            if meta.is_prompt and skip > ctx:
                start, full_hit = (skip, False) if skip < seq_len else (seq_len - 1, True)
            toks = list(s.get_token_ids()[start:seq_len])
            scheduled[q] = len(toks)
            if full_hit:  # the hit block's own token, rewritten in place (module doc)
                start, toks = seq_len, []
            writes[q] = (start, toks, list(meta.block_tables[s.seq_id]))
        calls = [c for x in calls if x is not None
                 for c in (x if isinstance(x, list) else [x])]
        update_from = len(self.kv_calls)
        for meta, sg in zip(metas, outputs.scheduled_seq_groups, strict=True):
            g = sg.seq_group
            if g.is_finished():
                continue
            g.update_num_computed_tokens(sg.token_chunk_size)
            s = g.get_seqs()[0]
            sample = getattr(meta, "do_sample", None)
            if sample is None:  # (0.4.0, 0.4.1: LLMEngine._process_model_outputs processes a
                # group's outputs once its sequences are in their DECODE stage; 0.4.0: always)
                stage = getattr(s.data, "stage", None)
                sample = stage is None or stage.name == "DECODE"
            if not sample:
                continue
            q = self.ids[s.seq_id]
            rng = random.Random(gen * 1_000_003 + q)
            tok = STOP if rng.random() < 0.08 else rng.randint(2, VOCAB)
            sampled[q] = [tok]
            s.append_token_id(tok, {tok: self._Logprob(0.0)})
            self._stop(s, g.sampling_params)
            if s.is_finished():
                self.scheduler.free_seq(s)
        self.scheduler.free_finished_seq_groups()
        return StepResult(scheduled, {}, sampled, {}, writes, calls,
                          list(self.kv_calls[update_from:]))

    def _stop(self, s: Any, params: Any) -> None:
        """``StopChecker.maybe_stop_sequence``'s token-id rules (no detokenizer)."""
        st = self._Status
        if s.get_output_len() < params.min_tokens:
            return
        if not params.ignore_eos and s.get_last_token_id() == s.eos_token_id:
            s.status = st.FINISHED_STOPPED
        elif s.get_len() > self.scheduler.scheduler_config.max_model_len:
            s.status = st.FINISHED_LENGTH_CAPPED
        elif s.get_output_len() == params.max_tokens:
            s.status = st.FINISHED_LENGTH_CAPPED

    # -- observation -----------------------------------------------------------------
    def _seq(self, q: int) -> Any:
        return self.requests[q].get_seqs()[0]

    def _table(self, s: Any) -> list[int]:
        t = self.manager.block_tables.get(s.seq_id)
        return list(t.physical_block_ids) if t is not None else []

    def status(self, seq: int) -> str:
        return self._seq(seq).status.name

    def computed(self, seq: int) -> int:
        s = self._seq(seq)
        return s.data.get_num_computed_tokens() if s.status == self._Status.RUNNING else 0

    def blocks(self, seq: int) -> list[int]:
        return self._table(self._seq(seq))

    def running(self) -> list[int]:
        return [int(g.request_id) for g in self.scheduler.running]

    def waiting(self) -> list[int]:
        return [int(g.request_id) for g in self.scheduler.waiting]

    def refcount(self, block: int) -> int:
        return self.gpu._refcounter.get(block)

    def free_blocks(self) -> list[int]:
        return free_block_ids(self.gpu)

    def num_free(self) -> int:
        return self.manager.block_allocator.get_num_free_blocks(
            self._mods["vllm.utils"].Device.GPU)

    def token_ids(self, seq: int) -> list[int]:
        return list(self._seq(seq).get_token_ids())

    def _hashes(self, s: Any) -> list:
        if not self.caching:
            return []
        bs, toks = self.block_size, s.get_token_ids()
        out, h = [], None
        for i in range(len(toks) // bs):
            more = (s.extra_hash(),) if self._extra else ()
            h = self._Block.hash_block_tokens(i == 0, h, list(toks[i * bs:(i + 1) * bs]),
                                              *more)
            out.append(h)
        return out

    def block_hashes(self, seq: int) -> list:
        return self._hashes(self._seq(seq))

    def cached_entries(self) -> list[tuple[Any, int]]:
        """The entries a lookup can serve as computed: ``_cached_blocks`` whose block
        ``block_is_computed`` (v0 keys a full block when it is allocated, before the
        forward pass writes it; ``ComputedBlocksTracker`` counts a hit only on a computed
        block, an active one marked computed or one in the evictor)."""
        if not self.caching:
            return []
        gpu = self.gpu
        return [(h, b) for h, b in gpu._cached_blocks.items() if gpu.block_is_computed(b)]

    def block_hash(self, block: int):
        if not self.caching:
            return None
        for h, b in self.cached_entries():
            if b == block:
                return h
        return None

    def is_finished(self, seq: int) -> bool:
        return self.requests[seq].is_finished()


_SHARED = ("_mods", "_Sequence", "_Group", "_Status", "_Logprob", "_Params", "_Block",
           "_extra", "_priority", "_bare_prompt")


class ResultBlock:
    """A block as the oracle's ``result_blocks`` reads it (``block_id``)."""

    def __init__(self, block_id: int):
        self.block_id = block_id


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> VllmV0EngineTarget:
    """vLLM v0's scheduler without chunked prefill (v0's default)."""
    return VllmV0EngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, False, version)


def make_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 version: str | None = None,
                 max_model_len: int | None = None) -> VllmV0EngineTarget:
    """vLLM v0's scheduler with chunked prefill (``enable_chunked_prefill``)."""
    return VllmV0EngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, True, version)
