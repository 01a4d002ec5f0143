"""What a vLLM release refuses at start-up, by the release's own validation (issue 34).

The engine targets (``vllm_v0_engine``, ``vllm_v1_engine`` and the forks that carry their
files) build the release's scheduler over a stand-in config (the real ``vllm/config*.py``
imports torch, transformers and pydantic), so the checks vLLM makes when its
``SchedulerConfig`` is built would never run and kvcheck would drive settings the engine
refuses to start with (``max_num_batched_tokens`` below ``max_num_seqs``; below
``max_model_len`` without chunked prefill). ``refusal`` runs those checks: the release's
``SchedulerConfig`` validation method (``_verify_args``, 0.3 .. 0.11.0; from 0.11.1
``verify_max_model_len(max_model_len)``), compiled from its own source text
(``_loader.exec_methods``; the class's other members, pydantic and its imports are not run)
and called on a record of the run's settings (``_loader.Settings``: a field it does not
hold stops the run with one line and exit 2), every other field at ``SchedulerConfig``'s
default. Stand-ins in its namespace: ``logger`` (a stdlib logger: the release only warns
through it), ``model_validator`` (pydantic's decorator, 0.9.2 .. 0.11.0: the identity,
the method is called directly) and ``Self`` (an annotation).

The pool (``max_model_len`` against ``num_gpu_blocks``). vLLM refuses at start-up a
``max_model_len`` whose one request the KV pool cannot hold; ``pool_refusal`` runs the
release's own check, compiled from its own source, on the run's pool (``num_gpu_blocks``
blocks of ``block_size``, the null block included where the release keeps one) and says
it in the release's words:

* vLLM v1 0.7.0 on (and aphrodite-engine's v1, 0.20.0 on): ``check_enough_kv_cache_memory``
  (``vllm/v1/core/kv_cache_utils.py``; ``kv_cache_planning.py`` from 0.33.0) with the
  helpers it calls from its file (``_check_enough_kv_cache_memory``,
  ``max_memory_usage_bytes``, ``estimate_max_model_len``, ``_more_kv_cache_memory_hint``),
  the namespace the engine's loaded ``kv_cache_utils`` module has, the release's own
  ``FullAttentionSpec`` of the engine's one layer and ``available_memory`` = the pool's
  bytes (``num_gpu_blocks`` x the spec's page: the memory vLLM sizes exactly this pool
  from). It compares ``cdiv(max_model_len, block_size)`` pages with the memory: to 0.28.0
  the null block counted in, from 0.29.0 (aphrodite 0.24.1) held back (its "Reserve the
  null block" code). Stand-ins there, 0.29.0 on: ``get_kv_cache_groups`` (the release
  groups a model's layers; one full-attention layer is one group,
  ``KVCacheGroupSpec(["layer.0"], spec)``, the release's class) and
  ``_pool_bytes_per_block`` (one block's bytes in the pool: that layer's page), whose own
  code reads layout, hybrid-model and HiSparse settings no kvcheck engine has. The
  start-up path (``get_kv_cache_configs``, 0.29.0 on) makes the same comparison per
  worker; for one full-attention group the two agree.
* vLLM v1 0.6.4.post1 .. 0.6.6.post1: the v1 worker's ``Worker.initialize_cache``
  (``vllm/v1/worker/gpu_worker.py``: ``max_model_len > block_size * num_gpu_blocks``
  raises), compiled alone and called on a record of the two configs (its
  ``model_runner.initialize_kv_cache``, which allocates the GPU cache, a no-op).
* vLLM v0 (0.4.1 .. 0.9.2): the worker's ``raise_if_cache_size_invalid``
  (``vllm/worker/worker.py``; 0.4.0: ``check_block_size_valid``,
  ``vllm/executor/utils.py``): ``max_model_len > block_size * num_gpu_blocks`` raises.
  aphrodite 0.6.x's (``aphrodite/task_handler/worker.py``) refuses nothing: it logs an
  error ("Forcing max_model_len to ...", a local variable) and the engine runs with the
  length asked; compiled and called the same way, with ``get_tensor_model_parallel_rank``
  (rank 0: the engine is one device) and a stdlib ``logger`` in its namespace.

``largest_len`` is the default the engine targets run with when the run sets none: the
largest ``max_model_len`` the release's check accepts on the pool, at most ``MODEL_LEN``
(65,536, the context length kvcheck's model-less engines stand for) -- what vLLM's
``max_model_len=-1`` auto-fits to from 0.14.0 (``_auto_fit_max_model_len``: the release's
``estimate_max_model_len`` over the same memory), and, before, the length the release's
refusal names as the most it can hold.
"""

