"""Counterexample traces: one stable, versioned JSON format for every model.

A trace is everything needed to reproduce a violation on any target of its
model: which model (``blocks``, ``prefix``, ``scheduler``, ``device``), the
scope (pool size, block size, and what else the model sizes), where it came
from (target, seed, kvcheck version), the operations with their arguments
and results, the observed state after each step, and the broken rule with
its step and evidence.

The format is written down as a JSON Schema: the envelope ships as
``kvcheck/check/trace_schema.json``; ``schema()`` adds every model's
operations and states, generated from the models' operation tables
(``kvcheck.check.model.OpSpec``), so nothing about an operation is written
twice. Loading reads at most ``MAX_BYTES``, decodes strict UTF-8, parses
strict JSON (no NaN/Infinity, no duplicate keys), validates against that
schema and then checks what a schema cannot say (the model's own rules: ids
within the pool, a state per step at most). It never executes anything from
the file: every failure is a one-line ``TraceError``. Version 1 traces (the
block manager's, before there were models) load as model ``blocks``; a model's
own format from before there was one (``"format": "kvcheck.<model>-trace"``)
loads converted by that model (``Model.legacy_trace``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from kvcheck import __version__
from kvcheck.check.model import BLOCK, COUNT, NEW_SEQ, SEQ, SEQS, TOKENS, model_named
from kvcheck.check.portable import TargetNotFound, located, recorded
from kvcheck.check.violation import Violation

FORMAT = "kvcheck.trace"
VERSION = 2
READS = (1, 2)  # the versions this kvcheck loads
MAX_BYTES = 64 * 1024 * 1024  # a trace bigger than this is refused unread
MAX_BLOCK_SIZE = 65536  # the schema's scope.block_size maximum (the largest block a trace records)
MAX_BLOCKS = 1048576  # the schema's scope.num_blocks maximum (the largest pool a trace records)
# The longest prompt kvcheck runs: 2**24 tokens, beyond any model's context window. A
# trace may record more (the schema allows up to 2**31 - 1), but replaying such a prompt
# would have an allocator that materialises its tokens run out of memory, a false alarm:
# ``kvcheck replay`` refuses it instead.
MAX_PROMPT = 2**24


class TraceError(Exception):
    """The file is not a valid kvcheck trace (bad input, exit 2)."""


# -- the schema, and a validator for the part of JSON Schema it uses ---------------------------
@cache
def _envelope() -> dict:
    return json.loads(resources.files("kvcheck.check").joinpath("trace_schema.json")
                      .read_text("utf-8"))


_ROLE_SCHEMA = {
    SEQ: {"$ref": "#/$defs/seq"},
    NEW_SEQ: {"$ref": "#/$defs/seq"},
    TOKENS: {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/token"}},
    SEQS: {"type": "array", "maxItems": 65536, "items": {"$ref": "#/$defs/seq"}},
    BLOCK: {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/block"}]},
}
_ANY_VALUE = {"type": ["integer", "string", "boolean", "null"], "maxLength": 4096}


def _arg_schema(arg, result: bool = False) -> dict:
    if arg.schema is not None:  # the model's own (a structured value)
        return arg.schema
    if arg.role == COUNT:
        return {"type": "integer", "minimum": 0 if result else arg.low, "maximum": 2147483647}
    if result and arg.role == SEQS:
        return {"type": "array", "maxItems": 65536, "items": {"$ref": "#/$defs/seq"}}
    return _ROLE_SCHEMA.get(arg.role, _ANY_VALUE)


def op_schemas(model) -> dict:
    """The JSON Schema of ``model``'s operations (one alternative per kind, told apart by
    ``"op"``), from its operation table."""
    alternatives = []
    for kind, spec in model.ops.items():
        result = {"type": "object", "required": ["outcome"], "additionalProperties": False,
                  "properties": {"outcome": {"enum": list(model.outcomes)},
                                 **{r.json_key: _arg_schema(r, True) for r in spec.results}}}
        alternatives.append({
            "type": "object", "required": ["op", *(a.json_key for a in spec.args)],
            "additionalProperties": False,
            "properties": {"op": {"const": kind},
                           **{a.json_key: _arg_schema(a) for a in spec.args},
                           "result": result}})
    return {"oneOf": alternatives}


@cache
def _schema(models: tuple[str, ...] = ("blocks", "prefix", "scheduler", "device", "hybrid")) -> dict:
    s = json.loads(json.dumps(_envelope()))
    s["title"] = "kvcheck counterexample trace, version 2"
    conditions = []
    for name in models:
        try:
            m = model_named(name)
        except (KeyError, ImportError):  # a model whose dependencies are not installed
            continue
        s["$defs"][f"{name}_op"] = op_schemas(m)
        s["$defs"][f"{name}_state"] = m.state_schema
        when = {"properties": {"model": {"const": name}}}
        if name == "blocks":  # version 1 traces name no model
            when = {"anyOf": [when, {"not": {"required": ["model"]}}]}
        conditions.append({"if": when, "then": {"properties": {
            "ops": {"items": {"$ref": f"#/$defs/{name}_op"}},
            "states": {"items": {"$ref": f"#/$defs/{name}_state"}}}}})
    s["allOf"] = conditions
    s["properties"]["model"]["enum"] = [n for n in models if f"{n}_op" in s["$defs"]]
    return s


def schema() -> dict:
    """The complete JSON Schema of the trace format, every model included (a fresh copy)."""
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

    Supports what the schema uses: $ref (local), type, const, enum,
    minimum/maximum, minLength/maxLength, pattern, items/maxItems, required,
    properties, additionalProperties, propertyNames, maxProperties, oneOf, allOf,
    anyOf, not, if/then.
    Recursion follows the schema, whose nesting is bounded, never the data.
    """
    if "$ref" in s:
        ref = s["$ref"]
        node = _ROOT[-1] if _ROOT else _schema()
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        _validate(v, node, where)
    if "oneOf" in s:
        _one_of(v, s["oneOf"], where)
    for sub in s.get("allOf", ()):
        _validate(v, sub, where)
    if "anyOf" in s and not any(_valid(v, sub) for sub in s["anyOf"]):
        raise TraceError(f"{where}: unexpected value {_show(v)}")
    if "not" in s and _valid(v, s["not"]):
        raise TraceError(f"{where}: unexpected value {_show(v)}")
    if "if" in s and _valid(v, s["if"]) and "then" in s:
        _validate(v, s["then"], where)
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


