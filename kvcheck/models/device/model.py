"""The device model, as data: a block manager whose K/V really lives and moves in a store.

Operations: the block manager's four (``allocate``, ``append_slot``, ``fork``,
``free_seq``, from ``kvcheck.models.blocks``) and the batched decode step an engine runs
(``decode_step(seqs)``: one new token for each sequence, every slot reserved as by
``append_slot``, then the data moved in one copy launch and one write launch), whose
result is each sequence's reservation. The run's checks (``oracle.DataOracle``: the
block manager's oracle for the structure, every live sequence's K/V read back bit for
bit after every step) need torch; nothing here does, so a device trace and the trace
schema load without it.

The scope is the pool (``num_blocks``, ``block_size``) and, where the target's factory
takes them as keywords, the store's shape (``num_layers``, ``num_kv_heads``,
``head_dim``; unset: the factory's own, called as ``factory(num_blocks, block_size)``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from itertools import combinations

from kvcheck.check.model import SEQS, VALUE, Arg, Model, OpSpec, Options, ScopeField, register
from kvcheck.models.blocks.model import MODEL as BLOCKS
from kvcheck.models.blocks.model import STATE_SCHEMA
from kvcheck.models.device.datatarget import DECODE
from kvcheck.spec import contracts
from kvcheck.spec.contracts import SEED_OPERATIONS

SHAPE = ("num_layers", "num_kv_heads", "head_dim")  # the store's sizes a scope may fix
_SHAPE_WORDS = {"num_layers": "layer", "num_kv_heads": "KV head", "head_dim": "head dim"}
MAX_SHAPE = 1048576  # the largest size a trace's scope records


@dataclass(frozen=True)
class DeviceScope:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens, and the store's shape
    where it is fixed (None: the factory's own)."""

    num_blocks: int
    block_size: int
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None

    def shape(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in SHAPE if getattr(self, k) is not None}

    def describe(self) -> str:
        return f"{self.num_blocks} blocks x {self.block_size} slots{_shape_words(self)}"


@dataclass(frozen=True)
class DeviceExploreScope:
    """What bounded exploration enumerates: the pool and store, the sequence slots, the
    longest prompt and the depth."""

    num_blocks: int = 4
    block_size: int = 2
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    seqs: int = 3
    max_tokens: int = 4
    depth: int = 6

    def describe(self) -> str:
        return (f"{self.num_blocks} blocks x {self.block_size} slots{_shape_words(self)}, "
                f"{self.seqs} sequences, prompts <= {self.max_tokens}, depth {self.depth}")


def _shape_words(scope) -> str:
    parts = []
    for k in SHAPE:
        n = getattr(scope, k)
        if n is not None:
            parts.append(f"{_SHAPE_WORDS[k]} {n}" if k == "head_dim" else
                         f"{n} {_SHAPE_WORDS[k]}{'' if n == 1 else 's'}")
    return f", {' x '.join(parts)}" if parts else ""


@dataclass
class DecodeStep:
    """One batched decode step: a token for each of ``seqs`` (distinct, live), in order.

    ``reserved`` (filled in when it ran) holds each sequence's ``(block, offset,
    cow_src)``, or None where the pool had no block for it (that sequence gets no
    token this step, as an engine would preempt it); ``outcome`` is ``oob`` when no
    sequence got a slot."""

    kind: str = DECODE
    seqs: list[int] = None  # type: ignore[assignment]
    outcome: str = "ok"
    reserved: list | None = None

    def __post_init__(self):
        self.seqs = list(self.seqs or [])


def _make_decode(kind: str, seqs) -> DecodeStep:
    return DecodeStep(kind, list(seqs))


def _append_doc() -> str:
    return " ".join((contracts.CONTRACTS["append_slot"].__doc__ or "").split())


