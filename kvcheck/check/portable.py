"""Traces that name their target portably (issue 35 §3): a colleague's checkout, a CI
runner or another directory replays a trace without ``--target``.

A ``file.py:attr`` target is recorded, when a trace is written to a file,

* as ``module:attr`` when the file is importable as that module in any process of this
  environment (a fresh interpreter's ``sys.path``, without the working directory, which
  differs between machines: an installed package, a ``src/`` layout installed in
  development mode, a folder on ``PYTHONPATH``; not a folder a test runner added);
* otherwise as a path *relative to the trace file* (``../corpus/buggy.py:Thing``), with
  the file's SHA-256 in ``target_file`` so that a stale copy is told apart.

Reading it back (``located``), a relative file is looked for beside the trace, then in
the current directory, then under each ``sys.path`` entry, the first with the recorded
hash preferred; a path that resolves nowhere is one clear line with the ``--target``
hint. Old traces recording an absolute path keep loading wherever the path exists.
Registered names and ``module:attr`` targets are portable as they are.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path


class TargetNotFound(Exception):
    """A trace's recorded target file is nowhere to be found (bad input)."""


def is_file(where: str) -> bool:
    """Whether the part before a target's ``:attr`` names a file, not a module."""
    return where.endswith(".py") or "/" in where or os.sep in where


def _file_part(spec: str) -> tuple[str, str] | None:
    """``(file, attr)`` of a ``file.py:attr`` (or ``file.py:attr@version``) target."""
    where, sep, attr = spec.rpartition(":")
    if sep and where and attr and is_file(where):
        return where, attr
    return None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@cache
def _fresh_path() -> tuple[str, ...]:
    """``sys.path`` as a fresh interpreter of this environment starts with (site-packages,
    ``.pth`` entries, ``PYTHONPATH``), without its working directory: what every process
    replaying a trace sees, unlike entries this process added at run time (a test runner's
    rootdir, ``sys.path.insert``)."""
    try:
        out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(),
                             check=True).stdout
        return tuple(e for e in json.loads(out) if e)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()


def module_name(path: Path) -> str | None:
    """The name ``path`` is importable as in any process of this environment (from a fresh
    interpreter's ``sys.path``, without the working directory), or None. Checked by finding
    the module's spec here too (its parent packages are imported, as loading the target
    would)."""
    path = path.resolve()
    cwd = Path.cwd().resolve()
    tmp = Path(tempfile.gettempdir()).resolve()
    for entry in _fresh_path():
        try:
            base = Path(entry).resolve()
        except (OSError, RuntimeError):
            continue
        if base in (cwd, tmp) or not base.is_dir():
            continue
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        if not parts or not all(p.isidentifier() for p in parts):
            continue
        name = ".".join(parts)
        try:
            spec = importlib.util.find_spec(name)
        except BaseException:  # noqa: BLE001 - a parent package that fails to import: not this way
            continue
        origin = getattr(spec, "origin", None)
        if origin and Path(origin).resolve() == path:
            return name
    return None


def recorded(spec: str, trace_path) -> tuple[str, dict | None]:
    """What a trace written to ``trace_path`` records for target ``spec``: ``(target,
    target_file)`` (``target_file``: ``{"path", "sha256"}`` of a relative file, else None)."""
    part = _file_part(spec)
    if part is None:
        return spec, None
    where, attr = part
    path = Path(where)
    if not path.is_file():
        return spec, None
    name = module_name(path)
    if name is not None:
        return f"{name}:{attr}", None
    folder = Path(trace_path).resolve().parent
    rel = Path(os.path.relpath(path.resolve(), folder)).as_posix()
    return f"{rel}:{attr}", {"path": rel, "sha256": sha256(path)}


def located(spec: str, trace_path=None, target_file: dict | None = None) -> tuple[str, str]:
    """The target to load for a trace's recorded ``spec``: ``(spec, note)``, a relative
    file resolved to an absolute one (``note``: "" or a line about a stale copy). Raises
    ``TargetNotFound`` when a recorded file exists nowhere."""
    part = _file_part(spec)
    if part is None:
        return spec, ""
    where, attr = part
    path = Path(where)
    if path.is_absolute():
        if path.is_file():
            return spec, ""
        raise TargetNotFound(f"the recorded target file {where} does not exist here")
    roots = ([Path(trace_path).resolve().parent] if trace_path is not None else []) + \
        [Path.cwd()] + [Path(e) for e in sys.path if e]
    found = []
    for root in roots:
        cand = root / path
        if cand.is_file() and cand.resolve() not in found:
            found.append(cand.resolve())
    if not found:
        looked = "beside the trace, " if trace_path is not None else ""
        raise TargetNotFound(f"the recorded target file {where} was found nowhere ({looked}in "
                             f"the current directory or under sys.path)")
    want = (target_file or {}).get("sha256")
    for cand in found:
        if want is None or sha256(cand) == want:
            return f"{cand}:{attr}", ""
    return f"{found[0]}:{attr}", (f"note: {found[0]} differs from the file the trace was "
                                  f"recorded on (SHA-256 {want[:12]}...): replaying on it")
