"""A trace in Apalache's Informal Trace Format (ITF), for TLA+ tooling.

ITF (https://apalache-mc.org/docs/adr/015adr-trace.html) is plain JSON: a
``#meta`` header, the names of the state variables (``vars``) and the states in
order, each a record of those variables. Values are encoded the ITF way:
integers as ``{"#bigint": "..."}``, lists as arrays, maps (a table per
sequence) as ``{"#map": [[key, value], ...]}``, sets as ``{"#set": [...]}``.

kvcheck's states become ITF states: state 0 is the state before the first
operation (when the model knows it), state i the state observed after
operation i; every state also carries ``action`` (the operation that led to it,
in words: ``init`` for state 0) and ``outcome``. The violation, with its
evidence, is in the header's ``description`` and in ``#meta.violation``. Any
model works: its recorded states are converted as they are.
"""

from __future__ import annotations

import json

from kvcheck import __version__
from kvcheck.check.model import model_named
from kvcheck.check.trace import Trace

FORMAT_DESCRIPTION = "https://apalache-mc.org/docs/adr/015adr-trace.html"


def value(v):
    """A JSON value from a kvcheck state, in ITF's encoding."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return "" if v is None else v
    if isinstance(v, int):
        return {"#bigint": str(v)}
    if isinstance(v, float):
        return {"#unserializable": repr(v)}
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return {"#set": [value(x) for x in sorted(v, key=repr)]}
    if isinstance(v, dict):
        if all(isinstance(k, str) and _is_int(k) for k in v) and v:
            return {"#map": [[value(int(k)), value(x)] for k, x in sorted(v.items(),
                                                                      key=lambda i: int(i[0]))]}
        return {str(k): value(x) for k, x in v.items()}
    return {"#unserializable": repr(v)}


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def to_itf(trace: Trace) -> dict:
    """The trace as one ITF object."""
    m = model_named(trace.model)
    first = m.initial_state_json(trace.scope)
    recorded = ([first] if first is not None else []) + list(trace.states)
    offset = 0 if first is not None else 1
    names: list[str] = []
    for st in recorded:
        for k in st:
            if k not in names:
                names.append(k)
    states = []
    for i, st in enumerate(recorded):
        step = i + offset  # the operation that led here (0: none)
        op = trace.ops[step - 1] if step >= 1 else None
        rec = {"#meta": {"index": i, "step": step},
               "action": "init" if op is None else m.describe(op),
               "outcome": "" if op is None else str(op.outcome)}
        for k in names:
            rec[k] = value(st.get(k, ""))
        states.append(rec)
    v = trace.violation
    meta = {
        "format": "ITF",
        "format-description": FORMAT_DESCRIPTION,
        "source": trace.target,
        "description": (f"kvcheck {m.name} trace: {len(trace.ops)} operation(s)"
                        + ("" if v is None else f"; violation at step {v.step} ({v.kind}): "
                                                 f"{v.name}: {v.witness}")),
        "kvcheck": {"version": __version__, "model": m.name, "scope": trace.scope_json(),
                    "seed": trace.seed, "minimality": trace.minimality},
    }
    if v is not None:
        meta["violation"] = v.to_json()
    return {"#meta": meta, "params": [], "vars": ["action", "outcome", *names],
            "states": states}


def dumps(trace: Trace) -> str:
    return json.dumps(to_itf(trace), indent=1)
