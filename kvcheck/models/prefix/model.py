"""The prefix-cache model, as data: the block manager's four operations with their token
ids, the recorded states (the block manager's and the cache's), the shrink moves only a
prefix cache needs, and how a run of it reads in words.

Binds ``kvcheck.spec`` (``contracts``, ``invariants``) and ``kvcheck.spec.prefix``
(``PREFIX_INVARIANTS``, ``cache_hits``, ``allocate_with_hits``) to prefix-caching
targets; the run's checks live in ``oracle`` (``PrefixOracle``), the workload in
``driver``.

Exploration (``moves``, ``canonical``, ``exploration_scope``) keeps the base class's
defaults, so the shrinker runs no breadth-first search for this model: an allocation's
argument is a whole prompt, so the moves from a state are every token list up to the
longest prompt over the vocabulary (exponential in the prompt length), and two states
are the same only if every sequence's tokens are equal up to renaming token values as
well as blocks and sequences; a search over that would rarely complete within the
shrinker's budget and could not say "shortest". The greedy passes (with this model's
moves below) are what minimises its traces.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kvcheck.check.model import (
    BLOCK,
    COUNT,
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
from kvcheck.models.blocks.model import _COPIES, BlockScope
from kvcheck.models.blocks.model import STATE_SCHEMA as BLOCKS_STATE
from kvcheck.spec import contracts
from kvcheck.spec import prefix as P
from kvcheck.spec.contracts import Op


@dataclass
class PrefixOp(Op):
    """An operation with its token ids (allocate: the prompt; append_slot: its one token)
    and, for a successful allocate, ``hits``: how many leading blocks came from the cache."""

    tokens: tuple = ()
    hits: int | None = None
    cached_tokens: int | None = None  # what a successful allocate reported (None: nothing)

    @property
    def token(self):
        """append_slot's token."""
        return self.tokens[0] if self.tokens else None


def _make(kind: str, **args) -> PrefixOp:
    if kind in ("allocate", "append_slots"):
        toks = tuple(args.pop("tokens"))
        return PrefixOp(kind, n_tokens=len(toks), tokens=toks, **args)
    if kind == "append_slot":
        return PrefixOp(kind, tokens=(args.pop("token"),), **args)
    return PrefixOp(kind, **args)


def _doc(kind: str) -> str:
    rule = {"allocate": P.allocate_with_hits, "commit": P.commit}.get(kind) or contracts.CONTRACTS[kind]
    return " ".join((rule.__doc__ or "").split())


OPS = {
    "allocate": OpSpec("allocate", _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS)),
                       results=(Arg("hits", COUNT), Arg("cached_tokens", VALUE, schema={
                           "type": ["integer", "null"]})), doc=_doc("allocate")),
    "append_slot": OpSpec("append_slot", _make, (Arg("seq", SEQ), Arg("token", VALUE)),
                          results=(Arg("block", BLOCK), Arg("offset", VALUE), Arg("cow_src", BLOCK)),
                          doc=_doc("append_slot")),
    "fork": OpSpec("fork", _make, (Arg("seq", SEQ, key="parent"), Arg("child", NEW_SEQ)),
                   doc=_doc("fork")),
    "free_seq": OpSpec("free_seq", _make, (Arg("seq", SEQ),), doc=_doc("free_seq")),
    # only for a target with commit(seq): the engine wrote seq's prompt (publish after write)
    "commit": OpSpec("commit", _make, (Arg("seq", SEQ),), doc=_doc("commit")),
    # only for a target offering them (its capabilities), as in the block manager's model:
    # the reserved slots a rollback leaves are written by append_slots, with their token ids
    # (or one at a time by append_slot)
    "append_slots": OpSpec("append_slots", _make, (Arg("seq", SEQ), Arg("tokens", TOKENS),
                                                   Arg("lookahead", COUNT, low=0)),
                           results=(_COPIES,), doc=_doc("append_slots")),
    "rollback": OpSpec("rollback", _make, (Arg("seq", SEQ), Arg("n_tokens", COUNT)),
                       doc=_doc("rollback")),
    "rebase": OpSpec("rebase", _make, (Arg("seq", SEQ, key="source"), Arg("child", SEQ)),
                     results=(_COPIES,), doc=_doc("rebase")),
    "preempt": OpSpec("preempt", _make, (Arg("seq", SEQ),), doc=_doc("preempt")),
}
# The block manager's operations the prefix model drives where a target offers them.
EXTRA_OPS = ("append_slots", "rollback", "rebase", "preempt")

