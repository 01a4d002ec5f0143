"""The prefix-cache oracle: structural checks plus cache checks at the data level.

``PrefixOracle(target)`` drives an allocator with real token ids
(``allocate(seq, n, token_ids=...)``, ``append_slot(seq, token_id)``) and,
after every operation, checks:

1. the structural spec through ``kvcheck.oracle.Oracle`` (every state
   invariant, the append/fork/free contracts, read-back through the shadow
   memory), with ``allocate``'s contract replaced by
   ``spec.prefix.allocate_with_hits`` because a hit shares a block in use;
2. the cache-hit contract ``spec.prefix.cache_hits``: every block an
   allocation served from the cache held, before it, exactly the requested
   prefix (its ghost *prefix id*, see below), so a hit can never return an
   evicted or reused block;
3. every invariant of ``spec.prefix.PREFIX_INVARIANTS`` on a
   ``PrefixSnapshot`` built from the allocator's cache, free and evictable
   lists and the oracle's ghost contents;
4. after an out-of-blocks failure: the cache and evictable list unchanged.

Ghost contents. The oracle plays the engine: it writes each token into the
slot the allocator names (skipping blocks served from the cache, which an
engine would not recompute), and remembers per block how many slots hold the
current content (``filled``) and which whole prefix that content was computed
under (``content``, an interned prefix id: block tokens chained with the
previous block's id). A cache key is bound to the prefix id of the block it
names when the oracle first sees it.

Which blocks were hits? The engine is told by the lookup; the oracle infers it
the same way for every target: the leading table entries of a new sequence
that were cached under a key before the call and are still cached under that
key after it. (A block taken for new content must lose its key first, so a
block evicted but left in the hash map counts as a hit and is caught by 2.)

Targets expose their cache either through methods (``cache_entries()`` ->
(key, block) pairs, ``evictable_blocks()``, ``free_list_blocks()``, optional
``num_evictable()``; the bundled ``prefix`` target has them) or are one of the
third-party adapters read by ``_view_for`` (vLLM v1, nano-vllm).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from kvcheck.check.shrink import budget_ran_out
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, OperationTimeout, Watchdog, active_watchdog
from kvcheck.errors import what_it_did
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.blocks.shadow import ShadowMemory
from kvcheck.spec import prefix as P
from kvcheck.spec.contracts import OK, OOB, Op
from kvcheck.spec.logic import PY
from kvcheck.targets.loading import TargetError, build, resolve


@dataclass
class PrefixOp(Op):
    """An operation with its token ids (allocate: the prompt; append_slot: one token)."""

    tokens: tuple = ()


def request(op: Op) -> PrefixOp:
    return PrefixOp(op.kind, seq=op.seq, child=op.child, n_tokens=op.n_tokens,
                    tokens=tuple(getattr(op, "tokens", ())))


# -- reading a target's cache --------------------------------------------------------
class MethodView:
    """A target that reports its cache itself."""

    def __init__(self, obj):
        self.obj = obj

    def entries(self):
        return [(k, int(b)) for k, b in self.obj.cache_entries()]

    def evictable(self):
        return [int(b) for b in self.obj.evictable_blocks()]

    def free_list(self):
        return [int(b) for b in self.obj.free_list_blocks()]

    def evictable_len(self):
        f = getattr(self.obj, "num_evictable", None)
        return int(f()) if callable(f) else len(self.evictable())

    def free_list_len(self):
        f = getattr(self.obj, "num_free_list", None)
        return int(f()) if callable(f) else len(self.free_list())


class VllmV1View:
    """vLLM v1: the BlockPool's hash map; its one free queue holds both parts."""

    def __init__(self, target):
        self.pool = target.pool

    def entries(self):
        out = []
        for key, val in self.pool.cached_block_hash_to_block._cache.items():
            for blk in (val.values() if isinstance(val, dict) else (val,)):
                if blk.block_id != 0:
                    out.append((key, blk.block_id - 1))
        return out

    def _queue(self):
        return [b for b in self.pool.free_block_queue.get_all_free_blocks() if b.block_id != 0]

    def evictable(self):
        return [b.block_id - 1 for b in self._queue() if b.block_hash is not None]

    def free_list(self):
        return [b.block_id - 1 for b in self._queue() if b.block_hash is None]

    def evictable_len(self):
        return len(self.evictable())

    def free_list_len(self):
        return len(self.free_list())


