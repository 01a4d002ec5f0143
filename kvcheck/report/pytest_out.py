"""A counterexample as a standalone pytest file.

``pytest_source(trace, target)`` returns the text of a test module that
imports kvcheck, embeds the trace's operations as ``Op(...)`` literals (no
pickles, nothing loaded at run time but the target) and replays them under
the oracle in full mode. The test fails while the target still breaks the
spec on those operations and passes once it is fixed. ``KVCHECK_TARGET`` in
the environment points it at another allocator.

Everything taken from the trace is emitted as a Python literal (``repr`` of
an int or str) or as a comment stripped of anything but printable
characters, so a hostile trace cannot inject code into the file.
"""

from __future__ import annotations

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


def portable_target(target: str) -> str:
    """A ``file.py:attr`` target made absolute (so the test runs from any directory)."""
    from kvcheck.targets.loading import location

    return location(target)


def _op_literal(op) -> str:
    if op.kind == "allocate":
        return f"Op('allocate', seq={op.seq!r}, n_tokens={op.n_tokens!r})"
    if op.kind == "fork":
        return f"Op('fork', seq={op.seq!r}, child={op.child!r})"
    return f"Op({op.kind!r}, seq={op.seq!r})"


def pytest_source(trace: Trace, target: str | None = None, timeout: float = 10.0) -> str:
    """The reproducer's source text, checking ``target`` (default: the recorded one)."""
    target = portable_target(target or trace.target)
    v = trace.violation
    head = [
        "# Reproducer for a kvcheck counterexample, written by `kvcheck replay --pytest-out`.",
        "#",
        f"# Recorded on: {trace.target!r}, seed {trace.seed!r}, kvcheck {trace.kvcheck_version!r}",
    ]
    if v is not None:
        head.append(f"# Violation at step {v.step!r} ({v.kind}):")
        head += _comment(v.name)
        if v.witness:
            head.append("# What happened:")
            head += _comment(v.witness)
    head += [
        "#",
        "# The test passes when the allocator meets the spec on these operations and fails",
        "# while the violation reproduces. Run it as:  pytest THIS_FILE",
        "# or against another allocator:  KVCHECK_TARGET=reference pytest THIS_FILE",
    ]
    head = [line if line.isprintable() else "#" for line in head]
    if trace.model != "blocks":
        return "\n".join(head) + _model_body(trace, target, timeout)
    ops = "\n".join(f"    {_op_literal(op)}," for op in trace.ops)
    return "\n".join(head) + f'''

import os

from kvcheck.targets.loading import resolve
from kvcheck.shrink import replay
from kvcheck.spec.contracts import Op

TARGET = os.environ.get("KVCHECK_TARGET") or {target!r}
NUM_BLOCKS = {trace.num_blocks!r}
BLOCK_SIZE = {trace.block_size!r}
TIMEOUT = {float(timeout)!r}  # seconds one operation may take before it counts as a hang
OPS = [
{ops}
]


def test_kvcheck_counterexample():
    _, factory = resolve(TARGET)
    result = replay(factory, NUM_BLOCKS, BLOCK_SIZE, OPS, timeout=TIMEOUT)
    v = result.violation
    assert v is None, f"{{TARGET}}: step {{v.step}} ({{v.kind}}) {{v.name}}: {{v.witness}}"
'''


def _model_body(trace: Trace, target: str, timeout: float) -> str:
    """The test for a trace of any model: its operations as the trace's JSON (literals of
    ints, strings and lists, from a validated trace), replayed by ``kvcheck.check.run``."""
    from kvcheck.check.model import model_named

    model = model_named(trace.model)
    requests = []
    for op in trace.ops:
        d = model.op_to_json(model.request(op))
        d.pop("result", None)
        requests.append(f"    {d!r},")
    ops = "\n".join(requests)
    return f'''

import os

from kvcheck.check.model import Options, model_named
from kvcheck.check.run import replay
from kvcheck.targets.loading import resolve

TARGET = os.environ.get("KVCHECK_TARGET") or {target!r}
MODEL = model_named({trace.model!r})
SCOPE = MODEL.scope_from_json({trace.scope_json()!r})
TIMEOUT = {float(timeout)!r}  # seconds one operation may take before it counts as a hang
OPS = [MODEL.op_from_json(op) for op in [
{ops}
]]


def test_kvcheck_counterexample():
    _, factory = resolve(TARGET)
    result = replay(MODEL, factory, SCOPE, OPS, Options(timeout=TIMEOUT))
    v = result.violation
    assert v is None, f"{{TARGET}}: step {{v.step}} ({{v.kind}}) {{v.name}}: {{v.witness}}"
'''
