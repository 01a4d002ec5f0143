"""The block-manager model, as data: its four operations, its scopes, how to explore and
shrink runs of it.

Binds ``kvcheck.spec`` (``contracts``, ``invariants``, ``outcomes``) to targets speaking
the ``Target`` protocol (``kvcheck.targets``). The run's checks live in ``oracle``; what
is here is what the checker needs to draw, copy, serialise, explore and shrink runs: the
shrink moves only a block manager has (fold an append into its allocation, drop an
allocation with the blocks it held, scale prompts with the block size) included.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.check.model import BLOCK, COUNT, NEW_SEQ, SEQ, VALUE, Arg, Model, OpSpec, Options, ScopeField, register
from kvcheck.spec import contracts
from kvcheck.spec.contracts import SEED_OPERATIONS, Op


@dataclass(frozen=True)
class BlockScope:
    """A pool: ``num_blocks`` blocks of ``block_size`` tokens each."""

    num_blocks: int
    block_size: int

    def describe(self) -> str:
        return f"{self.num_blocks} blocks x {self.block_size} slots"


@dataclass(frozen=True)
class ExploreScope:
    """What bounded exploration enumerates: the pool, the sequence slots, the longest
    prompt and the depth."""

    num_blocks: int = 4
    block_size: int = 2
    seqs: int = 3
    max_tokens: int = 4
    depth: int = 8

    def describe(self) -> str:
        return (f"{self.num_blocks} blocks x {self.block_size} slots, {self.seqs} sequences, "
                f"prompts <= {self.max_tokens}, depth {self.depth}")


def _make(kind: str, **args) -> Op:
    return Op(kind, **args)


def _doc(kind: str) -> str:
    return " ".join((contracts.CONTRACTS[kind].__doc__ or "").split())


# The copies a caller must make before it writes: (src, dst) block pairs.
COPIES = {"type": "array", "maxItems": 65536,
          "items": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/block"}}}
_COPIES = Arg("copies", VALUE, schema=COPIES)

OPS = {
    "allocate": OpSpec("allocate", _make, (Arg("seq", NEW_SEQ), Arg("n_tokens", COUNT)),
                       doc=_doc("allocate")),
    "append_slot": OpSpec("append_slot", _make, (Arg("seq", SEQ),),
                          results=(Arg("block", BLOCK), Arg("offset", VALUE), Arg("cow_src", BLOCK)),
                          doc=_doc("append_slot")),
    "fork": OpSpec("fork", _make, (Arg("seq", SEQ, key="parent"), Arg("child", NEW_SEQ)),
                   results=(_COPIES,), doc=_doc("fork")),
    "free_seq": OpSpec("free_seq", _make, (Arg("seq", SEQ),), doc=_doc("free_seq")),
    "append_slots": OpSpec("append_slots", _make,
                           (Arg("seq", SEQ), Arg("n_tokens", COUNT), Arg("lookahead", COUNT, low=0)),
                           results=(_COPIES,), doc=_doc("append_slots")),
    "rollback": OpSpec("rollback", _make, (Arg("seq", SEQ), Arg("n_tokens", COUNT)),
                       doc=_doc("rollback")),
    "rebase": OpSpec("rebase", _make, (Arg("seq", SEQ, key="source"), Arg("child", SEQ)),
                     results=(_COPIES,), doc=_doc("rebase")),
    "preempt": OpSpec("preempt", _make, (Arg("seq", SEQ),), doc=_doc("preempt")),
    # (the window rides in ``n_tokens``: how many of the last tokens attention reads)
    "drop_behind_window": OpSpec("drop_behind_window", _make,
                                 (Arg("seq", SEQ), Arg("n_tokens", COUNT, key="window")),
                                 doc=_doc("drop_behind_window")),
}


_SEQ_KEYS = {"pattern": "^(0|[1-9][0-9]{0,9})$"}
STATE_SCHEMA = {  # a recorded state: every live table, the lengths, refcounts and free list
    "type": "object", "required": ["tables", "refs", "free"], "additionalProperties": False,
    "properties": {
        "tables": {"type": "object", "maxProperties": 100000, "propertyNames": _SEQ_KEYS,
                   "additionalProperties": {"type": "array", "maxItems": 1048576,
                                            "items": {"$ref": "#/$defs/block"}}},
        "lens": {"type": "object", "maxProperties": 100000, "propertyNames": _SEQ_KEYS,
                 "additionalProperties": {"$ref": "#/$defs/count"}},
        "refs": {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/block"}},
        "free": {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/block"}},
    },
}


_CALLERS = {kind: spec.caller() for kind, spec in OPS.items()}


def call(target, op):
    """Run operation ``op`` (a ``kvcheck.spec.contracts.Op``) on ``target``; its result."""
    return _CALLERS[op.kind](target, op)


class BlocksModel(Model):
    name = "blocks"
    title = "paged block manager"
    ops = OPS
    scope_fields = (ScopeField("num_blocks"), ScopeField("block_size"))
    state_schema = STATE_SCHEMA
    outcomes = ("ok", "oob", "refused")  # a refusal: a policy the target declares

    # -- operations ----------------------------------------------------------------
    def describe(self, op) -> str:
        from kvcheck.models.blocks.witness import describe_op

        return describe_op(op)

    def op_to_json(self, op) -> dict:
        if op.kind not in SEED_OPERATIONS:
            return super().op_to_json(op)
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
        if op.kind == "fork" and op.outcome == "ok" and op.copies:  # an eager fork's copy
            result["copies"] = [list(c) for c in op.copies]
        d["result"] = result
        return d

    def op_from_json(self, d: dict):
        op = super().op_from_json(d)
        op.has_cow = op.cow_src is not None
        if op.copies is not None:
            op.copies = [tuple(c) for c in op.copies]
        return op

    def check_op_json(self, d: dict, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if d["op"] == "fork" and d["parent"] == d["child"]:
            raise TraceError(f"{where}: a sequence cannot fork into itself")
        result = d.get("result", {})
        if d["op"] == "append_slot" and "block" in result and "offset" not in result:
            raise TraceError(f"{where}.result: 'block' given without 'offset'")

    def check_state_json(self, state: dict, scope, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if len(state["refs"]) != scope.num_blocks:
            raise TraceError(f"{where}.refs: {len(state['refs'])} refcounts for a pool of "
                             f"{scope.num_blocks} blocks")

    def history_error(self, ops: list, scope) -> tuple[int, str] | None:
        """Each operation's precondition over the history the operations before it make:
        which sequences are live and their token counts (``oracle.length_delta``, by the
        recorded outcomes); what only the target decides (reserved slots, null entries) is
        taken to allow the operation."""
        from kvcheck.models.blocks.oracle import length_delta
        from kvcheck.spec.logic import PY

        lengths: dict[int, int] = {}
        made: dict[int, int] = {}  # sequence -> the operation that made it live
        ended: dict[int, int] = {}  # sequence -> the operation that ended it
        for i, op in enumerate(ops):
            history = _History(lengths, scope.block_size)
            try:
                holds = contracts.precondition(PY, history, op)
            except AttributeError:  # (it reads what only the target decides: not decided here)
                holds = True
            if not holds:
                return i, f"{self.describe(self.request(op))} cannot run there: " + _why(op, history, made,
                                                                             ended)
            for q, n in length_delta(lengths, op).items():
                if n is None:
                    if lengths.pop(q, None) is not None:
                        ended[q] = i
                else:
                    if q not in lengths:
                        made[q] = i
                    lengths[q] = n
        return None

    # -- runs -----------------------------------------------------------------------
    def build(self, factory, scope: BlockScope, options: Options):
        from kvcheck.targets.loading import build

        return build(factory, scope.num_blocks, scope.block_size, options.out_of_blocks)

    def start(self, target, scope, options: Options):
        from kvcheck.models.blocks.oracle import Oracle

        return Oracle(target, mode=options.mode, timeout=options.timeout, compiled=options.compiled)

    def driver(self, seed: int, scope, target, options: Options):
        from kvcheck.models.blocks.driver import RandomDriver

        return _Driving(RandomDriver(seed, scope.num_blocks, scope.block_size, target.capabilities,
                                     options.extra.get("weights"),
                                     getattr(target, "drop_window", None)))

    # -- exploration ----------------------------------------------------------------
    def moves(self, state, scope: ExploreScope) -> list:
        """Every operation worth trying next (one fresh id suffices by symmetry)."""
        live = sorted(state.lengths)
        fresh = next((q for q in range(scope.seqs) if q not in state.lengths), None)
        caps = state.target.capabilities
        out: list = []
        if fresh is not None and "allocate" in caps:
            out += [Op("allocate", seq=fresh, n_tokens=n) for n in range(1, scope.max_tokens + 1)]
        bs = scope.block_size
        for q in live:
            if "append_slot" in caps:
                out.append(Op("append_slot", seq=q))
            if fresh is not None and "fork" in caps:
                out.append(Op("fork", seq=q, child=fresh))
            if "free_seq" in caps:
                out.append(Op("free_seq", seq=q))
            if "append_slots" in caps:  # one token or a block's worth, with or without lookahead
                out += [Op("append_slots", seq=q, n_tokens=n, lookahead=look)
                        for n in sorted({1, bs}) for look in sorted({0, bs})]
            n = state.lengths[q]
            if "rollback" in caps and n >= 2:
                out += [Op("rollback", seq=q, n_tokens=k) for k in sorted({1, n - 1})]
            if "rebase" in caps:
                out += [Op("rebase", seq=q, child=r) for r in live if r != q]
            if "preempt" in caps:
                out.append(Op("preempt", seq=q))
            if "drop_behind_window" in caps:  # a window of one token, of a block, the engine's
                wins = {1, bs, getattr(state.target, "drop_window", None) or 1}
                out += [Op("drop_behind_window", seq=q, n_tokens=w) for w in sorted(wins)]
        return out

    def canonical(self, state) -> tuple:
        """The observed state with sequence and block ids renamed canonically:
        sequences ordered by a renaming-invariant signature, blocks numbered by first
        appearance in the tables in that order, then along the free list."""
        from kvcheck.proofs.renaming import canonical_tables

        snap = state.observed
        tables, label = canonical_tables(
            {q: (state.lengths.get(q, 0), t) for q, t in snap.tables.items()}, snap.ref)
        target = state.target
        free_order = tuple(label.setdefault(b, len(label)) for b in target.free_blocks()) \
            if hasattr(target, "free_blocks") else ()
        refs = tuple(sorted((label.get(b, -1 - b), snap.ref(b)) for b in snap.blocks()
                            if snap.ref(b)))
        hidden = getattr(target, "hidden_table", None)
        if hidden is None:
            return tables, free_order, refs
        # (what the engine keeps beyond what it shows, e.g. the stale names behind a cyclic
        # window, which its later steps read: states differing there are not merged)
        kept = tuple(sorted(tuple(label.setdefault(b, len(label)) for b in hidden(q))
                            for q in sorted(snap.tables)))
        return tables, free_order, refs, kept

    def exploration_scope(self, ops: list, scope: BlockScope) -> ExploreScope:
        return ExploreScope(scope.num_blocks, scope.block_size,
                            seqs=len({q for o in ops for q in (o.seq, o.child)}),
                            max_tokens=_longest_prompt(ops, scope), depth=len(ops) - 1)

    # -- shrinking ------------------------------------------------------------------
    def count_hints(self, scope) -> tuple[int, ...]:
        return (scope.block_size,)

    def focus(self, ops: list) -> list | None:
        """The operations on the last operation's sequences and on every sequence that
        shares blocks with them (by a fork or rebase, transitively), each sequence taken
        from its allocation or fork on (an id reused later is another sequence): what
        the other sequences do reaches these only through the pool's free blocks, which
        a failure often does not need."""
        kept = _sharing_family(ops)
        return [self.request(ops[i]) for i in kept] if len(kept) < len(ops) else None

    def shrink_candidates(self, ops: list, scope: BlockScope):
        # fold an append into its sequence's allocation (allocate n, append == allocate n+1
        # when nothing in between reads the sequence)
        for i in range(len(ops)):
            cand = _fold_append(ops, i)
            if cand is not None:
                yield cand, scope
        # drop an allocation together with the pool space it held (a trace that fills
        # the pool before the failing step often needs neither); a reservation likewise,
        # with the blocks it may have grown by
        bs, nb = scope.block_size, scope.num_blocks
        for i, op in enumerate(ops):
            if op.kind == "allocate":
                held = {-(-op.n_tokens // bs)}
            elif op.kind == "append_slots":
                held = {-(-(op.n_tokens + op.lookahead) // bs), (op.n_tokens + op.lookahead) // bs}
            else:
                continue
            for h in sorted(held, reverse=True):
                if 0 < h < nb:
                    yield ([self.request(o) for o in ops[:i] + ops[i + 1:]],
                           BlockScope(nb - h, bs))

    def scope_variants(self, ops: list, scope: BlockScope, smaller: BlockScope):
        if smaller.block_size < scope.block_size:  # every prompt scaled along, full blocks full
            yield _scaled(ops, scope.block_size, smaller.block_size)

    # -- showing ------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        from kvcheck.models.blocks.witness import state_line

        return state_line(state)

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        from kvcheck.models.blocks.witness import narrate

        return narrate(op, before, after, block_size)

    def initial_state_json(self, scope) -> dict:
        return {"tables": {}, "lens": {}, "refs": [0] * scope.num_blocks,
                "free": list(range(scope.num_blocks))}

    def scope_json(self, scope: BlockScope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size}

    def scope_from_json(self, data: dict) -> BlockScope:
        return BlockScope(data["num_blocks"], data["block_size"])


class _History:
    """The state a trace's own operations decide, as the spec's precondition reads it: the
    live sequences and their tokens. Reserved slots and null entries are the target's to
    say: none reserved, no entry null (so they never make an operation invalid here)."""

    def __init__(self, lengths: dict, block_size: int):
        self.lengths, self.block_size = lengths, block_size

    def live(self, q) -> bool:
        return q in self.lengths

    def length(self, q) -> int:
        return self.lengths.get(q, 0)

    def reserved(self, q) -> int:
        return 0

    def table(self, q, i) -> int:
        return 0


def _why(op, history: _History, made: dict, ended: dict) -> str:
    """Why ``op``'s precondition fails in ``history``, in words."""
    def where(q) -> str:
        if q in ended:
            return f"ended by ops[{ended[q]}]"
        return "no earlier operation creates it"

    child = op.child if op.kind in ("fork", "rebase") else None
    if not history.live(op.seq) and op.kind != "allocate":
        return f"sequence {op.seq} is not live ({where(op.seq)})"
    if op.kind == "allocate" and history.live(op.seq):
        return f"sequence {op.seq} is live already (created by ops[{made[op.seq]}])"
    if child is not None and child == op.seq:
        return f"sequence {op.seq} cannot {op.kind} onto itself"
    if op.kind == "fork" and history.live(child):
        return f"sequence {child} is live already (created by ops[{made[child]}])"
    if op.kind == "rebase" and not history.live(child):
        return f"sequence {child} is not live ({where(child)})"
    if op.kind == "rollback":
        return (f"a rollback keeps at least one token: sequence {op.seq} holds "
                f"{history.length(op.seq)}, the rollback drops {op.n_tokens}")
    return "its precondition fails (spec.contracts.precondition) after the operations before it"