class NanoView:
    """nano-vllm: ``hash_to_block_id``; no evictable list (a freed block's entry is dropped)."""

    def __init__(self, target):
        self.m = target.manager

    def entries(self):
        return list(self.m.hash_to_block_id.items())

    def evictable(self):
        return []

    def free_list(self):
        return list(self.m.free_block_ids)

    def evictable_len(self):
        return 0

    def free_list_len(self):
        return len(self.m.free_block_ids)


class VllmV0View:
    """vLLM v0: the prefix-caching allocator's ``_cached_blocks`` (hash -> block),
    its evictor's ``free_table`` (cached, unreferenced blocks) and the hashless
    allocator's free deque."""

    def __init__(self, target):
        self.gpu = target.gpu

    def entries(self):
        return [(key, int(b)) for key, b in self.gpu._cached_blocks.items()]

    def evictable(self):
        return [int(b) for b in self.gpu.evictor.free_table]

    def free_list(self):
        return [int(b) for b in self.gpu._hashless_allocator._free_block_indices]

    def evictable_len(self):
        return int(self.gpu.evictor.num_blocks)

    def free_list_len(self):
        return len(self.gpu._hashless_allocator._free_block_indices)


def _view_for(target):
    obj = getattr(target, "impl", target)
    if all(callable(getattr(obj, m, None))
           for m in ("cache_entries", "evictable_blocks", "free_list_blocks")):
        return MethodView(obj)
    pool = getattr(obj, "pool", None)
    if pool is not None and hasattr(pool, "cached_block_hash_to_block"):
        return VllmV1View(obj)
    manager = getattr(obj, "manager", None)
    if manager is not None and hasattr(manager, "hash_to_block_id"):
        return NanoView(obj)
    gpu = getattr(obj, "gpu", None)
    if gpu is not None and hasattr(gpu, "_cached_blocks") and hasattr(gpu, "evictor"):
        return VllmV0View(obj)
    raise TargetError(f"{type(obj).__name__} does not expose a prefix cache "
                      "(cache_entries/evictable_blocks/free_list_blocks)")


# -- the engine's side: ghost contents --------------------------------------------------
class Ghost:
    """Interned prefixes and what each block holds."""

    def __init__(self, block_size: int):
        self.bs = block_size
        self.ids: dict[tuple, int] = {}
        self.parts: list[tuple] = []  # id -> (parent id, block tokens)
        self.filled: dict[int, int] = {}
        self.content: dict[int, int] = {}
        self.chains: dict[int, list[int]] = {}  # seq -> prefix id of each full block

    def intern(self, parent: int, toks: tuple) -> int:
        key = (parent, toks)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.parts)
            self.parts.append(key)
        return i

    def chain(self, tokens) -> list[int]:
        out, parent, bs = [], -1, self.bs
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = self.intern(parent, tuple(tokens[start : start + bs]))
            out.append(parent)
        return out

    def tokens_of(self, pid: int) -> list:
        out: list = []
        while pid >= 0:
            pid, toks = self.parts[pid]
            out[:0] = toks
        return out

    def show(self, pid: int) -> str:
        if pid < 0:
            return "no complete prefix"
        toks = self.tokens_of(pid)
        body = toks if len(toks) <= 12 else [*toks[:4], "...", *toks[-6:]]
        return f"prefix {body} ({len(toks)} tokens)"


