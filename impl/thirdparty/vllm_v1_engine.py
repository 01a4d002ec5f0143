"""Adapter: vLLM v1's engine core -- the release's real ``Scheduler`` with its real
``KVCacheManager`` and real ``Request`` objects -- driven step by step with no model.

Issue 34 §1. Releases 0.6.4.post1 .. 0.34.0 (``vllm-v1-engine@VERSION``; 0.33.0 by default;
each of the 54 releases of that range in kvcheck's cache builds and runs, at the defaults
and with drafts, priority scheduling and prefix caching off: ``benchmarks/vllm_v1_releases.py``;
``tests/thirdparty/test_vllm_v1_engine_releases.py`` runs the range's ends and the releases
whose stand-ins differ). To 0.8.4
the manager preallocates blocks beyond a request's need (``num_preallocate_tokens``, 64,
as the release's scheduler leaves it): ``preallocate_blocks``, the bound the engine model
checks a table by; every release's table is also bounded by its block-table row,
``cdiv(max_model_len, block_size)``. ``max_model_len`` is checked against the pool as the
release checks it at start-up (``vllm_config.check_pool``: its own
``check_enough_kv_cache_memory``, 0.7.0 on, or its v1 worker's ``initialize_cache``, 0.6.x,
compiled from its source): one it refuses is refused in its words (one line, exit 2); unset,
it is the largest the release accepts on the pool, at most 65,536 (``vllm_config.largest_len``:
vLLM's ``max_model_len=-1`` auto-fit) -- the usable blocks' tokens from 0.29.0 and to 0.8.2,
one block more in 0.8.3 .. 0.28.0, whose check counts the null block in.

The early releases (to 0.8.2: the scheduler in ``vllm/v1/core/scheduler.py`` to 0.8.0, in
``vllm/v1/core/sched/`` in 0.8.2) are driven the same way; what differs is read from the
release's files, never from its version number:

* the scheduler's module (``scheduler_module``) and its constructor's parameters (the
  configs one by one to 0.8.2, a ``kv_cache_config`` in 0.8.4 on);
* where the pool lives (``BlockPool`` from 0.8.0, else the manager's own block list, free
  queue and hash map) and whether vLLM's block 0 is a null block outside it (0.8.3 on,
  ``_has_null_block``: ``block_offset``, the oracle's ids being vLLM's less it);
* who advances ``num_computed_tokens``: ``update_from_output`` to 0.8.2 (what the forward
  pass writes then starts at the request's computed tokens), ``schedule()`` later (read
  from the release's ``update_from_output``);
* the running branch's KV call: ``append_slots`` to 0.7.1 (recorded as ``allocate_slots``
  is), ``allocate_slots`` later;
* the model runner's output record (``ModelRunnerOutput``'s fields): one sampled token per
  scheduled request to 0.7.2 (a tensor, ``sampled_token_ids_cpu``, in 0.6.4.post1), a list
  per request from 0.7.3 (``typing.List[typing.List[int]]`` there; a NumPy array per request
  in 0.11.1 and 0.11.2, which read it with ``.tolist()``), drafts in it (``spec_token_ids``)
  from 0.7.3; a release without them refuses ``spec`` in words;
* the request: ``inputs`` (the release's ``token_inputs`` record, ``vllm/inputs/data.py``)
  to 0.7.0, the prompt's token ids later; its block hashes: the request's own (0.10.1 on),
  the manager's ``req_to_block_hashes`` (0.7.3 .. 0.10.0), ``kv_block_hashes`` (0.6.6.post1
  .. 0.7.2), else the release's ``hash_request_tokens`` over its tokens (``_hashes``).

What runs is the release's own code, executed from the installed wheel's
files (``_loader``): the scheduler (``vllm/v1/core/sched/{scheduler, request_queue,
output, utils, interface}.py``), the KV-cache manager and block pool (the files
``vllm_v1`` loads), the request (``vllm/v1/request.py``), the sampling parameters
(``vllm/sampling_params.py``), the engine-core records (``vllm/v1/engine/__init__.py``:
``EngineCoreOutput``, ``FinishReason``...), the model runner's output record
(``vllm/v1/outputs.py``), the encoder-cache manager (built by the scheduler, unused by
text requests) and what those import of vLLM's own utilities. The adapter plays the
engine core's loop (``EngineCore.step``, ``vllm/v1/engine/core.py``) and the model runner:

1. ``add_request(Request(...))`` for a request that arrives (``EngineCore.add_request``);
2. ``schedule()``;
3. the model runner's output, which kvcheck generates (``ModelRunnerOutput``: one
   sampled token for each scheduled request whose prefill is complete, plus the accepted
   prefix of its drafts, and new drafts for the next step when speculation is on);
4. ``update_from_output(scheduler_output, model_runner_output)``;
5. ``finish_requests(ids, FINISHED_ABORTED)`` for an abort (between steps, as
   ``EngineCore.abort_requests``).

Stand-ins, in one place: ``STUBS`` (a module each, its builder's docstring says what it
replaces and why; ``STUBS_TO_0_10`` on top of it where ``vllm.utils`` is one module) and
``OFF`` (features that are off: only their names are imported, any use raises); every other
``vllm.*`` import is the release's own file, and a name neither loaded nor stood in raises
(``_loader``). Each replaces an object the engine cannot run without on a CPU-only machine
without vLLM's dependencies, or one that only reports:

``vllm.config`` (``VllmConfig``, ``SchedulerConfig``, ``CacheConfig``, ``ModelConfig``...)
    the real config classes import ``transformers`` and read a model's HF config; the
    scheduler only *reads* settings. ``EngineConfig`` below is a namespace holding every
    setting the release's scheduler reads, each at vLLM's default unless the run sets it
    (policy, token budget, max_num_seqs, prefix caching, speculative tokens, block size).
    A setting one release alone reads is there too, at that release's default (read from
    its config classes): ``is_encoder_only`` (0.28.0's ``VllmConfig`` property: no EC
    producer, no encoder-only multimodal config, so ``False``),
    ``enable_mamba_fine_grained_prefix_cache`` (0.30.0's ``CacheConfig``: ``False``).
    What the real ``SchedulerConfig`` refuses at start-up is refused first, in the release's
    own words: its validation method, compiled from its own source (``vllm_config.refusal``),
    runs on the settings (a budget below ``max_num_seqs``); then what its KV-cache sizing
    refuses of the pool (``vllm_config.pool_refusal``: a ``max_model_len`` one request of
    which the pool cannot hold).
``msgspec``
    not installed here: ``Struct`` is a plain record base (fields from the annotations,
    defaults, ``__post_init__`` called as msgspec calls it); no behaviour reads the
    serialisation.
``vllm.v1.structured_output``
    the real manager builds a tokenizer and grammar backends; no request of ours asks
    for structured output, so every grammar query answers "none".
``vllm.distributed.*``, ``vllm.compilation.*``, ``vllm.multimodal.*``, ``vllm.lora.*``
    KV/EC connectors, KV events, CUDA graphs, multimodal budgets and LoRA are off (their
    config is ``None``): only their names are imported; constructing one raises.
``vllm.multimodal.MULTIMODAL_REGISTRY``
    the real registry imports PIL, the media loaders and the model registry. The stand-in
    answers what the real one answers for a text-only model that is no encoder-decoder:
    ``supports_multimodal_inputs`` is ``False``, ``get_encdec_max_encoder_len`` 0 (0.14.0 ..
    0.15.1's scheduler asks it at start-up); any other question raises.
``vllm.v1.metrics.*``, ``vllm.v1.spec_decode.metrics``, ``prometheus_client``
    statistics records (``log_stats`` off); a record built anyway keeps its fields.
``vllm.logger``, ``vllm.platforms``, ``vllm.utils.torch_utils``, ``vllm.v1.utils``, ...
    logging, platform queries, torch helpers, ZMQ helpers (see ``_stub_*``).
``vllm.utils`` (to 0.10.x, one module behind torch, psutil, zmq, cachetools), ``vllm.inputs``
(to 0.8: the package file builds the input registry and processors; its ``data.py`` is the
release's own, loaded where the request reads its prompt through it),
``vllm.spec_decode`` (v0's metrics, a name ``vllm/sequence.py`` imports, to 0.7),
``vllm.model_executor.layers.fused_moe`` (0.20 on: routed experts, off),
``vllm._bc_linter``'s names on the ``vllm`` package (0.10.2 on: ``vllm/__init__.py``'s lazy
names, the file itself is loaded).

Model outputs (``_generate``): a request whose prefill completes in the step samples its
accepted drafts' prefix and one token (the stop token ``STOP`` with probability 0.08); a
draft of -1 (0.33's padding to a uniform speculative size) is never accepted; drafts for
the next step are 0 .. k tokens. The generation is a function of the step's ``gen`` and each request's
id and scheduled drafts.

Observation: the scheduler's queues (``running``, ``waiting``), each live request's
``num_computed_tokens`` and blocks (``KVCacheManager.get_block_ids``), the block pool's
``ref_cnt``, free queue and cached-hash map; the KV calls the scheduler makes inside a
step are recorded at the manager's boundary (``allocate_slots`` / ``free`` /
``get_computed_blocks``: arguments, result, which blocks changed hands).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any

from ..errors import MisuseError
from . import _loader, aphrodite, install, vllm_config, vllm_v1
from ._loader import Loaded

ENGINE_KEY = "vllm-v1"

FILES = (
    *vllm_v1.FILES,
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.utils",
    "vllm.v1.core.sched.interface",
    "vllm.v1.core.encoder_cache_manager",
    "vllm.v1.request",
    "vllm.v1.engine",
    "vllm.v1.outputs",
    "vllm.v1.kv_hints",
    "vllm.v1.structured_output.request",
    "vllm.sampling_params",
    "vllm.pooling_params",
    "vllm.outputs",
    "vllm.logprobs",
    "vllm.exceptions",
    "vllm.tasks",
    "vllm.utils",
    "vllm.envs",
    "vllm.v1.kv_hints.protocol",
    "vllm.v1.structured_output.backend_types",
    "vllm.v1.metrics.stats",
    "vllm.v1.metrics.cache_hit_source",
    "vllm.logits_process",  # to 0.10: imported by sampling_params
    "vllm.v1.core.scheduler",  # to 0.7.2: the scheduler's module
    "vllm.sequence",  # to 0.7.x: imported by the request and sampling modules
    "vllm.prompt_adapter.request",
    "vllm.adapter_commons.request",
    "vllm._bc_linter",  # 0.10.2 on: `from vllm import bc_linter_include`
    "vllm.v1.core.specialized_manager",  # 0.8.3 .. 0.8.5
    "vllm.v1.core.scheduler_output",  # 0.8.0 .. 0.8.2
    "vllm.v1.structured_output.grammar",  # 0.8.0 .. 0.8.2
    "vllm.inputs.data",  # to 0.7.0: the Request reads its prompt through token_inputs
)


def _unreachable(what: str):
    def fail(*_a: Any, **_k: Any):
        raise NotImplementedError(f"kvcheck stand-in: {what} is not reached by the engine "
                                  f"target (its config is off)")

    return fail


def _placeholder(name: str, what: str) -> type:
    """A class named ``name`` that the loaded code may import, subclass, annotate with or
    test ``isinstance`` against, and never constructs (constructing one raises)."""
    return type(name, (), {"__init__": _unreachable(what), "__kvcheck_stand_in__": what})


def _names(what: str, *names: str, **values: Any):
    """A stand-in module defining ``names`` as placeholders and ``values`` as given."""

    def build(mod: types.ModuleType, _: Loaded) -> None:
        for n in names:
            setattr(mod, n, _placeholder(n, what))
        for n, v in values.items():
            setattr(mod, n, v)

    build.__doc__ = f"Names only ({what}: off): {', '.join((*names, *values))}."
    return build


# -- msgspec ---------------------------------------------------------------------------
_MISSING = object()


class _Field:
    def __init__(self, default=_MISSING, default_factory=None, name=None):
        self.default, self.default_factory = default, default_factory


class Struct:
    """``msgspec.Struct`` as a plain record: fields are the class annotations (bases
    first), a default is the class attribute (or ``msgspec.field``), ``__post_init__`` runs
    after construction as msgspec runs it."""

    __struct_fields__: tuple[str, ...] = ()
    __struct_defaults__: dict = {}

    def __init_subclass__(cls, **_options: Any) -> None:
        fields: list[str] = []
        defaults: dict = {}
        for klass in reversed(cls.__mro__):
            if klass is Struct:
                continue
            for name in vars(klass).get("__annotations__", {}):
                ann = vars(klass)["__annotations__"][name]
                if "ClassVar" in str(ann):
                    continue
                if name not in fields:
                    fields.append(name)
                if name in vars(klass):
                    value = vars(klass)[name]
                    defaults[name] = value
        cls.__struct_fields__ = tuple(fields)
        cls.__struct_defaults__ = defaults
        for name, value in defaults.items():  # a msgspec.field is no class attribute
            if isinstance(value, _Field) and name in vars(cls):
                delattr(cls, name)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__struct_fields__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}: too many positional arguments")
        given = dict(zip(names, args, strict=False))
        given.update(kwargs)
        for name in names:
            if name in given:
                value = given[name]
            else:
                d = self.__struct_defaults__.get(name, _MISSING)
                if isinstance(d, _Field):
                    value = d.default_factory() if d.default_factory is not None else d.default
                else:  # (msgspec copies an empty list, dict or set default per instance)
                    value = copy.copy(d) if isinstance(d, (list, dict, set)) else d
                if value is _MISSING:
                    raise TypeError(f"{type(self).__name__}: missing required argument {name!r}")
            object.__setattr__(self, name, value)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    def __repr__(self) -> str:
        body = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in self.__struct_fields__)
        return f"{type(self).__name__}({body})"


def _stub_msgspec(mod: types.ModuleType, _: Loaded) -> None:
    """``msgspec`` is not installed here: ``Struct`` (see the class), ``field``,
    ``structs.replace``; the engine's records (``SamplingParams``, ``EngineCoreOutput``...)
    are only constructed and read, never serialised."""
    mod.Struct = Struct
    mod.field = lambda default=_MISSING, default_factory=None, name=None: _Field(
        default, default_factory)
    structs = types.ModuleType("msgspec.structs")
    structs.replace = lambda s, **changes: type(s)(**{
        **{n: getattr(s, n) for n in s.__struct_fields__}, **changes})
    structs.fields = _unreachable("msgspec.structs.fields")
    mod.structs = structs
    mod.Meta = lambda *a, **k: None


def _any_name(what: str):
    """A stand-in module of a feature that is off: any name imported from it is a
    placeholder (``_placeholder``); it is a package, so its submodules are stood in the
    same way (listed in ``OFF``)."""

    def build(mod: types.ModuleType, _: Loaded) -> None:
        def __getattr__(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            value = _placeholder(name, f"{what} ({mod.__kvcheck_real_name__}.{name})")
            setattr(mod, name, value)
            return value

        mod.__getattr__ = __getattr__
        mod.__path__ = []

    return build


# Features that are off in every engine-target run: only their names are imported.
OFF = {
    "vllm.compilation": "CUDA graphs",
    "vllm.distributed": "KV / EC connectors and KV events (no kv_transfer_config, "
                        "ec_transfer_config or kv_events_config)",
    "vllm.multimodal": "multimodal inputs (text-only requests)",
    "vllm.lora": "LoRA (no LoRA requests)",
    "vllm.tokenizers": "the tokenizer (requests carry token ids)",
    "vllm.transformers_utils": "the tokenizer and HF configs (requests carry token ids)",
    "vllm.reasoning": "reasoning parsers",
    "vllm.parser": "reasoning parsers",
    "vllm.v1.metrics.perf": "performance statistics (log_stats off)",
    "vllm.v1.metrics.utils": "metrics export",
    "vllm.v1.spec_decode": "speculative-decoding metrics and drafters (drafts come from "
                           "kvcheck's generated model output)",
    "vllm.usage": "usage reporting",
    "vllm.inputs": "the processed prompt inputs (requests carry token ids), to 0.8",
    "vllm.spec_decode": "v0's speculative-decoding metrics (a name vllm/sequence.py imports, "
                        "to 0.7)",
    "vllm.model_executor.layers.fused_moe": "returning routed experts (MoE; "
                                            "enable_return_routed_experts off)",
    "prometheus_client": "metrics export",
}


def _stub_platforms(mod: types.ModuleType, _: Loaded) -> None:
    """``current_platform``: a CPU platform whose answers are the base ``Platform``'s
    defaults (no custom KV-cache specs, pinned memory off)."""

    class _Platform:
        device_type = "cpu"

        @classmethod
        def register_custom_kv_cache_specs(cls, vllm_config: Any) -> None:
            pass

        def is_pin_memory_available(self) -> bool:
            return False

        def __getattr__(self, name: str):
            if name.startswith("is_"):
                return lambda *a, **k: False
            raise AttributeError(f"kvcheck stand-in: current_platform.{name}")

    mod.current_platform = _Platform()


def _stub_torch_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    """The torch helpers the loaded files import: page sizing (2 bytes per element, as in
    ``vllm_v1``), pinned memory off (a CPU run), tensor padding for sampling penalties
    (never built: the engine target applies no penalties)."""
    vllm_v1.STUBS["vllm.utils.torch_utils"](mod, loaded)
    mod.PIN_MEMORY = False
    mod.make_ndarray_with_pad = _unreachable("sampling-penalty tensors")
    mod.make_tensor_with_pad = _unreachable("sampling-penalty tensors")


def _stub_mistral(mod: types.ModuleType, _: Loaded) -> None:
    """No tokenizer: nothing is a Mistral tokenizer."""
    mod.is_mistral_tokenizer = lambda _tokenizer: False


def _stub_serial_utils(mod: types.ModuleType, _: Loaded) -> None:
    """The ZMQ / msgpack serialisation helpers: ``PydanticMsgspecMixin`` only adds pydantic
    schema hooks to ``SamplingParams`` (no behaviour of ours reads them)."""
    mod.PydanticMsgspecMixin = type("PydanticMsgspecMixin", (), {})
    mod.UtilityResult = _placeholder("UtilityResult", "engine-core utility calls")


def _stub_v1_utils(mod: types.ModuleType, _: Loaded) -> None:
    """``vllm/v1/utils.py`` imports ZMQ and process helpers; the scheduler and request use
    its ``ConstantList`` (a read-only view of a list): re-implemented."""
    from collections.abc import Sequence

    class ConstantList(Sequence):
        def __init__(self, x: list) -> None:
            self._x = x

        def __getitem__(self, i):
            return self._x[i]

        def __len__(self) -> int:
            return len(self._x)

        def __iter__(self):
            return iter(self._x)

        def __contains__(self, item) -> bool:
            return item in self._x

        def __repr__(self) -> str:
            return f"ConstantList({self._x!r})"

        def copy(self) -> list:
            return list(self._x)

        def index(self, item, *args):
            return self._x.index(item, *args)

    mod.ConstantList = ConstantList
    mod.tensor_data = _unreachable("prompt embeddings")
    mod.record_function_or_nullcontext = lambda *_a, **_k: __import__("contextlib").nullcontext()


def _stub_structured_output(mod: types.ModuleType, _: Loaded) -> None:
    """``StructuredOutputManager``: the real one loads a tokenizer and grammar backends. No
    request of ours asks for structured output, so it holds no grammar, and a request
    never waits for one. Any grammar query answers "none"."""

    class StructuredOutputManager(_loader.StandIn):
        WHERE = "impl/thirdparty/vllm_v1_engine.py"

        def __init__(self, *_a: Any, **_k: Any) -> None:
            self.backend = None

        def grammar_init(self, request: Any) -> None:
            pass

        def should_advance(self, request: Any, *_a: Any, **_k: Any) -> bool:
            return False  # (aphrodite's passes the new tokens too)

        def should_fill_bitmask(self, request: Any) -> bool:
            return False

        def grammar_bitmask(self, *_a: Any, **_k: Any):
            return None

        def validate_tokens(self, request: Any, tokens: list) -> list:
            return tokens  # no grammar: every draft stands

        def accept_tokens(self, request: Any, tokens: list) -> bool:
            return True  # no grammar: every token is accepted

        def trim_spec_tokens(self, request: Any, spec_tokens: list) -> list:
            return spec_tokens  # (0.34.0 on) no grammar: the drafts are kept whole

        def clear_backend(self) -> None:
            pass

    mod.StructuredOutputManager = StructuredOutputManager

    class StructuredOutputGrammar:  # (aphrodite's scheduler imports it for annotations)
        pass

    mod.StructuredOutputGrammar = StructuredOutputGrammar
    mod.__path__ = []


def _stub_backend_registry(mod: types.ModuleType, loaded: Loaded) -> None:
    """``MambaAttentionBackendEnum`` for ``kv_cache_interface`` (as ``vllm_v1``): Mamba
    specs are never built; the real registry imports the attention backends (CUDA)."""
    vllm_v1.STUBS["vllm.v1.attention.backends.registry"](mod, loaded)


def _stub_cbor2(mod: types.ModuleType, loaded: Loaded) -> None:
    """``cbor2`` (not installed): only the ``*_cbor`` hash functions use it; the engine
    target hashes with ``sha256``, vLLM's default."""
    vllm_v1.STUBS["cbor2"](mod, loaded)


