"""The tiers model, as data: a device pool and a host pool, transfers that complete later
(``kvcheck.spec.tiers``; the target protocol is docs/tiers.md).

Operations: ``allocate(seq, tokens)`` and ``load(seq, tokens)`` admit a request (a load
looks its leading blocks up in the host cache and starts copying the hits), ``append``
decodes a token, ``free`` ends a request (finished or aborted, jobs in flight or not),
``store(seq)`` starts copying the request's full blocks to the host, ``complete(job, ok)``
ends a pending job (``complete(seq, job, ok, filled)``: the ``job``-th job started for
request ``seq``, from 0: a reference that survives deleting another request's operations;
``filled``, a prefetch's only: the leading pages the storage returned),
``prefetch(seq, tokens)`` fetches request seq's prompt pages past the cached prefix from a
storage tier into host blocks (SGLang's HiCache L3; seq is a request about to be
scheduled, never live here),
``evict(n)`` asks the host cache to evict, ``swap_out`` / ``swap_in``
move a sequence's KV whole (vLLM v0), ``slide(seq, upto)`` moves a request's sliding
window past its first ``upto`` tokens (released from a pool behind a mapping, kept on the
device: SGLang's SWA pool). Which pending job completes next, and whether it
fails, is the driver's choice: completions interleave with everything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.check.model import (
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
from kvcheck.spec import tiers as T


@dataclass(frozen=True)
class TierScope:
    """A device pool of ``num_blocks`` blocks and a host pool of ``host_blocks`` blocks,
    ``block_size`` tokens each."""

    num_blocks: int
    block_size: int
    host_blocks: int

    def describe(self) -> str:
        return (f"{self.num_blocks} device + {self.host_blocks} host blocks x "
                f"{self.block_size} slots")


@dataclass(frozen=True)
class TierExploreScope(TierScope):
    """What bounded exploration enumerates: the pools, and ``depth`` operations per run
    (``TiersModel.moves``: completions of every pending job, succeeding or failing,
    among them)."""

    depth: int = 4

    def describe(self) -> str:
        return f"{super().describe()}, depth {self.depth}"


@dataclass
class TierOp:
    """One operation: its arguments, outcome and results (``job``: the number, among the
    request's jobs, of the job a store or load started, None for none; ``hits``: a load's blocks found in the host
    cache; ``block``/``offset``: where an append wrote; ``admitted``: a swap's admission
    check). ``wanted``: the oracle's ghost, a load's prefix ids per leading block."""

    kind: str
    seq: int = 0
    tokens: tuple = ()
    token: object = None
    job: object = None
    ok: bool = True
    n: int = 1
    outcome: str = "ok"
    block: object = None
    offset: object = None
    hits: object = None
    admitted: object = None
    wanted: tuple | None = None
    lookahead: int = 0  # a swap_in's lookahead slots (targets with "lookahead" only)
    upto: int = 0
    units: tuple = ()  # the oracle's ghost: an evict's eviction units before it
    filled: int | None = None  # a prefetch's completion: the leading pages filled


def _make(kind: str, **args) -> TierOp:
    if "tokens" in args:
        args["tokens"] = tuple(args["tokens"])
    return TierOp(kind, **args)


def _doc(kind: str) -> str:
    return " ".join((T.CONTRACTS[kind].__doc__ or "").split())


_JOB = {"type": ["integer", "null"], "minimum": 0, "maximum": 2147483647}
OPS = {
    "allocate": OpSpec("allocate", _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS)),
                       doc=_doc("allocate")),
    "load": OpSpec("load", _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS)),
                   results=(Arg("job", VALUE, schema=_JOB), Arg("hits", VALUE, schema=_JOB)),
                   doc=_doc("load")),
    "append": OpSpec("append", _make, (Arg("seq", SEQ), Arg("token", VALUE)),
                     results=(Arg("block", VALUE, schema=_JOB),
                              Arg("offset", VALUE, schema=_JOB)), doc=_doc("append")),
    "free": OpSpec("free", _make, (Arg("seq", SEQ),), doc=_doc("free")),
    "store": OpSpec("store", _make, (Arg("seq", SEQ),),
                    results=(Arg("job", VALUE, schema=_JOB),), doc=_doc("store")),
    "complete": OpSpec("complete", _make, (Arg("seq", SEQ), Arg("job", VALUE, schema=_JOB),
                                           Arg("ok", VALUE, schema={"type": "boolean"}),
                                           Arg("filled", VALUE, schema=_JOB, optional=True)),
                       doc=_doc("complete")),
    T.PREFETCH: OpSpec(T.PREFETCH, _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS)),
                       results=(Arg("job", VALUE, schema=_JOB),), doc=_doc(T.PREFETCH)),
    "evict": OpSpec("evict", _make, (Arg("n", COUNT),), doc=_doc("evict")),
    "swap_out": OpSpec("swap_out", _make, (Arg("seq", SEQ),),
                       results=(Arg("admitted", VALUE, schema={"type": ["boolean", "null"]}),),
                       doc=_doc("swap_out")),
    "swap_in": OpSpec("swap_in", _make, (Arg("seq", SEQ), Arg("lookahead", COUNT, low=0)),
                      results=(Arg("admitted", VALUE, schema={"type": ["boolean", "null"]}),),
                      doc=_doc("swap_in")),
}
OPS[T.SLIDE] = OpSpec(T.SLIDE, _make, (Arg("seq", SEQ), Arg("upto", COUNT)),
                      doc=_doc(T.SLIDE))
SEED_OPS = ("allocate", "load", "append", "free", "store", "complete", "evict")

_BLOCKS = {"type": "array", "maxItems": 1048576, "items": {"$ref": "#/$defs/block"}}
_KEYS = {"pattern": "^(0|[1-9][0-9]{0,9})$"}
_POOL = {"type": "object", "additionalProperties": False, "required": ["refs", "free"],
         "properties": {"refs": _BLOCKS, "free": _BLOCKS, "cached": _BLOCKS}}
STATE_SCHEMA = {
    "type": "object", "required": ["pools", "tables"], "additionalProperties": False,
    "properties": {
        "pools": {"type": "object", "maxProperties": 8, "additionalProperties": _POOL},
        "tables": {"type": "object", "maxProperties": 100000, "propertyNames": _KEYS,
                   "additionalProperties": {
                       "type": "object", "additionalProperties": False,
                       "required": ["pool", "blocks", "len"],
                       "properties": {"pool": {"type": "string", "maxLength": 32},
                                      "blocks": _BLOCKS, "len": {"$ref": "#/$defs/count"},
                                      "mapped": {"type": "object", "maxProperties": 8,
                                                 "additionalProperties": _BLOCKS}}}},
        "jobs": {"type": "object", "maxProperties": 100000,
                 "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})[.](0|[1-9][0-9]{0,9})$"},
                 "additionalProperties": {
                     "type": "object", "additionalProperties": False,
                     "properties": {"kind": {"type": "string", "maxLength": 16},
                                    "seq": {"$ref": "#/$defs/count"},
                                    "src": _BLOCKS, "dst": _BLOCKS}}},
    },
}


class TiersModel(Model):
    name = "tiers"
    title = "tiered KV store (device and host pools, transfers in flight)"
    ops = OPS
    scope_fields = (ScopeField("num_blocks"), ScopeField("host_blocks"), ScopeField("block_size"))
    state_schema = STATE_SCHEMA

    def describe(self, op) -> str:
        if op.kind in ("allocate", "load"):
            head = f"{op.kind}(seq={op.seq}, tokens={list(op.tokens)})"
        elif op.kind == "append":
            head = f"append(seq={op.seq}, token={op.token!r})"
        elif op.kind == "complete":
            filled = "" if op.filled is None else f", filled={op.filled}"
            head = f"complete(seq={op.seq}, job={op.job}, ok={op.ok}{filled})"
        elif op.kind == T.PREFETCH:
            head = f"prefetch(seq={op.seq}, tokens={list(op.tokens)})"
        elif op.kind == "evict":
            head = f"evict(n={op.n})"
        elif op.kind == T.SLIDE:
            head = f"slide(seq={op.seq}, upto={op.upto})"
        elif op.kind == "swap_in" and op.lookahead:
            head = f"swap_in(seq={op.seq}, lookahead={op.lookahead})"
        else:
            head = f"{op.kind}(seq={op.seq})"
        if op.outcome == "oob":
            return f"{head} -> OutOfBlocks"
        if op.kind in ("store", "load", T.PREFETCH) and op.job is not None:
            hits = f", {op.hits} hit(s)" if op.kind == "load" else ""
            return f"{head} -> job {op.seq}.{op.job}{hits}"
        if op.kind in ("swap_out", "swap_in") and op.admitted is not None:
            return f"{head} -> {'admitted' if op.admitted else 'refused'}"
        if op.kind == "append" and op.block is not None:
            return f"{head} -> (block={op.block}, offset={op.offset})"
        return head

    def check_op_json(self, d: dict, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if d["op"] in ("allocate", "load", T.PREFETCH) and not d["tokens"]:
            raise TraceError(f"{where}.tokens: a prompt has at least one token")
        if d["op"] == "complete" and d["job"] is None:
            raise TraceError(f"{where}.job: complete needs a job number")

    # -- runs -----------------------------------------------------------------------
    def resolve(self, spec):
        from kvcheck.targets import registry
        from kvcheck.targets.loading import _import_attr

        known = getattr(registry, "TIERS_TARGETS", {})
        if isinstance(spec, str) and spec in known:
            return spec, _import_attr(known[spec][0])
        name, at, version = spec.partition("@") if isinstance(spec, str) else ("", "", "")
        if at and name in known:  # sglang-swa@0.5.13: the adapter's release
            from kvcheck.targets.loading import with_version

            return spec, with_version(_import_attr(known[name][0]), spec, version)
        if isinstance(spec, str) and spec and ":" not in spec:
            from kvcheck.targets.loading import TargetError

            raise TargetError(f"unknown tiers target {spec!r}: use module:attr, file.py:attr "
                              f"or one of: {', '.join(sorted(known)) or '(none)'}")
        return None

    def build(self, factory, scope: TierScope, options: Options):
        from kvcheck.models.tiers.oracle import build

        return build(factory, scope, options)

    def start(self, target, scope, options: Options):
        from kvcheck.models.tiers.oracle import TierOracle

        return TierOracle(target, scope, options)

    def driver(self, seed: int, scope, target, options: Options):
        from kvcheck.models.tiers.driver import TiersDriver

        return TiersDriver(seed, scope, target, options.extra.get("weights"))

    # -- exploration -------------------------------------------------------------------
    def moves(self, state, scope) -> list:
        """A small branching set: a new request (allocated, or loaded with a prompt that
        repeats a live one's), per live request a token, a store, a free (and swaps where
        offered), every pending job completed or failed, one eviction."""
        out = []
        new = max([*state.tokens, -1]) + 1
        B = scope.block_size
        out.append(_make("allocate", seq=new, tokens=(0,) * (B + 1)))
        for toks in {tuple(t) for t in state.tokens.values()}:
            out.append(_make("load", seq=new, tokens=toks + (0,)))
        for q in sorted(state.tokens):
            out += [_make("append", seq=q, token=0), _make("store", seq=q),
                    _make("free", seq=q), _make("swap_out", seq=q), _make("swap_in", seq=q),
                    _make("swap_in", seq=q, lookahead=B),  # (where the target's is B)
                    _make(T.SLIDE, seq=q, upto=state.slid.get(q, 0) + 1)]
        for toks in {tuple(t) for t in state.tokens.values()}:  # (its pages past a live
            out.append(_make(T.PREFETCH, seq=new, tokens=toks + (0,) * B))  # prompt's)
        for q, j in sorted(state.pending()):
            if state.jobs[q, j]["kind"] == T.PREFETCH:  # every partial fill, none to all
                out += [_make("complete", seq=q, job=j, ok=True, filled=f)
                        for f in range(len(state.jobs[q, j]["keys"]) + 1)]
                continue
            out += [_make("complete", seq=q, job=j, ok=True),
                    _make("complete", seq=q, job=j, ok=False)]
        out.append(_make("evict", n=1))
        return out

    def canonical(self, state):
        import json

        return json.dumps(state.observed_json(), sort_keys=True) + repr(sorted(
            (q, tuple(t)) for q, t in state.tokens.items()))

    # -- shrinking ------------------------------------------------------------------
    def count_hints(self, scope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_groups(self, ops: list) -> list[list[int]] | None:
        """A request's operations (its jobs' completions included) are a group; each
        eviction is one of its own."""
        groups: dict = {}
        for i, op in enumerate(ops):
            key = ("evict", i) if op.kind == "evict" else op.seq
            groups.setdefault(key, []).append(i)
        return list(groups.values()) if len(groups) > 1 else None

    def shrink_candidates(self, ops: list, scope: TierScope):
        # a request dropped whole: every operation on it, its jobs' completions included
        seqs = list(dict.fromkeys(op.seq for op in ops if op.kind not in ("evict",)))
        for q in seqs[:-1] if seqs else ():
            cand = [self.request(o) for o in ops if o.kind == "evict" or o.seq != q]
            if len(cand) < len(ops):
                yield cand, scope
        # a completion moved one place earlier (completion orders are part of a bug)
        for i in range(1, len(ops)):
            if ops[i].kind == "complete" and ops[i - 1].kind not in ("store", "load",
                                                                      T.PREFETCH):
                cand = [self.request(o) for o in ops]
                cand[i - 1], cand[i] = cand[i], cand[i - 1]
                yield cand, scope
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
        # a prefetch's completion filling one page fewer
        for i, op in enumerate(ops):
            if op.kind == "complete" and op.filled:
                cand = [self.request(o) for o in ops]
                cand[i].filled = op.filled - 1
                yield cand, scope
        # a prompt one token shorter
        for i, op in enumerate(ops):
            if op.kind in ("allocate", "load", T.PREFETCH) and len(op.tokens) > 1:
                cand = [self.request(o) for o in ops]
                cand[i] = _make(op.kind, seq=op.seq, tokens=op.tokens[:-1])
                yield cand, scope

    # -- showing ------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        parts = []
        for q, t in state.get("tables", {}).items():
            parts.append(f"seq {q}: {t['len']} tokens in {t['pool']} {t['blocks']}" + "".join(
                f", {p} {b}" for p, b in t.get("mapped", {}).items()))
        for j, job in state.get("jobs", {}).items():
            parts.append(f"job {j} ({job.get('kind')}): "
                         f"{job.get('src')} -> {job.get('dst')}")
        pools = "; ".join(
            f"{p} free {len(v.get('free', []))}"
            + (f", cached {v['cached']}" if v.get("cached") else "")
            for p, v in state.get("pools", {}).items())
        return f"{'; '.join(parts) or 'no requests'} | {pools}"

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        if op.outcome == "oob":
            return f"{op.kind} ran out of blocks: nothing may change"
        if op.kind == "allocate":
            return f"request {op.seq} admitted on the device with {len(op.tokens)} tokens"
        if op.kind == "load":
            if op.job is None:
                return (f"request {op.seq} admitted with {len(op.tokens)} tokens; the host "
                        f"cache had none of its blocks")
            return (f"request {op.seq} admitted with {len(op.tokens)} tokens; {op.hits} leading "
                    f"block(s) found in the host cache, copied by job {op.seq}.{op.job}")
        if op.kind == "append":
            return f"request {op.seq} decodes one token"
        if op.kind == "free":
            return f"request {op.seq} ends (finished or aborted)"
        if op.kind == "store":
            return (f"request {op.seq} has nothing stored" if op.job is None else
                    f"job {op.seq}.{op.job} starts copying full blocks of request {op.seq} "
                    f"to the host")
        if op.kind == T.PREFETCH:
            return (f"request {op.seq}'s pages are not in the storage tier, or the host has "
                    f"no room: nothing fetched" if op.job is None else
                    f"job {op.seq}.{op.job} starts fetching request {op.seq}'s pages from the "
                    f"storage tier into host blocks")
        if op.kind == "complete" and op.filled is not None:
            return (f"job {op.seq}.{op.job} completes with {op.filled} page(s) filled: the "
                    f"rest are released")
        if op.kind == "complete":
            return f"job {op.seq}.{op.job} {'completes' if op.ok else 'fails'}"
        if op.kind == "evict":
            return f"the host cache evicts up to {op.n} block(s)"
        if op.kind == T.SLIDE:
            return (f"request {op.seq}'s first {op.upto} token(s) leave its sliding window: "
                    f"released behind the mapping, kept on the device")
        verdict = {True: "admitted", False: "refused", None: ""}[op.admitted]
        return f"request {op.seq} {op.kind.replace('_', ' ')}: {verdict}"

    def pool_of(self, state: dict) -> dict | None:
        return None

    def scope_json(self, scope: TierScope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size,
                "host_blocks": scope.host_blocks}

    def scope_from_json(self, data: dict) -> TierScope:
        return TierScope(data["num_blocks"], data["block_size"],
                         data.get("host_blocks", default_host(data["num_blocks"])))

    def scope_words(self, scope) -> str:
        n = scope.host_blocks
        return f", {n} host block{'' if n == 1 else 's'}"


def default_host(num_blocks: int) -> int:
    """The host pool when none is given: half the device's (so that the host fills and
    evicts, and a store may have to wait for room)."""
    return max(1, num_blocks // 2)


MODEL = register(TiersModel())