class PrefixShadow(ShadowMemory):
    """Shadow memory writing the real token ids, skipping blocks served from the cache."""

    def __init__(self, block_size: int, owner: PrefixOracle):
        super().__init__(block_size)
        self.owner = owner

    def clone(self):  # pragma: no cover - the prefix oracle never clones
        raise NotImplementedError

    def owner_of(self, token):
        return None

    def owner(self, token):  # token ids are shared between sequences: no single writer
        return None

    def allocate(self, seq, n_tokens, table):
        o, g, bs = self.owner, self.owner.ghost, self.block_size
        toks = list(o.pending.tokens)
        self.expect(seq, toks)
        chain = g.chain(toks)
        g.chains[seq] = chain
        for i in range(o.pending_hits, len(table)):
            chunk = toks[i * bs : (i + 1) * bs]
            b = table[i]
            self.write_tokens(b, 0, chunk)
            g.filled[b] = len(chunk)
            g.content[b] = chain[i] if len(chunk) == bs else -1

    def append(self, seq, block, offset, cow_src):
        o, g, bs = self.owner, self.owner.ghost, self.block_size
        tok = o.pending.tokens[0]
        if cow_src is not None:
            self.copy(cow_src, block)
        self.write(block, offset, tok)
        self.expect_one_more(seq, tok)
        g.filled[block] = offset + 1
        chain = g.chains[seq]
        if offset + 1 == bs:
            n = self.length(seq)
            chain.append(g.intern(chain[-1] if chain else -1, tuple(self.tokens(seq, n - bs, n))))
            g.content[block] = chain[-1]
        else:
            g.content[block] = -1

    def fork(self, parent, child):
        super().fork(parent, child)
        g = self.owner.ghost
        g.chains[child] = list(g.chains[parent])

    def free(self, seq):
        super().free(seq)
        self.owner.ghost.chains.pop(seq, None)


class _Structural(Oracle):
    """The structural oracle, calling with token ids and judging allocate with hits."""

    def __init__(self, target, owner: PrefixOracle, mode: str, timeout):
        self.owner = owner
        super().__init__(target, mode=mode, timeout=timeout)
        self.shadow = PrefixShadow(target.block_size, owner)

    def _call(self, op):
        t = self.target
        if op.kind == "allocate":
            return t.allocate(op.seq, op.n_tokens, token_ids=list(op.tokens))
        if op.kind == "append_slot":
            return t.append_slot(op.seq, op.tokens[0])
        return super()._call(op)

    def _check_op(self, pre, post, op, dom, n):
        if op.kind != "allocate":
            return super()._check_op(pre, post, op, dom, n)
        return self.owner._check_allocate(pre, post, op, dom, n)


# -- the oracle --------------------------------------------------------------------------
@dataclass
class Stats:
    allocations: int = 0
    hit_allocations: int = 0
    hit_blocks: int = 0
    revived: int = 0  # evictable blocks brought back by a hit
    evicted: int = 0  # evictable blocks taken for new content
    oob: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