STUBS = {
    "vllm.logger": _loader.stub_logger,
    "vllm.platforms": _stub_platforms,
    "vllm.utils.torch_utils": _stub_torch_utils,
    "vllm.utils.mistral": _stub_mistral,
    "vllm.utils.mem_utils": vllm_v1.STUBS["vllm.utils.mem_utils"],
    "vllm.v1.serial_utils": _stub_serial_utils,
    "vllm.v1.utils": _stub_v1_utils,
    "vllm.v1.structured_output": _stub_structured_output,
    "vllm.v1.hisparse.layout": vllm_v1.STUBS["vllm.v1.hisparse.layout"],
    "vllm.v1.attention.backends.registry": _stub_backend_registry,
    "msgspec": _stub_msgspec,
    "cbor2": _stub_cbor2,
}


def _stub_config(mod: types.ModuleType, loaded: Loaded) -> None:
    """The config classes are names only (annotations, never constructed here): the run's
    settings are ``EngineConfig`` namespaces; ``get_current_vllm_config_or_none`` is None
    (the KV-spec registry passes it to the platform hook, a no-op)."""
    _any_name("vllm's config classes (settings come from EngineConfig)")(mod, loaded)
    mod.get_current_vllm_config_or_none = lambda: None
    top = getattr(loaded, "top", "vllm")  # a fork's own name for it (aphrodite's)
    setattr(mod, f"get_current_{top}_config_or_none", lambda: None)


