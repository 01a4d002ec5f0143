"""The hybrid-pool model, as data: a request-level ``allocate`` (its prompt's token ids),
``append_slot`` (one decode token) and ``free_seq``, each acting on the request's table
in every KV-cache group of one shared pool (vLLM v1's hybrid coordinator).

A hybrid target offers those three operations (``allocate(seq, tokens)`` returns the
cached tokens it served, per group, or one count for all), optionally
``append_tokens(seq, tokens)`` (several tokens computed in one step: a chunk of a
streamed prompt), and reads back as

    windows                 the groups' windows, one per group (0: full attention; else >= 2)
    block_table(seq, g)     request seq's table in group g (``KeyError``: none);
                            ``None`` or ``kvcheck.spec.state.NULL`` is a null entry
    table_identity(seq, g)  optional: the table object (aliasing)
    refcount(b), free_blocks(), num_free(), seq_len(seq), is_out_of_blocks(exc)

Binds ``kvcheck.spec.hybrid`` (``HYBRID_INVARIANTS``, ``CONTRACTS``) and
``kvcheck.spec.invariants.INVARIANTS`` (on the (request, group) sequences); the run's
checks live in ``oracle`` (``HybridOracle``), the workload in ``driver``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.check.model import (
    NEW_SEQ,
    SEQ,
    TOKENS,
    VALUE,
    Arg,
    Model,
    OpSpec,
    Options,
    ScopeField,
    register,
)
from kvcheck.models.blocks.model import BlockScope
from kvcheck.spec import hybrid as H


@dataclass
class HybridOp:
    """One request-level operation: ``tokens`` (allocate: the prompt), ``token`` (append_slot)
    and, for a successful allocate, ``cached``: the cached tokens served per group."""

    kind: str
    seq: int = 0
    tokens: tuple = ()
    token: object = None
    cached: object = None
    outcome: str = "ok"

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def _make(kind: str, **args) -> HybridOp:
    if "tokens" in args:
        args["tokens"] = tuple(args["tokens"])
    return HybridOp(kind, **args)


def _doc(kind: str) -> str:
    return " ".join((H.CONTRACTS[kind].__doc__ or "").split())


OPS = {
    "allocate": OpSpec("allocate", _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS)),
                       results=(Arg("cached", VALUE, schema={
                           "type": ["array", "null"], "maxItems": 64,
                           "items": {"type": "integer"}}),), doc=_doc("allocate")),
    "append_slot": OpSpec("append_slot", _make, (Arg("seq", SEQ), Arg("token", VALUE)),
                          doc=_doc("append_slot")),
    # only for a target with append_tokens(seq, tokens): n tokens computed in one step
    "append_tokens": OpSpec("append_tokens", _make, (Arg("seq", SEQ), Arg("tokens", TOKENS)),
                            doc=_doc("append_tokens")),
    "free_seq": OpSpec("free_seq", _make, (Arg("seq", SEQ),), doc=_doc("free_seq")),
}

_BLOCKS = {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/block"}}
_KEYS = {"pattern": "^(0|[1-9][0-9]{0,9})$"}
STATE_SCHEMA = {  # every live request's tables (one per group), lengths, refcounts, free list
    "type": "object", "required": ["windows", "tables", "refs", "free"],
    "additionalProperties": False,
    "properties": {
        "windows": {"type": "array", "maxItems": 64, "items": {"$ref": "#/$defs/count"}},
        "tables": {"type": "object", "maxProperties": 100000, "propertyNames": _KEYS,
                   "additionalProperties": {"type": "array", "maxItems": 64, "items": {
                       "type": "array", "maxItems": 1048576,
                       "items": {"$ref": "#/$defs/block"}}}},
        "lens": {"type": "object", "maxProperties": 100000, "propertyNames": _KEYS,
                 "additionalProperties": {"$ref": "#/$defs/count"}},
        "refs": _BLOCKS,
        "free": _BLOCKS,
        "num_free": {"$ref": "#/$defs/count"},
    },
}


class HybridModel(Model):
    name = "hybrid"
    title = "hybrid-pool block manager (KV-cache groups sharing one pool)"
    ops = OPS
    scope_fields = (ScopeField("num_blocks"), ScopeField("block_size"))
    state_schema = STATE_SCHEMA

    def describe(self, op) -> str:
        if op.kind == "allocate":
            head = f"allocate(seq={op.seq}, tokens={list(op.tokens)})"
        elif op.kind == "append_slot":
            head = f"append_slot(seq={op.seq}, token={op.token!r})"
        elif op.kind == "append_tokens":
            head = f"append_tokens(seq={op.seq}, tokens={list(op.tokens)})"
        else:
            head = f"free_seq(seq={op.seq})"
        if op.outcome == "oob":
            return f"{head} -> OutOfBlocks"
        if op.kind == "allocate" and op.cached is not None and any(op.cached):
            return f"{head} -> cached tokens per group {list(op.cached)}"
        return head

    def check_op_json(self, d: dict, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if d["op"] == "allocate" and not d["tokens"]:
            raise TraceError(f"{where}.tokens: a prompt has at least one token")
        if d["op"] == "append_tokens" and not d["tokens"]:
            raise TraceError(f"{where}.tokens: a step appends at least one token")
        if d["op"] == "append_slot" and (type(d["token"]) is not int
                                         or not -(2**63) <= d["token"] < 2**63):
            raise TraceError(f"{where}.token: expected a token id (a 64-bit integer), got "
                             f"{d['token']!r:.40}")

    def check_state_json(self, state: dict, scope, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if len(state["refs"]) != scope.num_blocks:
            raise TraceError(f"{where}.refs: {len(state['refs'])} refcounts for a pool of "
                             f"{scope.num_blocks} blocks")

    # -- runs -----------------------------------------------------------------------
    def resolve(self, spec):
        from kvcheck.targets.loading import _import_attr
        from kvcheck.targets.registry import HYBRID_TARGETS

        if isinstance(spec, str) and spec in HYBRID_TARGETS:
            return spec, _import_attr(HYBRID_TARGETS[spec][0])
        name, at, version = spec.partition("@") if isinstance(spec, str) else ("", "", "")
        if at and name in HYBRID_TARGETS:  # vllm-v1-hybrid@0.20.2: the adapter's release
            from kvcheck.targets.loading import with_version

            return spec, with_version(_import_attr(HYBRID_TARGETS[name][0]), spec, version)
        if isinstance(spec, str) and spec and ":" not in spec:  # a name: not a file or module
            from kvcheck.targets.loading import TargetError
            from kvcheck.targets.registry import TARGETS

            if name not in TARGETS:
                raise TargetError(f"unknown hybrid target {spec!r}: use module:attr, "
                                  f"file.py:attr or one of: {', '.join(sorted(HYBRID_TARGETS))}")
        return None

    def build(self, factory, scope: BlockScope, options: Options):
        from kvcheck.models.hybrid.oracle import build

        return build(factory, scope, options)

    def start(self, target, scope, options: Options):
        from kvcheck.models.hybrid.oracle import HybridOracle

        return HybridOracle(target, scope, options)

    def driver(self, seed: int, scope, target, options: Options):
        from kvcheck.models.hybrid.driver import HybridDriver

        return HybridDriver(seed, scope, target, options.extra.get("weights"))

    # -- shrinking ------------------------------------------------------------------
    def count_hints(self, scope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_candidates(self, ops: list, scope: BlockScope):
        # token ids renamed 0, 1, 2 ... in order of first use (only equality matters)
        ids: dict = {}
        for op in ops:
            for t in (*op.tokens, *(() if op.token is None else (op.token,))):
                ids.setdefault(t, len(ids))
        if any(t != i for t, i in ids.items()):
            out = []
            for op in ops:
                r = self.request(op)
                r.tokens = tuple(ids[t] for t in op.tokens)
                if op.token is not None:
                    r.token = ids[op.token]
                out.append(r)
            yield out, scope
        # a prompt one token shorter (the shrinker's counts do not reach token lists)
        for i, op in enumerate(ops):
            if op.kind == "allocate" and len(op.tokens) > 1:
                cand = [self.request(o) for o in ops]
                cand[i] = _make("allocate", seq=op.seq, tokens=op.tokens[:-1])
                yield cand, scope

    # -- showing ------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        tables = state.get("tables", {})
        lens = state.get("lens", {})
        parts = [f"seq {q} (len {lens.get(q, '?')}): " + " | ".join(
            f"g{g} {_table(t)}" for g, t in enumerate(ts)) for q, ts in tables.items()]
        free = state.get("free", [])
        count = state.get("num_free", len(free))
        said = "" if count == len(free) else f" (num_free {count})"
        return f"{'; '.join(parts) or 'no requests'} | free {len(free)}{said}"

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        if op.outcome == "oob":
            return f"{op.kind} ran out of blocks: nothing may change"
        if op.kind == "allocate":
            cached = list(op.cached) if op.cached is not None else []
            hit = f"; cached tokens per group {cached}" if any(cached) else ""
            return f"request {op.seq} admitted with {len(op.tokens)} prompt tokens{hit}"
        if op.kind == "append_slot":
            return f"request {op.seq} decodes one token"
        if op.kind == "append_tokens":
            return f"request {op.seq} computes {len(op.tokens)} new tokens in one step"
        return f"request {op.seq} is freed"

    def pool_of(self, state: dict) -> dict | None:
        return None

    def initial_state_json(self, scope) -> dict | None:
        return None

    def scope_json(self, scope: BlockScope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size}

    def scope_from_json(self, data: dict) -> BlockScope:
        return BlockScope(data["num_blocks"], data["block_size"])


def _table(t) -> str:
    return "[" + ", ".join("null" if b == -1 else str(b) for b in t) + "]"


MODEL = register(HybridModel())
