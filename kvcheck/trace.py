"""Counterexample traces: a stable, versioned JSON format.

A trace is everything needed to reproduce a violation on any allocator:
the scope (pool size, block size), where it came from (target, seed,
kvcheck version), the operations with their arguments and results, the
observed state after each step, and the broken rule with its step.
Loading validates the structure and never executes anything from the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvcheck import __version__
from kvcheck.spec.contracts import Op
from kvcheck.violation import Violation

FORMAT = "kvcheck.trace"
VERSION = 1
KINDS = ("allocate", "append_slot", "fork", "free_seq")


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


def _int(d: dict, key: str, where: str, minimum: int = 0) -> int:
    v = d.get(key)
    if type(v) is not int or v < minimum:
        raise TraceError(f"{where}: '{key}' must be an integer >= {minimum}, got {v!r}")
    return v


def op_from_json(d, where: str) -> Op:
    if not isinstance(d, dict):
        raise TraceError(f"{where}: an operation must be an object")
    kind = d.get("op")
    if kind not in KINDS:
        raise TraceError(f"{where}: unknown operation {kind!r} (expected one of {', '.join(KINDS)})")
    if kind == "fork":
        op = Op(kind, seq=_int(d, "parent", where), child=_int(d, "child", where))
    elif kind == "allocate":
        op = Op(kind, seq=_int(d, "seq", where), n_tokens=_int(d, "n_tokens", where, 1))
    else:
        op = Op(kind, seq=_int(d, "seq", where))
    result = d.get("result", {})
    if not isinstance(result, dict):
        raise TraceError(f"{where}: 'result' must be an object")
    outcome = result.get("outcome", "ok")
    if outcome not in ("ok", "oob"):
        raise TraceError(f"{where}: outcome must be 'ok' or 'oob', got {outcome!r}")
    op.outcome = outcome
    if kind == "append_slot" and "block" in result:
        for key in ("block", "offset"):
            if type(result[key]) is not int:
                raise TraceError(f"{where}: result '{key}' must be an integer")
        cow = result.get("cow_src")
        if cow is not None and type(cow) is not int:
            raise TraceError(f"{where}: result 'cow_src' must be an integer or null")
        op.block, op.offset, op.cow_src, op.has_cow = result["block"], result["offset"], cow, cow is not None
    return op


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
        Path(path).write_text(self.dumps() + "\n")

    @classmethod
    def from_json(cls, data) -> Trace:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(f"not a kvcheck trace (expected \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise TraceError(f"unsupported trace version {data.get('version')!r} (this kvcheck reads {VERSION})")
        scope = data.get("scope")
        if not isinstance(scope, dict):
            raise TraceError("'scope' must be an object")
        nb, bs = _int(scope, "num_blocks", "scope", 1), _int(scope, "block_size", "scope", 1)
        ops = data.get("ops")
        if not isinstance(ops, list):
            raise TraceError("'ops' must be a list")
        parsed = [op_from_json(d, f"ops[{i}]") for i, d in enumerate(ops)]
        target = data.get("target")
        if not isinstance(target, str):
            raise TraceError("'target' must be a string")
        seed = data.get("seed")
        if seed is not None and type(seed) is not int:
            raise TraceError("'seed' must be an integer or null")
        states = data.get("states", [])
        if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
            raise TraceError("'states' must be a list of objects")
        v = data.get("violation")
        violation = None
        if v is not None:
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or type(v.get("step")) is not int:
                raise TraceError("'violation' must be null or an object with 'step' and 'name'")
            known = {"step", "kind", "name", "element", "witness", "doc", "details"}
            violation = Violation(**{k: v[k] for k in known if k in v})
        return cls(target, nb, bs, parsed, violation, seed, states, str(data.get("minimality", "")),
                   str(data.get("kvcheck_version", "")))

    @classmethod
    def load(cls, path) -> Trace:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_json(data)