STUBS["vllm.config"] = _stub_config


def _stub_kv_events(mod: types.ModuleType, loaded: Loaded) -> None:
    """KV events are off (no ``kv_events_config``): the event records the block pool names
    (as in ``vllm_v1``) and ``EventPublisherFactory.create`` giving vLLM's null
    publisher's behaviour (publishes nothing). The real module needs zmq and msgspec."""
    vllm_v1.STUBS["vllm.distributed.kv_events"](mod, loaded)

    class NullEventPublisher:
        def publish(self, events: Any) -> None:
            pass

        def shutdown(self) -> None:
            pass

    class EventPublisherFactory:
        @staticmethod
        def create(config: Any, *_a: Any, **_k: Any):
            if config is not None:
                raise NotImplementedError("kvcheck stand-in: KV events are off")
            return NullEventPublisher()

    mod.EventPublisherFactory = EventPublisherFactory
    mod.KVEventBatch = _placeholder("KVEventBatch", "KV events")
    mod.KVConnectorKVEvents = _placeholder("KVConnectorKVEvents", "KV events")


STUBS["vllm.distributed.kv_events"] = _stub_kv_events


def _none_only(what: str):
    """A multimodal helper for requests without multimodal features: what it is given
    back unchanged when that is empty (as the real helper returns it), else it raises."""

    def helper(features: Any = None, *_a: Any, **_k: Any):
        if not features:
            return features
        raise NotImplementedError(f"kvcheck stand-in: {what} (multimodal inputs)")

    return helper