class PrefixOracle:
    def __init__(self, target, mode: str = "full", timeout: float | None = 10.0):
        self.target = target
        self.view = _view_for(target)
        self.block_size = target.block_size
        self.ghost = Ghost(target.block_size)
        self.meanings: dict = {}
        self.stats = Stats()
        self.pending: PrefixOp | None = None
        self.pending_hits = 0
        self.s = _Structural(target, self, mode, timeout)
        self.violation = self.s.violation
        self.steps = 0
        self.pre: P.PrefixSnapshot | None = None
        if self.violation is None:
            self.pre, self.violation = self._observe_and_check(0, None)

    def live(self) -> list[int]:
        return self.s.live()

    def num_free(self) -> int:
        return self.s._state().num_free()

    def valid(self, op: Op) -> bool:
        return self.s.valid(op)

    def step(self, op: PrefixOp, watchdog=None) -> Violation | None:
        if self.violation is not None:
            return self.violation
        self.pending, self.pending_hits = op, 0
        wd = watchdog if watchdog is not None else active_watchdog()
        if wd is not None:
            wd.enter()  # the operation and the cache observation after it: one guarded call
        try:
            return self._step(op, wd)
        except OperationTimeout as exc:
            self.violation = Violation(self.s.steps, "hang", "prefix observation",
                                       witness=f"reading the prefix cache after {op.kind} {exc}")
            return self.violation
        finally:
            if wd is not None:
                wd.leave()

    def _step(self, op: PrefixOp, watchdog) -> Violation | None:
        v = self.s.step(op, watchdog)
        self.steps = self.s.steps
        if v is None:
            post, v = self._observe_and_check(self.steps, op)
            if v is None:
                self._count(op, post)
                self.pre = post
        self.violation = v
        return v

    # -- observation --------------------------------------------------------------------
    def _observe(self) -> P.PrefixSnapshot:
        view, g, st = self.view, self.ghost, self.s._state()
        entries = view.entries()
        for key, b in entries:
            if key not in self.meanings:
                ok = g.filled.get(b, 0) == self.block_size
                self.meanings[key] = g.content.get(b, -1) if ok else -1
        bs, partial = self.block_size, set()
        for q in st.seqs():
            full = st.length(q) // bs
            partial.update(st.table_tuple(q)[full:])
        refs = [st.ref(b) for b in range(self.target.num_blocks)]
        return P.PrefixSnapshot(self.target.num_blocks, bs, refs, view.free_list(),
                                view.evictable(), entries, self.meanings, partial,
                                g.filled, g.content, view.free_list_len(), view.evictable_len())

    def _observe_and_check(self, n: int, op):
        try:
            post = self._observe()
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the allocator's fault
            why = f"reading the prefix cache {what_it_did(exc)}"
            return None, Violation(n, "malformed", "prefix observation", witness=why)
        if op is not None and op.outcome == OOB and self.pre is not None:
            if sorted(map(repr, post.entries)) != sorted(map(repr, self.pre.entries)) or \
                    post.evictable != self.pre.evictable:
                name = f"{op.kind}: exception_safety: cache unchanged"
                return post, Violation(n, "contract", name, op.seq, witness=(
                    f"{op.kind} ran out of blocks but changed the prefix cache or the evictable "
                    f"list (evictable {sorted(self.pre.evictable.elements())} -> "
                    f"{sorted(post.evictable.elements())}, {len(self.pre.entries)} -> "
                    f"{len(post.entries)} cache entries)"))
        for inv in P.PREFIX_INVARIANTS:
            elements = (None,) if inv.domain == "global" else post.blocks()
            for b in elements:
                if not inv.holds_for(PY, post, b):
                    return post, Violation(n, "invariant", inv.name, b, doc=inv.doc,
                                           witness=self._explain(post, b))
        return post, None

    def _explain(self, s: P.PrefixSnapshot, b) -> str:
        if b is None:
            return (f"the allocator reports {s.free_list_len()} free and {s.evictable_len()} "
                    f"evictable blocks; its lists hold {len(s.free_list)} and {len(s.evictable)}")
        g = self.ghost
        meaning = [g.show(s.meanings.get(k, -1)) for k in s.keys_of(b)]
        return (f"block {b}: refcount {s.ref(b)}, {s.on_free(b)}x on the free list, "
                f"{s.on_evictable(b)}x evictable, {s.cache_entries(b)} cache key(s)"
                f"{' naming ' + '; '.join(meaning) if meaning else ''}; "
                f"{'partial in a table, ' if s.partial(b) else ''}"
                f"{s.filled(b)}/{s.block_size} slots written, holding {g.show(s.content(b))}")

    # -- allocate ------------------------------------------------------------------------
    def _check_allocate(self, pre, post, op, dom, n):
        if op.outcome == OK:
            table = post.table_tuple(op.seq)
            try:
                now = {(repr(k), b) for k, b in self.view.entries()}
            except CONTROL:
                raise
            except BaseException:  # noqa: BLE001 - reported by the state check
                now = set()
            before = self.pre
            hits = 0
            full = op.n_tokens // self.block_size
            while hits < min(full, len(table)) and before is not None:
                b = table[hits]
                if not any((repr(k), b) in now for k in before.keys_of(b)):
                    break
                hits += 1
            self.pending_hits = hits
            wants = self.ghost.chain(op.tokens)[:hits]
            for name, i, holds in P.cache_hits(PY, before, table[:hits], wants):
                if not holds:
                    b = table[i]
                    return Violation(n, "contract", f"allocate: {name}", b, witness=(
                        f"sequence {op.seq} was given block {b} at position {i} from the cache for "
                        f"{self.ghost.show(wants[i])}, but before the call block {b} "
                        f"{'was cached and ' if before.cached(b) else 'was not cached and '}"
                        f"held {self.ghost.show(before.content(b))}"),
                        doc=" ".join((P.cache_hits.__doc__ or "").split()[:60]))
        for name, element, holds in P.allocate_with_hits(PY, pre, post, op, dom,
                                                         self.pending_hits):
            if not holds:
                return Violation(n, "contract", f"allocate: {name}", element,
                                 witness=f"after {op.kind}({op.seq}, {op.n_tokens} tokens, "
                                         f"{self.pending_hits} block(s) from the cache)",
                                 doc=" ".join((P.allocate_with_hits.__doc__ or "").split()))
        return None

    def _count(self, op, post):
        st, pre = self.stats, self.pre
        if op.outcome == OOB:
            st.oob += 1
            return
        if op.kind == "allocate":
            st.allocations += 1
            st.hit_blocks += self.pending_hits
            st.hit_allocations += self.pending_hits > 0
        if pre is None or op.kind not in ("allocate", "append_slot"):
            return
        table = self.s._state().table_tuple(op.seq)
        hits = set(table[: self.pending_hits]) if op.kind == "allocate" else set()
        for b in set(table):
            if pre.on_evictable(b) and post.on_evictable(b) == 0:
                if b in hits:
                    st.revived += 1
                else:
                    st.evicted += 1


