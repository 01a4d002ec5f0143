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
from decimal import Decimal
from functools import cache
from importlib import resources
from pathlib import Path

import fastjsonschema

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


# -- the schema ---------------------------------------------------------------------------------
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
            "type": "object",
            "required": ["op", *(a.json_key for a in spec.args if not a.optional)],
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


def _show(v) -> str:
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    text = repr(float(v) if isinstance(v, Decimal) else v)
    return text if len(text) <= 40 else text[:37] + "..."


# -- validation: fastjsonschema, with the schema's tagged choices dispatched here -----------------
# fastjsonschema compiles a JSON Schema into Python code (its semantics kept by its authors and
# tested against the JSON-Schema-Test-Suite). What no library does is kept here, on a copy of
# the schema that accepts exactly the same traces:
#  * a ``oneOf`` whose alternatives are told apart by a constant (each operation by its
#    ``"op"``) is a dispatch: the one meant alternative is validated and its first problem
#    named (not "valid under none of 9 definitions"), and an operation is not tried against
#    every other kind first (each try that fails builds an exception);
#  * ``oneOf: [null, X]`` is X's own type plus null (where X says nothing to other types);
#  * every ``$ref`` is inlined (fastjsonschema formats a name for every item it hands to a
#    referenced definition: 40% of the time on a big trace);
#  * the first problem is said in one line naming the field, in kvcheck's words (``_message``);
#  * JSON Schema counts 2.0 as an integer, a trace does not (an id or a count is never a
#    float): ``parse`` reads such a number as a ``Decimal``, which no "integer" accepts, and it
#    is a float again once the trace is valid (where a value may be anything).
_TAG = "kvcheck: an operation's name"  # marks a dispatch's tag (an unknown one is said so)
_SCHEMA_IN = ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else")
_SCHEMAS_IN = ("properties", "$defs")
_LISTS_IN = ("oneOf", "anyOf", "allOf")
_TYPE_ONLY = {"type", "description", "properties", "required", "additionalProperties",
              "maxProperties", "propertyNames", "items", "maxItems", "minimum", "maximum",
              "minLength", "maxLength", "pattern"}  # keywords saying nothing about other types


def _resolve_in(root: dict, node):
    while isinstance(node, dict) and "$ref" in node:
        target = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _inline(root: dict, node):
    """``node`` with every ``$ref`` replaced by the schema it names (the schema has no cycle)."""
    node = _resolve_in(root, node)
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$defs":
            continue
        if k in _SCHEMA_IN:
            out[k] = _inline(root, v)
        elif k in _SCHEMAS_IN:
            out[k] = {name: _inline(root, x) for name, x in v.items()}
        elif k in _LISTS_IN:
            out[k] = [_inline(root, x) for x in v]
        else:
            out[k] = v
    return out


def _tag_of(alt) -> tuple[str, str] | None:
    """(key, name) telling this alternative apart: one required property with a string const."""
    if not isinstance(alt, dict) or alt.get("type") != "object":
        return None
    consts = [(k, p["const"]) for k, p in alt.get("properties", {}).items()
              if isinstance(p, dict) and isinstance(p.get("const"), str) and k in alt.get("required", ())]
    return consts[0] if len(consts) == 1 else None


def _or_null(alts: list) -> dict | None:
    """``oneOf: [null, X]`` as one schema: X's type (or enum) with null added; None if X's
    keywords are not all about its own type (or null is one of X's values)."""
    if len(alts) != 2 or {"type": "null"} not in alts:
        return None
    other = alts[1] if alts[0] == {"type": "null"} else alts[0]
    types = other.get("type")
    if types is not None and set(other) <= _TYPE_ONLY:
        types = types if isinstance(types, list) else [types]
        return None if "null" in types else {**other, "type": [*types, "null"]}
    if set(other) <= {"enum", "description"} and None not in other.get("enum", [None]):
        return {**other, "enum": [*other["enum"], None]}
    return None


@dataclass
class _Dispatch:
    """Where a tagged ``oneOf`` stood: the path to its values (property names, ``*`` for each
    item), the ``if`` schemas it applies under, the tag's key, and each alternative."""

    path: tuple
    conditions: list
    key: str
    kinds: dict