_BLOCKS = {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/block"}}
STATE_SCHEMA = copy.deepcopy(BLOCKS_STATE)  # the block manager's state, and the cache's
STATE_SCHEMA["required"] = [*STATE_SCHEMA["required"], "evictable", "cache"]
STATE_SCHEMA["properties"].update({
    "free_list": _BLOCKS,  # the plain free list (refcount 0, no key), in the allocator's order
    "evictable": _BLOCKS,  # refcount 0, key still cached, least recently used first
    "cache": {"type": "object", "maxProperties": 1048576,  # key (as text) -> the block it names
              "propertyNames": {"maxLength": 80}, "additionalProperties": {"$ref": "#/$defs/block"}},
})

KEY_CHARS = 72  # a cache key is recorded as at most this many characters


def key_text(key) -> str:
    """A cache key in a few characters: bytes as hex, numbers and text as they are."""
    if isinstance(key, (bytes, bytearray)):
        text = key.hex()
    elif isinstance(key, (int, str)):
        text = str(key)
    else:
        try:
            text = repr(key)
        except Exception:  # noqa: BLE001 - an unprintable key is still a key
            text = f"<{type(key).__name__}>"
    return text if len(text) <= KEY_CHARS else text[: KEY_CHARS - 3] + "..."


def cache_json(entries) -> dict:
    """The cache's (key, block) entries as a trace records them: key text -> block (two
    keys that read alike are told apart by ``#2``, ``#3`` ...)."""
    out: dict = {}
    for key, b in entries:
        text = key_text(key)
        if text in out:
            n = 2
            while f"{text}#{n}" in out:
                n += 1
            text = f"{text}#{n}"
        out[text] = b
    return out


class PrefixModel(Model):
    name = "prefix"
    title = "prefix-caching block manager"
    ops = OPS
    scope_fields = (ScopeField("num_blocks"), ScopeField("block_size"))
    state_schema = STATE_SCHEMA
    outcomes = ("ok", "oob", "refused")  # a refusal: a policy the target declares

    # -- operations ----------------------------------------------------------------
    def describe(self, op) -> str:
        if op.kind == "allocate":
            head = f"allocate(seq={op.seq}, tokens={_tokens(op.tokens)})"
        elif op.kind == "append_slot":
            head = f"append_slot(seq={op.seq}, token={op.token!r})"
        elif op.kind == "fork":
            head = f"fork(parent={op.seq}, child={op.child})"
        elif op.kind == "commit":
            head = f"commit(seq={op.seq})"
        elif op.kind == "append_slots":
            la = f", lookahead={op.lookahead}" if op.lookahead else ""
            head = f"append_slots(seq={op.seq}, tokens={_tokens(op.tokens)}{la})"
        elif op.kind == "rollback":
            head = f"rollback(seq={op.seq}, n_tokens={op.n_tokens})"
        elif op.kind == "rebase":
            head = f"rebase(source={op.seq}, child={op.child})"
        elif op.kind == "preempt":
            head = f"preempt(seq={op.seq})"
        else:
            head = f"free_seq(seq={op.seq})"
        if op.outcome == "oob":
            return f"{head} -> OutOfBlocks"
        if op.outcome == "refused":
            return f"{head} -> refused"
        if op.kind == "append_slot" and op.block is not None:
            return f"{head} -> (block={op.block}, offset={op.offset}, cow_src={op.cow_src})"
        if op.kind in ("append_slots", "rebase") and op.copies:
            return f"{head} -> copies {list(map(list, op.copies))}"
        if op.kind == "allocate" and op.hits:
            return f"{head} -> {_plural(op.hits, 'block')} from the cache"
        return head

    def op_from_json(self, d: dict):
        op = super().op_from_json(d)
        op.has_cow = op.cow_src is not None
        return op

    def check_op_json(self, d: dict, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if d["op"] == "fork" and d["parent"] == d["child"]:
            raise TraceError(f"{where}: a sequence cannot fork into itself")
        if d["op"] == "allocate" and not d["tokens"]:
            raise TraceError(f"{where}.tokens: a prompt has at least one token")
        if d["op"] == "append_slot" and (type(d["token"]) is not int
                                         or not -(2**63) <= d["token"] < 2**63):
            raise TraceError(f"{where}.token: expected a token id (a 64-bit integer, as in a "
                             f"prompt), got {d['token']!r:.40}")
        result = d.get("result", {})
        if d["op"] == "append_slot" and "block" in result and "offset" not in result:
            raise TraceError(f"{where}.result: 'block' given without 'offset'")

    def check_state_json(self, state: dict, scope, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if len(state["refs"]) != scope.num_blocks:
            raise TraceError(f"{where}.refs: {len(state['refs'])} refcounts for a pool of "
                             f"{scope.num_blocks} blocks")

    # -- runs -----------------------------------------------------------------------
    def build(self, factory, scope: BlockScope, options: Options):
        from kvcheck.models.prefix.oracle import view_for
        from kvcheck.targets.loading import build

        target = build(factory, scope.num_blocks, scope.block_size, options.out_of_blocks)
        view_for(target)  # no cache to observe: bad input, before anything runs
        return target

    def start(self, target, scope, options: Options):
        from kvcheck.models.prefix.oracle import PrefixOracle

        return PrefixOracle(target, mode=options.mode, timeout=options.timeout,
                            compiled=options.compiled)

    def driver(self, seed: int, scope, target, options: Options):
        from kvcheck.models.prefix.driver import PrefixDriver
        from kvcheck.models.prefix.oracle import committer, takes_token_ids

        caps = set(target.capabilities) | ({"commit"} if committer(target) else set())
        if not takes_token_ids(target):  # (a prefix cache keys blocks by their tokens)
            caps.discard("append_slots")
        return _Driving(PrefixDriver(seed, scope.num_blocks, scope.block_size, frozenset(caps),
                                     options.extra.get("weights"),
                                     retry_refused=bool(getattr(target, "retries_refused", False))))

    # -- shrinking ------------------------------------------------------------------
    def count_hints(self, scope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_candidates(self, ops: list, scope: BlockScope):
        # drop an allocation together with the pool space it held
        bs, nb = scope.block_size, scope.num_blocks
        for i, op in enumerate(ops):
            held = -(-op.n_tokens // bs) if op.kind == "allocate" else 0
            if 0 < held < nb:
                yield [self.request(o) for o in ops[:i] + ops[i + 1:]], BlockScope(nb - held, bs)
        # fold an append into its sequence's prompt (allocate t, append u ~ allocate t + [u])
        for i in range(len(ops)):
            cand = _fold_append(self, ops, i)
            if cand is not None:
                yield cand, scope
        # token ids renamed 0, 1, 2 ... in order of first use (only equality matters to a
        # cache keyed by content; small ids read better)
        cand = _renamed_tokens(self, ops)
        if cand is not None:
            yield cand, scope

    def scope_variants(self, ops: list, scope: BlockScope, smaller: BlockScope):
        if smaller.block_size < scope.block_size:  # every prompt cut along with its blocks
            yield _scaled(self, ops, scope.block_size, smaller.block_size)

    # -- showing ------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        from kvcheck.models.blocks.witness import state_line

        cache = state.get("cache", {})
        evictable = state.get("evictable", [])
        keyed = sorted(set(cache.values()), key=_order)
        return (f"{state_line(state)} | evictable {_blocks(evictable)} | cache: "
                f"{_plural(len(cache), 'key')}{' on blocks ' + _blocks(keyed) if keyed else ''}")

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        from kvcheck.models.blocks.witness import narrate

        if op.outcome in ("oob", "refused"):
            return narrate(op, before, after, block_size).replace(
                "nothing may change", "nothing may change, the cache included")
        words = [narrate(op, before, after, block_size)]
        if op.kind in ("free_seq", "preempt") and before is not None and after is not None:
            back = sorted(set(after.get("free", [])) - set(before.get("free", [])), key=_order)
            evictable = set(after.get("evictable", []))
            keyed = [b for b in back if b in evictable]
            plain = [b for b in back if b not in evictable]
            words = [f"sequence {op.seq} is {'preempted' if op.kind == 'preempt' else 'freed'}"]
            if plain:
                words.append(f"block(s) {_blocks(plain)} return to the free list")
            if keyed:
                words.append(f"block(s) {_blocks(keyed)} become evictable (still cached)")
            if not back:
                words.append("no block returns to the pool")
        if op.kind == "allocate" and op.hits:
            words.append(f"{_plural(op.hits, 'block')} from the cache")
        if before is not None and after is not None:
            ev0, ev1 = before.get("evictable", []), after.get("evictable", [])
            keyed0, keyed1 = set(before.get("cache", {}).values()), set(after.get("cache", {}).values())
            left = [b for b in ev0 if b not in ev1]
            joined = [b for b in ev1 if b not in ev0]
            if left and op.kind == "allocate" and op.hits:
                table = after.get("tables", {}).get(str(op.seq), [])
                revived = [b for b in left if b in table[: op.hits]]
                if revived:
                    words.append(f"evictable block(s) {_blocks(revived)} revived")
                left = [b for b in left if b not in revived]
            if left:
                words.append(f"evictable block(s) {_blocks(left)} evicted for new content")
            if joined and op.kind not in ("free_seq", "preempt"):  # (said above for a free)
                words.append(f"block(s) {_blocks(joined)} now evictable (still cached)")
            new = sorted(keyed1 - keyed0, key=_order)
            gone = sorted(keyed0 - keyed1 - set(left), key=_order)
            if new:
                words.append(f"block(s) {_blocks(new)} now cached")
            if gone:
                words.append(f"block(s) {_blocks(gone)} no longer cached")
        return "; ".join(words)

    def initial_state_json(self, scope) -> dict:
        return {"tables": {}, "lens": {}, "refs": [0] * scope.num_blocks,
                "free": list(range(scope.num_blocks)), "free_list": list(range(scope.num_blocks)),
                "evictable": [], "cache": {}}

    def scope_json(self, scope: BlockScope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size}

    def scope_from_json(self, data: dict) -> BlockScope:
        return BlockScope(data["num_blocks"], data["block_size"])

    # -- traces from before the one format ---------------------------------------------
    def legacy_trace(self, data: dict) -> dict:
        """A ``kvcheck.prefix-trace`` (version 1, written by ``verify-prefix`` before the
        prefix cache was a model) as a version 2 trace: the same operations, each append's
        one-token list as its ``token``, no states."""
        from kvcheck.check.trace import TraceError

        if data.get("version") != 1 or type(data.get("version")) is not int:
            raise TraceError(f"unsupported kvcheck.prefix-trace version {data.get('version')!r:.40} "
                             f"(this kvcheck reads 1)")
        extra = sorted(set(data) - {"format", "version", "target", "seed", "minimality", "scope",
                                    "ops", "violation"})
        if extra:
            raise TraceError(f"trace: unexpected key {extra[0]!r:.40}")
        ops = data.get("ops")
        if not isinstance(ops, list):
            raise TraceError("trace.ops: expected a list")
        out = {k: data[k] for k in ("target", "seed", "minimality", "scope", "violation") if k in data}
        return {"format": "kvcheck.trace", "version": 2, "model": self.name, **out,
                "ops": [_legacy_op(d, f"trace.ops[{i}]") for i, d in enumerate(ops)]}


def _legacy_op(d, where: str) -> dict:
    from kvcheck.check.trace import TraceError

    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected an object")
    extra = sorted(set(d) - {"op", "seq", "parent", "child", "tokens", "outcome"})
    if extra:
        raise TraceError(f"{where}: unexpected key {extra[0]!r:.40}")
    out = {k: d[k] for k in ("op", "seq", "parent", "child") if k in d}
    if d.get("op") == "allocate" and "tokens" in d:
        out["tokens"] = d["tokens"]
    elif d.get("op") == "append_slot" and "tokens" in d:
        toks = d["tokens"]
        if not isinstance(toks, list) or len(toks) != 1:
            raise TraceError(f"{where}.tokens: an append_slot writes exactly one token")
        out["token"] = toks[0]
    elif "tokens" in d:
        raise TraceError(f"{where}: unexpected key 'tokens'")
    out["result"] = {"outcome": d.get("outcome", "ok")}
    return out


class _Driving:
    """The seeded driver, asked with the run state (the checker's calling convention)."""

    def __init__(self, driver):
        self.driver = driver
        self.rng = driver.rng

    def next_op(self, state):
        return self.driver.next_op(state.live(), state.num_free(),
                                   getattr(state, "uncommitted", None), state=state)


def _fold_append(model: PrefixModel, ops: list, i: int) -> list | None:
    """``ops`` without the append at ``i``, its token appended to its sequence's prompt."""
    if ops[i].kind != "append_slot":
        return None
    q = ops[i].seq
    for j in range(i - 1, -1, -1):
        if ops[j].kind == "allocate" and ops[j].seq == q:
            cand = [model.request(o) for o in ops]
            cand[j] = _make("allocate", seq=q, tokens=(*ops[j].tokens, ops[i].token))
            del cand[i]
            return cand
        if ops[j].kind in ("fork", "rebase") and ops[j].child == q:
            return None
        if ops[j].kind in ("rollback", "preempt", "append_slots") and ops[j].seq == q:
            return None
    return None


def _renamed_tokens(model: PrefixModel, ops: list) -> list | None:
    """``ops`` with token ids renumbered from 0 in order of first use; None if they are."""
    ids: dict = {}
    for op in ops:
        for t in op.tokens:
            ids.setdefault(t, len(ids))
    if all(t == i for t, i in ids.items()):
        return None
    out = []
    for op in ops:
        r = model.request(op)
        r.tokens = tuple(ids[t] for t in op.tokens)
        out.append(r)
    return out


def _scaled(model: PrefixModel, ops: list, bs: int, smaller: int) -> list:
    """``ops`` with each prompt of ``n`` tokens cut to its first ``ceil(n * smaller / bs)``:
    about as many blocks of the smaller size (a prefix of a shared prompt stays shared)."""
    out = [model.request(o) for o in ops]
    for i, o in enumerate(out):
        if o.kind == "allocate":
            out[i] = _make("allocate", seq=o.seq, tokens=o.tokens[: max(1, -(-o.n_tokens * smaller // bs))])
    return out


def _order(b):
    """Block ids in numeric order (anything else after them)."""
    return (0, b, "") if type(b) is int else (1, 0, repr(b))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tokens(toks) -> str:
    toks = list(toks)
    if len(toks) <= 16:
        return str(toks)
    return f"[{', '.join(map(str, toks[:8]))}, ..., {', '.join(map(str, toks[-4:]))}] ({len(toks)} tokens)"


def _blocks(bs) -> str:
    bs = list(bs)
    return str(bs) if len(bs) <= 32 else f"[{', '.join(map(str, bs[:32]))}, ...] ({len(bs)} blocks)"


MODEL = register(PrefixModel())