# -- workloads ------------------------------------------------------------------------------
class PrefixDriver:
    """Seeded workload with shared prefixes: a few "system prompts" with random
    suffixes from a tiny vocabulary, decode tokens from the same vocabulary,
    and pool pressure, so hits, evictions, revivals and duplicates all happen."""

    def __init__(self, seed: int, num_blocks: int, block_size: int, capabilities):
        self.rng = random.Random(seed)
        self.num_blocks, self.bs, self.caps = num_blocks, block_size, capabilities
        rng = self.rng
        self.bases = [[rng.randrange(100, 200) for _ in range(block_size * rng.randint(1, 3))]
                      for _ in range(3)]
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _prompt(self) -> list[int]:
        rng, bs = self.rng, self.bs
        base = rng.choice(self.bases)
        cut = rng.choice((len(base), len(base), rng.randint(0, len(base))))
        toks = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 2 * bs))]
        return toks or [rng.randrange(3)]

    def next_op(self, live: list[int], free_blocks: int) -> PrefixOp:
        rng, caps = self.rng, self.caps
        fullness = 1.0 - free_blocks / self.num_blocks if self.num_blocks else 1.0
        if not live or rng.random() < 0.3 * (1.0 - fullness) + 0.05:
            toks = self._prompt()
            return PrefixOp("allocate", seq=self._new_id(), n_tokens=len(toks), tokens=tuple(toks))
        r = rng.random()
        if r < 0.1 and "fork" in caps:
            return PrefixOp("fork", seq=rng.choice(live), child=self._new_id())
        if r < 0.1 + 0.3 * fullness + 0.05:
            return PrefixOp("free_seq", seq=rng.choice(live))
        return PrefixOp("append_slot", seq=rng.choice(live), tokens=(rng.randrange(3),))