_ROOT: list[dict] = []  # the schema whose $defs a $ref names (the one being validated)


def validate(data, s: dict, where: str = "trace") -> None:
    """``data`` against the schema ``s`` (raises ``TraceError``)."""
    _ROOT.append(s)
    try:
        _validate(data, s, where)
    finally:
        _ROOT.pop()


def _valid(v, s: dict) -> bool:
    try:
        _validate(v, s, "")
    except TraceError:
        return False
    return True


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
        node = _ROOT[-1] if _ROOT else _schema()
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


def _upgraded(data):
    """A model's own trace format from before version 2 (``kvcheck.<model>-trace``), as
    version 2 JSON (``Model.legacy_trace``); anything else as it is."""
    fmt = data.get("format") if isinstance(data, dict) else None
    legacy = re.fullmatch(r"kvcheck\.([a-z][a-z_]{0,31})-trace", fmt) if isinstance(fmt, str) else None
    if legacy is None:
        return data
    try:
        converted = model_named(legacy.group(1)).legacy_trace(data)
    except KeyError:
        converted = None
    if converted is None:
        raise TraceError(f"not a kvcheck trace (expected \"format\": \"{FORMAT}\")")
    return converted


@dataclass
class Trace:
    """A run of ``model``: its operations (the model's operation objects), the states
    observed after them, and the violation it ended with (if any)."""

    target: str
    num_blocks: int
    block_size: int
    ops: list
    violation: Violation | None = None
    seed: int | None = None
    states: list[dict] = field(default_factory=list)
    minimality: str = ""
    kvcheck_version: str = __version__
    model: str = "blocks"
    extra: dict = field(default_factory=dict)  # the rest of the scope (e.g. a watermark)
    settings: dict = field(default_factory=dict)  # how the target was run (strings, per model)
    target_file: dict | None = None  # a relative file target's {"path", "sha256"} (portable)
    source: str | None = None  # the file it was loaded from (not recorded)

    @property
    def scope(self):
        """The scope as the model's own object."""
        return model_named(self.model).scope_from_json(self.scope_json())

    def scope_json(self) -> dict:
        return {"num_blocks": self.num_blocks, "block_size": self.block_size, **self.extra}

    def to_json(self) -> dict:
        m = model_named(self.model)
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "kvcheck_version": self.kvcheck_version,
            "target": self.target,
            **({"target_file": dict(self.target_file)} if self.target_file else {}),
            "scope": self.scope_json(),
            **({"settings": dict(self.settings)} if self.settings else {}),
            "seed": self.seed,
            "minimality": self.minimality,
            "ops": [m.op_to_json(op) for op in self.ops],
            "states": self.states,
            "violation": None if self.violation is None else self.violation.to_json(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def loadable_target(self) -> str:
        """The recorded target as ``resolve`` loads it: a relative file found beside the
        trace, in the current directory or under ``sys.path`` (``kvcheck.check.portable``);
        raises ``TargetNotFound`` when it is nowhere."""
        return located(self.target, self.source, self.target_file)[0]

    def dumps_for(self, path) -> str:
        """``dumps`` of the trace as written to ``path``: a file target recorded as its
        module where importable, else relative to ``path`` with its hash (portable)."""
        try:
            spec = self.loadable_target()
        except TargetNotFound:
            spec = self.target  # (kept as recorded: nothing better is known)
        target, target_file = recorded(spec, path)
        data = {}
        for k, v in self.to_json().items():
            if k == "target":
                data[k] = target
                if target_file:
                    data["target_file"] = target_file
            elif k != "target_file":
                data[k] = v
        return json.dumps(data, indent=1)

    def write(self, path) -> None:
        Path(path).write_text(self.dumps_for(path) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data) -> Trace:
        data = _upgraded(data)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(f"not a kvcheck trace (expected \"format\": \"{FORMAT}\")")
        if data.get("version") not in READS or type(data.get("version")) is not int:
            raise TraceError(f"unsupported trace version {_show(data.get('version'))} "
                             f"(this kvcheck reads {', '.join(map(str, READS))})")
        if data["version"] == 1 and "model" in data:
            raise TraceError("trace: a version 1 trace names no model")
        name = data.get("model", "blocks")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z_]{0,31}", name):
            raise TraceError(f"trace.model: {_show(name)} is not a model name")
        try:
            m = model_named(name)
        except KeyError:
            raise TraceError(f"trace.model: unknown model {name!r}") from None
        validate(data, _schema((name,)), "trace")
        scope_data = data["scope"]
        try:
            scope = m.scope_from_json(scope_data)
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"trace.scope: not a scope of model {name}: {exc}") from None
        ops = []
        for i, d in enumerate(data["ops"]):
            m.check_op_json(d, f"trace.ops[{i}]")
            ops.append(m.op_from_json(d))
        bad = m.history_error(ops, scope)
        if bad is not None:
            raise TraceError(f"trace.ops[{bad[0]}]: {bad[1]}; a trace is a run that happened, "
                             f"each operation valid after those before it")
        states = data.get("states", [])
        if len(states) > len(ops):
            raise TraceError(f"trace.states: {len(states)} states for {len(ops)} operations")
        for i, st in enumerate(states):
            m.check_state_json(st, scope, f"trace.states[{i}]")
        v = data.get("violation")
        violation = None
        if v is not None:
            if v["step"] > len(ops):
                raise TraceError(f"trace.violation.step: step {v['step']} of a trace with "
                                 f"{len(ops)} operations")
            violation = Violation.from_json(v)
        extra = {k: x for k, x in scope_data.items() if k not in ("num_blocks", "block_size")}
        return cls(data["target"], scope_data["num_blocks"], scope_data["block_size"], ops,
                   violation, data.get("seed"), states, data.get("minimality", ""),
                   data.get("kvcheck_version", ""), name, extra, dict(data.get("settings", {})),
                   dict(data["target_file"]) if data.get("target_file") else None)

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
        trace = cls.loads(raw, str(path))
        trace.source = str(path)
        return trace
