"""The prefix-cache oracle: structural checks plus cache checks at the data level.

``PrefixOracle(target)`` is the prefix model's run state (``kvcheck.check.model.RunState``).
It drives an allocator with real token ids (``allocate(seq, n, token_ids=...)``,
``append_slot(seq, token_id)``) and, after every operation, checks:

1. the structural spec through the block manager's oracle
   (``kvcheck.models.blocks.oracle.Oracle``: every state invariant, the
   append/fork/free contracts, read-back through the shadow memory), with
   ``allocate``'s contract replaced by ``spec.prefix.allocate_with_hits``
   because a hit shares a block in use;
2. the cache-hit contract ``spec.prefix.cache_hits``: every block an
   allocation served from the cache held, before it, exactly the requested
   prefix (its ghost *prefix id*, see below), so a hit can never return an
   evicted or reused block;
3. every invariant of ``spec.prefix.PREFIX_INVARIANTS`` on a
   ``PrefixSnapshot`` built from the allocator's cache, free and evictable
   lists and the oracle's ghost contents (compiled from the spec's text,
   ``kvcheck.models.prefix.compiled``; the spec itself names what broke);
4. after an out-of-blocks failure: the cache and evictable list unchanged.

Two modes, the same verdicts. ``full``: the structural part snapshots the whole
allocator before and after each operation. ``fast``: the structural part is the
block manager's fast mode (what the operation touched, everything in a sweep
every ``max(1024, 2 x blocks)`` operations and at the end); the cache is still
read whole after every operation (its entries, both lists), the refcounts and
tables the prefix invariants read come from the structural oracle's verified
ghost, so 2-4 are exactly the full mode's checks.

Ghost contents. The oracle plays the engine: it writes each token into the
slot the allocator names (skipping blocks served from the cache, which an
engine would not recompute), and remembers per block how many slots hold the
current content (``filled``) and which whole prefix that content was computed
under (``content``, an interned prefix id: block tokens chained with the
previous block's id). A cache key means the prefix the engine hashes to it: the
target's ``prefix_key(parent key, block tokens)`` over the chained prefixes of the
token ids the run's sequences were allocated and appended with (``Ghost.meaning``),
so a block published under a key that is not its prefix's is caught in the step that
publishes it. A target without ``prefix_key`` (the third-party views) has each key
bound to the prefix id of the block it names when the oracle first sees it.

Which blocks were hits? The engine is told by the lookup; the oracle infers it
the same way for every target: the leading table entries of a new sequence
that were cached under a key before the call and are still cached under that
key after it. (A block taken for new content must lose its key first, so a
block evicted but left in the hash map counts as a hit and is caught by 2.)

Every target exposes its cache through public methods (``cache_entries()`` ->
(key, block) pairs, ``evictable_blocks()``, ``free_list_blocks()``, optional
``num_evictable()`` / ``num_free_list()``; ``kvcheck.engines`` documents them): the
bundled ``prefix`` target and every third-party adapter (vLLM v1, vLLM v0, nano-vllm,
SGLang...) implement them; nothing is recognised by its private attributes.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass

from kvcheck.check import evidence
from kvcheck.check.copies import deep_copy
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, active_watchdog
from kvcheck.compile.tracer import Untraceable
from kvcheck.errors import what_it_did
from kvcheck.models.blocks import fused as fused_steps
from kvcheck.models.blocks.oracle import _FUSED, _STEPS, Oracle
from kvcheck.models.blocks.shadow import ShadowMemory
from kvcheck.models.prefix import compiled as compiled_checks
from kvcheck.models.prefix.incremental import Mirror, partial_blocks
from kvcheck.models.prefix.live import LiveOrder
from kvcheck.models.prefix.model import PrefixOp, cache_json
from kvcheck.spec import prefix as P
from kvcheck.spec.contracts import OK, OOB, REFUSED
from kvcheck.spec.logic import PY
from kvcheck.targets.loading import TargetError

# -- reading a target's cache --------------------------------------------------------
OBSERVATION = ("cache_entries", "evictable_blocks", "free_list_blocks")
"""The public methods through which the prefix model reads any target's cache (the built-in
engine adapters implement them too: nothing is recognised by its private attributes)."""


class MethodView:
    """A target's cache, read through its public observation methods (``OBSERVATION``;
    optional ``num_evictable``/``num_free_list`` counts and the incremental reads)."""

    def __init__(self, obj):
        self.obj = obj
        f = getattr(obj, "num_evictable", None)
        self._n_evict = f if callable(f) else None
        f = getattr(obj, "num_free_list", None)
        self._n_free = f if callable(f) else None
        if self.incremental:
            self._block, self._sizes = obj.block_cache_state, obj.cache_sizes

    def entries(self):
        return [(k, int(b)) for k, b in self.obj.cache_entries()]

    def evictable(self):
        return [int(b) for b in self.obj.evictable_blocks()]

    def free_list(self):
        return [int(b) for b in self.obj.free_list_blocks()]

    def evictable_len(self):
        f = self._n_evict
        if f is None:
            return len(self.evictable())
        n = f()
        return n if type(n) is int else int(n)

    def free_list_len(self):
        f = self._n_free
        if f is None:
            return len(self.free_list())
        n = f()
        return n if type(n) is int else int(n)

    # incremental reads (optional; the fast mode's, ``kvcheck.models.prefix.incremental``)
    @property
    def incremental(self) -> bool:
        return all(callable(getattr(self.obj, m, None))
                   for m in ("cache_changes", "block_cache_state", "cache_sizes"))

    def changes(self):
        """The blocks changed since the last call (ids that are not pool blocks are
        dropped by the caller); None: unknown."""
        got = self.obj.cache_changes()
        return None if got is None else got if type(got) is set else set(got)

    def block(self, b):
        keys, on_free, on_evict = self._block(b)
        if type(on_free) is not int or type(on_evict) is not int:
            on_free, on_evict = int(on_free), int(on_evict)
        return keys if type(keys) is tuple else tuple(keys), on_free, on_evict

    def sizes(self):
        a, b, c = self._sizes()
        return (a, b, c) if type(a) is type(b) is type(c) is int else (int(a), int(b), int(c))


def view_for(target):
    """How to read ``target``'s cache; ``TargetError`` if it shows none kvcheck can read."""
    try:
        return _view_for(target)
    except (*CONTROL, TargetError):
        raise
    except BaseException as exc:  # noqa: BLE001 - looking at the target ran its code
        raise TargetError(f"cannot read the prefix cache of {type(target).__name__}: looking "
                          f"for it {what_it_did(exc)}") from None