def _rewritten(node, path: tuple, conditions: list, found: list, here: bool = True):
    """The inlined ``node`` as compiled (see above); its tagged choices at a known place in the
    data (``here``) appended to ``found`` as ``_Dispatch``es (their alternatives rewritten)."""
    if isinstance(node, list):
        return [_rewritten(x, path, conditions, found, False) for x in node]
    if not isinstance(node, dict):
        return node
    alts = node.get("oneOf")
    if isinstance(alts, list):
        tags = [_tag_of(a) for a in alts]
        names = [t[1] for t in tags if t is not None]
        if (here and None not in tags and len({t[0] for t in tags if t}) == 1
                and len(set(names)) == len(names) and not set(node) - {"oneOf", "description"}):
            key = tags[0][0]
            found.append(_Dispatch(path, conditions, key, {
                name: _rewritten(alt, (), [], [], False) for name, alt in zip(names, alts, strict=True)}))
            return {"type": "object", "required": [key],
                    "properties": {key: {"enum": names, "description": _TAG}}}
        merged = _or_null(alts) if not set(node) - {"oneOf", "description"} else None
        if merged is not None:
            return _rewritten(merged, path, conditions, found, here)
    out = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {name: _rewritten(x, (*path, name), conditions, found, here)
                      for name, x in v.items()}
        elif k == "items":
            out[k] = _rewritten(v, (*path, "*"), conditions, found, here)
        elif k == "allOf":
            out[k] = [_rewritten(x, path, conditions, found, here) for x in v]
        elif k == "then":
            out[k] = _rewritten(v, path, [*conditions, node.get("if", True)], found, here)
        elif k in _SCHEMA_IN:
            out[k] = _rewritten(v, path, conditions, found, False)
        elif k in _LISTS_IN:
            out[k] = [_rewritten(x, path, conditions, found, False) for x in v]
        else:
            out[k] = v
    return out


class _Compiled:
    """The schema as fastjsonschema validators: the whole, with each dispatch's values left to
    the validator of the alternative their tag names."""

    def __init__(self, s: dict):
        found: list[_Dispatch] = []
        whole = _rewritten(_inline(s, s), (), [], found)
        self.whole = fastjsonschema.compile(whole, use_default=False)
        self.dispatches = [(d.path, [fastjsonschema.compile(c, use_default=False) for c in d.conditions],
                            d.key, {k: fastjsonschema.compile(a, use_default=False) for k, a in d.kinds.items()})
                           for d in found]

    def __call__(self, data, where: str) -> None:
        _run(self.whole, data, where)
        for path, conditions, key, kinds in self.dispatches:
            if all(_holds(c, data) for c in conditions):
                for name, value in _at(data, path, where):
                    _run(kinds[value[key]], value, name)


def _run(f, value, where: str) -> None:
    try:
        f(value)
    except fastjsonschema.JsonSchemaValueException:
        try:  # (again, naming where: formatting names only when something is wrong)
            f(value, name_prefix=where)
        except fastjsonschema.JsonSchemaValueException as e:
            raise TraceError(_message(e)) from None
        raise AssertionError("fastjsonschema: a value failed once, then passed") from None


def _holds(f, value) -> bool:
    try:
        f(value)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


def _at(data, path: tuple, where: str):
    """(name, value) of every value at ``path`` in ``data`` (valid: the types are known)."""
    if not path:
        yield where, data
        return
    step, rest = path[0], path[1:]
    if step == "*":
        for i, item in enumerate(data):
            yield from _at(item, rest, f"{where}[{i}]")
    elif isinstance(data, dict) and step in data:
        yield from _at(data[step], rest, f"{where}.{step}")


_COMPILED: dict[int, tuple[dict, _Compiled]] = {}  # id(schema) -> (schema, its validators)


def _validator(s: dict) -> _Compiled:
    known = _COMPILED.get(id(s))
    if known is None or known[0] is not s:
        known = _COMPILED[id(s)] = (s, _Compiled(s))
    return known[1]