class _Driving:
    """The seeded driver, asked with the run state (the checker's calling convention)."""

    def __init__(self, driver):
        self.driver = driver
        self.rng = driver.rng

    def next_op(self, state):
        return self.driver.next_op(state.live_seqs(), state._state().num_free(), state)


def _sharing_family(ops: list) -> list[int]:
    """The indices of ``focus``'s operations: a union-find over the sequences' lives (a
    life begins at its allocate or fork), joined by every fork and rebase."""
    parent: dict = {}

    def root(x):
        while (up := parent.setdefault(x, x)) != x:
            parent[x] = parent.setdefault(up, up)  # (path halving)
            x = up
        return x

    life: dict = {}  # sequence -> its life now: the index of the op that began it
    lives = []
    for i, op in enumerate(ops):
        if op.kind == "allocate":
            life[op.seq] = i
        elif op.kind == "fork":
            life[op.child] = i
        seqs = (op.seq, op.child) if op.kind in ("fork", "rebase") else (op.seq,)
        mine = [life.get(q, ("before", q)) for q in seqs]
        for other in mine[1:]:
            parent[root(other)] = root(mine[0])
        lives.append(mine)
    if not lives:
        return []
    last = {root(x) for x in lives[-1]}
    return [i for i, mine in enumerate(lives) if any(root(x) in last for x in mine)]