from __future__ import annotations

import ast
import functools
import logging
from pathlib import Path
from typing import Any

from . import _loader

METHODS = ("verify_max_model_len", "_verify_args")  # the newer name first


def _candidates(root: Path, top: str) -> list[Path]:
    return [root / top / "config" / "scheduler.py", root / top / "config" / "__init__.py",
            root / top / "config.py", root / top / "common" / "config.py"]


def _method(root: Path, top: str):
    """``(path, name)`` of the release's ``SchedulerConfig`` validation, or ``None``."""
    for path in _candidates(root, top):
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "SchedulerConfig":
                have = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
                for name in METHODS:
                    if name in have:
                        return path, name
    return None


@functools.cache
def _compiled(root: str, top: str):
    """``(name, method)``: the release's validation method compiled, or ``None``. Once per
    release and process: a shrink builds hundreds of engines, and parsing vLLM's config.py
    (4,000+ lines) for each made vllm-18957's command take 173 s instead of 26 s."""
    found = _method(Path(root), top)
    if found is None:
        return None
    path, name = found
    namespace = {"logger": logging.getLogger(f"kvcheck.thirdparty.{top}.config"),
                 "model_validator": lambda *a, **k: (lambda f: f), "Self": Any}
    return name, _loader.exec_methods(path, "SchedulerConfig", (name,), namespace)[name]


def refusal(root: Path | str, top: str, *, budget: int, max_seqs: int, max_model_len: int,
            chunked: bool) -> str | None:
    """The release's own words refusing these settings at start-up (its ``SchedulerConfig``
    validation's ``ValueError``), or ``None`` when it accepts them or has no such method.
    ``root``: the folder holding the release's top-level package ``top``."""
    compiled = _compiled(str(root), top)
    if compiled is None:
        return None
    name, method = compiled
    # (the SchedulerConfig fields the validation reads; one not held raises StandInMissing,
    # an AttributeError naming it: kvcheck's gap, one line and exit 2)
    fields = _loader.Settings(
        "SchedulerConfig", "impl/thirdparty/vllm_config.py", max_num_batched_tokens=budget,
        max_num_seqs=max_seqs, max_model_len=max_model_len, enable_chunked_prefill=chunked,
        chunked_prefill_enabled=chunked, num_lookahead_slots=0, num_scheduler_steps=1,
        max_num_partial_prefills=1, max_long_partial_prefills=1,
        long_prefill_token_threshold=0, max_num_active_seqs=None)
    try:
        if name == "verify_max_model_len":
            method(fields, max_model_len)
        else:
            method(fields)
    except ValueError as exc:
        return str(exc)
    return None


def check(dist: Any, root: Path | str, **settings: Any) -> None:
    """Raise ``MisuseError`` (bad input: one line, exit 2) with the release's own words where
    it refuses ``settings`` (``refusal``'s keywords) at start-up."""
    from ..errors import MisuseError

    said = refusal(root, dist.top, **settings)
    if said is not None:
        raise MisuseError(f"{dist.dist} {dist.version} refuses these settings at start-up "
                          f"(its SchedulerConfig): {said}")


# -- the pool: max_model_len against num_gpu_blocks ---------------------------------------
WHERE = "impl/thirdparty/vllm_config.py"
MODEL_LEN = 1 << 16  # the model's context length the engine targets stand for (no model)

# the release's v1 check and the helpers it calls from its own file
V1_NAMES = ("check_enough_kv_cache_memory", "_check_enough_kv_cache_memory",
            "max_memory_usage_bytes", "estimate_max_model_len", "_more_kv_cache_memory_hint")
