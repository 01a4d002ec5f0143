"""Rendering a counterexample trace as plain English, step by step."""

from __future__ import annotations

from kvcheck.trace import Trace
from kvcheck.witness import describe_op


def _state_line(state: dict) -> str:
    tables = state.get("tables", {})
    lens = state.get("lens", {})
    refs = state.get("refs", [])
    seqs = "; ".join(f"seq {q}: {lens.get(q, '?')} tokens in {t}" for q, t in tables.items())
    shared = ", ".join(f"block {b}={r}" for b, r in enumerate(refs) if r > 1)
    parts = [seqs or "no sequences", f"free {state.get('free', [])}"]
    if shared:
        parts.append(f"shared: {shared}")
    return " | ".join(parts)


def render(trace: Trace, title: str = "Counterexample") -> str:
    v = trace.violation
    lines = [
        f"{title}: {trace.target} with {trace.num_blocks} blocks of {trace.block_size} slots, "
        f"{len(trace.ops)} operation(s)"
    ]
    for i, op in enumerate(trace.ops, 1):
        mark = ">>" if v is not None and i == v.step else "  "
        lines.append(f"{mark}{i:3d}. {describe_op(op)}")
        if i - 1 < len(trace.states) and not (v is not None and i == v.step):
            lines.append(f"        {_state_line(trace.states[i - 1])}")
    if v is not None:
        where = "at the start" if v.step == 0 else f"at step {v.step}"
        lines.append(f"VIOLATION {where} ({v.kind}): {v.name}")
        if v.witness:
            lines.append(f"  what happened: {v.witness}")
        if v.doc:
            lines.append(f"  the rule: {v.doc}")
    if trace.minimality:
        lines.append(f"  minimal: {trace.minimality}")
    return "\n".join(lines)