# -- verify, replay, shrink --------------------------------------------------------------------
@dataclass
class PrefixResult:
    verdict: str
    ops: int
    seconds: float
    stats: Stats
    violation: Violation | None = None
    trace: list[PrefixOp] = field(default_factory=list)
    num_blocks: int = 0
    block_size: int = 0
    original_length: int = 0
    target: str = ""
    seed: int = 0
    minimality: str = "not shrunk"

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def trace_json(self) -> dict | None:
        if self.violation is None:
            return None
        return {
            "format": "kvcheck.prefix-trace", "version": 1, "target": self.target,
            "seed": self.seed, "minimality": self.minimality,
            "scope": {"num_blocks": self.num_blocks, "block_size": self.block_size},
            "ops": [op_json(op) for op in self.trace],
            "violation": self.violation.to_json(),
        }

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "ops": self.ops, "seconds": round(self.seconds, 3),
                "stats": self.stats.to_json(), "original_length": self.original_length,
                "violation": self.trace_json()}


def op_json(op: Op) -> dict:
    d: dict = {"op": op.kind}
    if op.kind == "fork":
        d.update(parent=op.seq, child=op.child)
    else:
        d["seq"] = op.seq
    if op.kind in ("allocate", "append_slot"):
        d["tokens"] = list(getattr(op, "tokens", ()))
    d["outcome"] = op.outcome
    return d


def describe(op: Op) -> str:
    toks = list(getattr(op, "tokens", ()))
    if op.kind == "allocate":
        oob = " -> out of blocks" if op.outcome == OOB else ""
        return f"allocate(seq {op.seq}, tokens {toks}){oob}"
    if op.kind == "append_slot":
        res = (f" -> block {op.block}, offset {op.offset}" if op.outcome == OK
               else " -> out of blocks")
        cow = f", copy of block {op.cow_src}" if op.cow_src is not None else ""
        return f"append_slot(seq {op.seq}, token {toks[0]}){res}{cow}"
    if op.kind == "fork":
        return f"fork(seq {op.seq} -> seq {op.child})"
    return f"free_seq(seq {op.seq})"


def render(r: PrefixResult) -> str:
    lines = [f"Counterexample: {r.target} with {r.num_blocks} blocks of {r.block_size} slots, "
             f"{len(r.trace)} operation(s)"]
    v = r.violation
    for i, op in enumerate(r.trace, 1):
        mark = ">>" if v is not None and i == v.step else "  "
        lines.append(f"{mark}{i:3d}. {describe(op)}")
    if v is not None:
        lines.append(f"VIOLATION at step {v.step} ({v.kind}): {v.name}")
        if v.witness:
            lines.append(f"  what happened: {v.witness}")
        if v.doc:
            lines.append(f"  the rule: {v.doc}")
    if r.minimality:
        lines.append(f"  minimal: {r.minimality}")
    return "\n".join(lines)


def replay(factory, num_blocks, block_size, ops, timeout=10.0):
    """Run ``ops`` on a fresh target (full mode); (violation, ops run)."""
    target = build(factory, num_blocks, block_size)
    oracle = PrefixOracle(target, mode="full", timeout=timeout)
    ran: list[PrefixOp] = []
    if oracle.violation is not None:
        return oracle.violation, ran
    with Watchdog(timeout) as wd:
        for req in ops:
            op = request(req)
            if op.kind == "allocate" and len(op.tokens) != op.n_tokens:
                continue
            if not oracle.valid(op):
                continue
            v = oracle.step(op, wd)
            ran.append(op)
            if v is not None:
                return v, ran
    return None, ran