def _stub_mm_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm/multimodal/utils.py`` (the media loaders, PIL, aiohttp): its helpers, on a
    text request's empty feature list, return it unchanged."""
    _any_name(OFF["vllm.multimodal"])(mod, loaded)
    mod.strip_covered_mm_data = _none_only("strip_covered_mm_data")
    mod.get_mm_features_in_window = _none_only("get_mm_features_in_window")


STUBS["vllm.multimodal.utils"] = _stub_mm_utils


def _stub_multimodal(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm.multimodal``: its registry answers that the (text-only) model takes no
    multimodal inputs, as the real one does for a model without a multimodal processor;
    any other question raises. The real package imports PIL, the media loaders and the
    model registry."""
    _any_name(OFF["vllm.multimodal"])(mod, loaded)

    class MultiModalRegistry:
        def supports_multimodal_inputs(self, model_config: Any) -> bool:
            return False

        def get_encdec_max_encoder_len(self, model_config: Any) -> int:
            # (0.14.0 .. 0.15.1's scheduler asks at start-up) the real one's answer for a
            # model that is no encoder-decoder: 0
            if not model_config.is_encoder_decoder:
                return 0
            raise NotImplementedError("kvcheck stand-in: MULTIMODAL_REGISTRY."
                                      "get_encdec_max_encoder_len (encoder-decoder models)")

        def __getattr__(self, name: str):
            raise NotImplementedError(f"kvcheck stand-in: MULTIMODAL_REGISTRY.{name} "
                                      f"(multimodal inputs)")

    mod.MultiModalRegistry = MultiModalRegistry
    mod.MULTIMODAL_REGISTRY = MultiModalRegistry()


STUBS["vllm.multimodal"] = _stub_multimodal


def _stub_utils_module(mod: types.ModuleType, loaded: Loaded) -> None:
    """Before 0.11 ``vllm.utils`` is one module (torch, psutil, zmq, cachetools behind
    it): its KV-cache helpers re-implemented as ``vllm_v1`` does (``cdiv``, ``sha256``...),
    the few the scheduler-side files call re-implemented with the same results, and any
    other name a placeholder that raises when called."""
    _any_name("vllm.utils helpers the engine target does not call")(mod, loaded)
    del mod.__path__
    vllm_v1.ONE_UTILS_STUBS["vllm.utils"](mod, loaded)
    mod.sha256_cbor_64bit = _unreachable("cbor hashing")

    class LRUCache(dict):  # the encoder cache of old releases: never filled by text requests
        def __init__(self, capacity: int = 0, *_a: Any, **_k: Any) -> None:
            super().__init__()
            self.capacity = capacity

    mod.LRUCache = LRUCache

    def LazyLoader(local_name: str, _globals: dict, name: str):  # noqa: N802 - vLLM's name
        """A grammar backend imported lazily (xgrammar...): never touched by requests
        without structured output; touching it raises."""
        return _placeholder(local_name, f"{name} (structured output)")

    mod.LazyLoader = LazyLoader
    mod.is_list_of = lambda value, typ, *, check="first": isinstance(value, list) and all(
        isinstance(v, typ) for v in value)
    mod.length_from_prompt_token_ids_or_embeds = (
        lambda ids, embeds=None: len(ids) if ids is not None else len(embeds))


def _stub_inputs(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm.inputs`` (its package file imports the input registry and processors: a
    tokenizer and HF configs): the release's own ``vllm/inputs/data.py`` (``token_inputs``,
    ``SingletonInputsAdapter``: how a request to 0.7.0 reads its prompt token ids) under
    the package's names; any other name is a placeholder (the processed-inputs pipeline is
    off, requests carry token ids)."""
    _any_name(OFF["vllm.inputs"])(mod, loaded)
    request = loaded.path("vllm/v1/request.py")
    if loaded.has("vllm.inputs.data") and "token_inputs" in request.read_text():
        data = loaded.get("vllm.inputs.data")
        for name, value in vars(data).items():
            if not name.startswith("_"):
                setattr(mod, name, value)


STUBS["vllm.inputs"] = _stub_inputs
# the stand-ins of releases whose vllm.utils is one module (to 0.10.x), on top of STUBS
STUBS_TO_0_10 = {"vllm.utils": _stub_utils_module}
STUBS["vllm.v1.structured_output.utils"] = _names(
    "structured output", strip_speculative_padding=_unreachable("structured output"))
OFF["vllm.config"] = "vllm's config classes (settings come from EngineConfig)"


class _EngineLoaded(Loaded):
    """``Loaded`` with every module under an ``OFF`` prefix stood in by ``_any_name``.

    A fork carrying vLLM v1's engine under its own top-level package (``FORKS``:
    aphrodite-engine's ``aphrodite.*``) is loaded with its own names; the adapter asks for
    vLLM's (``vllm.v1.request``...) and gets the fork's module (``aphrodite.v1.request``),
    and ``path`` names the fork's file for a vLLM path."""

    def __init__(self, dist, root, files, stubs, top: str = "vllm"):
        self.top = top
        super().__init__(dist, root, [self.fork(f) for f in files],
                         {self.fork(k): v for k, v in stubs.items()})

    def fork(self, name: str) -> str:
        """vLLM's module name ``name`` as the loaded release names it."""
        if self.top != "vllm" and (name == "vllm" or name.startswith("vllm.")):
            return self.top + name[len("vllm"):]
        return name

    def vllm(self, name: str) -> str:
        """The loaded release's module name ``name`` as vLLM names it."""
        if self.top != "vllm" and (name == self.top or name.startswith(self.top + ".")):
            return "vllm" + name[len(self.top):]
        return name

    def has(self, name: str) -> bool:
        """Whether vLLM's module ``name`` is one of the release's files loaded."""
        return self.fork(name) in self.files

    def path(self, rel: str):
        """The release's file for vLLM's path ``rel`` (``vllm/v1/request.py``)."""
        return self.root / (self.top + rel[len("vllm"):] if rel.startswith("vllm/") else rel)

    def _ours(self, name: str) -> bool:
        return super()._ours(name) or _off(self.vllm(name)) is not None

    def get(self, name: str) -> types.ModuleType:
        name = self.fork(name)
        if name not in self.modules and name not in self.stubs and name not in self.files:
            off = _off(self.vllm(name))
            if off is not None:
                self.stubs[name] = _any_name(OFF[off])
        return super().get(name)


def _off(name: str) -> str | None:
    for prefix in OFF:
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


_LOADS: dict[tuple, Loaded] = {}

# engines that carry vLLM v1's engine core under another top-level package: install key ->
# (that package, what the fork adds to the stand-ins: fork-only module names, as vLLM's),
# held here whichever adapter was imported first. aphrodite-engine (aphrodite_v1_engine):
# its aphrodite.utils.mem_utils, stood in by its allocator adapter's stub (aphrodite.STUBS,
# named there with its reason)
FORKS: dict[str, tuple[str, dict[str, Any]]] = {
    aphrodite.ENGINE_KEY: ("aphrodite", {
        "vllm.utils.mem_utils": aphrodite.STUBS["aphrodite.utils.mem_utils"]}),
}


def load(version: str | None = None, engine: str = ENGINE_KEY) -> Loaded:
    """The release's scheduler with everything it imports (see the module docstring): any
    vLLM v1 release kvcheck installs (the ``vllm-v1`` family, 0.6.4.post1 on), or a fork's
    (``engine``, a ``FORKS`` key: its own files under its own names)."""
    import os

    asked = (version, engine, os.environ.get(_loader.ENV_DIR), os.environ.get("VIRTUAL_ENV"))
    loaded = _LOADS.get(asked)  # a run builds the engine once per replay: no disk lookups
    if loaded is not None:
        return loaded
    top, extra = FORKS.get(engine, ("vllm", {}))
    dist = install.select(engine, version, with_family=engine == ENGINE_KEY)
    root = _loader.require(dist)
    key = (dist, str(root))
    loaded = _LOADS.get(key)
    if loaded is None:
        def there(f: str) -> bool:
            rel = (top + f[len("vllm"):]).replace(".", "/")
            return (root / (rel + ".py")).is_file() or (root / rel / "__init__.py").is_file()

        files = tuple(f for f in FILES if there(f))
        stubs = {**STUBS, **extra}
        if not there("vllm.utils.math_utils"):  # to 0.10.x: one vllm.utils
            stubs.update(STUBS_TO_0_10)
        loaded = _EngineLoaded(dist, root, files, stubs, top)
        loaded.prefix += "_engine"
        if loaded.has("vllm._bc_linter"):  # vllm/__init__.py's lazy names (not run)
            top_mod = loaded.get("vllm")
            linter = loaded.get("vllm._bc_linter")
            top_mod.bc_linter_include = linter.bc_linter_include
            top_mod.bc_linter_skip = linter.bc_linter_skip
        loaded.get(scheduler_module(loaded))
        _LOADS[key] = loaded
    _LOADS[asked] = loaded
    return loaded


def _has_null_block(mods: Any) -> bool:
    """Whether the release's block pool keeps a null block (vLLM's block 0) outside the
    usable blocks (0.8.3 on), read from its ``vllm/v1/core/block_pool.py``."""
    path = mods.path("vllm/v1/core/block_pool.py")
    return path.is_file() and "null_block" in path.read_text()


def _source(function: Any) -> str:
    import inspect

    return inspect.getsource(function)


def scheduler_module(mods: Any) -> str:
    """``vllm.v1.core.sched.scheduler`` (0.7.3 on), ``vllm.v1.core.scheduler`` before."""
    if mods.path("vllm/v1/core/sched/scheduler.py").is_file():
        return "vllm.v1.core.sched.scheduler"
    return "vllm.v1.core.scheduler"


# -- the settings (the stand-in for VllmConfig) --------------------------------------
class Settings(_loader.Settings):
    """A namespace of settings (``_loader.Settings``): a setting kvcheck does not give stops
    the run with one line and exit 2, at build or in a step (kvcheck's gap, never blamed on
    the engine)."""

    def __init__(self, path: str, **values: Any):
        super().__init__(path, "impl/thirdparty/vllm_v1_engine.py", **values)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """What a run configures; everything else is at vLLM's default."""

    num_blocks: int  # usable blocks (vLLM's null block comes on top)
    block_size: int
    max_num_batched_tokens: int = 64  # the step's token budget (chunked prefill)
    max_num_seqs: int = 8
    policy: str = "fcfs"  # or "priority"
    enable_prefix_caching: bool = True
    num_speculative_tokens: int = 0  # n-gram style drafts (no drafter forward pass)
    # 0: the largest the release accepts on this pool, at most 65,536 (vllm_config.largest_len)
    max_model_len: int = 0


def engine_config(s: EngineSettings, null: int = 1) -> Settings:
    """``VllmConfig``'s stand-in: the settings of 0.34.0's config classes (and the names
    earlier releases read) at their defaults, but for ``s``. A speculative config is the
    n-gram method's (drafts proposed without a forward pass, no lookahead slots)."""
    spec = None
    if s.num_speculative_tokens:
        spec = Settings(
            "speculative_config", num_speculative_tokens=s.num_speculative_tokens,
            method="ngram", num_speculative_tokens_per_batch_size=None,
            disable_eagle_block_drop=False, disable_lookahead_block_hashes=False,
            use_eagle=lambda: False, use_eagle_block_drop=lambda: False,
            needs_eagle_block_drop=lambda: False, uses_draft_model=lambda: False,
            use_dflash=lambda: False, use_dspark=lambda: False, num_lookahead_slots=0,
            max_num_new_slots_for_drafting=0, parallel_drafting=False,
            uses_target_hidden_states=False)
    sched = Settings(
        "scheduler_config", max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_scheduled_tokens=None, max_num_seqs=s.max_num_seqs, max_num_active_seqs=None,
        long_prefill_token_threshold=0, long_prefill_token_threshold_adaptive=False,
        enable_chunked_prefill=True, chunked_prefill_enabled=True,
        max_num_encoder_input_tokens=s.max_num_batched_tokens,
        encoder_cache_size=s.max_num_batched_tokens, policy=s.policy,
        disable_chunked_mm_input=False, scheduler_reserve_full_isl=True, watermark=0.0,
        prefill_schedule_interval=1, async_scheduling=False, max_model_len=s.max_model_len,
        num_lookahead_slots=0, delay_factor=0.0, preemption_mode=None,
        max_num_partial_prefills=1, max_long_partial_prefills=1, is_multimodal_model=False,
        cache_aware_admission_window=0, cache_aware_admission_threshold=0.5,
        max_num_inflight_kv_loads=None)
    cache = Settings(
        "cache_config", block_size=s.block_size, num_gpu_blocks=s.num_blocks + null,
        enable_prefix_caching=s.enable_prefix_caching, enable_mamba_shared_prefix_checkpoint=False,
        enable_mamba_fine_grained_prefix_cache=False,  # (0.30.0)
        mamba_cache_mode="none", num_preallocate_tokens=None, sliding_window=None,
        prefix_caching_hash_algo="sha256", cpu_offload_gb=0, num_cpu_blocks=None,
        enable_extensible_kv_cache=False)
    model = Settings(
        "model_config", uses_mrope=False, uses_xdrope=False, is_encoder_decoder=False,
        runner_type="generate",
        is_diffusion=False, supports_multimodal_inputs=False, max_model_len=s.max_model_len,
        return_sampling_mask=False, multimodal_config=None, is_multimodal_model=False,
        enable_return_routed_experts=False)
    return Settings(
        "vllm_config", scheduler_config=sched, cache_config=cache, model_config=model,
        lora_config=None, kv_events_config=None, kv_transfer_config=None,
        ec_transfer_config=None, speculative_config=spec, watermark_config=None,
        parallel_config=Settings("parallel_config", data_parallel_index=0, data_parallel_rank=0,
                                 data_parallel_size=1, pipeline_parallel_size=1,
                                 decode_context_parallel_size=1,
                                 prefill_context_parallel_size=1),
        observability_config=Settings(
            "observability_config", per_request_spec_decode_metrics="none",
            kv_cache_metrics=False, kv_cache_metrics_sample=0.01, enable_mfu_metrics=False,
            enable_logging_iteration_details=False),
        ec_manager_config=Settings("ec_manager_config",
                                   get_encoder_cache_manager_obj=lambda: None),
        aux_output_config=Settings("aux_output_config", enabled=False),
        is_mm_encoder_only=False, is_encoder_only=False,  # (0.28.0's name for it)
        max_concurrent_batches=1,
        max_in_flight_tokens=s.max_num_batched_tokens,
        num_speculative_tokens=s.num_speculative_tokens, num_lookahead_tokens=0,
        num_prefill_lookahead_tokens=0, num_hash_lookahead_tokens=0,
        use_v2_model_runner=False)


# -- the engine target ------------------------------------------------------------------
STOP = 1  # the stop token every request's sampling parameters name (stop_token_ids)
VOCAB = 8  # generated tokens are drawn from 1 .. VOCAB (1 = STOP, drawn rarely)


class _Recorder:
    """One KV-cache-manager method, recorded at the manager's boundary: each call's
    request, arguments, result and the pool's free count before and after. A plain object
    (not a closure), so a deep copy of the scheduler records into the copy."""

    def __init__(self, manager: Any, name: str, calls: list):
        self.manager, self.name, self.calls = manager, name, calls
        self.method = getattr(type(manager), name)

    def __call__(self, request: Any, *args: Any, **kwargs: Any):
        free_before = _num_free(self.manager)
        before = _block_ids(self.manager, request)
        result = self.method(self.manager, request, *args, **kwargs)
        self.calls.append(KVCall(self.name, request.request_id, args, dict(kwargs), result,
                                 before, _block_ids(self.manager, request), free_before,
                                 _num_free(self.manager), _hashes(self.manager, request),
                                 list(request.all_token_ids)))
        return result


def _num_free(manager: Any) -> int:
    """The free queue's length: the ``BlockPool``'s (0.8.0 on) or the manager's own."""
    pool = manager.block_pool
    if hasattr(pool, "get_num_free_blocks"):
        return pool.get_num_free_blocks()
    return manager.free_block_queue.num_free_blocks


@dataclasses.dataclass
class KVCall:
    """A KV call the scheduler made inside a step, as seen at the manager's boundary."""

    name: str
    request_id: str
    args: tuple
    kwargs: dict
    result: Any
    blocks_before: list  # the request's block ids (vLLM's) before and after the call
    blocks_after: list
    free_before: int
    free_after: int
    hashes: list  # the request's block hashes after the call, and its token ids
    tokens: list
    # {shared block: its fresh copy} a copy-on-write swapped into the request's last entry
    # (vLLM v0's BlockSpaceManagerV1 with prefix caching shares a partial block: its
    # append_slots' blocks_to_copy); the engine oracle reads it only on a target with
    # ``keys_partial_blocks``
    copies: dict = dataclasses.field(default_factory=dict)


def _hashes(manager: Any, request: Any) -> list:
    """The request's block hashes: its own (0.10.1 on), the manager's
    ``req_to_block_hashes`` entry (0.7.3 .. 0.10.0, dropped when the request is freed), the
    request's ``kv_block_hashes`` (0.6.6.post1 .. 0.7.2), else (0.6.4.post1, 0.6.5: no hashes
    kept per request) the chain the release's own ``hash_request_tokens`` gives its tokens,
    the chain its lookup computes."""
    import inspect
    import sys

    got = getattr(request, "block_hashes", None)
    if got is None and hasattr(manager, "req_to_block_hashes"):
        got = manager.req_to_block_hashes.get(request.request_id, [])
    if got is None:
        got = getattr(request, "kv_block_hashes", None)
    if got is None:
        fn = getattr(sys.modules[type(manager).__module__], "hash_request_tokens", None)
        if fn is None or not manager.enable_caching:
            return []
        whole = "request" in inspect.signature(fn).parameters
        got = fn(manager.block_size, request if whole else request.all_token_ids)
    return list(got or [])


def _block_ids(manager: Any, request: Any) -> list:
    """The request's blocks (vLLM ids) in the manager's one KV-cache group: the
    coordinator's manager (0.9.2 on), the single-type manager (0.9.0, 0.9.1), the
    specialized manager's or the manager's own ``req_to_blocks`` (earlier)."""
    if hasattr(manager, "coordinator"):
        holder = manager.coordinator.single_type_managers[0]
    elif hasattr(manager, "single_type_manager"):
        holder = manager.single_type_manager
    else:
        holder = manager
    return [b.block_id for b in holder.req_to_blocks.get(request.request_id, [])]


def result_blocks(result: Any) -> list:
    """The new blocks an ``allocate_slots`` result names (``KVCacheBlocks`` from 0.8, a list
    before), as vLLM ids; [] for None."""
    if result is None:
        return []
    blocks = getattr(result, "blocks", result)
    if blocks and isinstance(blocks[0], (list, tuple)):
        blocks = blocks[0]
    return [b.block_id for b in blocks]


class EngineTarget:
    """vLLM v1's engine core on the release's own ``Scheduler`` (see the module doc).

    Operations (each a method, called by the engine model's oracle):

    ``add(seq, tokens, max_new, priority)``
        a request of prompt ``tokens`` to generate ``max_new`` tokens (stop token
        ``STOP``), arriving now: ``Scheduler.add_request(Request(...))``;
    ``abort(seq)``
        ``Scheduler.finish_requests(seq, FINISHED_ABORTED)``, between steps;
    ``step(gen, recorded)``
        ``schedule()``, the model output (generated from ``gen``, or the ``recorded``
        outputs of a trace where they fit), ``update_from_output``, drafts for the next
        step. Returns a ``StepResult``.
    """

    def __init__(self, settings: EngineSettings, version: str | None = None,
                 engine: str = ENGINE_KEY):
        if settings.num_blocks < 1 or settings.block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size = settings.num_blocks, settings.block_size
        mods = load(version, engine)
        self.version = mods.dist.version
        name = "vLLM" if engine == ENGINE_KEY else mods.dist.dist
        self._mods = mods
        # vLLM's block 0 is a null block outside the pool from 0.8.3 (the oracle's ids are
        # then vLLM's less one); before, every block is the pool's (read from block_pool.py)
        self.block_offset = int(_has_null_block(mods))
        # the pool at start-up (vllm_config.pool_refusal): the release's own check of
        # max_model_len against num_gpu_blocks; unset, the largest it accepts (<= 65,536)
        gpu_blocks = settings.num_blocks + self.block_offset
        asked = settings.max_model_len
        pool = (engine_config(dataclasses.replace(settings, max_model_len=asked or 1),
                              self.block_offset), _layer_spec(mods, settings.block_size))
        if not asked:
            settings = dataclasses.replace(settings, max_model_len=vllm_config.largest_len(
                mods, gpu_blocks, settings.block_size, pool))
        self.settings = settings
        self.max_model_len = settings.max_model_len  # a request's block-table row, in tokens
        # what the release's SchedulerConfig refuses at start-up, in its own words (a budget
        # below max_num_seqs); v1 always chunks a prefill
        vllm_config.check(mods.dist, mods.root, budget=settings.max_num_batched_tokens,
                          max_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len,
                          chunked=True)
        if asked:  # then the KV pool's check, as the engine makes them (config, then cache)
            vllm_config.check_pool(mods, gpu_blocks, settings.block_size, asked, pool,
                                   self.block_offset)
        self.config = engine_config(settings, self.block_offset)
        if settings.num_speculative_tokens and "spec_token_ids" not in {
                f.name for f in dataclasses.fields(mods["vllm.v1.outputs"].ModelRunnerOutput)} \
                and not hasattr(mods["vllm.v1.outputs"], "DraftTokenIds"):
            raise MisuseError(f"{name} {self.version}'s v1 scheduler has no speculative decoding "
                              f"(its ModelRunnerOutput carries no drafts; 0.7.3 on)")
        if settings.policy != "fcfs" and not hasattr(mods[scheduler_module(mods)],
                                                      "SchedulingPolicy"):
            raise MisuseError(f"{name} {self.version}'s v1 scheduler has no {settings.policy} "
                              f"scheduling (it reads no policy; priority scheduling is 0.9.2's)")
        self.scheduler = _build_scheduler(mods, self.config, settings, self.block_offset)
        self.manager = self.scheduler.kv_cache_manager
        # to 0.8.4 the manager preallocates up to this many blocks beyond a request's need
        # whenever it takes new ones (the engine model bounds a table by it)
        self.preallocate_blocks = getattr(self.manager, "num_preallocate_blocks", 0) or 0
        # the block list, free queue and hash map: the BlockPool's (0.8.0 on), else the
        # manager's own
        m = self.manager
        self._owner = m.block_pool if hasattr(m.block_pool, "free_block_queue") else m
        self._blocks = m.block_pool.blocks if self._owner is not m else m.block_pool
        # to 0.8.0 update_from_output advances num_computed_tokens (read from the release's
        # scheduler), later schedule() does
        self._advances_at_output = "num_computed_tokens +=" in _source(
            type(self.scheduler).update_from_output)
        self.kv_calls: list[KVCall] = []
        # append_slots: a running request's slots, 0.6.4.post1 .. 0.7.1
        for name in ("get_computed_blocks", "allocate_slots", "append_slots", "free"):
            if hasattr(m, name):
                setattr(m, name, _Recorder(m, name, self.kv_calls))
        self.requests: dict[int, Any] = {}  # every request added (finished ones kept)
        self.arrivals = 0
        self._hasher = None  # as EngineCore makes it: with prefix caching only
        utils = mods["vllm.v1.core.kv_cache_utils"]
        if settings.enable_prefix_caching and hasattr(utils, "get_request_block_hasher"):
            sha256 = vllm_v1.hash_fn(mods)
            utils.init_none_hash(sha256)
            self._hasher = utils.get_request_block_hasher(settings.block_size, sha256)

    def __deepcopy__(self, memo):
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, v if k == "_mods" else copy.deepcopy(v, memo))
        return new

    # -- operations ---------------------------------------------------------------------
    def add(self, seq: int, tokens: list[int], max_new: int, priority: int = 0) -> None:
        req = _make_request(self._mods, self, str(seq), list(tokens), max_new, priority,
                            float(self.arrivals))
        self.arrivals += 1
        self.requests[seq] = req
        self.scheduler.add_request(req)

    def abort(self, seq: int) -> None:
        status = self._mods["vllm.v1.request"].RequestStatus.FINISHED_ABORTED
        self.scheduler.finish_requests(str(seq), status)

    def step(self, gen: int, recorded: dict | None = None) -> StepResult:
        del self.kv_calls[:]
        sched = self.scheduler
        out = sched.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        spec = {k: list(v) for k, v in (getattr(out, "scheduled_spec_decode_tokens", None)
                                          or {}).items()}
        # what the forward pass writes: each scheduled token at its position
        writes = {}
        after = {}  # each scheduled request's computed tokens once the step's are written
        for rid, n in scheduled.items():
            req = sched.requests[rid]
            if self._advances_at_output:
                start = req.num_computed_tokens
                end = start + n
            else:
                end = req.num_computed_tokens  # advanced by the scheduler for this step
                start = end - n
            after[rid] = end
            toks = list(req.all_token_ids) + list(spec.get(rid, []))
            writes[rid] = (start, toks[start:end], _block_ids(self.manager, req))
        sampled, drafts = _generate(self, gen, scheduled, spec, recorded, after)
        runner_out = _runner_output(self._mods, list(scheduled), sampled, drafts, self.settings)
        calls_in_schedule = list(self.kv_calls)
        sched.update_from_output(out, runner_out)
        if drafts and hasattr(sched, "update_draft_token_ids") and not _drafts_in_output(
                self._mods):
            dt = self._mods["vllm.v1.outputs"].DraftTokenIds(
                list(drafts), [drafts[r] for r in drafts])
            sched.update_draft_token_ids(dt)
        return StepResult({int(r): n for r, n in scheduled.items()},
                          {int(r): list(v) for r, v in spec.items()},
                          {int(r): v for r, v in sampled.items()},
                          {int(r): v for r, v in drafts.items()},
                          {int(r): w for r, w in writes.items()},
                          calls_in_schedule, list(self.kv_calls[len(calls_in_schedule):]))

    # -- observation -----------------------------------------------------------------
    def status(self, seq: int) -> str:
        return self.requests[seq].status.name

    def computed(self, seq: int) -> int:
        return self.requests[seq].num_computed_tokens

    def blocks(self, seq: int) -> list[int]:
        """The request's blocks, as oracle ids (vLLM's id less ``block_offset``: 1 where
        block 0 is vLLM's null block)."""
        off = self.block_offset
        return [b - off for b in _block_ids(self.manager, self.requests[seq])]

    def running(self) -> list[int]:
        return [int(r.request_id) for r in self.scheduler.running]

    def waiting(self) -> list[int]:
        w = self.scheduler.waiting
        out = [int(r.request_id) for r in (list(w) if not hasattr(w, "__iter__") else w)]
        for name in ("kv_holding_waiting", "skipped_waiting"):
            extra = getattr(self.scheduler, name, None)
            if extra is not None:
                out += [int(r.request_id) for r in extra]
        return out

    def refcount(self, block: int) -> int:
        return self._blocks[block + self.block_offset].ref_cnt

    def free_blocks(self) -> list[int]:
        off = self.block_offset
        return [b.block_id - off for b in self._owner.free_block_queue.get_all_free_blocks()]

    def num_free(self) -> int:
        return _num_free(self.manager)

    def token_ids(self, seq: int) -> list[int]:
        return list(self.requests[seq].all_token_ids)

    def block_hashes(self, seq: int) -> list:
        return _hashes(self.manager, self.requests[seq])

    def cached_entries(self) -> list[tuple[Any, int]]:
        """The block pool's hash map as (request-level block hash, oracle block id) pairs
        (a key with a KV-cache group id, 0.10.2 on, is read back to its block hash with
        the release's ``get_block_hash``)."""
        strip = getattr(self._mods["vllm.v1.core.kv_cache_utils"], "get_block_hash", None)
        if strip is None:  # 0.9.1 .. 0.10.1: a (block_hash, group_id) named tuple
            def strip(key):
                return key.block_hash if hasattr(key, "group_id") else key
        out = []
        off = self.block_offset
        for key, blk in vllm_v1.hash_map_blocks(self._owner.cached_block_hash_to_block):
            if blk.block_id >= off:
                out.append((strip(key) if strip else key, blk.block_id - off))
        return out

    def block_hash(self, block: int):
        return self._blocks[block + self.block_offset].block_hash

    def is_finished(self, seq: int) -> bool:
        req = self.requests[seq]
        return req.is_finished() if hasattr(req, "is_finished") else req.status > 5


