"""Counterexample traces: a stable, versioned JSON format.

A trace is everything needed to reproduce a violation on any allocator:
the scope (pool size, block size), where it came from (target, seed,
kvcheck version), the operations with their arguments and results, the
observed state after each step, and the broken rule with its step.

The format is written down as a JSON Schema (``kvcheck/trace_schema.json``,
described in ``docs/trace-format.md``). Loading reads at most ``MAX_BYTES``,
decodes strict UTF-8, parses strict JSON (no NaN/Infinity, no duplicate
keys), validates against that schema and then checks what a schema cannot
say (ids within the pool, a state per step at most). It never executes
anything from the file: every failure is a one-line ``TraceError``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from kvcheck import __version__
from kvcheck.spec.contracts import Op
from kvcheck.violation import Violation

FORMAT = "kvcheck.trace"
VERSION = 1
KINDS = ("allocate", "append_slot", "fork", "free_seq")
MAX_BYTES = 64 * 1024 * 1024  # a trace bigger than this is refused unread
MAX_BLOCK_SIZE = 65536  # the schema's scope.block_size maximum (the largest block a trace records)
# The longest prompt kvcheck runs: 2**24 tokens, beyond any model's context window. A
# trace may record more (the schema allows up to 2**31 - 1), but replaying such a prompt
# would have an allocator that materialises its tokens run out of memory, a false alarm:
# ``kvcheck replay`` refuses it instead.
MAX_PROMPT = 2**24


class TraceError(Exception):
    """The file is not a valid kvcheck trace (bad input, exit 2)."""


def request(op: Op) -> Op:
    """The call alone, without any outcome (what is replayed)."""
    return Op(op.kind, seq=op.seq, child=op.child, n_tokens=op.n_tokens)


def op_to_json(op: Op) -> dict:
    d: dict = {"op": op.kind}
    if op.kind == "fork":
        d.update(parent=op.seq, child=op.child)
    else:
        d["seq"] = op.seq
    if op.kind == "allocate":
        d["n_tokens"] = op.n_tokens
    result: dict = {"outcome": op.outcome}
    if op.kind == "append_slot" and op.outcome == "ok" and op.block is not None:
        result.update(block=op.block, offset=op.offset, cow_src=op.cow_src)
    d["result"] = result
    return d


def op_from_json(d, where: str = "op") -> Op:
    """An ``Op`` from its JSON object (validated against the schema first)."""
    _validate(d, _schema()["$defs"]["op"], where)
    kind = d["op"]
    if kind == "fork":
        op = Op(kind, seq=d["parent"], child=d["child"])
        if op.seq == op.child:
            raise TraceError(f"{where}: a sequence cannot fork into itself")
    elif kind == "allocate":
        op = Op(kind, seq=d["seq"], n_tokens=d["n_tokens"])
    else:
        op = Op(kind, seq=d["seq"])
    result = d.get("result", {"outcome": "ok"})
    op.outcome = result["outcome"]
    if kind == "append_slot" and "block" in result:
        if "offset" not in result:
            raise TraceError(f"{where}.result: 'block' given without 'offset'")
        cow = result.get("cow_src")
        op.block, op.offset = result["block"], result["offset"]
        op.cow_src, op.has_cow = cow, cow is not None
    return op


# -- the schema, and a validator for the part of JSON Schema it uses ---------------------------
@cache
def _schema() -> dict:
    return json.loads(resources.files("kvcheck").joinpath("trace_schema.json").read_text("utf-8"))


def schema() -> dict:
    """The JSON Schema of the trace format (a fresh copy)."""
    return json.loads(json.dumps(_schema()))


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def _show(v) -> str:
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _validate(v, s: dict, where: str) -> None:
    """Check ``v`` against schema ``s``; raise ``TraceError`` at the first problem.

    Supports what ``trace_schema.json`` uses: $ref (local), type, const, enum,
    minimum/maximum, minLength/maxLength, pattern, items/maxItems, required,
    properties, additionalProperties, propertyNames, maxProperties, oneOf.
    Recursion follows the schema, whose nesting is bounded, never the data.
    """
    if "$ref" in s:
        ref = s["$ref"]
        node = _schema()
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        _validate(v, node, where)
    if "oneOf" in s:
        _one_of(v, s["oneOf"], where)
    if "const" in s and not (v == s["const"] and type(v) is type(s["const"])):
        raise TraceError(f"{where}: expected {s['const']!r}, got {_show(v)}")
    if "enum" in s and not any(v == e and type(v) is type(e) for e in s["enum"]):
        allowed = ", ".join(map(repr, s["enum"]))
        raise TraceError(f"{where}: expected one of {allowed}, got {_show(v)}")
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_TYPES[t](v) for t in types):
            raise TraceError(f"{where}: expected {' or '.join(types)}, got {_show(v)}")
    if type(v) in (int, float):
        if "minimum" in s and v < s["minimum"]:
            raise TraceError(f"{where}: must be >= {s['minimum']}, got {_show(v)}")
        if "maximum" in s and v > s["maximum"]:
            raise TraceError(f"{where}: must be <= {s['maximum']}, got {_show(v)}")
    elif isinstance(v, str):
        if len(v) < s.get("minLength", 0):
            raise TraceError(f"{where}: must not be empty")
        if "maxLength" in s and len(v) > s["maxLength"]:
            raise TraceError(f"{where}: longer than {s['maxLength']} characters")
        if "pattern" in s and not re.search(s["pattern"], v):
            raise TraceError(f"{where}: {_show(v)} does not match {s['pattern']}")
    elif isinstance(v, list):
        if "maxItems" in s and len(v) > s["maxItems"]:
            raise TraceError(f"{where}: more than {s['maxItems']} items")
        if "items" in s:
            for i, item in enumerate(v):
                _validate(item, s["items"], f"{where}[{i}]")
    elif isinstance(v, dict):
        _validate_object(v, s, where)


def _validate_object(v: dict, s: dict, where: str) -> None:
    if "maxProperties" in s and len(v) > s["maxProperties"]:
        raise TraceError(f"{where}: more than {s['maxProperties']} entries")
    for key in s.get("required", ()):
        if key not in v:
            raise TraceError(f"{where}: missing '{key}'")
    props = s.get("properties", {})
    extra = s.get("additionalProperties", True)
    names = s.get("propertyNames")
    for key, item in v.items():
        if names is not None:
            _validate(key, names, f"{where}: key")
        if key in props:
            _validate(item, props[key], f"{where}.{key}")
        elif extra is False:
            raise TraceError(f"{where}: unexpected key {_show(key)}")
        elif isinstance(extra, dict):
            _validate(item, extra, f"{where}[{key}]")


def _one_of(v, alternatives: list, where: str) -> None:
    # Alternatives told apart by a constant (the "op" name, or null) are chosen by it, so the
    # error names what is wrong inside the one that was meant.
    def tag_matches(alt: dict) -> bool:
        alt = _resolve(alt)
        if alt.get("type") == "null":
            return v is None
        consts = {k: p["const"] for k, p in alt.get("properties", {}).items() if "const" in p}
        if consts:
            return isinstance(v, dict) and all(v.get(k) == c for k, c in consts.items())
        return v is not None

    meant = [a for a in alternatives if tag_matches(a)]
    if len(meant) == 1:
        _validate(v, meant[0], where)
        return
    tags = [p["const"] for a in alternatives
            for k, p in _resolve(a).get("properties", {}).items() if "const" in p]
    if isinstance(v, dict) and tags:
        raise TraceError(f"{where}: unknown operation {_show(v.get('op'))} "
                         f"(expected one of {', '.join(tags)})")
    raise TraceError(f"{where}: unexpected value {_show(v)}")


def _resolve(s: dict) -> dict:
    while "$ref" in s:
        node = _schema()
        for part in s["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        s = node
    return s


def _no_constant(name: str):
    raise TraceError(f"not valid JSON: {name} is not a number")


def _unique_keys(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise TraceError(f"not valid JSON for a trace: duplicate key {_show(dup)}")
    return d


def parse(text: str) -> dict:
    """Strict JSON: no NaN/Infinity, no duplicate keys; one-line ``TraceError`` otherwise."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise TraceError("not valid JSON for a trace: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints longer than Python will convert
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"not valid JSON: {msg}") from None


