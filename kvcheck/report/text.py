"""Rendering a counterexample trace as plain English, step by step.

``render(trace)`` prints every operation with what it did in words and the
observed state after it, marks the violating step with ``>>``, and ends with
the broken rule and its witness (the concrete numbers on both sides).
"""

from __future__ import annotations

import re

from kvcheck.check.model import model_named
from kvcheck.check.trace import Trace
from kvcheck.spec.state import BLOCK_VALUED, NULL

_KIND_WORDS = {
    "invariant": "a state invariant broke",
    "contract": "an operation broke its contract",
    "data": "a block holds K/V of tokens other than its own (a sequence would read them back)",
    "crash": "an operation raised an exception other than out-of-blocks (or tried to end the process)",
    "hang": "an operation did not return in time",
    "malformed": "the allocator returned or exposed something of the wrong shape",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def state_line(state: dict, model: str = "blocks") -> str:
    """One observed state of ``model``, in one line."""
    return model_named(model).state_line(state)


def describe_step(op, before: dict | None, after: dict | None, block_size: int,
                  model: str = "blocks") -> str:
    """What one operation did, in words, from the states around it (either may be missing)."""
    return model_named(model).narrate(op, before, after, block_size)


def terms_line(terms: list[dict]) -> str:
    """The evidence of a violation in one line: ``ref(3) 0 -> 2; holders(3) 1``. A value a
    state could not give (recorded as null) is left out, with the state that gave the other
    one named; a term no state could value is left out."""
    parts = []
    for t in terms:
        sides = [(k, t[k]) for k in ("pre", "post", "state", "value") if k in t]
        known = [(k, v) for k, v in sides if v is not None]
        if not known:
            continue
        term = t["term"]
        if [k for k, _ in sides] == ["pre", "post"] and len(known) == 2:
            pre, post = known[0][1], known[1][1]
            if pre != post:
                parts.append(f"{term} {term_value(term, pre)} -> {term_value(term, post)}")
                continue
        key, value = known[-1]
        which = {"pre": " before", "post": " after"}.get(key, "") if len(known) < len(sides) else ""
        parts.append(f"{term} = {term_value(term, value)}{which}")
    return "; ".join(parts)


def term_value(term: str, v) -> str:
    """A term's value as a report writes it: ``true``/``false``, a block-valued term's
    ``NULL`` as ``null`` (``spec.state.BLOCK_VALUED``), ``not observed`` for none."""
    if v is None:
        return "not observed"
    if isinstance(v, bool):
        return str(v).lower()
    if v == NULL and term.split("(", 1)[0] in BLOCK_VALUED:
        return "null"
    return str(v)


def rule_text(doc: str) -> str:
    """A rule's wording for a reader: the spec's ````name```` markup written plainly."""
    return re.sub(r"``([^`]+)``", r"\1", doc)


def render(trace: Trace, title: str = "Counterexample", source: str | None = None) -> str:
    """The trace in words; ``source`` (the trace's file) adds how to replay it."""
    v = trace.violation
    m = model_named(trace.model)
    seed = "" if trace.seed is None else f", seed {trace.seed}"
    lines = [
        f"{title}: {trace.target} with {_plural(trace.num_blocks, 'block')} of "
        f"{_plural(trace.block_size, 'slot')}{m.scope_words(trace.scope)}, "
        f"{_plural(len(trace.ops), 'operation')}{seed}"
    ]
    states = trace.states
    for i, op in enumerate(trace.ops, 1):
        bad = v is not None and i == v.step
        mark = ">>" if bad else "  "
        lines.append(f"{mark}{i:3d}. {m.describe(op)}")
        before = states[i - 2] if 2 <= i <= len(states) + 1 else (
            m.initial_state_json(trace.scope) if i == 1 else None)
        after = states[i - 1] if i - 1 < len(states) else None
        if not (bad and v.kind in ("crash", "hang", "malformed")):
            lines.append(f"        {m.narrate(op, before, after, trace.block_size)}")
        if after is not None:
            stale = bad and v.kind in ("crash", "hang", "malformed")
            label = "last state observed" if stale else "state after" if bad else "state"
            lines.append(f"        {label}: {m.state_line(after)}")
    if v is not None:
        where = "at the start" if v.step == 0 else f"at step {v.step}"
        lines.append(f"VIOLATION {where} ({v.kind}): {v.name}")
        if v.kind in _KIND_WORDS:
            lines.append(f"  in short: {_KIND_WORDS[v.kind]}")
        if v.witness:
            lines.append(f"  what happened: {v.witness}")
        if v.terms:
            lines.append(f"  the terms it reads: {terms_line(v.terms)}")
        if v.doc:
            lines.append(f"  the rule: {rule_text(v.doc)}")
    if trace.minimality:
        lines.append(f"  minimal: {trace.minimality}")
    if source:
        lines.append(f"  replay: kvcheck replay {source} [--target TARGET]")
    return "\n".join(lines)