@dataclasses.dataclass
class StepResult:
    """What one engine step did: tokens scheduled per request, the drafts scheduled, the
    generated output (sampled tokens, drafts for the next step), what the forward pass
    wrote (request -> (first position, tokens, its vLLM block ids)), and the KV calls
    made inside ``schedule()`` and inside ``update_from_output``."""

    scheduled: dict
    spec: dict
    sampled: dict
    drafts: dict
    writes: dict
    calls: list
    update_calls: list


def _generate(target: EngineTarget, gen: int, scheduled: dict, spec: dict,
              recorded: dict | None, after: dict):
    """The model runner's output for the scheduled requests, from ``gen`` (or a trace's
    ``recorded`` outputs where they fit): a request whose prefill is complete after this
    step samples its accepted drafts' prefix and one token; a prefill chunk samples
    nothing. Drafts for the next step (speculation on): 0 .. k tokens."""
    import random

    sched = target.scheduler
    k = target.settings.num_speculative_tokens
    rec_s = (recorded or {}).get("sampled") or {}
    rec_d = (recorded or {}).get("drafts") or {}
    sampled: dict = {}
    drafts: dict = {}
    for rid in scheduled:
        req = sched.requests[rid]
        rng = random.Random(gen * 1_000_003 + int(rid))
        d = spec.get(rid, [])
        if after[rid] < req.num_tokens:  # a prefill chunk: nothing sampled
            sampled[rid] = []
            continue
        # a padding draft (-1: 0.33's uniform spec-decode size) is never accepted, as the
        # rejection sampler rejects it
        valid = next((i for i, t in enumerate(d) if t < 0), len(d))
        got = rec_s.get(rid, rec_s.get(int(rid)))
        if (isinstance(got, list) and 1 <= len(got) <= valid + 1
                and got[:-1] == d[:len(got) - 1]):
            toks = list(got)
        else:
            a = rng.randint(0, valid)
            last = STOP if rng.random() < 0.08 else rng.randint(2, VOCAB)
            toks = d[:a] + [last]
        sampled[rid] = toks
        if k:
            got = rec_d.get(rid, rec_d.get(int(rid)))
            if isinstance(got, list) and len(got) <= k:
                drafts[rid] = list(got)
            else:
                drafts[rid] = [rng.randint(2, VOCAB) for _ in range(rng.randint(0, k))]
    return sampled, drafts


