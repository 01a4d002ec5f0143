"""Prefix caching: vocabulary, invariants and the cache-hit contract, written once.

A prefix-caching block manager keeps, besides refcounts and tables, a *cache*
of keys (hashes) each naming one block, and splits its refcount-0 blocks in
two: the plain *free list* (no key) and the *evictable* list (key still
cached, may be revived by a hit or evicted for new content). Structurally
(``kvcheck.spec.invariants``) both parts are "free"; this module says how
they differ.

Prefix ids. A block's *content* is the whole token prefix its KV data was
computed under (its own tokens and every block before it). The oracle interns
each prefix as an integer, the *prefix id*, so a content comparison is an
integer comparison; -1 means "no complete prefix" (never written, or only
partly). A cache key's *meaning* is the prefix id it names: the prefix whose
key the engine's own hash gives (the target's ``prefix_key(parent, tokens)``,
over the chained token ids its sequences were allocated and appended with),
so a block published under a wrong key is caught where it is published; a
target that does not say how it hashes has each key bound to the content of
the block it names when the oracle first sees it.

Vocabulary (per block ``b``; every state class provides these):

    ref(b)            the allocator's refcount
    on_free(b)        times b is on the plain free list (the unkeyed part)
    on_evictable(b)   times b is on the evictable list
    cache_entries(b)  number of cache entries (keys) naming b
    cached(b)         cache_entries(b) >= 1
    partial(b)        some live sequence's table holds b past its last full
                      block (the table view: the block is not full)
    filled(b)         slots of b the caller has written for its current
                      content (the data view, 0..block_size)
    content(b)        prefix id of b's content (-1: not a complete prefix)
    meaning(b)        prefix id named by the key naming b (-1 if none)
    content_ok(b)     b's content is exactly the prefix its key names:
                      content(b) >= 0 and meaning(b) == content(b)

and globally ``free_list_len()`` / ``evictable_len()``: the sizes the
allocator reports for its two lists.

Concrete states: ``PrefixSnapshot``. Symbolic states: ``PrefixSymState``,
one Z3 variable per block per term (``bind`` pins them to a snapshot), for
plugging into the proof engines: build ``inv.formula(Z3Logic(w), state)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .invariants import Invariant

PREFIX_INVARIANTS: list[Invariant] = []


def prefix_invariant(domain: str):
    def register(fn):
        PREFIX_INVARIANTS.append(Invariant(fn.__name__, domain, fn))
        return fn

    return register


# -- invariants (checked in this order; the first failure is reported) -----------
@prefix_invariant("block")
def pool_partition(L, s, b):
    """Free list, evictable list and in-use blocks account for the whole
    pool with no block in two places: every block is on exactly one of the
    free list, the evictable list, or in use (refcount > 0), and on a list
    at most once."""
    places = L.count([s.on_free(b) >= 1, s.on_evictable(b) >= 1, s.ref(b) > 0])
    return L.and_(places == 1, s.on_free(b) <= 1, s.on_evictable(b) <= 1)


@prefix_invariant("global")
def pool_sizes(L, s):
    """The list sizes the allocator reports are the numbers of pool blocks
    on its free and evictable lists (nothing counted twice or left out)."""
    return L.and_(
        s.free_list_len() == L.count(s.on_free(b) >= 1 for b in s.blocks()),
        s.evictable_len() == L.count(s.on_evictable(b) >= 1 for b in s.blocks()),
    )


@prefix_invariant("block")
def evictable_keyed(L, s, b):
    """An evictable block has refcount 0 and a live key in the cache."""
    return L.implies(s.on_evictable(b) >= 1, L.and_(s.ref(b) == 0, s.cached(b)))


@prefix_invariant("block")
def free_unkeyed(L, s, b):
    """A block on the plain free list has no key in the cache (a freed block
    with a live key goes to the evictable list; a block taken for new content
    loses its key first)."""
    return L.implies(s.on_free(b) >= 1, L.not_(s.cached(b)))


@prefix_invariant("block")
def one_key_per_block(L, s, b):
    """At most one cache key names a block."""
    return s.cache_entries(b) <= 1


@prefix_invariant("block")
def no_partial_cached(L, s, b):
    """Partial blocks are never in the cache: a cached block is full in
    every table that holds it. A rollback that leaves a cached full block
    partial in a table (its tokens past the new end are dropped, and the next
    token is written into it in place) drops the block's key with it; a rebase
    or a copy that overwrites a cached block likewise."""
    return L.implies(s.cached(b), L.not_(s.partial(b)))


@prefix_invariant("block")
def key_after_write(L, s, b):
    """A key is registered only once the block's tokens are written: a
    cached block has all block_size slots written. Publish after write: with
    an engine that writes the prompt's KV after admitting it (a target with
    ``commit(seq)``, the forward pass), a block is written only at its commit,
    so no key may name it before; a block freed or preempted before its write
    must never become findable (vLLM PR #43569: a later request hit a block
    whose KV was never written)."""
    return L.implies(s.cached(b), s.filled(b) == s.block_size)


@prefix_invariant("block")
def cache_content(L, s, b):
    """Every cached key names a block whose content is exactly that prefix
    (the block's tokens and every token before them): the token history a
    block is keyed by is the history whose KV it holds, after every fork,
    rebase, rollback and preemption."""
    return L.implies(s.cached(b), s.content_ok(b))


def by_name(name: str) -> Invariant:
    for inv in PREFIX_INVARIANTS:
        if inv.name == name:
            return inv
    raise KeyError(name)


# -- the cache-hit step contract ---------------------------------------------------
def cache_hits(L, pre, table: Iterable[Any], wants: Iterable[Any]):
    """A cache hit returns only blocks that hold the requested prefix: for
    each position i the allocation served from the cache, the block was
    cached before the operation and its content was exactly the first
    (i + 1) * block_size requested tokens. An evicted or reused block holds
    another prefix (or none), so no hit may return one.

    ``pre`` is the prefix state before the operation, ``table`` the hit
    blocks (the new table's leading entries), ``wants`` the prefix ids of
    the requested prefixes at those positions. Yields (name, position, formula).
    """
    for i, (b, want) in enumerate(zip(table, wants, strict=True)):
        yield "cache hit returns a cached block", i, pre.cached(b)
        yield "cache hit returns a block holding the requested prefix", i, L.and_(
            pre.content(b) >= 0, pre.content(b) == want
        )


def cached_tokens(L, pre, table, wants, n_tokens: int, hits: int, reported):
    """The number of cached prompt tokens an allocation reports is the engine's
    skip-prefill state: the engine computes only the prompt's tokens from
    ``reported`` on. It is checked against the blocks actually served, not
    against the cache map alone:

    * every block the count skips (position i with i * block_size < reported)
      held, before the call, exactly the requested prefix, fully computed: a
      block reused from the evictable list for new content, or one whose
      content was never written, must not be skipped even if the allocator
      still marks it computed (vLLM PR #5364);
    * the count stops at the blocks served from the cache (the leading run of
      hits: lookup stops at the first miss), reported <= hits * block_size;
    * a prompt fully in the cache still leaves at least one token to compute
      (the engine needs the last token's logits), reported <= n_tokens - 1
      (vLLM PR #11186, nano-vllm #144).

    A count short of the blocks served is legal: the engine recomputes
    content the block already holds (and a block evicted and re-taken for the
    same prefix within one allocation is indistinguishable from a hit); but
    the engine writes every block holding a token from ``reported`` on, so
    each of those must be the sequence's alone (``allocate_with_hits`` with
    ``unwritten`` blocks served).

    ``pre`` is the prefix state before the call, ``table`` the new sequence's
    table, ``wants`` the prefix ids of the prompt's full blocks, ``hits`` how
    many leading blocks were served from the cache. Yields (name, position, formula).
    """
    bs = pre.block_size
    yield "reported cached tokens are a count", None, reported >= 0
    for i, (b, want) in enumerate(zip(table, wants, strict=False)):
        yield "every block the cached tokens skip holds the requested prefix", i, L.implies(
            i * bs < reported, L.and_(pre.content(b) >= 0, pre.content(b) == want))
    yield "cached tokens stop at the blocks served from the cache", None, reported <= hits * bs
    yield "a prompt fully in the cache leaves at least one token to compute", None, (
        reported <= n_tokens - 1)


def commit(L, pre, post, table: Iterable[Any]):
    """commit(seq): the engine has written the KV of seq's prompt (its forward
    pass ran); the allocator may now publish the keys of the blocks it took
    for that prompt, and nothing else changes: a key appears only on a block
    of the committed sequence's table, no key leaves the cache, every
    refcount and both lists stay as they were. (Publishing only written
    blocks is ``key_after_write``, checked on the state after.)

    ``table`` is the committed sequence's table. Yields (name, block, formula).
    """
    mine = set(table)
    for b in pre.blocks():
        if b in mine:
            yield "no key leaves the cache", b, post.cache_entries(b) >= pre.cache_entries(b)
        else:
            yield "a key appears only on a block of the committed sequence", b, (
                post.cache_entries(b) == pre.cache_entries(b))
        yield "refcounts and lists unchanged", b, L.and_(
            post.ref(b) == pre.ref(b), post.on_free(b) == pre.on_free(b),
            post.on_evictable(b) == pre.on_evictable(b))


def unwritten(hits: int, reported, block_size: int, twins: bool = False) -> int:
    """How many leading blocks of a new table the engine reads from the cache instead of
    writing: the blocks served from the cache (``hits``: the leading run still cached
    under the key it had before the call) that the cached-token count the allocation
    reports (``reported``; None: it reports none) skips whole. The prefill writes every
    token from ``reported`` on, so a block holding one of them (position i with
    (i + 1) * block_size > reported) is written, served from the cache or not.

    ``twins``: the target declares (``writes_cached_twins``) that its engine may leave a
    position its prefill computed naming the cached block that holds exactly that prefix
    (SGLang frees the pages it prefilled for their cached twins when it caches the
    request; vLLM v0's runner recomputes a full hit's last token into the cached last
    block, the same KV): then every block served from the cache is one, and
    ``cache_hits`` holds it to the requested prefix."""
    if reported is None or twins:
        return hits
    return min(hits, reported // block_size)


def allocate_with_hits(L, pre, post, op, dom, hits: int):
    """allocate(seq, n, token_ids) with prefix sharing, all or nothing. On
    success seq holds ceil(n/B) distinct blocks: the first ``hits`` were
    shared from the cache (refcount + 1, possibly revived from the evictable
    list), the rest were free (refcount 0 before, 1 after): every block the
    engine writes is the sequence's alone, whatever the cache map says (a hit
    placed past the first miss, or a block the map serves that the prefill
    writes anyway, is no exception); the structural free list shrinks by the
    number of blocks that had refcount 0. Out of blocks leaves everything
    unchanged. ``hits`` is ``unwritten``: the leading blocks served from the
    cache that the prefill does not write. (Structural vocabulary; with hits = 0
    this is ``contracts.allocate``.)"""
    from . import contracts

    q, n = op.seq, op.n_tokens
    if op.outcome == contracts.OOB:
        yield from contracts.exception_safety(L, pre, post, op, dom)
        return
    need = L.ceil_div(n, pre.block_size)
    yield "sequence is live with n tokens", q, L.and_(post.live(q), post.length(q) == n)
    yield "holds exactly ceil(n/B) blocks", q, post.nblocks(q) == need
    revived = []
    for i in post.positions(q):
        b = post.table(q, i)
        revived.append(pre.ref(b) == 0)
        yield "every block the prefill writes was free: the sequence's alone", q, L.implies(
            i >= hits, pre.ref(b) == 0)
    yield "free list shrinks by the blocks that had refcount 0", None, (
        post.num_free() == pre.num_free() - L.count(revived)
    )
    for b in dom.blocks:
        got = post.occurrences(q, b)
        yield "blocks handed out are distinct", b, got <= 1
        yield "refcount +1 for each block handed out, others unchanged", b, (
            post.ref(b) == pre.ref(b) + got
        )
    yield from contracts.unchanged_others(L, pre, post, dom, (q,))


CACHE_UNCHANGED = "exception_safety: cache unchanged"
"""The clause an out-of-blocks or refused call breaks when it changed the prefix cache
or the evictable list (the oracle compares the keys themselves: ``kind: CACHE_UNCHANGED``)."""


def clause_names() -> dict[str, str]:
    """Every clause this module's step contracts can name, as a violation names it
    (``kind: clause``), mapped to its operation: ``allocate_with_hits``, ``cache_hits``,
    ``cached_tokens`` and ``commit``, and ``CACHE_UNCHANGED`` for each operation that can
    fail. With ``contracts.clause_names`` what ``verify-prefix --allow`` accepts."""
    from .contracts import CONTRACTS, OK, OOB, Domain, Op
    from .logic import Z3Logic
    from .symbolic import SymScope, SymState

    L = Z3Logic(None, max_quotient=3)
    scope = SymScope(2, 2, 2, 4)
    pre, post = SymState(L, scope, "pre"), SymState(L, scope, "post")
    out: dict[str, str] = {}
    for outcome in (OK, OOB):
        op = Op("allocate", seq=0, outcome=outcome, n_tokens=L.var("n"))
        for name, _, _ in allocate_with_hits(L, pre, post, op, Domain(range(2), range(2)), 1):
            out.setdefault(f"allocate: {name}", "allocate")
    P = Z3Logic(PrefixScope(2, 2).width)
    a, b = PrefixSymState(P, PrefixScope(2, 2), "a"), PrefixSymState(P, PrefixScope(2, 2), "b")
    for name, _, _ in [*cache_hits(P, a, [0], [0]),
                       *cached_tokens(P, a, [0], [0], 2, 1, P.var("reported"))]:
        out.setdefault(f"allocate: {name}", "allocate")
    for name, _, _ in commit(P, a, b, [0]):
        out.setdefault(f"commit: {name}", "commit")
    for kind in CONTRACTS:
        out.setdefault(f"{kind}: {CACHE_UNCHANGED}", kind)
    return out


# -- concrete state -------------------------------------------------------------------
class PrefixSnapshot:
    """A complete concrete prefix-cache state.

    ``entries``: the cache as (key, block) pairs; ``meanings``: key -> prefix id
    (-1 / absent: unknown); ``partial``: blocks some table holds past its last
    full block; ``filled`` / ``content``: per block (missing = 0 / -1).
    """

    def __init__(self, num_blocks: int, block_size: int, refs, free_list: Iterable[int],
                 evictable: Iterable[int], entries: Iterable[tuple[Any, int]],
                 meanings: Mapping[Any, int], partial: Iterable[int] = (),
                 filled: Mapping[int, int] | None = None, content: Mapping[int, int] | None = None,
                 free_list_len: int | None = None, evictable_len: int | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refs = list(refs)
        self.free_list = Counter(free_list)
        self.evictable = Counter(evictable)
        self.entries = list(entries)
        self.meanings = dict(meanings)
        self._partial = set(partial)
        self.filled_map = dict(filled or {})
        self.content_map = dict(content or {})
        self._free_len = sum(self.free_list.values()) if free_list_len is None else free_list_len
        self._evict_len = sum(self.evictable.values()) if evictable_len is None else evictable_len
        self._keys: dict[int, list] = {}
        for key, b in self.entries:
            self._keys.setdefault(b, []).append(key)

    def blocks(self) -> range:
        return range(self.num_blocks)

    def ref(self, b):
        return self.refs[b] if 0 <= b < self.num_blocks else 0

    def on_free(self, b):
        return self.free_list.get(b, 0)

    def on_evictable(self, b):
        return self.evictable.get(b, 0)

    def cache_entries(self, b):
        return len(self._keys.get(b, ()))

    def cached(self, b):
        return b in self._keys

    def partial(self, b):
        return b in self._partial

    def filled(self, b):
        return self.filled_map.get(b, 0)

    def content(self, b):
        return self.content_map.get(b, -1)

    def meaning(self, b):
        keys = self._keys.get(b)
        return self.meanings.get(keys[0], -1) if keys else -1

    def content_ok(self, b):
        c = self.content(b)
        return c >= 0 and all(self.meanings.get(k, -1) == c for k in self._keys.get(b, ()))

    def free_list_len(self):
        return self._free_len

    def evictable_len(self):
        return self._evict_len

    def keys_of(self, b) -> list:
        return list(self._keys.get(b, ()))


# -- symbolic state ---------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixScope:
    num_blocks: int
    block_size: int

    @property
    def width(self) -> int:
        return max(12, (4 * max(self.num_blocks, self.block_size, 4) + 4).bit_length() + 3)


class PrefixSymState:
    """The prefix vocabulary over Z3 variables, one per block per term.

    For a proof engine: ``s = PrefixSymState(Z3Logic(scope.width), scope, "s0")``,
    then ``inv.formula(L, s)`` for each ``inv`` in ``PREFIX_INVARIANTS`` is a
    Z3 formula over ``s.variables()``; a transition relation constrains a
    second state's variables. Prefix ids are bit-vectors (-1 = none); the
    meaning of a block's key is a per-block variable, so two blocks under
    one key are modelled by ``cache_entries`` > 1 rather than by key values.
    """

    def __init__(self, L, scope: PrefixScope, name: str):
        self.L = L
        self.scope = scope
        self.num_blocks = scope.num_blocks
        self.block_size = scope.block_size
        z3, N = L.z3, scope.num_blocks
        self._ref = [L.var(f"{name}.ref{b}") for b in range(N)]
        self._free = [L.var(f"{name}.onfree{b}") for b in range(N)]
        self._evict = [L.var(f"{name}.onevict{b}") for b in range(N)]
        self._entries = [L.var(f"{name}.entries{b}") for b in range(N)]
        self._partial = [z3.Bool(f"{name}.partial{b}") for b in range(N)]
        self._filled = [L.var(f"{name}.filled{b}") for b in range(N)]
        self._content = [L.var(f"{name}.content{b}") for b in range(N)]
        self._meaning = [L.var(f"{name}.meaning{b}") for b in range(N)]
        self._free_len = L.var(f"{name}.free_len")
        self._evict_len = L.var(f"{name}.evict_len")

    def variables(self) -> list:
        return [*self._ref, *self._free, *self._evict, *self._entries, *self._partial,
                *self._filled, *self._content, *self._meaning, self._free_len, self._evict_len]

    def domain(self):
        """Well-formedness of the encoding (counts non-negative, fill within a block)."""
        L, B = self.L, self.block_size
        return L.and_(
            *[v >= 0 for v in (*self._ref, *self._free, *self._evict, *self._entries,
                               self._free_len, self._evict_len)],
            *[L.and_(f >= 0, f <= B) for f in self._filled],
            *[c >= -1 for c in (*self._content, *self._meaning)],
        )

    def blocks(self):
        return range(self.num_blocks)

    def ref(self, b):
        return self.L.select(self._ref, b)

    def on_free(self, b):
        return self.L.select(self._free, b)

    def on_evictable(self, b):
        return self.L.select(self._evict, b)

    def cache_entries(self, b):
        return self.L.select(self._entries, b)

    def cached(self, b):
        return self.cache_entries(b) >= 1

    def partial(self, b):
        return self.L.select(self._partial, b)

    def filled(self, b):
        return self.L.select(self._filled, b)

    def content(self, b):
        return self.L.select(self._content, b)

    def meaning(self, b):
        return self.L.select(self._meaning, b)

    def content_ok(self, b):
        return self.L.and_(self.content(b) >= 0, self.meaning(b) == self.content(b))

    def free_list_len(self):
        return self._free_len

    def evictable_len(self):
        return self._evict_len

    def bind(self, snap: PrefixSnapshot) -> list:
        """Equalities pinning every variable to ``snap``'s values.

        A block under several keys with different meanings has no single
        ``meaning``; it is bound to -2 so ``content_ok`` is false, as it is
        concretely.
        """
        L, out = self.L, []
        ids = sorted({x for b in snap.blocks()
                      for x in (snap.content(b), snap.meaning(b)) if x >= 0})
        rank = {x: i for i, x in enumerate(ids)}  # prefix ids only matter up to equality

        def small(x: int) -> int:
            return rank.get(x, x if x < 0 else -1)

        for b in snap.blocks():
            meaning = snap.meaning(b)
            if snap.cached(b) and not snap.content_ok(b) and snap.content(b) >= 0:
                meanings = {snap.meanings.get(k, -1) for k in snap.keys_of(b)}
                if len(meanings) > 1:
                    meaning = -2
            out += [
                self._ref[b] == L.val(snap.ref(b)),
                self._free[b] == L.val(snap.on_free(b)),
                self._evict[b] == L.val(snap.on_evictable(b)),
                self._entries[b] == L.val(snap.cache_entries(b)),
                self._partial[b] == L.z3.BoolVal(snap.partial(b)),
                self._filled[b] == L.val(snap.filled(b)),
                self._content[b] == L.val(small(snap.content(b))),
                self._meaning[b] == L.val(small(meaning)),
            ]
        out += [self._free_len == L.val(snap.free_list_len()),
                self._evict_len == L.val(snap.evictable_len())]
        return out
