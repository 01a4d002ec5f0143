"""Run CrossHair on the spec-derived contracts and report one verdict per property.

``run_crosshair`` is the stable entry point (``kvcheck prove`` calls it for
the reference target)::

    run_crosshair(target_class_or_module=None, budget_seconds=300.0,
                  per_condition_timeout=120.0, ...) -> list[dict]

It runs ``crosshair check`` in a subprocess, once per property (one per
operation: ``allocate``, ``append_slot``, ``fork``, ``free_seq``), on
``kvcheck.proofs.crosshair_contracts`` (see that module for what each
contract says), parses CrossHair's report and returns, in property order::

    {"property":  "fork",                 # the contract function checked
     "result":    "proved-within-bound" | "counterexample" | "unknown",
     "seconds":   12.3,                   # wall-clock of that subprocess
     "message":   "...",                  # CrossHair's line, or why unknown
     "counterexample": "fork(Reached([...]), 0, 1) -> <...>" | None,
     "target":    "kvcheck.impl.block_manager:BlockManager",
     "scope":     "3,2,3,3,2",            # num_blocks,block_size,seqs,max_tokens,prefix
     "command":   "KVCHECK_CROSSHAIR_...=... python -m crosshair check ..."}

``proved-within-bound``: CrossHair reported "Confirmed over all paths": it
exhausted every execution path of the contract for inputs within the scope
(every operation sequence of at most ``prefix`` operations, then the
operation under check, with ids and sizes bounded by the scope).
``counterexample``: it found inputs that break the contract; ``message``
names the broken clauses. ``unknown``: it ran out of time (per condition or
the overall budget), could not meet the precondition, or failed.

The whole call never runs past ``budget_seconds`` (plus a second or two to
kill and reap): each subprocess gets a wall-clock deadline inside the budget
and is killed with its process group when it passes it; properties not
started when the budget is spent are reported ``unknown``.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from kvcheck.proofs import crosshair_contracts as _contracts
from kvcheck.proofs.crosshair_contracts import PROPERTIES, SCOPE_ENV, TARGET_ENV, Scope

PROVED, COUNTEREXAMPLE, UNKNOWN = "proved-within-bound", "counterexample", "unknown"
CONTRACTS_MODULE = _contracts.__name__
STARTUP_SECONDS = 6.0  # interpreter + CrossHair + z3 import, before analysis starts
DEFAULT_SCOPE = Scope()

_LINE = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<level>error|warning|info): (?P<msg>.*)$")


def run_crosshair(
    target_class_or_module=None,
    budget_seconds: float = 300.0,
    per_condition_timeout: float = 120.0,
    *,
    properties: tuple[str, ...] | list[str] | None = None,
    scope: Scope | str | None = None,
    max_uninteresting_iterations: int | None = None,
    jobs: int = 1,
) -> list[dict]:
    """Check the spec-derived contracts with CrossHair; one result dict per property.

    ``target_class_or_module``:
      * ``None``: the reference ``kvcheck.impl.block_manager.BlockManager``;
      * a class (or any factory ``f(num_blocks, block_size)``) defined at
        module level in an importable module or a ``.py`` file;
      * a string TARGET as ``kvcheck.loading`` reads it (``module:attr``,
        ``path/file.py:attr`` or a registered name);
      * a module object or a dotted module name without ``:``: a contracts
        module written like ``crosshair_contracts`` (its ``PROPERTIES`` lists
        the functions to check), checked as is.

    ``budget_seconds`` bounds the whole call (wall-clock). ``per_condition_timeout``
    is CrossHair's ``--per_condition_timeout`` (CPU seconds per property), capped
    by what is left of the budget. ``scope`` overrides the bounds
    (``Scope`` or ``"num_blocks,block_size,seqs,max_tokens,prefix"``); the
    default ``3,2,3,3,2`` is proved for the reference in about 200 s on two
    busy cores (see docs/crosshair.md for figures).
    ``max_uninteresting_iterations`` is passed through when given. ``jobs``
    runs that many properties at once.
    """
    module, target = _contracts_module_and_target(target_class_or_module)
    if properties is None:
        properties = _properties_of(module, target)
    scope_text = _scope_text(scope)
    env = dict(os.environ)
    env[SCOPE_ENV] = scope_text
    if target is None:
        env.pop(TARGET_ENV, None)
    else:
        env[TARGET_ENV] = target
    roots = _module_roots(target_class_or_module)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([os.getcwd(), *roots, *(p for p in sys.path if p)]))
    shown_env = [f"{SCOPE_ENV}={scope_text}"]
    if target:
        shown_env.append(f"{TARGET_ENV}={shlex.quote(target)}")
    if roots:
        shown_env.append("PYTHONPATH=" + shlex.quote(os.pathsep.join(roots)))
    label = target or "kvcheck.impl.block_manager:BlockManager"

    start = time.monotonic()
    deadline = start + max(0.0, budget_seconds)
    results: dict[str, dict] = {}
    pending = list(properties)
    running: list[tuple[str, subprocess.Popen, float, float, str]] = []
    while pending or running:
        while pending and len(running) < max(1, jobs):
            prop = pending.pop(0)
            left = deadline - time.monotonic()
            if left < STARTUP_SECONDS + 1:
                results[prop] = _result(prop, UNKNOWN, 0.0, "not started: the time budget is spent",
                                        label, scope_text, "")
                continue
            # CrossHair's own timeout is CPU time of the analysis: keep it inside
            # the wall-clock left, with room for startup (it then stops cleanly).
            cond = max(1.0, min(per_condition_timeout, left - STARTUP_SECONDS - 1))
            argv = [sys.executable, "-m", "crosshair", "check", "--analysis_kind=PEP316",
                    "--report_all", f"--per_condition_timeout={cond:g}"]
            if max_uninteresting_iterations is not None:
                argv.append(f"--max_uninteresting_iterations={max_uninteresting_iterations}")
            argv.append(f"{module}.{prop}")
            shown = " ".join([*shown_env, "python", *(shlex.quote(x) for x in argv[1:])])
            # Output goes to files, not pipes: CrossHair can write more than a
            # pipe holds while nobody reads, and would then block forever.
            out_f = tempfile.TemporaryFile("w+")
            err_f = tempfile.TemporaryFile("w+")
            proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, text=True, env=env,
                                    start_new_session=True)
            proc.files = (out_f, err_f)  # type: ignore[attr-defined]
            running.append((prop, proc, time.monotonic(), deadline, shown))
        done = [it for it in running if it[1].poll() is not None or time.monotonic() >= it[3]]
        if not done:
            time.sleep(0.05)
            continue
        for item in done:
            running.remove(item)
            prop, proc, began, until, shown = item
            out, err, killed = _finish(proc, until)
            seconds = round(time.monotonic() - began, 2)
            if killed:
                why = "stopped: the time budget ran out before CrossHair finished"
                results[prop] = _result(prop, UNKNOWN, seconds, why, label, scope_text, shown)
            else:
                results[prop] = _parse(prop, proc.returncode, out, err, seconds, label, scope_text,
                                       shown)
    return [results[p] for p in properties]


# -- parsing ---------------------------------------------------------------------
def _parse(prop, rc, out, err, seconds, label, scope_text, shown) -> dict:
    lines = [m for m in (_LINE.match(x) for x in out.splitlines()) if m]
    errors = [m for m in lines if m["level"] == "error"]
    if errors:
        msg = errors[0]["msg"]
        return _result(prop, COUNTEREXAMPLE, seconds, msg, label, scope_text, shown,
                       counterexample=_counterexample(msg))
    msgs = [m["msg"] for m in lines]
    if msgs and all(m.startswith("Confirmed over all paths") for m in msgs) and rc == 0:
        return _result(prop, PROVED, seconds, msgs[0], label, scope_text, shown)
    if msgs:
        why = "; ".join(dict.fromkeys(msgs))
        return _result(prop, UNKNOWN, seconds, why, label, scope_text, shown)
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return _result(prop, UNKNOWN, seconds, f"crosshair exited {rc} without a verdict: {tail}",
                   label, scope_text, shown)


def _counterexample(msg: str) -> str | None:
    m = re.search(r"when calling (.*)$", msg)
    if not m:
        return None
    text = m.group(1)
    return re.sub(r" \(which returns (.*)\)$", r" -> \1", text)


def _result(prop, result, seconds, message, label, scope_text, shown, counterexample=None) -> dict:
    return {"property": prop, "result": result, "seconds": seconds, "message": message,
            "counterexample": counterexample, "target": label, "scope": scope_text,
            "command": shown}


def _finish(proc: subprocess.Popen, until: float) -> tuple[str, str, bool]:
    """Wait until ``until`` at most (killing the process group past it); the output."""
    killed = False
    try:
        proc.wait(timeout=max(0.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        killed = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    texts = []
    for f in proc.files:  # type: ignore[attr-defined]
        f.seek(0)
        texts.append(f.read())
        f.close()
    return texts[0], texts[1], killed


# -- arguments -------------------------------------------------------------------
def _scope_text(scope) -> str:
    if scope is None:
        return DEFAULT_SCOPE.text()
    if isinstance(scope, Scope):
        return scope.text()
    return Scope.parse(str(scope)).text()


def _properties_of(module: str, target: str | None = None) -> tuple[str, ...]:
    if module == CONTRACTS_MODULE:
        if target is None:
            return PROPERTIES
        from kvcheck.targets.loading import resolve

        try:
            return _contracts.offered_by(resolve(target)[1]) or PROPERTIES
        except Exception:  # noqa: BLE001 - unloadable here: the subprocess reports it
            return PROPERTIES
    return tuple(importlib.import_module(module).PROPERTIES)


def _contracts_module_and_target(obj) -> tuple[str, str | None]:
    """(contracts module name, TARGET string for it or None for the reference)."""
    if obj is None:
        return CONTRACTS_MODULE, None
    if isinstance(obj, types.ModuleType):
        return obj.__name__, None
    if isinstance(obj, str):
        if ":" in obj:
            return CONTRACTS_MODULE, obj
        from kvcheck.targets.registry import TARGETS

        if obj in TARGETS:
            return CONTRACTS_MODULE, obj
        return obj, None  # a contracts module by name
    if callable(obj):
        mod = sys.modules.get(getattr(obj, "__module__", ""), None)
        qual = getattr(obj, "__qualname__", "")
        if mod is None or not qual or "<" in qual:
            raise ValueError(f"{obj!r} must be defined at module level of an importable module")
        name = mod.__name__
        if name == "__main__" or name.startswith("kvcheck_target_"):
            return CONTRACTS_MODULE, f"{mod.__file__}:{qual}"
        return CONTRACTS_MODULE, f"{name}:{qual}"
    raise TypeError(f"cannot check {obj!r}: pass None, a class, a TARGET string or a module")


def _module_roots(obj) -> list[str]:
    """Where the target's module was imported from (e.g. ``tests/`` for
    ``corpus.buggy``), for the subprocess's PYTHONPATH."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, str):
        name = obj.partition(":")[0] if ":" in obj and not obj.endswith(".py") else ""
        name = "" if "/" in name or name.endswith(".py") else name
    elif callable(obj):
        name = getattr(obj, "__module__", "") or ""
    else:
        name = ""
    mod = sys.modules.get(name) if name else None
    file = getattr(mod, "__file__", None)
    if not file:
        return []
    root = Path(file).resolve().parent
    for _ in range(name.count(".") + (1 if Path(file).name == "__init__.py" else 0)):
        root = root.parent
    return [] if str(root) == os.getcwd() else [str(root)]


def summary(results: list[dict]) -> str:
    """One line per property, for humans."""
    rows = []
    for r in results:
        rows.append(f"{r['property']:<12} {r['result']:<20} {r['seconds']:>7.1f}s  {r['message']}")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - manual use
    import argparse
    import json

    ap = argparse.ArgumentParser(description="CrossHair bounded proofs of the spec's contracts")
    ap.add_argument("target", nargs="?", default=None)
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--per-condition-timeout", type=float, default=120.0)
    ap.add_argument("--scope", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run_crosshair(a.target, a.budget, a.per_condition_timeout, scope=a.scope, jobs=a.jobs)
    print(json.dumps(res, indent=2) if a.json else summary(res))