def _fold_append(ops: list, i: int) -> list | None:
    """``ops`` without the append at ``i`` (one slot, or a reservation's tokens without
    its lookahead), its sequence allocated that much longer."""
    kind = ops[i].kind
    if kind not in ("append_slot", "append_slots"):
        return None
    q = ops[i].seq
    for j in range(i - 1, -1, -1):
        if ops[j].kind == "allocate" and ops[j].seq == q:
            cand = [MODEL.request(o) for o in ops]
            cand[j].n_tokens += 1 if kind == "append_slot" else ops[i].n_tokens
            del cand[i]
            return cand
        if ops[j].kind in ("fork", "rebase") and ops[j].child == q:
            return None
    return None


def _longest_prompt(ops: list, scope: BlockScope) -> int:
    """The longest prompt worth exploring for ``ops``: their longest allocation, or, where
    reservations grow a sequence, the most it allocates and reserves (at most the pool)."""
    longest = max([o.n_tokens for o in ops if o.kind == "allocate"] or [1])
    grown: dict[int, int] = {}
    for o in ops:
        if o.kind == "allocate":
            grown[o.seq] = o.n_tokens
        elif o.kind == "append_slots" and o.seq in grown:
            grown[o.seq] += o.n_tokens + o.lookahead
    most = max(grown.values(), default=1)
    return min(max(longest, most), max(longest, scope.num_blocks * scope.block_size))


def _scaled(ops: list, bs: int, smaller: int) -> list:
    """``ops`` with each prompt of ``n`` tokens cut to ``ceil(n * smaller / bs)``: about as
    many blocks of the smaller size, full blocks staying full."""
    out = [MODEL.request(o) for o in ops]
    for o in out:
        if o.kind == "allocate":
            o.n_tokens = max(1, -(-o.n_tokens * smaller // bs))
    return out


MODEL = register(BlocksModel())