def _drafts_in_output(mods: Loaded) -> bool:
    """Whether the release's ``ModelRunnerOutput`` carries the drafts (``spec_token_ids``,
    to 0.10) rather than ``update_draft_token_ids`` (later)."""
    cls = mods["vllm.v1.outputs"].ModelRunnerOutput
    return "spec_token_ids" in {f.name for f in dataclasses.fields(cls)}


def _runner_output(mods: Loaded, req_ids: list, sampled: dict, drafts: dict,
                   settings: EngineSettings):
    """The release's own ``ModelRunnerOutput`` record for the generated output."""
    cls = mods["vllm.v1.outputs"].ModelRunnerOutput
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    names = set(fields)
    tokens = [sampled.get(r, []) for r in req_ids]
    # (0.7.3 spells it typing.List[typing.List[int]])
    kind = fields.get("sampled_token_ids", "list[list").lower().replace("typing.", "")
    if "ndarray" in kind:  # (0.11.1, 0.11.2: a NumPy array a request, read with .tolist())
        import numpy as np

        tokens = [np.array(t, dtype=np.int32) for t in tokens]
    elif "list[list" not in kind:
        # to 0.7.2 one token per scheduled request (a prefill chunk's is ignored): a list
        # (0.6.5 on) or a tensor (0.6.4.post1's sampled_token_ids_cpu)
        tokens = [t[-1] if t else 0 for t in tokens]
    values = {"req_ids": req_ids, "req_id_to_index": {r: i for i, r in enumerate(req_ids)},
              "sampled_token_ids": tokens,
              "sampled_token_ids_cpu": (__import__("torch").tensor(tokens)
                                        if "sampled_token_ids_cpu" in names else None),
              "logprob_token_ids_cpu": None, "logprobs_cpu": None,
              "spec_token_ids": ([drafts.get(r, []) for r in req_ids]
                                 if settings.num_speculative_tokens else None),
              "logprobs": None, "prompt_logprobs_dict": {}, "pooler_output": [],
              "finished_sending": None, "finished_recving": None}
    return cls(**{k: v for k, v in values.items() if k in names})