@dataclass
class Trace:
    target: str
    num_blocks: int
    block_size: int
    ops: list[Op]
    violation: Violation | None = None
    seed: int | None = None
    states: list[dict] = field(default_factory=list)
    minimality: str = ""
    kvcheck_version: str = __version__

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "kvcheck_version": self.kvcheck_version,
            "target": self.target,
            "scope": {"num_blocks": self.num_blocks, "block_size": self.block_size},
            "seed": self.seed,
            "minimality": self.minimality,
            "ops": [op_to_json(op) for op in self.ops],
            "states": self.states,
            "violation": None if self.violation is None else self.violation.to_json(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def write(self, path) -> None:
        Path(path).write_text(self.dumps() + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data) -> Trace:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(f"not a kvcheck trace (expected \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION or type(data.get("version")) is not int:
            raise TraceError(f"unsupported trace version {_show(data.get('version'))} "
                             f"(this kvcheck reads {VERSION})")
        _validate(data, _schema(), "trace")
        scope = data["scope"]
        nb, bs = scope["num_blocks"], scope["block_size"]
        ops = [op_from_json(d, f"trace.ops[{i}]") for i, d in enumerate(data["ops"])]
        states = data.get("states", [])
        if len(states) > len(ops):
            raise TraceError(f"trace.states: {len(states)} states for {len(ops)} operations")
        for i, st in enumerate(states):
            if len(st["refs"]) != nb:
                raise TraceError(f"trace.states[{i}].refs: {len(st['refs'])} refcounts for a pool "
                                 f"of {nb} blocks")
        v = data.get("violation")
        violation = None
        if v is not None:
            if v["step"] > len(ops):
                raise TraceError(f"trace.violation.step: step {v['step']} of a trace with "
                                 f"{len(ops)} operations")
            violation = Violation(**v)
        return cls(data["target"], nb, bs, ops, violation, data.get("seed"), states,
                   data.get("minimality", ""), data.get("kvcheck_version", ""))

    @classmethod
    def loads(cls, raw: bytes | str, name: str = "trace") -> Trace:
        if isinstance(raw, bytes):
            if len(raw) > MAX_BYTES:
                raise TraceError(f"{name} is larger than {MAX_BYTES // 2**20} MiB")
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"{name} is not UTF-8 text (byte {exc.start})") from None
        if len(raw) > MAX_BYTES:
            raise TraceError(f"{name} is larger than {MAX_BYTES // 2**20} MiB")
        try:
            return cls.from_json(parse(raw))
        except TraceError as exc:
            raise TraceError(f"{name}: {exc}") from None

    @classmethod
    def load(cls, path) -> Trace:
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:  # e.g. a NUL in the name
            raise TraceError(f"cannot read {path!r}: {exc}") from None
        return cls.loads(raw, str(path))