_RESERVED = {  # a decode step's result: per sequence, its reservation or null (out of blocks)
    "type": "array", "maxItems": 65536,
    "items": {"oneOf": [{"type": "null"}, {
        "type": "array", "maxItems": 3,
        "items": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/block"}]}}]},
}

OPS = {  # the seed's operations (the device oracle writes K/V one token at a time) and a step
    **{kind: BLOCKS.ops[kind] for kind in SEED_OPERATIONS},
    DECODE: OpSpec(DECODE, _make_decode, (Arg("seqs", SEQS),),
                   results=(Arg("reserved", VALUE, schema=_RESERVED),),
                   doc=("one token for each listed sequence, in order, as an engine's batched "
                        "step: each slot reserved as by append_slot, then every copy-on-write "
                        "copy in one launch, then every write in one launch; append_slot: "
                        + _append_doc())),
}


class DeviceModel(Model):
    name = "device"
    title = "device-backed KV store (K/V read back bit for bit)"
    ops = OPS
    scope_fields = (ScopeField("num_blocks"), ScopeField("block_size"))
    state_schema = STATE_SCHEMA  # the block manager's: tables, lengths, refcounts, free list
    outcomes = ("ok", "oob")

    # -- operations ------------------------------------------------------------------
    def describe(self, op) -> str:
        if op.kind != DECODE:
            return BLOCKS.describe(op)
        head = f"decode_step(seqs={list(op.seqs)})"
        if op.outcome == "oob" and not op.reserved:
            return f"{head} -> OutOfBlocks"
        if op.reserved is None:
            return head
        parts = [f"seq {q}: " + ("OutOfBlocks" if r is None else
                             f"(block={r[0]}, offset={r[1]}, cow_src={r[2]})")
                 for q, r in zip(op.seqs, op.reserved, strict=False)]
        return f"{head} -> [{'; '.join(parts)}]"

    def op_to_json(self, op) -> dict:
        if op.kind != DECODE:
            return BLOCKS.op_to_json(op)
        result: dict = {"outcome": op.outcome}
        if op.reserved is not None:
            result["reserved"] = [None if r is None else list(r) for r in op.reserved]
        return {"op": DECODE, "seqs": list(op.seqs), "result": result}

    def op_from_json(self, d: dict):
        if d["op"] != DECODE:
            return BLOCKS.op_from_json(d)
        op = super().op_from_json(d)
        if op.reserved is not None:
            op.reserved = [None if r is None else tuple(r) for r in op.reserved]
        return op

    def check_op_json(self, d: dict, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if d["op"] != DECODE:
            BLOCKS.check_op_json(d, where)
            return
        seqs = d["seqs"]
        if not seqs:
            raise TraceError(f"{where}.seqs: a decode step takes at least one sequence")
        if len(set(seqs)) != len(seqs):
            raise TraceError(f"{where}.seqs: a decode step takes each sequence at most once")
        reserved = d.get("result", {}).get("reserved")
        if reserved is None:
            return
        if len(reserved) > len(seqs):
            raise TraceError(f"{where}.result.reserved: {len(reserved)} reservations for "
                             f"{len(seqs)} sequences")
        for i, r in enumerate(reserved):
            if r is not None and (len(r) != 3 or r[0] is None or r[1] is None):
                raise TraceError(f"{where}.result.reserved[{i}]: expected [block, offset, "
                                 f"cow_src] or null")

    def check_state_json(self, state: dict, scope, where: str) -> None:
        BLOCKS.check_state_json(state, scope, where)

    # -- runs ---------------------------------------------------------------------------
    def build(self, factory, scope, options: Options):
        from kvcheck.models.device.datatarget import DataTarget, NotDataTarget
        from kvcheck.targets.loading import build

        shape = {k: getattr(scope, k) for k in SHAPE if getattr(scope, k, None) is not None}
        if shape:
            factory = functools.partial(factory, **shape)
        target = build(factory, scope.num_blocks, scope.block_size, options.out_of_blocks)
        try:
            return DataTarget(target)
        except NotDataTarget:
            raise
        except Exception as exc:  # noqa: BLE001 - its sizes or capabilities could not be read
            from kvcheck.errors import what_it_did

            raise NotDataTarget(f"{type(target).__name__} cannot be driven as a data target: "
                                f"reading it {what_it_did(exc)}") from None

    def start(self, target, scope, options: Options):
        from kvcheck.models.device.oracle import DataOracle

        return DataOracle(target, mode=options.mode, seed=options.seed, timeout=options.timeout,
                          compiled=options.compiled)

    def driver(self, seed: int, scope, target, options: Options):
        return DeviceDriver(seed, scope, target.capabilities,
                            float(options.extra.get("batch_prob", 0.3)), options.extra.get("weights"))

    # -- exploration ----------------------------------------------------------------------
    def moves(self, state, scope: DeviceExploreScope) -> list:
        """The block manager's moves, and a decode step over every set of live sequences
        (in order, and for two or more also in reverse: who copies first differs)."""
        out = BLOCKS.moves(state.oracle, scope)
        if DECODE in state.feed.capabilities:
            live = sorted(state.oracle.lengths)
            for r in range(1, len(live) + 1):
                for group in combinations(live, r):
                    out.append(DecodeStep(DECODE, list(group)))
                    if r > 1:
                        out.append(DecodeStep(DECODE, list(reversed(group))))
        return out

    def canonical(self, state) -> tuple:
        """The block manager's canonical state (every live sequence reads back its own K/V
        in any state reached without a violation, so the data adds nothing to tell apart)."""
        return BLOCKS.canonical(state.oracle)

    def exploration_scope(self, ops: list, scope: DeviceScope) -> DeviceExploreScope:
        seqs = set()
        for o in ops:
            seqs.update(o.seqs if o.kind == DECODE else (o.seq, o.child))
        return DeviceExploreScope(scope.num_blocks, scope.block_size, scope.num_layers,
                                  scope.num_kv_heads, scope.head_dim, seqs=len(seqs),
                                  max_tokens=max([o.n_tokens for o in ops if o.kind == "allocate"]
                                                 or [1]),
                                  depth=len(ops) - 1)

    # -- shrinking --------------------------------------------------------------------------
    def count_hints(self, scope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_candidates(self, ops: list, scope: DeviceScope):
        # fold an append into its sequence's allocation (when nothing between reads it)
        for i in range(len(ops)):
            cand = self._fold_append(ops, i)
            if cand is not None:
                yield cand, scope
        # drop an allocation together with the pool space it held
        bs, nb = scope.block_size, scope.num_blocks
        for i, op in enumerate(ops):
            held = -(-op.n_tokens // bs) if op.kind == "allocate" else 0
            if 0 < held < nb:
                yield ([self.request(o) for o in ops[:i] + ops[i + 1:]],
                       replace(scope, num_blocks=nb - held))
        # a smaller store, where the scope fixes its shape
        for k in SHAPE:
            n = getattr(scope, k)
            for smaller in sorted({1, n - 1} if n is not None else ()):
                if 1 <= smaller < n:
                    yield [self.request(o) for o in ops], replace(scope, **{k: smaller})

    def _fold_append(self, ops: list, i: int) -> list | None:
        if ops[i].kind != "append_slot":
            return None
        q = ops[i].seq
        for j in range(i - 1, -1, -1):
            o = ops[j]
            if o.kind == "allocate" and o.seq == q:
                cand = [self.request(x) for x in ops]
                cand[j].n_tokens += 1
                del cand[i]
                return cand
            if (o.kind == "fork" and o.child == q) or (o.kind == DECODE and q in o.seqs):
                return None
        return None

    def scope_variants(self, ops: list, scope: DeviceScope, smaller: DeviceScope):
        if smaller.block_size < scope.block_size:  # every prompt scaled along
            out = [self.request(o) for o in ops]
            for o in out:
                if o.kind == "allocate":
                    o.n_tokens = max(1, -(-o.n_tokens * smaller.block_size // scope.block_size))
            yield out

    # -- showing ------------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        return BLOCKS.state_line(state)

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        if op.kind != DECODE:
            return BLOCKS.narrate(op, before, after, block_size)
        lens = (before or {}).get("lens", {})
        if op.reserved is None:
            return f"one decode step over {_seqs(op.seqs)}"
        parts = []
        for q, r in zip(op.seqs, op.reserved, strict=False):
            if r is None:
                parts.append(f"sequence {q} gets no slot (out of blocks) and no token")
                continue
            n = lens.get(str(q))
            token = f"token #{n}" if n is not None else "its next token"
            text = f"sequence {q} puts {token} in slot {r[1]} of block {r[0]}"
            if r[2] is not None:
                text += f", after copying block {r[2]} into it"
            parts.append(text)
        if len(op.reserved) < len(op.seqs):
            parts.append("the step stopped there")
        return (f"one decode step over {_seqs(op.seqs)}: " + "; ".join(parts)
                + ("; every copy in one launch, then every write in one launch"
                   if any(r is not None for r in op.reserved) else ""))

    def initial_state_json(self, scope) -> dict:
        return BLOCKS.initial_state_json(scope)

    def scope_words(self, scope) -> str:
        return _shape_words(scope)

    def scope_json(self, scope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size,
                **{k: getattr(scope, k) for k in SHAPE if getattr(scope, k, None) is not None}}

    def scope_from_json(self, data: dict) -> DeviceScope:
        unknown = sorted(set(data) - {"num_blocks", "block_size", *SHAPE})
        if unknown:
            raise ValueError(f"unknown size {unknown[0]!r} (a device scope has num_blocks, "
                             f"block_size, {', '.join(SHAPE)})")
        for k in SHAPE:
            if k in data and not (type(data[k]) is int and 1 <= data[k] <= MAX_SHAPE):
                raise ValueError(f"{k} must be an integer from 1 to {MAX_SHAPE}, got {data[k]!r}")
        return DeviceScope(data["num_blocks"], data["block_size"],
                           *(data.get(k) for k in SHAPE))


def _seqs(qs) -> str:
    qs = list(qs)
    return f"sequence {qs[0]}" if len(qs) == 1 else f"sequences {qs}"


class DeviceDriver:
    """The block manager's seeded driver; where it asks for an append, with probability
    ``batch_prob`` a decode step over a random set of the live sequences instead (drawn
    from the driver's own generator)."""

    def __init__(self, seed: int, scope, capabilities, batch_prob: float, weights: dict | None = None):
        from kvcheck.models.blocks.driver import RandomDriver

        self.driver = RandomDriver(seed, scope.num_blocks, scope.block_size, capabilities, weights)
        self.rng = self.driver.rng
        self.batch_prob = batch_prob if DECODE in capabilities else 0.0

    def next_op(self, state):
        op = self.driver.next_op(state.live_seqs(), state.num_free())
        if op.kind == "append_slot" and self.batch_prob > 0 and self.rng.random() < self.batch_prob:
            live = state.live_seqs()
            return DecodeStep(DECODE, self.rng.sample(live, self.rng.randint(1, len(live))))
        return op


MODEL = register(DeviceModel())