# v0's worker check, by file (0.4.0: the executor's utils)
V0_CHECKS = (("worker/worker.py", "raise_if_cache_size_invalid"),
             ("task_handler/worker.py", "raise_if_cache_size_invalid"),
             ("executor/utils.py", "check_block_size_valid"))


def _one_group(iface: Any) -> dict:
    """The two grouping helpers the check calls (0.29.0 on), stood in for the engine's one
    full-attention layer: its layers are one group (``KVCacheGroupSpec``, the release's own
    class), and one block of the pool is that layer's page."""

    def get_kv_cache_groups(_config: Any, specs: dict) -> list:
        return [iface.KVCacheGroupSpec(list(specs), next(iter(specs.values())))]

    def _pool_bytes_per_block(*args: Any) -> int:  # (0.29.0: its only argument the groups)
        return args[-1][0].kv_cache_spec.page_size_bytes

    return {"get_kv_cache_groups": get_kv_cache_groups,
            "_pool_bytes_per_block": _pool_bytes_per_block}


def _v1_check(mods: Any):
    """``(where, kind, function)``: the release's v1 pool check (``"memory"``:
    ``check_enough_kv_cache_memory``; ``"worker"``: ``Worker.initialize_cache``), or
    ``None``. Compiled once per release and process."""
    top = mods.dist.top
    key = ("v1", str(mods.root), top)
    if key in _CHECKS:
        return _CHECKS[key]
    found = None
    root = Path(mods.root) / top
    for rel in ("v1/core/kv_cache_planning.py", "v1/core/kv_cache_utils.py"):
        path = root / rel
        if path.is_file() and "def check_enough_kv_cache_memory" in path.read_text():
            namespace = dict(vars(mods["vllm.v1.core.kv_cache_utils"]))
            namespace.update(_one_group(mods["vllm.v1.kv_cache_interface"]))
            for rel_util, util in (("utils/mem_constants.py", "GiB_bytes"),
                                   ("utils/mem_utils.py", "format_gib")):
                if util not in namespace and (root / rel_util).is_file():
                    # (0.33.0 on: kv_cache_planning.py's import, the release's own)
                    _loader.exec_definitions(root / rel_util, namespace, (util,))
            _loader.exec_definitions(path, namespace, V1_NAMES)
            found = (f"{top}/{rel}", "memory", namespace["check_enough_kv_cache_memory"])
            break
    if found is None:
        path = root / "v1/worker/gpu_worker.py"
        if path.is_file() and "max_model_len > max_seq_len" in path.read_text():
            method = _loader.exec_methods(path, "Worker", ("initialize_cache",), {})
            found = (f"{top}/v1/worker/gpu_worker.py", "worker",
                     method["initialize_cache"])
    _CHECKS[key] = found
    return found


def _v0_check(root: Path | str, top: str):
    """``(where, function)``: the release's v0 worker check, or ``None``; once per release
    and process."""
    key = ("v0", str(root), top)
    if key in _CHECKS:
        return _CHECKS[key]
    found = None
    for rel, name in V0_CHECKS:
        path = Path(root) / top / rel
        if path.is_file() and f"def {name}(" in path.read_text():
            # (aphrodite 0.6.x's only logs: rank 0 of a one-device engine, its logger)
            namespace: dict = {"logger": logging.getLogger(f"kvcheck.thirdparty.{top}.worker"),
                               "get_tensor_model_parallel_rank": lambda: 0}
            _loader.exec_definitions(path, namespace, (name,))
            found = (f"{top}/{rel}", namespace[name])
            break
    _CHECKS[key] = found
    return found


_CHECKS: dict[tuple, Any] = {}
_SAID: dict[tuple, str | None] = {}


def _v1_refusal(mods: Any, config: Any, spec: Any, num_gpu_blocks: int,
                max_model_len: int) -> str | None:
    found = _v1_check(mods)
    if found is None:
        return None
    where, kind, check = found
    model = config.model_config
    saved = model.max_model_len
    model.max_model_len = max_model_len
    try:
        if kind == "memory":
            # the memory vLLM sizes exactly this pool from: num_gpu_blocks pages
            check(config, {"layer.0": spec}, num_gpu_blocks * spec.page_size_bytes)
        else:
            runner = _loader.Settings("model_runner", WHERE,
                                      initialize_kv_cache=lambda _n: None)
            worker = _loader.Settings("Worker", WHERE, cache_config=config.cache_config,
                                      model_config=model, model_runner=runner)
            check(worker, num_gpu_blocks)
    except ValueError as exc:
        return f"{where}: {exc}"
    finally:
        model.max_model_len = saved
    return None


