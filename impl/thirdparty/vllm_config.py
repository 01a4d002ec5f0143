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