def _make_request(mods: Loaded, target: EngineTarget, rid: str, tokens: list[int],
                  max_new: int, priority: int, arrival: float):
    """The release's own ``SamplingParams`` and ``Request``."""
    import inspect

    sp_cls = mods["vllm.sampling_params"].SamplingParams
    sp = sp_cls(max_tokens=max_new, stop_token_ids=[STOP])
    cls = mods["vllm.v1.request"].Request
    params = inspect.signature(cls.__init__).parameters
    values = {"request_id": rid, "prompt_token_ids": tokens, "sampling_params": sp,
              "pooling_params": None, "arrival_time": arrival, "priority": priority,
              "block_hasher": target._hasher, "eos_token_id": None, "client_index": 0,
              "multi_modal_inputs": None, "multi_modal_hashes": None, "multi_modal_kwargs": None,
              "multi_modal_placeholders": None, "mm_features": None, "lora_request": None,
              "prompt": None, "cache_salt": None, "structured_output_request": None}
    if "inputs" in params:  # to 0.7.0: the prompt as the release's processed inputs
        values["inputs"] = mods["vllm.inputs"].token_inputs(prompt_token_ids=tokens)
    return cls(**{k: v for k, v in values.items() if k in params})


def _build_scheduler(mods: Loaded, config: Settings, s: EngineSettings, null: int):
    """The release's ``Scheduler`` over one full-attention KV-cache group of
    ``num_blocks + 1`` blocks (vLLM's null block on top)."""
    import inspect

    import torch

    cls = mods[scheduler_module(mods)].Scheduler
    params = inspect.signature(cls.__init__).parameters
    som = mods["vllm.v1.structured_output"].StructuredOutputManager(config)
    values = {"vllm_config": config, f"{mods.top}_config": config,  # (a fork's own name)
              "structured_output_manager": som,
              "block_size": s.block_size, "log_stats": False, "include_finished_set": False,
              # to 0.8.4: the configs one by one
              "scheduler_config": config.scheduler_config, "model_config": config.model_config,
              "cache_config": config.cache_config, "lora_config": None,
              "speculative_config": config.speculative_config}
    if "kv_cache_config" in params:  # 0.8.4 on: the scheduler builds the manager from it
        values["kv_cache_config"] = _kv_cache_config(mods, s, torch, null)
    return cls(**{k: v for k, v in values.items() if k in params})