def _v0_refusal(root: Path | str, top: str, num_gpu_blocks: int, block_size: int,
                max_model_len: int) -> str | None:
    found = _v0_check(root, top)
    if found is None:
        return None
    where, check = found
    import inspect

    values = {"num_gpu_blocks": num_gpu_blocks, "block_size": block_size,
              "is_attention_free": False, "max_model_len": max_model_len,
              "pipeline_parallel_size": 1}
    params = inspect.signature(check).parameters
    try:
        check(**{k: v for k, v in values.items() if k in params})
    except ValueError as exc:
        return f"{where}: {exc}"
    return None


def pool_refusal(mods: Any, num_gpu_blocks: int, block_size: int, max_model_len: int,
                 v1: tuple | None = None) -> str | None:
    """The release's own words refusing ``max_model_len`` on a pool of ``num_gpu_blocks``
    blocks of ``block_size`` at start-up (prefixed with the file saying it), or ``None``.
    ``v1``: ``(config, spec)``, the engine's config record and its layer's
    ``FullAttentionSpec``, for a v1 engine (else v0's worker check). Once per release,
    pool and length and process."""
    key = (str(mods.root), mods.dist.top, num_gpu_blocks, block_size, max_model_len,
           # (the settings a v1 check could read beside the pool: the budget, drafts)
           v1 and (v1[0].scheduler_config.max_num_batched_tokens,
                   v1[0].num_speculative_tokens))
    if key not in _SAID:
        if v1 is not None:
            _SAID[key] = _v1_refusal(mods, *v1, num_gpu_blocks, max_model_len)
        else:
            _SAID[key] = _v0_refusal(mods.root, mods.dist.top, num_gpu_blocks, block_size,
                                     max_model_len)
    return _SAID[key]


def largest_len(mods: Any, num_gpu_blocks: int, block_size: int, v1: tuple | None = None,
                cap: int = MODEL_LEN) -> int:
    """The largest ``max_model_len`` of 1 .. ``cap`` the release's check accepts on the pool
    (``pool_refusal``'s arguments): ``cap`` when it accepts that, 0 when it accepts none
    (the check is monotone in the length: a binary search)."""
    if pool_refusal(mods, num_gpu_blocks, block_size, cap, v1) is None:
        return cap
    low, high = 0, cap  # low accepted (0: none yet), high refused
    while high - low > 1:
        mid = (low + high) // 2
        if pool_refusal(mods, num_gpu_blocks, block_size, mid, v1) is None:
            low = mid
        else:
            high = mid
    return low


def check_pool(mods: Any, num_gpu_blocks: int, block_size: int, max_model_len: int,
               v1: tuple | None = None, null: int = 0) -> None:
    """Raise ``MisuseError`` (bad input: one line, exit 2) with the release's own words where
    it refuses ``max_model_len`` on this pool at start-up, naming the largest it accepts.
    ``null``: the blocks of ``num_gpu_blocks`` outside the usable pool (vLLM v1's null
    block, 0.8.3 on), for the words."""
    from ..errors import MisuseError

    said = pool_refusal(mods, num_gpu_blocks, block_size, max_model_len, v1)
    if said is not None:
        most = largest_len(mods, num_gpu_blocks, block_size, v1)
        fits = (f"--max-model-len {most} or less starts" if most else
                "no max_model_len starts")
        pool = f"{num_gpu_blocks - null} blocks of {block_size} tokens" + (
            f" (num_gpu_blocks {num_gpu_blocks} with its null block)" if null else "")
        raise MisuseError(f"{mods.dist.dist} {mods.dist.version} refuses max_model_len "
                          f"{max_model_len} at start-up on a pool of {pool}: {fits}; its "
                          f"{said}".replace("\n", " "))