def shrink(factory, num_blocks, block_size, ops, key, timeout=10.0, budget=30.0, progress=None):
    """Greedy shrinking to a trace failing the same way: cut the tail, delete chunks,
    shorten prompts, lower the pool size; then renumber sequences. ``(violation, ops,
    num_blocks, settled)``; ``settled`` is False when the budget stopped it first.
    ``progress(attempts, length)`` is told of every candidate tried."""
    deadline = time.monotonic() + budget
    attempts, smallest = 0, len(ops)

    def fails(cand, nb):
        nonlocal attempts, smallest
        attempts += 1
        try:
            v, ran = replay(factory, nb, block_size, cand, timeout)
        except Exception:  # noqa: BLE001 - a scope the target refuses is not smaller
            v = ran = None
        got = (v, ran) if v is not None and v.key == key else None
        if got is not None:
            smallest = min(smallest, len(ran))
        if progress is not None:
            progress(attempts, smallest)
        return got

    got = fails(ops, num_blocks)
    if got is None:
        return None
    nb, cur = num_blocks, got[1]
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        size = max(1, len(cur) // 2)
        while size >= 1 and time.monotonic() < deadline:
            i = 0
            while i < len(cur) and time.monotonic() < deadline:
                r = fails(cur[:i] + cur[i + size:], nb)
                if r is not None:
                    cur, changed = r[1], True
                else:
                    i += size
            size //= 2
        for i, op in enumerate(cur):
            if op.kind != "allocate" or time.monotonic() >= deadline:
                continue
            for m in sorted({1, block_size, op.n_tokens - block_size, op.n_tokens - 1}):
                if 1 <= m < op.n_tokens:
                    cand = [request(o) for o in cur]
                    cand[i].tokens, cand[i].n_tokens = cand[i].tokens[:m], m
                    r = fails(cand, nb)
                    if r is not None:
                        cur, changed = r[1], True
                        break
        for smaller in range(1, nb):
            if time.monotonic() >= deadline:
                break
            r = fails(cur, smaller)
            if r is not None:
                cur, nb, changed = r[1], smaller, True
                break
    ids: dict[int, int] = {}

    def new(q):
        return ids.setdefault(q, len(ids))

    renamed = []
    for op in cur:
        r = request(op)
        r.seq = new(op.seq)
        if op.kind == "fork":
            r.child = new(op.child)
        renamed.append(r)
    final = fails(renamed, nb) or fails(cur, nb)
    return final[0], final[1], nb, not changed


def verify_prefix(target="prefix", num_blocks: int = 16, block_size: int = 4, ops: int = 5000,
                  seed: int = 0, mode: str = "full", do_shrink: bool = True,
                  shrink_budget: float = 30.0, timeout: float | None = 10.0,
                  progress=None, shrink_progress=None) -> PrefixResult:
    """Drive ``target`` with shared-prefix workloads under the prefix oracle
    (``progress(done)`` told of the operations run, ``shrink_progress(attempts, length)`` of
    the shrinking)."""
    start = time.perf_counter()
    with Watchdog(timeout) as wd:  # importing, building, every step and every observation
        label, factory = resolve(target)
        t = build(factory, num_blocks, block_size)
        oracle = PrefixOracle(t, mode=mode, timeout=timeout)
        driver = PrefixDriver(seed, num_blocks, block_size, t.capabilities)
        history: list[PrefixOp] = []
        v = oracle.violation
        for i in range(ops):
            if v is not None:
                break
            if progress is not None and i % 256 == 0:
                progress(i)
            op = driver.next_op(oracle.live(), oracle.num_free())
            if not oracle.valid(op):
                continue
            history.append(op)
            v = oracle.step(op, wd)
    seconds = time.perf_counter() - start
    res = PrefixResult("pass" if v is None else "fail", oracle.steps, seconds, oracle.stats, v,
                       [], num_blocks, block_size, len(history), label, seed)
    if v is None:
        return res
    res.trace = history
    if do_shrink and v.step > 0:
        s = shrink(factory, num_blocks, block_size, history[: v.step], v.key, timeout,
                   shrink_budget, shrink_progress)
        if s is not None:
            res.violation, res.trace, res.num_blocks, settled = s
            res.minimality = ("1-minimal: removing any one operation, shortening any prompt or "
                              "lowering the pool size stops it failing" if settled else
                              budget_ran_out(shrink_budget, len(res.trace), "operation"))
    res.seconds = time.perf_counter() - start
    return res
