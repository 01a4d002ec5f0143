"""SGLang's own scheduler loop for ``sglang-engine`` (issue 34 §1): the release's
``Scheduler`` methods, ``SchedulerBatchResultProcessor`` methods and ``ScheduleBatch`` class,
compiled from the installed wheel's source into the release's namespace that
``sglang_engine.load`` builds, and the members a CPU run with no model gives them.

What is compiled (nothing rewritten; a method's code object names the release's file):

* ``managers/scheduler.py``: every method of ``Scheduler`` (its class body; the mixins for
  disaggregation, multiplexing, pipeline parallelism, diffusion LLMs and MLX are not its
  bases here: all off), and the module's ``TEST_RETRACT*`` settings, ``LOAD_STALL_REFRESH_S``
  and ``_make_abort_req``. The run calls ``get_next_batch_to_run`` (with
  ``process_pending_chunked_abort``, ``stash_chunked_request``, ``get_new_batch_prefill`` /
  ``_get_new_batch_prefill_raw``, ``update_running_batch``), ``process_batch_result``,
  ``on_idle``, ``_add_request_to_queue``, ``abort_request``, ``init_req_max_new_tokens``;
* ``managers/scheduler_components/batch_result_processor.py``: every method of
  ``SchedulerBatchResultProcessor`` (``process_batch_result_prefill`` / ``_decode``, ...)
  on a shell holding the members the scheduler's ``init_batch_result_processor`` gives it;
* ``managers/schedule_batch.py``: the ``ScheduleBatch`` dataclass (``init_new``,
  ``prepare_for_extend``, ``prepare_for_decode``, ``filter_batch``, ``merge_batch``,
  ``check_decode_mem``, ``retract_decode``, ...) on CPU torch tensors, and the module
  functions it calls; ``model_executor/forward_batch_info.py``'s ``ForwardMode`` and
  ``CaptureHiddenMode``; ``beam_search/batch_tail.py``'s ``strip_beam_tail`` /
  ``append_beam_tail``; ``managers/utils.py``'s ``GenerationBatchResult``;
  ``utils/common.py``'s ``flatten_arrays_to_pinned_cpu``.

The stand-ins are listed in ``sglang_engine``'s module doc (one place).
"""

from __future__ import annotations
import __future__

import ast
import functools
import types
from pathlib import Path
from typing import Any

from ._loader import StandIn, exec_definitions

SCHEDULER = "sglang/srt/managers/scheduler.py"
PROCESSOR = "sglang/srt/managers/scheduler_components/batch_result_processor.py"
SB = "sglang/srt/managers/schedule_batch.py"

# top-level definitions executed from the release (file -> names); a name the release
# does not define is not executed (LOOP_OPTIONAL) -- its code then does not call it
LOOP_DEFS = {
    "sglang/srt/model_executor/forward_batch_info.py": (
        "ForwardMode", "CaptureHiddenMode", "get_server_return_hidden_states_mode",
        "get_required_capture_hidden_mode"),
    SB: ("get_batch_return_hidden_states_mode", "compute_extend_logprob_start_len",
         "_compute_chunked_req_next_prompt_token", "mamba_lazy_spec_in_window", "ScheduleBatch"),
    "sglang/srt/beam_search/batch_tail.py": ("strip_beam_tail", "append_beam_tail"),
    "sglang/srt/managers/utils.py": ("GenerationBatchResult",),
    "sglang/srt/utils/common.py": ("flatten_arrays_to_pinned_cpu",),
    SCHEDULER: ("TEST_RETRACT", "TEST_RETRACT_INTERVAL", "TEST_RETRACT_NO_PREFILL_BS",
                "LOAD_STALL_REFRESH_S", "_make_abort_req"),
    PROCESSOR: ("_get_speculative_output_stride",),
    # 0.5.19's prepare_for_extend asks these predicates over the published settings
    "sglang/srt/runtime_context.py": ("mamba_extra_buffer_enabled",
                                      "mamba_extra_buffer_lazy_enabled"),
}
LOOP_OPTIONAL = frozenset({"mamba_extra_buffer_enabled", "mamba_extra_buffer_lazy_enabled",
                           "get_server_return_hidden_states_mode",
                           "get_required_capture_hidden_mode", "mamba_lazy_spec_in_window",
                           "strip_beam_tail", "append_beam_tail",
                           "flatten_arrays_to_pinned_cpu", "LOAD_STALL_REFRESH_S",
                           "_get_speculative_output_stride", "get_batch_return_hidden_states_mode",
                           "_compute_chunked_req_next_prompt_token",
                           "compute_extend_logprob_start_len"})

