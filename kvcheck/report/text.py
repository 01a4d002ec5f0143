"""Rendering a counterexample trace as plain English, step by step.

``render(trace)`` prints every operation with what it did in words and the
observed state after it, marks the violating step with ``>>``, and ends with
the broken rule and its witness (the concrete numbers on both sides).
"""

from __future__ import annotations

from kvcheck.check.trace import Trace
from kvcheck.models.blocks.witness import describe_op

_KIND_WORDS = {
    "invariant": "a state invariant broke",
    "contract": "an operation broke its contract",
    "data": "a sequence read back tokens that are not its own",
    "crash": "an operation raised an exception other than out-of-blocks (or tried to end the process)",
    "hang": "an operation did not return in time",
    "malformed": "the allocator returned or exposed something of the wrong shape",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def state_line(state: dict) -> str:
    """One observed state, in one line."""
    tables = state.get("tables", {})
    lens = state.get("lens", {})
    refs = state.get("refs", [])
    seqs = "; ".join(f"seq {q}: {_plural(lens[q], 'token') if q in lens else '? tokens'} in {t}"
                     for q, t in tables.items())
    shared = ", ".join(f"block {b}={r}" for b, r in enumerate(refs) if r > 1)
    free = state.get("free", [])
    shown = str(free)
    if len(free) > 32:
        shown = f"[{', '.join(map(str, free[:32]))}, ...] ({len(free)} entries)"
    parts = [seqs or "no sequences", f"free {shown}"]
    if shared:
        parts.append(f"shared: {shared}")
    return " | ".join(parts)


_state_line = state_line  # the old private name


def describe_step(op, before: dict | None, after: dict | None, block_size: int) -> str:
    """What one operation did, in words, from the states around it (either may be missing)."""
    q = op.seq
    free0 = set(before.get("free", [])) if before is not None else None
    free1 = set(after.get("free", [])) if after is not None else None
    table1 = (after or {}).get("tables", {}).get(str(op.child if op.kind == "fork" else q))
    if op.outcome == "oob":
        if op.kind == "allocate":
            need = -(-op.n_tokens // block_size)
            have = f", {len(before.get('free', []))} free" if before is not None else ""
            return (f"out of blocks: {_plural(op.n_tokens, 'token')} need "
                    f"{_plural(need, 'block')}{have}; nothing may change")
        return "out of blocks; nothing may change"
    if op.kind == "allocate":
        where = f" in {table1}" if table1 is not None else ""
        return f"sequence {q} is given {_plural(op.n_tokens, 'token')}{where}"
    if op.kind == "fork":
        where = f", sharing blocks {table1}" if table1 is not None else ""
        return f"sequence {op.child} starts as a copy of sequence {q}{where}"
    if op.kind == "free_seq":
        if free0 is not None and free1 is not None:
            back = sorted(free1 - free0)
            if back:
                return f"sequence {q} is freed; block(s) {back} return to the free list"
            return f"sequence {q} is freed; no block returns to the free list"
        return f"sequence {q} is freed"
    # append_slot
    if op.block is None:
        return f"sequence {q} asks for one more slot"
    n = None
    if before is not None and str(q) in before.get("lens", {}):
        n = before["lens"][str(q)]
    token = f"token #{n}" if n is not None else "its next token"
    text = f"sequence {q} puts {token} in slot {op.offset} of block {op.block}"
    if op.cow_src is not None:
        text += f", after copying block {op.cow_src} into it"
    elif op.offset == 0:
        text += " (a fresh block)"
    return text


def render(trace: Trace, title: str = "Counterexample", source: str | None = None) -> str:
    """The trace in words; ``source`` (the trace's file) adds how to replay it."""
    v = trace.violation
    seed = "" if trace.seed is None else f", seed {trace.seed}"
    lines = [
        f"{title}: {trace.target} with {_plural(trace.num_blocks, 'block')} of "
        f"{_plural(trace.block_size, 'slot')}, {_plural(len(trace.ops), 'operation')}{seed}"
    ]
    states = trace.states
    for i, op in enumerate(trace.ops, 1):
        bad = v is not None and i == v.step
        mark = ">>" if bad else "  "
        lines.append(f"{mark}{i:3d}. {describe_op(op)}")
        before = states[i - 2] if 2 <= i <= len(states) + 1 else (
            {"tables": {}, "lens": {}, "refs": [0] * trace.num_blocks,
             "free": list(range(trace.num_blocks))} if i == 1 else None)
        after = states[i - 1] if i - 1 < len(states) else None
        if not (bad and v.kind in ("crash", "hang", "malformed")):
            lines.append(f"        {describe_step(op, before, after, trace.block_size)}")
        if after is not None:
            stale = bad and v.kind in ("crash", "hang", "malformed")
            label = "last state observed" if stale else "state after" if bad else "state"
            lines.append(f"        {label}: {state_line(after)}")
    if v is not None:
        where = "at the start" if v.step == 0 else f"at step {v.step}"
        lines.append(f"VIOLATION {where} ({v.kind}): {v.name}")
        if v.kind in _KIND_WORDS:
            lines.append(f"  in short: {_KIND_WORDS[v.kind]}")
        if v.witness:
            lines.append(f"  what happened: {v.witness}")
        if v.doc:
            lines.append(f"  the rule: {v.doc}")
    if trace.minimality:
        lines.append(f"  minimal: {trace.minimality}")
    if source:
        lines.append(f"  replay: kvcheck replay {source} [--target TARGET]")
    return "\n".join(lines)