def _message(e: fastjsonschema.JsonSchemaValueException) -> str:
    """The first problem fastjsonschema found, in one line naming the field."""
    where, rule, d, v = e.name, e.rule, e.definition or {}, e.value
    if len(where) > 200:
        where = where[:197] + "..."
    if rule == "type":
        types = d["type"] if isinstance(d["type"], list) else [d["type"]]
        return f"{where}: expected {' or '.join(types)}, got {_show(v)}"
    if rule == "const":
        return f"{where}: expected {d['const']!r}, got {_show(v)}"
    if rule == "enum" and d.get("description") == _TAG:
        head = where.rpartition(".")[0] or where
        return f"{head}: unknown operation {_show(v)} (expected one of {', '.join(d['enum'])})"
    if rule == "enum":
        return f"{where}: expected one of {', '.join(map(repr, d['enum']))}, got {_show(v)}"
    if rule in ("minimum", "maximum"):
        return f"{where}: must be {'>=' if rule == 'minimum' else '<='} {d[rule]}, got {_show(v)}"
    if rule == "minLength":
        return f"{where}: must not be empty"
    if rule == "maxLength":
        return f"{where}: longer than {d['maxLength']} characters"
    if rule == "pattern":
        return f"{where}: {_show(v)} does not match {d['pattern']}"
    if rule == "maxItems":
        return f"{where}: more than {d['maxItems']} items"
    if rule == "maxProperties":
        return f"{where}: more than {d['maxProperties']} entries"
    if rule == "required" and isinstance(v, dict):
        missing = next((k for k in d["required"] if k not in v), "?")
        return f"{where}: missing '{missing}'"
    if rule == "additionalProperties" and isinstance(v, dict):
        known = d.get("properties", {})
        extra = next((k for k in v if k not in known), "?")
        return f"{where}: unexpected key {_show(extra)}"
    if rule == "propertyNames" and isinstance(v, dict):
        names = d["propertyNames"]
        for key in v:
            if "maxLength" in names and len(key) > names["maxLength"]:
                return f"{where}: key: longer than {names['maxLength']} characters"
            if "pattern" in names and not re.search(names["pattern"], key):
                return f"{where}: key: {_show(key)} does not match {names['pattern']}"
    return f"{where}: unexpected value {_show(v)}"


def validate(data, s: dict, where: str = "trace") -> None:
    """``data`` against the schema ``s`` (raises ``TraceError`` naming the first problem)."""
    _validator(s)(data, where)


def _as_floats(data):
    """``data`` (parsed here: changed in place) with every ``Decimal`` of ``parse`` a float
    again (where a trace may hold any value); iterative, whatever the data's nesting."""
    stack = [data]
    while stack:
        node = stack.pop()
        for k, v in list(node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, Decimal):
                node[k] = float(v)
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return data


def _integral_float(data) -> bool:
    """Whether ``data`` (Python values, not from ``parse``) holds a float such as 2.0."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif type(node) is float and node.is_integer():
            return True
    return False


def _with_decimals(data):
    """A copy of ``data`` whose floats such as 2.0 are ``Decimal``s, as ``parse`` reads them."""
    root = [data]
    stack = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        v = parent[key]
        if isinstance(v, dict):
            parent[key] = v = dict(v)
            stack.extend((v, k) for k in v)
        elif isinstance(v, list):
            parent[key] = v = list(v)
            stack.extend((v, i) for i in range(len(v)))
        elif type(v) is float and v.is_integer():
            parent[key] = Decimal(repr(v))
    return root[0]


def _no_constant(name: str):
    raise TraceError(f"not valid JSON: {name} is not a number")


def _unique_keys(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise TraceError(f"not valid JSON for a trace: duplicate key {_show(dup)}")
    return d


def parse(text: str, decimals: list | None = None) -> dict:
    """Strict JSON: no NaN/Infinity, no duplicate keys; one-line ``TraceError`` otherwise.
    An integral number written as a float (``2.0``, ``1e3``) is a ``Decimal``, which no
    schema "integer" accepts (``validate`` names the field); each is added to ``decimals``."""
    def number(text: str) -> float | Decimal:
        value = float(text)
        if not value.is_integer():
            return value
        if decimals is not None:
            decimals.append(text)
        return Decimal(text)

    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys,
                          parse_float=number)
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
    def from_json(cls, data, decimals: bool | None = None) -> Trace:
        """The trace ``data`` holds. ``decimals``: whether it may hold ``Decimal``s from
        ``parse`` (made floats again once it is valid, where any value is allowed); None:
        ``data`` is Python's own, whose floats such as 2.0 are read as ``parse`` reads them."""
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
        if decimals is None and _integral_float(data):
            data, decimals = _with_decimals(data), True
        validate(data, _schema((name,)), "trace")
        if decimals:
            data = _as_floats(data)
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
        decimals: list = []
        try:
            return cls.from_json(parse(raw, decimals), bool(decimals))
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