# decorators of the release's methods that instrument, not decide: stage timing
# (``scheduler_stage_method``, ``scheduler_nvtx_method``: profiler ranges) and autograd
# mode (no tensor here needs gradients)
INSTRUMENTS = frozenset({"scheduler_stage_method", "scheduler_nvtx_method", "DynamicGradMode",
                         "torch.no_grad", "no_grad"})

_FUTURE = __future__.annotations.compiler_flag


@functools.cache
def _tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(), path)


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return ast.unparse(node)


def compile_class(path: Path, cls: str, ns: dict, bases: tuple = (StandIn,),
                  name: str | None = None) -> type:
    """The release's class ``cls`` in ``path`` as a shell of ``bases`` whose methods are the
    class's own, each compiled from its source with ``ns`` as its globals when first read
    (a run calls a few dozen of the Scheduler's hundreds), and whose plain class
    attributes are the class's. Instrumenting decorators (``INSTRUMENTS``) are left off;
    ``__init__`` and the class's own bases are not run: the caller sets the members."""
    node = next((n for n in _tree(str(path)).body
                 if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        raise ImportError(f"{path} has no class {cls}")
    methods = {m.name: m for m in node.body
               if isinstance(m, ast.FunctionDef) and m.name != "__init__"}
    attrs = [m for m in node.body if isinstance(m, (ast.Assign, ast.AnnAssign))
             and m.value is not None]

    def run(body: list) -> dict:
        holder = f"__{cls}_compiled__"
        made = ast.ClassDef(name=holder, bases=[], keywords=[], body=body or [ast.Pass()],
                            decorator_list=[])
        ast.copy_location(made, node)
        exec(compile(ast.fix_missing_locations(ast.Module(body=[made], type_ignores=[])),  # noqa: S102
                     str(path), "exec", flags=_FUTURE, dont_inherit=True), ns)
        return dict(vars(ns.pop(holder)))  # (the release's own source)

    def method(attr: str):
        m = methods[attr]
        m = ast.FunctionDef(name=m.name, args=m.args, body=m.body,
                            decorator_list=[d for d in m.decorator_list
                                            if _decorator_name(d) not in INSTRUMENTS],
                            returns=m.returns, type_comment=None,
                            lineno=m.lineno, col_offset=m.col_offset)
        return run([m])[attr]

    def __getattr__(self, attr: str):
        if attr in methods:
            setattr(type(self), attr, method(attr))
            return getattr(self, attr)
        return base_getattr(self, attr)

    base_getattr = bases[0].__getattr__
    members = {k: v for k, v in run(attrs).items()
               if k not in ("__dict__", "__weakref__", "__module__", "__qualname__",
                            "__doc__")}
    members["__getattr__"] = __getattr__
    members["__release_methods__"] = frozenset(methods)
    return type(name or cls, bases, members)


class NextBatchPlan:
    """``NextBatchPlan`` (a ``msgspec.Struct`` of two fields; msgspec is not installed)."""

    __slots__ = ("batch_to_run", "running_batch")

    def __init__(self, batch_to_run=None, running_batch=None):
        self.batch_to_run, self.running_batch = batch_to_run, running_batch


class ScheduleBatchDisaggregationDecodeMixin:
    """The base ``ScheduleBatch`` takes its PD-decode methods from: disaggregation off."""


class SamplingBatchInfo:
    """``sampling/sampling_batch_info.py``'s ``SamplingBatchInfo``: the sampler's tensors
    for the forward pass (temperatures, penalties, grammars' masks); there is no model and
    no sampler here. What ``ScheduleBatch`` asks of it: built, filtered and merged with the
    batch; no penalizer is required."""

    def __init__(self, n: int = 0):
        self.n = n
        self.penalizer_orchestrator = types.SimpleNamespace(is_required=False)

    @classmethod
    def from_schedule_batch(cls, batch, _vocab_size):
        return cls(len(batch.reqs))

    def filter_batch(self, keep_indices, _keep_device=None) -> None:
        self.n = len(keep_indices)

    def merge_batch(self, other) -> None:
        self.n += other.n


class Inert:
    """A member that records nothing: every attribute read gives another, every call
    returns None (time statistics, metrics, load publishing)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert()

    def __call__(self, *_a, **_k):
        return None

    def __bool__(self):
        return False


def _inert_function(*_a, **_k):
    return None


class MetricsReporter(StandIn):
    """``SchedulerMetricsReporter``: counters the loop adds to, with metrics off."""

    WHERE = "impl/thirdparty/sglang_engine.py"

    def __init__(self):
        self.num_generated_tokens = 0
        self.forward_ct_decode = 0
        self.enable_metrics = False
        self.metrics_collector = Inert()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert_function  # log_*, report_*, record_*, update_*


class PassThrough:
    """A component whose methods hand back the batch they are given unchanged: the DP
    attention adapter (``maybe_prepare_mlp_sync_batch``, ``maybe_convert_decode_to_extend``;
    no data parallelism) and the ngram embedding manager (``prepare_for_forward``; no
    ngram embeddings)."""

    def maybe_prepare_mlp_sync_batch(self, batch, need_sync=False):
        return batch

    def maybe_convert_decode_to_extend(self, batch):
        return batch

    def prepare_for_forward(self, batch, chunked_req=None):
        return batch

    def drop_sync_wait_carry(self) -> None:
        return None


def build(ns: dict, root: Path) -> dict:
    """The loop's definitions executed into the release's namespace ``ns`` (once per
    release): returns what the target needs (the compiled classes)."""
    import enum

    import numpy as np
    import torch

    ns.update({
        "IntEnum": enum.IntEnum, "auto": enum.auto, "total_ordering": functools.total_ordering,
        "np": np, "torch": torch, "NextBatchPlan": NextBatchPlan,
        # the wall clock: on_idle reads it to throttle its load publishing (stood in),
        # nothing it decides
        "time": __import__("time"),
        "ScheduleBatchDisaggregationDecodeMixin": ScheduleBatchDisaggregationDecodeMixin,
        "SamplingBatchInfo": SamplingBatchInfo,
        # time statistics and tracing: record nothing
        "set_schedule_time_batch": _inert_function, "set_time_batch": _inert_function,
        "flush_trace_batch": _inert_function,
        "PrefillStats": types.SimpleNamespace(from_adder=_inert_function),
        "compute_weight_version_spans": _inert_function,
        "AbortReq": _AbortReq,
        # no model state is captured (routed experts, indexer top-k: the model's)
        "get_global_indexer_capturer": _inert_function,
        "get_global_experts_capturer": _inert_function,
    })
    for rel, names in LOOP_DEFS.items():
        found = exec_definitions(root / rel, ns, names)
        missing = [n for n in names if n not in found and n not in LOOP_OPTIONAL]
        if missing:
            raise ImportError(f"{rel} has no {', '.join(missing)}")
    # the metrics stages' labels (observability/scheduler_stage_metrics.py): names only
    import re
    for label in set(re.findall(r"\bSCHEDULER_STAGE_[A-Z_]+\b", (root / SCHEDULER).read_text())):
        ns.setdefault(label, label)
    ns.setdefault("strip_beam_tail", _inert_function)
    ns.setdefault("append_beam_tail", _inert_function)
    ns["ScheduleBatch"].__module__ = ns["__name__"]
    scheduler = compile_class(root / SCHEDULER, "Scheduler", ns)
    processor = compile_class(root / PROCESSOR, "SchedulerBatchResultProcessor", ns)
    return {"Scheduler": scheduler, "Processor": processor, "ScheduleBatch": ns["ScheduleBatch"]}


class _AbortReq:
    """``io_struct.AbortReq`` (a ``msgspec`` struct): the fields ``abort_request`` reads."""

    def __init__(self, rid: str = "", abort_all: bool = False, finished_reason: Any = None,
                 abort_message: str | None = None, weight_versions: Any = None):
        self.rid, self.abort_all = rid, abort_all
        self.finished_reason, self.abort_message = finished_reason, abort_message
        self.weight_versions = weight_versions
