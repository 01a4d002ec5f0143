"""A counterexample as a standalone pytest file.

``pytest_source(trace, target)`` returns the text of a test module that
imports kvcheck, embeds the trace's operations as ``Op(...)`` literals (the
trace's model builds them from its operation table; no pickles, nothing loaded
at run time but the target) and replays them under the model's oracle in full
mode: the same file for every model. The test fails while the target still breaks the
spec on those operations and passes once it is fixed. ``KVCHECK_TARGET`` in
the environment points it at another allocator.

Everything taken from the trace is emitted as a Python literal (``repr`` of
an int or str) or as a comment stripped of anything but printable
characters, so a hostile trace cannot inject code into the file.
"""

from __future__ import annotations

from kvcheck.check.model import model_named
from kvcheck.check.trace import Trace


def _comment(text: str, width: int = 96) -> list[str]:
    """``text`` as comment lines: printable characters only, wrapped."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    words, lines, line = clean.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        lines.append(line)
    return [f"#   {x}" for x in lines] or ["#"]


def portable_target(target: str, path=None) -> tuple[str, str | None]:
    """``(target, relative_file)``: a ``file.py:attr`` target as the test file at ``path``
    names it from any checkout and any directory: its module where it is importable from
    ``sys.path``, else ``relative_file``, the file's path relative to the test's own folder
    (``target`` is then ``:attr``, joined at run time); without ``path``, absolute."""
    from kvcheck.check.portable import recorded
    from kvcheck.targets.loading import location

    if path is None:
        return location(target), None
    spec, target_file = recorded(location(target), path)
    if target_file is None:
        return spec, None
    return spec[len(target_file["path"]):], target_file["path"]


def _op_literal(model, op) -> str:
    """``Op('kind', arg=value, ...)``: the request, its values as Python literals."""
    spec = model.spec_of(op)
    args = ", ".join(f"{a.name}={_literal(getattr(op, a.name))}" for a in spec.args)
    return f"Op({op.kind!r}" + (f", {args})" if args else ")")


def pytest_source(trace: Trace, target: str | None = None, timeout: float = 10.0,
                  path=None) -> str:
    """The reproducer's source text, checking ``target`` (default: the recorded one), as
    written to ``path`` (a file target is then named relative to it: the test runs from
    any checkout of the project)."""
    model = model_named(trace.model)
    target, rel = portable_target(target or trace.loadable_target(), path)
    if rel is None:
        target_line = f"TARGET = os.environ.get(\"KVCHECK_TARGET\") or {target!r}"
    else:
        target_line = ("HERE = os.path.dirname(os.path.abspath(__file__))\n"
                       f"TARGET = os.environ.get(\"KVCHECK_TARGET\") or os.path.join(HERE, {rel!r})"
                       f" + {target!r}")
    v = trace.violation
    head = [
        "# Reproducer for a kvcheck counterexample, written by `kvcheck replay --pytest-out`.",
        "#",
        f"# Recorded on: {trace.target!r}, seed {trace.seed!r}, kvcheck {trace.kvcheck_version!r}",
        f"# Model: {model.name} ({model.title})",
    ]
    if v is not None:
        head.append(f"# Violation at step {v.step!r} ({v.kind}):")
        head += _comment(v.name)
        if v.witness:
            head.append("# What happened:")
            head += _comment(v.witness)
    head += [
        "#",
        "# The test passes when the target meets the spec on these operations and fails",
        "# while the violation reproduces. Run it as:  pytest THIS_FILE",
        "# or against another target:  KVCHECK_TARGET=reference pytest THIS_FILE",
    ]
    head = [line if line.isprintable() else "#" for line in head]
    ops = "\n".join(f"    {_op_literal(model, op)}," for op in trace.ops)
    scope = {k: int(x) for k, x in trace.scope_json().items()}
    return "\n".join(head) + f'''

import os

from kvcheck.verify import Op, replay_ops

MODEL = {model.name!r}
{target_line}
SCOPE = {scope!r}
TIMEOUT = {float(timeout)!r}  # seconds one operation may take before it counts as a hang
SETTINGS = {dict(trace.settings)!r}  # how the target was run beyond its scope (per model)
OPS = [
{ops}
]


def test_kvcheck_counterexample():
    result = replay_ops(MODEL, TARGET, SCOPE, OPS, timeout=TIMEOUT, extra=SETTINGS)
    v = result.violation
    assert v is None, f"{{TARGET}}: step {{v.step}} ({{v.kind}}) {{v.name}}: {{v.witness}}"
'''


def _literal(value) -> str:
    """``value`` (a trace's JSON: ints, strings, lists, objects) as the text of a Python literal."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(str(k))}: {_literal(x)}" for k, x in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(x) for x in value) + "]"
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    return repr(str(value))