def _view_for(target):
    obj = getattr(target, "impl", target)  # (a SeedAdapter: the allocator it wraps)
    if all(callable(getattr(obj, m, None)) for m in OBSERVATION):
        return MethodView(obj)
    raise TargetError(f"{type(obj).__name__} does not expose a prefix cache "
                      "(cache_entries/evictable_blocks/free_list_blocks)")


def takes_token_ids(target) -> bool:
    """Whether the target's ``append_slots`` takes the tokens' ids (``token_ids=``): a
    prefix cache keys the blocks they fill by them, so the prefix model drives
    append_slots only on a target that does."""
    fn = getattr(target, "append_slots", None)
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "token_ids" or p.kind is p.VAR_KEYWORD for p in params)


def key_function(target):
    """The target's ``prefix_key(parent, token_ids)``: the key its engine gives a full block
    of ``token_ids`` whose parent block's key is ``parent`` (None: the first block), or
    None. With it a cache key means the prefix it is the engine's hash of; without it,
    the content of the block it names when the oracle first sees it."""
    for obj in (target, getattr(target, "impl", None)):
        fn = getattr(obj, "prefix_key", None)
        if callable(fn):
            return fn
    return None


def declares(target, name: str) -> bool:
    """Whether the target (or the object it adapts) declares ``name`` true: a policy of
    its engine the spec reads (``writes_cached_twins``: ``spec.prefix.unwritten``)."""
    return any(getattr(obj, name, False) is True for obj in (target, getattr(target, "impl", None)))


def committer(target):
    """The target's ``commit(seq)`` (the engine wrote seq's prompt: publish after write),
    or None: a target without one writes the prompt within ``allocate``."""
    for obj in (target, getattr(target, "impl", None)):
        fn = getattr(obj, "commit", None)
        if callable(fn):
            return fn
    return None