def _layer_spec(mods: Loaded, block_size: int):
    """The engine's one layer: the release's ``FullAttentionSpec`` (one KV head of size 1 in
    float16), or ``None`` where the release has no ``kv_cache_interface`` (to 0.6.6.post1)."""
    if not mods.has("vllm.v1.kv_cache_interface"):
        return None
    import torch

    iface = mods["vllm.v1.kv_cache_interface"]
    values = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
              "dtype": torch.float16, "use_mla": False, "sliding_window": None,
              "attention_chunk_size": None}
    fields = {f.name for f in dataclasses.fields(iface.FullAttentionSpec)}
    return iface.FullAttentionSpec(**{k: v for k, v in values.items() if k in fields})


def _kv_cache_config(mods: Loaded, s: EngineSettings, torch: Any, null: int):
    """One full-attention KV-cache group of ``num_blocks + 1`` blocks (vLLM's null block on
    top), in the release's ``KVCacheConfig`` shape."""
    iface = mods["vllm.v1.kv_cache_interface"]
    spec = _layer_spec(mods, s.block_size)
    group = iface.KVCacheGroupSpec(["layer.0"], spec)
    cfg_fields = {f.name for f in dataclasses.fields(iface.KVCacheConfig)}
    cfg = {"num_blocks": s.num_blocks + null, "tensors": {}, "kv_cache_tensors": [],
           "kv_cache_groups": [group]}
    return iface.KVCacheConfig(**{k: v for k, v in cfg.items() if k in cfg_fields})


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None,
         engine: str = ENGINE_KEY) -> EngineTarget:
    """The engine target: the release's scheduler over ``num_blocks`` usable blocks of
    ``block_size``, a step's token budget ``budget``, ``max_seqs``, the scheduling
    ``policy``, prefix caching on or off, ``spec`` speculative tokens per step, and
    ``max_model_len`` (the model's context length: refused in the release's words where its
    start-up check refuses it on this pool; unset, the largest it accepts, at most
    65,536)."""
    more = {} if not max_model_len else {"max_model_len": max_model_len}
    return EngineTarget(EngineSettings(num_blocks, block_size, max_num_batched_tokens=budget,
                                       max_num_seqs=max_seqs, policy=policy,
                                       enable_prefix_caching=caching,
                                       num_speculative_tokens=spec, **more), version, engine)


make.loads_family = True  # TARGET@VERSION reaches every vllm-v1 release (0.6.4.post1 on)
