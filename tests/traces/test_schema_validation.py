"""The trace schema is validated by fastjsonschema on a rewritten copy of the schema
(``kvcheck.check.trace``: tagged ``oneOf``s dispatched, ``oneOf [null, X]`` merged, ``$ref``s
inlined). The rewrite must accept exactly the traces the schema does: jsonschema (the
reference implementation) judges the same documents, the committed traces of every model
and thousands of seeded mutations of them, and a rejected one is one line naming its field."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest

from kvcheck.check.trace import Trace, TraceError, _schema, parse, validate

ROOT = Path(__file__).resolve().parents[2]
# kvcheck's own traces, every model that has one committed (blocks, prefix, window, engine...)
TRACES = sorted(p for p in (ROOT / "docs" / "traces").rglob("*.json"))
VALUES = [None, True, False, 0, -1, 1, 2**31, 2**63, "", "x", "allocate", "ok", [], [0], [None],
          {}, {"op": "allocate"}, 1.5]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))


def _mutate(data, rng: random.Random):
    """One random change: a value replaced, a key dropped, a key added, an item dropped or
    duplicated."""
    data = copy.deepcopy(data)
    path = rng.choice([p for p in _paths(data) if p])
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    how = rng.randrange(4)
    if how == 0:
        parent[last] = copy.deepcopy(rng.choice(VALUES))
    elif how == 1:
        del parent[last]
    elif how == 2 and isinstance(parent, dict):
        parent[rng.choice(["evil", "op", "seq", "result", "outcome", "block", "x_y"])] = rng.choice(VALUES)
    else:
        parent.insert(last, copy.deepcopy(parent[last])) if isinstance(parent, list) else None
    return data


def test_there_are_traces_of_several_models():
    models = {json.loads(p.read_text()).get("model", "blocks") for p in TRACES}
    assert len(TRACES) >= 10 and {"blocks", "prefix", "engine"} <= models, models


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_rewrite_judges_as_jsonschema_does(path):
    original = parse(path.read_text())
    name = original.get("model", "blocks")
    s = _schema((name,))
    reference = jsonschema.Draft202012Validator(s)
    validate(original, s)  # a committed trace is valid
    assert reference.is_valid(original)
    rng = random.Random(path.name)
    rejected = 0
    for _ in range(150):
        data = _mutate(original, rng)
        try:
            validate(data, s)
            ours = None
        except TraceError as exc:
            ours = str(exc)
        expected = reference.is_valid(data)
        assert (ours is None) == expected, (path.name, ours, next(reference.iter_errors(data), None))
        if ours is not None:
            rejected += 1
            assert "\n" not in ours and len(ours) < 400 and re.match(r"trace(\.|\[|:)", ours), ours
    assert rejected >= 15  # the mutations do reach the schema's rules (an engine state is open)


def test_an_integral_float_is_not_an_integer():
    """JSON Schema counts 2.0 as an integer; a trace's ids and counts are never floats."""
    good = {"format": "kvcheck.trace", "version": 2, "model": "blocks", "target": "reference",
            "scope": {"num_blocks": 4, "block_size": 2},
            "ops": [{"op": "allocate", "seq": 0, "n_tokens": 1}]}
    assert Trace.loads(json.dumps(good)).ops[0].n_tokens == 1
    for text, shown in (("2.0", "2.0"), ("1e1", "10.0"), ("1.5", "1.5")):
        raw = json.dumps(good).replace('"n_tokens": 1', f'"n_tokens": {text}')
        with pytest.raises(TraceError, match=re.escape(f"trace.ops[0].n_tokens: expected integer, got {shown}")):
            Trace.loads(raw, "t")
        with pytest.raises(TraceError, match=re.escape(f"trace.ops[0].n_tokens: expected integer, got {shown}")):
            Trace.from_json(json.loads(raw))  # Python's own values: the same


def test_an_unknown_operation_and_a_bad_field_of_the_meant_one_are_named():
    base = {"format": "kvcheck.trace", "version": 2, "model": "blocks", "target": "reference",
            "scope": {"num_blocks": 4, "block_size": 2}}
    cases = [({"op": "rm_rf", "seq": 0}, r"trace\.ops\[1\]: unknown operation 'rm_rf' \(expected one of "
                                         r"allocate, append_slot, "),
             ({"op": "fork", "parent": 0, "child": -2}, r"trace\.ops\[1\]\.child: must be >= 0, got -2"),
             ({"op": "fork", "parent": 0}, r"trace\.ops\[1\]: missing 'child'"),
             ({"op": "free_seq", "seq": 0, "result": {"outcome": "ok", "x": 1}},
              r"trace\.ops\[1\]\.result: unexpected key 'x'")]
    for op, message in cases:
        data = {**base, "ops": [{"op": "allocate", "seq": 0, "n_tokens": 1}, op]}
        with pytest.raises(TraceError, match=message):
            Trace.loads(json.dumps(data), "t")