# -- the engine's side: ghost contents --------------------------------------------------
class Ghost:
    """Interned prefixes and what each block holds."""

    def __init__(self, block_size: int):
        self.bs = block_size
        self.ids: dict[tuple, int] = {}
        self.parts: list[tuple] = []  # id -> (parent id, block tokens)
        self.keys: list = []  # id -> the engine's key of that prefix (``meaning``), as far as computed
        self.by_key: dict = {}  # the engine's key -> the prefix id it names (-1: several)
        self.filled: dict[int, int] = {}
        self.content: dict[int, int] = {}
        self.chains: dict[int, list[int]] = {}  # seq -> prefix id of each full block
        self._memo: tuple | None = None

    def intern(self, parent: int, toks: tuple) -> int:
        key = (parent, toks)
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.parts)
            self.parts.append(key)
        return i

    def chain(self, tokens) -> list[int]:
        """The prefix ids of ``tokens``' full blocks (a fresh list; the last one asked is
        remembered: an allocation asks for its prompt's chain three times)."""
        memo = self._memo
        if memo is not None and memo[0] == tuple(tokens):
            return list(memo[1])
        out = self._chain(tokens)
        self._memo = (tuple(tokens), out)
        return list(out)

    def _chain(self, tokens) -> list[int]:
        out, parent, bs = [], -1, self.bs
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = self.intern(parent, tuple(tokens[start : start + bs]))
            out.append(parent)
        return out

    def meaning(self, key, prefix_key) -> int:
        """The prefix id ``key`` names: the prefix whose key the engine's own hash
        (``prefix_key(parent key, block tokens)``, the target's) is ``key``, over every prefix
        the run's sequences were given (-1: none, or several); the keys of prefixes
        interned since the last call are computed first, parents before children."""
        keys, parts, by_key = self.keys, self.parts, self.by_key
        for pid in range(len(keys), len(parts)):
            parent, toks = parts[pid]
            k = prefix_key(None if parent < 0 else keys[parent], list(toks))
            keys.append(k)
            if by_key.setdefault(k, pid) != pid:
                by_key[k] = -1  # (two prefixes under one key: it names neither)
        return by_key.get(key, -1)

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

    def __init__(self, block_size: int, oracle: PrefixOracle):
        super().__init__(block_size)
        self.oracle = oracle

    def owner(self, token):  # token ids are shared between sequences: no single writer
        return None

    def allocate(self, seq, n_tokens, table):
        o, g, bs = self.oracle, self.oracle.ghost, self.block_size
        toks = list(o.pending.tokens)
        self.expect(seq, toks)
        chain = g.chain(toks)
        g.chains[seq] = chain
        later = [] if o.commit_fn is not None else None
        for i in range(o.pending_served, len(table)):  # (what the prefill writes)
            chunk = toks[i * bs : (i + 1) * bs]
            b = table[i]
            self.write_tokens(b, 0, chunk)
            done = (len(chunk), chain[i] if len(chunk) == bs else -1)
            if later is None:
                g.filled[b], g.content[b] = done
            else:  # written at commit(seq): until then the block holds nothing computed
                g.filled[b], g.content[b] = 0, -1
                later.append((b, *done))
        if later is not None:
            o.uncommitted[seq] = later

    def append(self, seq, block, offset, cow_src):
        o = self.oracle
        tok = o.pending.tokens[0]
        if cow_src is not None:
            self.copy(cow_src, block)
        self.append_token(seq, block, offset, tok)
        self._wrote(seq, block, offset)

    def _wrote(self, seq, block, offset):
        """The ghost after seq's token at ``offset`` of ``block``: the block holds that many
        of seq's slots for its current content, a complete prefix once full."""
        g, bs = self.oracle.ghost, self.block_size
        g.filled[block] = offset + 1
        chain = g.chains[seq]
        if offset + 1 == bs:
            n = self.length(seq)
            chain.append(g.intern(chain[-1] if chain else -1, tuple(self.tokens(seq, n - bs, n))))
            g.content[block] = chain[-1]
        else:
            g.content[block] = -1

    def extend(self, seq, n, table):
        """append_slots: the caller writes the operation's token ids after seq's last token,
        through its table (the copies the target asked for are made before)."""
        bs, pos = self.block_size, self.length(seq)
        for tok in self.oracle.pending.tokens:
            k, off = divmod(pos, bs)
            self.write(table[k], off, tok)
            self.expect_one_more(seq, tok)
            self._wrote(seq, table[k], off)
            pos += 1

    def truncate(self, seq, n):
        """rollback: seq keeps its first n tokens. Nothing is written: every block keeps
        what it holds (a block a rollback made partial still holds its old prefix until
        the next write lands in it), only seq's chain of full-block prefixes is cut."""
        super().truncate(seq, n)
        g = self.oracle.ghost
        del g.chains[seq][n // self.block_size:]

    def copy(self, src, dst):
        """A copy the target asked for (a rebase's or a reservation's): dst holds what src
        holds, data and ghost alike."""
        super().copy(src, dst)
        g = self.oracle.ghost
        g.filled[dst] = g.filled.get(src, 0)
        g.content[dst] = g.content.get(src, -1)

    def fork(self, parent, child):
        super().fork(parent, child)
        g = self.oracle.ghost
        g.chains[child] = list(g.chains[parent])

    def free(self, seq):
        super().free(seq)
        self.oracle.ghost.chains.pop(seq, None)
        self.oracle.uncommitted.pop(seq, None)  # freed before its write: never written


def _fused_allocate() -> dict:
    """allocate's fused step with ``spec.prefix.allocate_with_hits`` for its contract (its
    hits from ``_Structural.fused_inputs``), by (kind, outcome); empty where it cannot be
    generated (allocate then takes the layered path: ``_allocate_steps``)."""
    try:
        return {("allocate", OK): fused_steps.step_with(P.allocate_with_hits, "allocate",
                                                        ("hits",))}
    except (fused_steps.Unfusable, Untraceable):
        return {}


_FUSED_ALLOCATE = _fused_allocate()


class _Structural(Oracle):
    """The structural oracle, calling with token ids and judging allocate with hits."""

    def __init__(self, target, oracle: PrefixOracle, mode: str, timeout, compiled: bool,
                 fused: bool = True):
        self.oracle = oracle
        super().__init__(target, mode=mode, timeout=timeout, compiled=compiled)
        # The block manager's compiled spec judges every operation but allocate (whose
        # contract here is allocate_with_hits, compiled from its own text: _allocate_steps);
        # the sweeps' and the full mode's state invariants too.
        self.compiled = compiled
        self.shadow = PrefixShadow(target.block_size, oracle)
        self.after = None  # the last fast step's observation (``After``), see _record
        # (the spec judges allocate where it cannot be compiled: the block manager's
        # compiled allocate knows no hits)
        self._steps = {**_STEPS, "allocate": self._allocate_steps()}
        # The block manager's fused steps for the kinds this class judges as the block
        # manager does, and allocate's with allocate_with_hits for its contract (its hits
        # from ``fused_inputs``), each leaving the blocks it touched and its sequences in
        # ``self.touched`` for the cache check (``fused.source``)
        self._fused = {**{k: f for k, f in _FUSED.items() if k[0] != "allocate"},
                       **_FUSED_ALLOCATE} if compiled and fused else {}

    def clone(self):
        new = super().clone()
        new._steps = {**_STEPS, "allocate": new._allocate_steps()}  # (the copy's own)
        return new

    def _call(self, op):
        t = self.target
        if op.kind == "allocate":
            got = t.allocate(op.seq, op.n_tokens, token_ids=list(op.tokens))
            # the cached-token count, where the target reports one (an int; else unchecked)
            op.cached_tokens = got if type(got) is int else None
            return got
        if op.kind == "append_slot":
            return t.append_slot(op.seq, op.tokens[0])
        if op.kind == "append_slots":
            return t.append_slots(op.seq, op.n_tokens, op.lookahead, token_ids=list(op.tokens))
        return super()._call(op)

    def fused_inputs(self, op, table: tuple) -> tuple | None:
        """The fused allocate's further input (``fused.source``): its cache hits, once
        ``_check_hits`` passed on ``table`` (the new table as observed); None if it failed."""
        oracle = self.oracle
        if oracle._check_hits_on(table, op, self.steps) is not None:
            return None
        return (oracle.pending_served,)

    def _allocate_steps(self) -> dict | None:
        """allocate's compiled step checks: ``spec.prefix.allocate_with_hits`` (compiled
        from its text, ``compiled.allocate_with_hits``) after the cache-hit checks, for
        each outcome; None where either cannot be compiled (then the spec judges it)."""
        awh, plain = compiled_checks.allocate_with_hits, _STEPS.get("allocate")
        if awh is None or plain is None:
            return None
        ok, oob = awh[OK], awh[OOB]

        def allocate_ok(pre, post, op, blocks, live):  # (self's oracle: see clone)
            oracle = self.oracle
            if oracle._check_hits(post, op, self.steps) is not None:
                return False  # (the spec names it: ``_check_op``)
            return ok(pre, post, op, blocks, live, oracle.pending_served)

        def allocate_oob(pre, post, op, blocks, live):
            return oob(pre, post, op, blocks, live, 0)

        return {OK: allocate_ok, OOB: allocate_oob, REFUSED: plain[REFUSED]}

    def _record(self, op, delta, post):
        self.after = post  # (this step's observation: the prefix fast mode reads its blocks)
        super()._record(op, delta, post)

    def _check_op(self, pre, post, op, dom, n):
        if op.kind != "allocate" or op.outcome == REFUSED:  # a refusal: contracts.refused
            return super()._check_op(pre, post, op, dom, n)
        return self.oracle._check_allocate(pre, post, op, dom, n)


class _Before:
    """The cache state before a fast step: the touched blocks as they were, the others
    as the mirror holds them (unchanged)."""

    def __init__(self, mirror, old: dict):
        self.m, self.old = mirror, old

    def on_evictable(self, b):
        got = self.old.get(b)
        return got[1] if got is not None else self.m.on_evictable(b)

    def cached(self, b):
        got = self.old.get(b)
        return got[0] if got is not None else self.m.cached(b)


# -- the oracle --------------------------------------------------------------------------
LIVE_LIST = 2048
"""Up to this many live sequences ``live()`` is a plain list (C-speed indexing; its
``remove`` cheap at that size), beyond it a ``LiveOrder`` (O(log n) throughout)."""

@dataclass
class Stats:
    allocations: int = 0
    hit_allocations: int = 0
    hit_blocks: int = 0
    revived: int = 0  # evictable blocks brought back by a hit
    evicted: int = 0  # evictable blocks taken for new content
    oob: int = 0
    refused: int = 0  # refusals under the target's declared policy (not a coverage class)
    partial_hits: int = 0  # allocations whose hits stopped at a miss before the last lookup
    orphans: int = 0  # states with a key cached while its parent block's key is gone
    repeats: int = 0  # allocations of the very prompt the operation before allocated
    commits: int = 0  # commit(seq): a prompt written (a target with commit only)
    freed_uncommitted: int = 0  # a sequence freed (or preempted) before its prompt was written
    # the block manager's operations beyond the seed's four (a target offering them only)
    rollbacks: int = 0
    rollbacks_into_cached: int = 0  # a rollback that made a block cached before it partial
    rebases: int = 0
    preempts: int = 0
    append_slots: int = 0  # multi-token writes (the slots a rollback left reserved)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    # The classes of cache behaviour a run should have exercised, by the count showing it.
    CLASSES = (("hit", "hit_allocations", "an allocation served from the cache"),
               ("partial_hit", "partial_hits",
                "an allocation served in part from the cache, up to a miss"),
               ("revived", "revived", "an evictable block revived by a cache hit"),
               ("evicted", "evicted", "an evictable block evicted for new content"),
               ("orphan", "orphans", "a key still cached after its parent block's key is gone"),
               ("repeat", "repeats", "identical prompts admitted back to back"),
               ("out_of_blocks", "oob", "an operation out of blocks"))

    def counts(self) -> dict:
        """Per class, how many times the run exercised it."""
        return {name: getattr(self, count) for name, count, _ in self.CLASSES}

    def coverage(self) -> dict:
        """Which of ``CLASSES`` the run exercised, the ones it missed, and how often each
        occurred (``counts``)."""
        counts = self.counts()
        seen = {name: n > 0 for name, n in counts.items()}
        return {**seen, "missed": [name for name, hit in seen.items() if not hit],
                "counts": counts}


class PrefixOracle:
    """The prefix model's run state: see the module docstring."""

    def __init__(self, target, mode: str = "fast", timeout: float | None = 10.0,
                 compiled: bool = True, fused: bool = True):
        self.target = target
        self.view = view_for(target)
        self.mode = mode
        self.compiled = compiled and compiled_checks.invariants is not None
        self.block_size = target.block_size
        self.ghost = Ghost(target.block_size)
        self.meanings: dict = {}
        self.stats = Stats()
        self.pending: PrefixOp | None = None
        self.pending_hits = 0
        self.pending_served = 0  # of those, the blocks the prefill does not write (P.unwritten)
        self.commit_fn = committer(target)
        self.key_fn = key_function(target)
        self.twins = declares(target, "writes_cached_twins")  # (``spec.prefix.unwritten``)
        self.slot_tokens = takes_token_ids(target)  # append_slots with token ids
        self.uncommitted: dict[int, list] = {}  # seq -> (block, filled, content) its commit writes
        self.s = _Structural(target, self, mode, timeout, compiled, fused)
        self.violation = self.s.violation
        self.steps = 0
        self.pre: P.PrefixSnapshot | None = None  # the last verified cache state
        self.observed: P.PrefixSnapshot | None = None  # the cache state after the last step
        # fast mode, on a view that reads block by block: the cache checked where each step
        # touched it (``kvcheck.models.prefix.incremental``); None until a full check built it
        self.fast = (mode == "fast" and self.compiled and compiled_checks.touched_invariants is not None
                     and getattr(self.view, "incremental", False))
        self.mirror: Mirror | None = None
        self._live: list | LiveOrder | None = None  # live(), kept step by step
        if self.violation is None:
            wd = active_watchdog()
            if wd is not None:
                wd.enter()
            try:
                self.pre, self.violation = self._observe_and_check(0, None)
                if self.violation is None:
                    self._verified(self.pre)
            except OperationTimeout as exc:
                self.violation = Violation(0, "hang", "prefix observation",
                                           witness=f"reading the fresh allocator's prefix cache {exc}")
            finally:
                if wd is not None:
                    wd.leave()

    # -- RunState -----------------------------------------------------------------------
    @property
    def lengths(self) -> dict:
        """Each live sequence's token count (the driver's view)."""
        return self.s.lengths

    @property
    def reserved(self) -> dict:
        """Each live sequence's reserved slots beyond its tokens, where it has any."""
        return self.s.reserved

    def tokens_of(self, seq: int) -> list:
        """The token ids ``seq`` holds (what a preempted sequence is re-admitted with)."""
        sh = self.s.shadow
        return sh.tokens(seq, 0, sh.length(seq))

    def live_seqs(self) -> list[int]:
        return self.s.live_seqs()

    def live(self) -> list[int] | LiveOrder:
        """The live sequences in the order they were allocated (the driver's choices), kept
        step by step (``list(lengths)`` costs the number of live sequences): a list while
        at most ``LIVE_LIST`` are live, beyond that a ``LiveOrder`` (a list's ``remove``
        costs the number of live sequences too); read-only to the caller."""
        got = self._live
        if got is None:
            got = self.s.live()
            if len(got) > LIVE_LIST:
                got = LiveOrder(got)
            self._live = got
        return got

    def _track_live(self, op) -> None:
        """``_live`` after ``op``: a new sequence joins the end, a freed one leaves."""
        got = self._live
        if got is None or op.outcome != OK:
            return
        if op.kind in ("allocate", "fork"):
            got.append(op.seq if op.kind == "allocate" else op.child)
            if type(got) is list and len(got) > LIVE_LIST:
                self._live = LiveOrder(got)
        elif op.kind in ("free_seq", "preempt"):
            got.remove(op.seq)

    def num_free(self) -> int:
        return self.s._state().num_free()

    def valid(self, op: PrefixOp) -> bool:
        if op.kind == "commit":
            return self.commit_fn is not None and op.seq in self.uncommitted
        if op.kind in ("append_slot", "fork", "append_slots", "rollback", "rebase") and (
                op.seq in self.uncommitted or (op.kind == "rebase" and op.child in self.uncommitted)):
            return False  # decoding, forking, rollbacks, rebases come after the prompt's write
        if op.kind == "append_slots" and (len(op.tokens) != op.n_tokens or not self.slot_tokens):
            return False
        if op.kind == "allocate" and len(op.tokens) != op.n_tokens:
            return False
        if op.kind == "append_slot" and len(op.tokens) != 1:
            return False
        return self.s.valid(op)

    def step(self, op: PrefixOp, watchdog=None) -> Violation | None:
        if self.violation is not None:
            return self.violation
        self.pending, self.pending_hits, self.pending_served = op, 0, 0
        wd = watchdog if watchdog is not None else active_watchdog()
        if wd is not None:
            wd.enter()  # the operation and the cache observation after it: one guarded call
        try:
            if op.kind == "commit":
                v = self._commit(op, wd)
                self.violation = v
                return v
            unwritten = op.kind in ("free_seq", "preempt") and op.seq in self.uncommitted
            inc = self.mirror is not None
            self.s.after = self.s.touched = None
            v = self.s.step(op, wd)
            self.steps = self.s.steps
            if v is None:
                self._track_live(op)
                was = None
                if inc and self.steps % self.s.sweep_every:
                    post, v, was = self._step_incremental(op)
                else:
                    post, v = self._full_check(self.steps, op)
                if v is None:
                    self._count(op, post, was)
                    if unwritten:
                        self.stats.freed_uncommitted += 1
                    if was is None:
                        self._verified(post)
            else:
                self._live = None
                if v.kind in ("contract", "invariant", "data"):
                    self._observe_for_the_record()
        except OperationTimeout as exc:
            v = Violation(self.s.steps, "hang", "prefix observation",
                          witness=f"reading the prefix cache after {op.kind} {exc}")
        finally:
            if wd is not None:
                wd.leave()
        self.violation = v
        return v

    def resync(self, op: PrefixOp) -> bool:
        """After a structural violation by ``op`` that the user allows (``--allow``: a
        documented deviation such as vLLM v0's swap of a completed block for its cached
        twin), take what the target did as the state to go on from: the structural
        oracle resynchronises (``Oracle.resync``), then the cache is observed and every
        prefix rule checked on it as after a passing step. False (the run stops on the
        violation) if either cannot be done or a prefix rule fails there."""
        v = self.violation
        if v is None or v.kind not in ("contract", "invariant"):
            return False
        if self.s.violation is None:  # the structure held: one of the cache's own clauses
            return self._resync_cache(op, v)
        if op.kind == "commit" or not self.s.resync(op):
            return False
        self.violation = None
        try:
            post, v2 = self._observe_and_check(self.s.steps, op)
        except OperationTimeout:
            v2 = v
        if v2 is not None:
            self.violation = v
            return False
        self._count(op, post)
        self.steps = self.s.steps
        self._verified(post)  # (the fast mode's mirror rebuilt from the whole read)
        self._live = None
        return True

    def _resync_cache(self, op: PrefixOp, v: Violation) -> bool:
        """``resync`` past an allowed clause of the cache's own contracts where the
        structural step held (a failed call that changed the cache, ``spec.prefix.commit``):
        the cache as observed now, with every prefix invariant checked on it (and, after a
        commit, the structural sweep a commit ends with). A prefix invariant is never
        allowed: False."""
        if v.kind != "contract":
            return False
        self.violation = None
        try:
            post, v2 = self._full_check(self.steps, None)
            if v2 is None and op.kind == "commit":
                v2 = self.s.sweep(None)
        except OperationTimeout:
            v2 = v
        if v2 is not None:
            self.violation = v
            return False
        if op.kind == "commit":
            self.stats.commits += 1
        else:
            self._count(op, post)
        self._verified(post)
        self._live = None
        return True

    def _commit(self, op: PrefixOp, wd) -> Violation | None:
        """commit(seq): call it, write the prompt into the ghost (the engine's forward pass),
        then check ``spec.prefix.commit`` and every prefix invariant on the cache, and the
        whole structure by a sweep (a commit changes no table or refcount)."""
        from kvcheck.check import watchdog as watchdog_module

        if op.seq not in self.uncommitted or self.commit_fn is None:
            raise ValueError(f"precondition of commit fails: {op}")
        s = self.s
        s.steps += 1
        self.steps = n = s.steps
        recorder = watchdog_module.RECORDER
        if recorder is not None:
            recorder.op(op)
        v = None
        try:
            self.commit_fn(op.seq)
            op.outcome = OK
        except OperationTimeout as exc:
            v = Violation(n, "hang", "commit", witness=f"commit {exc}")
        except (Interrupted, *CONTROL):
            raise
        except BaseException as exc:  # noqa: BLE001 - the target's exception
            v = Violation(n, "crash", "commit", witness=f"commit {what_it_did(exc)}")
        if v is None:
            g = self.ghost
            for b, filled, content in self.uncommitted.pop(op.seq):
                g.filled[b], g.content[b] = filled, content
            table = s._state().table_tuple(op.seq)
            post, v = self._full_check(n, None)
            if v is None and self.pre is not None:
                for name, b, holds in P.commit(PY, self.pre, post, table):
                    if not holds:
                        v = Violation(n, "contract", f"commit: {name}", b, subject="block",
                                      witness=f"after commit(seq={op.seq}): "
                                              f"{self._explain(post, b)}",
                                      doc=" ".join((P.commit.__doc__ or "").split()[:70]))
                        break
            if v is None:
                before = s.violation
                v = s.sweep(wd)
                if v is not None and before is None:
                    v = dataclasses.replace(v, step=n)
            if v is None:
                self.stats.commits += 1
                self._verified(post)
        if recorder is not None:
            recorder.outcome(op, v)
        return v

    def sweep(self, watchdog=None) -> Violation | None:
        """The structural sweep and, in the incremental fast mode, the full check of the
        cache (else the cache is checked whole after every step already)."""
        if self.violation is None:
            self.violation = self.s.sweep(watchdog)
        if self.violation is None and self.fast:
            wd = watchdog if watchdog is not None else active_watchdog()
            if wd is not None:
                wd.enter()
            try:
                post, self.violation = self._full_check(self.steps, None)
            except OperationTimeout as exc:
                self.violation = Violation(self.steps, "hang", "prefix observation",
                                           witness=f"reading the whole prefix cache {exc}")
            finally:
                if wd is not None:
                    wd.leave()
            if self.violation is None:
                self._verified(post)
        return self.violation

    def clone(self) -> PrefixOracle:
        """An independent copy, the target deep-copied (exploration)."""
        new = copy.copy(self)
        new.s = self.s.clone()
        new.s.oracle = new
        new.s.shadow.oracle = new
        new.target = new.s.target
        new.view = view_for(new.target)
        new.ghost = deep_copy(self.ghost)
        new.meanings = dict(self.meanings)
        new.commit_fn = committer(new.target)
        new.key_fn = key_function(new.target)
        new.uncommitted = {q: list(w) for q, w in self.uncommitted.items()}
        new.stats = dataclasses.replace(self.stats)
        new.mirror = None  # (it reads this run's ghosts): the copy's next step checks in full
        new._live = None
        return new

    def observed_json(self) -> dict:
        """The state observed after the last step, as a trace records it: the structural
        state (full mode: the allocator's; fast mode: the verified ghost's, with the free
        list as the cache's two lists) and the cache."""
        c = self.observed
        if isinstance(c, Mirror):  # (the fast mode's mirror holds no list order): read it
            try:
                c = self._observe()
            except CONTROL:
                raise
            except BaseException:  # noqa: BLE001 - unreadable now: the mirror's contents
                pass
        if self.mode == "full" and self.s.observed is not None:
            from kvcheck.models.blocks.runs import state_json

            out = state_json(self.s.observed)
        else:
            g = self.s._state()
            out = {"tables": {str(q): list(g.table_tuple(q)) for q in g.seqs()},
                   "lens": {str(q): g.length(q) for q in g.seqs()},
                   "refs": [g.ref(b) for b in range(self.target.num_blocks)],
                   "free": sorted([*c.free_list.elements(), *c.evictable.elements()])
                   if c is not None else []}
        if c is None:
            return {**out, "free_list": [], "evictable": [], "cache": {}}
        return {**out, "free_list": list(c.free_list.elements()),
                "evictable": list(c.evictable.elements()), "cache": cache_json(c.entries)}

    # -- observation --------------------------------------------------------------------
    def _observe(self) -> P.PrefixSnapshot:
        view, g, st = self.view, self.ghost, self.s._state()
        entries = view.entries()
        meanings, bs = self.meanings, self.block_size
        for key, b in entries:
            if key not in meanings:
                meanings[key] = self._meaning(key, b)
        partial = set()
        for q in st.seqs():
            partial.update(st.table_tuple(q)[st.length(q) // bs:])
        refs = st.refs  # (a list of every block's refcount, in either mode; copied below)
        return P.PrefixSnapshot(self.target.num_blocks, bs, refs, view.free_list(),
                                view.evictable(), entries, {k: meanings[k] for k, _ in entries},
                                partial, g.filled, g.content, view.free_list_len(),
                                view.evictable_len())

    def _meaning(self, key, b: int) -> int:
        """The prefix id a key seen for the first time names, ``b`` the block it names: the
        prefix the engine hashes to it (``Ghost.meaning``: the chained prefix of token ids
        the run's sequences were allocated and appended with), so a block published
        under a wrong key is caught where it is published; for a target that does not
        say how it hashes (``key_function``), the content ``b`` holds now."""
        fn = self.key_fn
        if fn is not None:
            return self.ghost.meaning(key, fn)
        g = self.ghost
        return g.content.get(b, -1) if g.filled.get(b, 0) == self.block_size else -1

    # -- the fast mode --------------------------------------------------------------------
    def _verified(self, post) -> None:
        """``post`` (a whole observation) passed: the state to check the next step from."""
        self.pre = post
        if self.fast and not isinstance(post, Mirror):
            self.view.changes()  # (post was read whole after every change so far)
            st, bs = self.s._state(), self.block_size
            self.mirror = Mirror(post, self.s, self.ghost, self.meanings,
                                 [(q, partial_blocks(st, q, bs)) for q in st.seqs()])
            self.pre = self.observed = self.mirror

    def _full_check(self, n: int, op):
        """The full mode's check: the whole cache read, every invariant everywhere."""
        post, v = self._observe_and_check(n, op)
        if v is None:
            self.mirror = None  # rebuilt from post by _verified
        return post, v

    def _step_incremental(self, op):
        """Observe and check what ``op`` touched (module ``incremental``). Returns (post,
        violation, the state before for the touched blocks) or a full check's (post,
        violation, None) where one was needed."""
        n, m, view = self.steps, self.mirror, self.view
        nb, bs = self.target.num_blocks, self.block_size
        after = self.s.after  # the structural step's observation (``After``)
        if after is not None:
            touched, tables, lengths = after.blocks, after.tables, after.lengths
        elif self.s.touched is not None:  # a fused step's: its sequences as committed
            touched, *seqs = self.s.touched
            g = self.s.ghost
            tables = {q: g.tables.get(q) for q in seqs}
            lengths = g.lengths
        else:
            return (*self._full_check(n, op), None)
        old = {}  # touched block -> (whether it had a key, times evictable) before
        try:
            changed = view.obj.cache_changes()  # (``view.changes``)
            if changed is None:
                return (*self._full_check(n, op), None)
            # checked: every block the step's tables name before or after it and the blocks
            # it returned or copied (the structural step's ``After.blocks``: pool blocks),
            # and the blocks the journal names (any order: a failure is named by the full
            # check); read: the journal's blocks (their keys and places are what changed:
            # the containers' index, which the block reads read, and their journal are kept
            # by the same mutators)
            if changed:
                changed = {b for b in changed if type(b) is int and 0 <= b < nb}
                touched = touched | changed
            read = view._block
            mkeys, mfree, mevict = m._keys, m.free_list, m.evictable
            failed = op.outcome in (OOB, REFUSED)
            meanings = self.meanings
            for b in changed:
                keys, on_free, on_evict = read(b)
                if type(keys) is not tuple or type(on_free) is not int or type(on_evict) is not int:
                    keys, on_free, on_evict = view.block(b)
                if keys == mkeys.get(b, ()) and on_free == mfree.get(b, 0) and \
                        on_evict == mevict.get(b, 0):
                    old[b] = (bool(keys), on_evict)  # unchanged (its keys bound when first read)
                    continue
                if failed:  # a failed call changed the cache: the full mode's words for it
                    return (*self._full_check(n, op), None)
                for key in keys:
                    if key not in meanings:
                        meanings[key] = self._meaning(key, b)
                old[b] = m.set_block(b, keys, on_free, on_evict)
            sizes = view.sizes()
            f, e = view._n_free, view._n_evict  # (``free_list_len``, ``evictable_len``)
            reported = (view.free_list_len() if f is None or type(a := f()) is not int else a,
                        view.evictable_len() if e is None or type(c := e()) is not int else c)
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the allocator's fault
            why = f"reading the prefix cache {what_it_did(exc)}"
            return None, Violation(n, "malformed", "prefix observation", witness=why), None
        m._free_len, m._evict_len = reported
        partial = m.seq_partial
        for q, t in tables.items():  # (the step's sequences: ``partial_blocks`` of each)
            got = None if t is None else t[lengths[q] // bs:]
            if not got or partial.get(q) != got:
                m.set_partial(q, got)
        self.observed = m
        if sizes != (m.n_entries, m.n_free, m.n_evict) or reported != sizes[1:] or \
                not compiled_checks.touched_invariants(m, touched):
            # something changed beyond what was read, the sizes it reports are not those
            # it holds, or an invariant broke: the full check (and the full mode's words)
            return (*self._full_check(n, op), None)
        return m, None, _Before(m, old)

    def _observe_for_the_record(self) -> None:
        """After a structural violation (the call returned): the cache as it is now, for
        the trace's last state only; if it cannot be read, the state before stands."""
        try:
            self.observed = self._observe()
        except Interrupted:
            raise
        except BaseException:  # noqa: BLE001 - a hang included: the violation found stands
            pass

    def _observe_and_check(self, n: int, op):
        try:
            post = self._observe()
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the allocator's fault
            why = f"reading the prefix cache {what_it_did(exc)}"
            return None, Violation(n, "malformed", "prefix observation", witness=why)
        self.observed = post
        if op is not None and op.outcome in (OOB, REFUSED) and self.pre is not None:
            if sorted(map(repr, post.entries)) != sorted(map(repr, self.pre.entries)) or \
                    post.evictable != self.pre.evictable:
                name = f"{op.kind}: {P.CACHE_UNCHANGED}"
                failed = "ran out of blocks" if op.outcome == OOB else "was refused"
                return post, Violation(n, "contract", name, op.seq, subject="seq", witness=(
                    f"{op.kind} {failed} but changed the prefix cache or the evictable "
                    f"list (evictable {sorted(self.pre.evictable.elements())} -> "
                    f"{sorted(post.evictable.elements())}, {len(self.pre.entries)} -> "
                    f"{len(post.entries)} cache entries)"))
        if self.compiled and compiled_checks.invariants(post):
            return post, None
        for inv in P.PREFIX_INVARIANTS:
            elements = (None,) if inv.domain == "global" else post.blocks()
            for b in elements:
                if not inv.holds_for(PY, post, b):
                    ev = evidence.for_invariant(inv, PY, post, b)
                    return post, Violation(n, "invariant", inv.name, b, doc=inv.doc,
                                           subject=ev.subject, terms=ev.terms,
                                           witness=self._explain(post, b))
        assert not self.compiled, "the compiled prefix invariants disagree with the spec"
        return post, None

    def _explain(self, s: P.PrefixSnapshot, b) -> str:
        if b is None:
            return (f"the allocator reports {s.free_list_len()} free and {s.evictable_len()} "
                    f"evictable blocks; its lists hold {len(s.free_list)} and {len(s.evictable)}")
        g = self.ghost
        early = "; its key was published before its content was written"
        unknown = ("no prefix (the engine's key of no prefix the sequences were given)"
                   if self.key_fn is not None else g.show(-1))
        meaning = [g.show(m) if (m := s.meanings.get(k, -1)) >= 0 else unknown
                   for k in s.keys_of(b)]
        return (f"block {b}: refcount {s.ref(b)}, {s.on_free(b)}x on the free list, "
                f"{s.on_evictable(b)}x evictable, {s.cache_entries(b)} cache key(s)"
                f"{' naming ' + '; '.join(meaning) if meaning else ''}; "
                f"{'partial in a table, ' if s.partial(b) else ''}"
                f"{s.filled(b)}/{s.block_size} slots written, holding {g.show(s.content(b))}"
                f"{early if s.cached(b) and s.filled(b) < s.block_size else ''}")

    # -- allocate ------------------------------------------------------------------------
    def _check_allocate(self, pre, post, op, dom, n):
        if op.outcome == OK:
            v = self._check_hits(post, op, n)
            if v is not None:
                return v
        for name, element, holds in P.allocate_with_hits(PY, pre, post, op, dom,
                                                         self.pending_served):
            if not holds:
                served, hits = self.pending_served, self.pending_hits
                why = (f"after {op.kind}({op.seq}, {op.n_tokens} tokens, {hits} block(s) from "
                       f"the cache")
                if served < hits:
                    why += (f"; it reported {op.cached_tokens} cached token(s), so the prefill "
                            f"writes from position {served} on")
                why += ")"
                if op.outcome == OK:
                    table = post.table_tuple(op.seq)
                    shared = [(i, b) for i, b in enumerate(table) if i >= served and pre.ref(b)]
                    if shared:
                        i, b = shared[0]
                        why += (f": block {b} at position {i}, which the prefill writes, had "
                                f"refcount {pre.ref(b)} before the call: it is not the "
                                f"sequence's alone")
                return Violation(n, "contract", f"allocate: {name}", element, witness=why,
                                 doc=" ".join((P.allocate_with_hits.__doc__ or "").split()))
        return None

    def _check_hits(self, post, op, n):
        """A successful allocation's cache hits: which leading blocks were served from the
        cache (``pending_hits``, ``op.hits``), ``spec.prefix.cache_hits`` on them and, where
        the target reports one, ``spec.prefix.cached_tokens``. The violation, or None."""
        return self._check_hits_on(post.table_tuple(op.seq), op, n)

    def _check_hits_on(self, table: tuple, op, n):
        """``_check_hits`` on the new table ``table`` as observed."""
        before = self.pre
        hits = 0
        full = min(op.n_tokens // self.block_size, len(table)) if before is not None else 0
        now: dict | None = None  # (full mode) block -> the reprs of the keys naming it after
        while hits < full:  # a hit: still cached under a key it had before the call
            b = table[hits]
            try:
                if self.mirror is not None:  # the fast mode: the candidates' keys, in order
                    got = set(map(repr, self.view.block(b)[0]))
                else:
                    if now is None:
                        now = {}
                        for k, c in self.view.entries():
                            now.setdefault(c, set()).add(repr(k))
                    got = now.get(b)
            except CONTROL:
                raise
            except BaseException:  # noqa: BLE001 - a read failed: reported by the state check
                hits = 0
                break
            if not got or got.isdisjoint(map(repr, before.keys_of(b))):
                break
            hits += 1
        self.pending_hits = op.hits = hits
        self.pending_served = P.unwritten(hits, op.cached_tokens, self.block_size, self.twins)
        wants = self.ghost.chain(op.tokens)[:hits]
        for name, i, holds in P.cache_hits(PY, before, table[:hits], wants):
            if not holds:
                b = table[i]
                return Violation(n, "contract", f"allocate: {name}", b, subject="block", witness=(
                    f"sequence {op.seq} was given block {b} at position {i} from the cache for "
                    f"{self.ghost.show(wants[i])}, but before the call block {b} "
                    f"{'was cached and ' if before.cached(b) else 'was not cached and '}"
                    f"held {self.ghost.show(before.content(b))}"),
                    doc=" ".join((P.cache_hits.__doc__ or "").split()[:60]))
        if op.cached_tokens is not None:
            return self._check_cached_tokens(op, before, table, hits, n)
        return None

    def _orphaned(self, post) -> bool:
        """Whether some cached key names a prefix whose parent prefix no key names."""
        parts = self.ghost.parts
        named = {post.meanings.get(k, -1) for k, _ in post.entries}
        return any(m >= 0 and parts[m][0] >= 0 and parts[m][0] not in named for m in named)

    def _check_cached_tokens(self, op, before, table, hits, n):
        """``spec.prefix.cached_tokens``: the count the allocation reported against the
        blocks it served (and what they held before the call)."""
        got = op.cached_tokens
        wants = self.ghost.chain(op.tokens)
        pre = before if before is not None else P.PrefixSnapshot(
            self.target.num_blocks, self.block_size, [0] * self.target.num_blocks, (), (), (), {})
        for name, i, holds in P.cached_tokens(PY, pre, table, wants, op.n_tokens, hits, got):
            if holds:
                continue
            if i is not None:
                b = table[i]
                why = (f"allocate(seq={op.seq}) reported {got} cached token(s), so the engine skips "
                       f"computing block {b} at position {i}, which should hold "
                       f"{self.ghost.show(wants[i])}; before the call block {b} held "
                       f"{self.ghost.show(pre.content(b))}"
                       f"{'' if i < hits else ' and was not served from the cache'}")
            else:
                why = (f"allocate(seq={op.seq}, {op.n_tokens} tokens) reported {got} cached "
                       f"token(s); {hits} block(s) of {self.block_size} token(s) were served from "
                       f"the cache (a hit is a leading table entry still cached under the key "
                       f"it had before the call)")
            return Violation(n, "contract", f"allocate: {name}", table[i] if i is not None else op.seq,
                             subject="block" if i is not None else "seq", witness=why,
                             doc=" ".join((P.cached_tokens.__doc__ or "").split()[:80]))
        return None

    def _count(self, op, post, was=None):
        st, pre = self.stats, (self.pre if was is None else was)
        last = getattr(self, "_last_op", None)
        if op.kind != "commit":  # back to back: with only the first one's commit between
            self._last_op = op
        if op.outcome == OOB:
            st.oob += 1
            return
        if op.outcome == REFUSED:
            st.refused += 1
            return
        st.orphans += post.orphaned() if isinstance(post, Mirror) else self._orphaned(post)
        kind = op.kind
        if kind == "rollback":
            st.rollbacks += 1
            if pre is not None:
                st.rollbacks_into_cached += any(
                    pre.cached(b) for b in self.s._state().table_tuple(op.seq)[
                        self.s.lengths[op.seq] // self.block_size:])
        elif kind == "rebase":
            st.rebases += 1
        elif kind == "preempt":
            st.preempts += 1
        elif kind == "append_slots":
            st.append_slots += 1
        elif kind == "allocate":
            st.allocations += 1
            st.hit_blocks += self.pending_hits
            st.hit_allocations += self.pending_hits > 0
            st.partial_hits += 0 < self.pending_hits < (op.n_tokens - 1) // self.block_size
            st.repeats += (last is not None and last.kind == "allocate" and last.outcome == OK
                           and last.tokens == op.tokens)
        if pre is None or kind not in ("allocate", "append_slot", "append_slots"):
            return
        if was is not None:
            # (a fast step's state before differs from the mirror only on the blocks it
            # read: only those can have left the evictable list)
            blocks = [b for b, got in was.old.items() if got[1]]
            if not blocks:
                return
            table = self.s._state().table_tuple(op.seq)
            blocks = [b for b in blocks if b in table]
        else:
            table = self.s._state().table_tuple(op.seq)
            blocks = set(table)
        hits = set(table[: self.pending_hits]) if kind == "allocate" else set()
        for b in blocks:
            if pre.on_evictable(b) and post.on_evictable(b) == 0:
                if b in hits:
                    st.revived += 1
                else:
                    st.evicted += 1
