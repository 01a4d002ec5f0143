"""Tiers: the operations of ``kvcheck.spec.tiers`` as per-block step rules, written once.

Each tiers operation is a sequence of *block steps*, each acting on one block ``a`` of
one pool and leaving every other block of that pool as it was (the other pools are
framed: a step names one pool's block; an operation touching two pools is a step in
each). The vocabulary is the tier invariants' own, per block (``spec.tiers``:
``held(p, b, kind)``, ``held_total``, ``keys_naming``, ``key_meanings``, ``is_pending``,
``is_storing``, ``is_evictable``, ``backs_another``, ``content``), here over Z3 variables
(``TierPoolSymState``), so ``TIER_BLOCK_INVARIANTS`` and the block-manager per-block
invariants (``refcount_conservation``, ``free_list`` through ``pool_view``) are evaluated
on the spec's own text:

    take_free[k]      a holder of kind k (a sequence's table, a job) takes a free block;
                      ``arg``: what it then holds (-1 nothing written; a swap's copy: the
                      prefix it moved)
    hold[k]           a holder of kind k gains a reference to a held block: a job pinning
                      a store's source or a load's hit, a request's device hit, a pin
    drop[k]           a holder of kind k lets go; at 0 the block is free; left to the
                      cache alone (and backing no device key) it is evictable. A job lets
                      go of a destination only once it stopped pending (``land`` /
                      ``publish``)
    start_store       a store's destination (the job took it fresh) is pending: not
                      findable, ``arg`` the prefix its copy writes
    start_load        a load's destination is pending, ``arg`` the prefix the copy writes
    start_prefetch    a prefetch's destination (the job took it fresh) is a pending write
                      into the host under a key, as a store's (``storing``): not
                      findable, ``arg`` the prefix its storage page holds
    release           a prefetch's page it does not keep (unfilled, or a prefix already
                      cached): the job's reference passes to the release queue (a pin),
                      unkeyed, no longer pending; the queue's drain (``drop[pin]``) frees
                      it. The queue takes the job's one reference, never a second one: a
                      page is released once, by one owner
    land              a transfer's destination stops pending (a load's copy landed, or a
                      failed one recomputed; a failed store's destination, then dropped)
    publish           a store's completion: the job's reference on its destination
                      becomes the cache's, under a key naming what the copy wrote; it
                      stops pending
    register          a cache keys a block it does not hold yet, held and written (a
                      device prefix cache on a full block; a load's destination published
                      at once, as SGLang's HiCache does), never a pending store's
    demote            a write-back: a free host block becomes cached (the cache alone
                      holds it) under a key naming what the device block held
    evict             a block the cache alone holds loses its key and is free
    write             a token written into a block its writer holds alone, never one a
                      job holds; ``arg`` what the block then holds
    back / unback     the device cache gains / loses a key this (host) block is cached
                      under: an inclusive cache keeps a backup while the device caches it

The tiers operations, as sequences of these:

    allocate          per block: ``evict`` (room) then ``take_free[seq]``; a device hit
                      ``hold[seq]``; then ``write``s
    append            ``write`` into the last block, or ``take_free[seq]`` (after
                      ``evict`` / a window's ``drop[seq]``) and ``write``; ``register``
                      once full (a prefix cache); a write-back ``demote`` on the host
    free              ``drop[seq]`` of each of the request's entries, in every pool: with
                      a job in flight that is all (the job's references stay: the block is
                      released at the completion)
    store             each source ``hold[job]`` (a job that holds its sources: a
                      ``Job`` with ``holds_src`` false, vLLM v1's native connector, takes
                      none); each destination (``evict`` for room) ``take_free[job]`` then
                      ``start_store``
    load              each host hit ``hold[job]``; each device block ``take_free[seq]``
                      (a device hit ``hold[seq]``); each destination ``hold[job]`` then
                      ``start_load`` (``register`` where it is published at once)
    complete(ok)      a store: each destination ``publish``, each source ``drop[job]``;
                      a load: each destination ``land`` then ``drop[job]``, each source
                      ``drop[job]``
    complete(failed)  each destination ``land`` then ``drop[job]``; sources ``drop[job]``
    prefetch          each destination (``evict`` for room) ``take_free[job]`` then
                      ``start_prefetch``
    complete(filled)  a prefetch: each filled page it keeps ``publish``; every other page
                      ``release`` (then ``drop[pin]`` at the drain), or ``land`` then
                      ``drop[job]`` where the engine frees it at once
    evict(n)          ``evict`` of each block it takes
    swap_out/swap_in  ``take_free[seq]`` of each block in the other pool (its copy's
                      prefix as ``arg``), ``drop[seq]`` of each block here
    slide             ``drop[seq]`` of each mapped entry behind the window (a mapped
                      table is a sequence of its pool)
    pins              ``hold[pin]`` / ``drop[pin]`` as the connector takes and releases them

Each rule is a generator of ``(clause, name, formula)`` as in ``spec.prefix_steps``:
``"requires"`` holds before (when the step may be taken), ``"ensures"`` relates before and
after. The rules restate no invariant; ``kvcheck.proofs.tiers_induction`` proves every
per-block invariant preserved by every rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import logic

Clause = tuple[str, str, Any]

KINDS = ("seq", "job", "pin", "cache")  # holder kinds of one block (seq: any table)
BLOCK_TERMS = ("seq", "job", "pin", "cache", "ref", "on_free", "evictable", "storing",
               "loading", "backs", "content", "meaning")


class TierPoolSymState:
    """One pool's blocks over Z3 variables, one per block per term: the holder counts
    (``seq`` for every table, a sequence's, a mapped or a window one; ``job``, ``pin``;
    ``cache``: the keys naming it, the cache holding one reference per key), the engine's
    refcount ``ref``, the free-list multiplicity ``on_free``, whether the cache would evict
    it, whether a pending store / load is writing it, whether the device caches a key it is
    cached under (``backs``), its content and its key's meaning (prefix ids, -1 none; the
    keys naming one block share one meaning variable, so two keys are ``cache`` = 2)."""

    COUNTS = ("seq", "job", "pin", "cache", "ref", "on_free")
    BOOLS = ("evictable", "storing", "loading", "backs")
    IDS = ("content", "meaning")

    def __init__(self, L, num_blocks: int, name: str, pool: str = "host"):
        self.L, self.num_blocks, self.pool = L, num_blocks, pool
        self._v = {t: [L.var(f"{name}.{t}{b}") for b in range(num_blocks)]
                   for t in (*self.COUNTS, *self.IDS)}
        self._v.update({t: [L.bool_var(f"{name}.{t}{b}") for b in range(num_blocks)]
                        for t in self.BOOLS})

    def blocks(self):
        return range(self.num_blocks)

    def get(self, term: str, b):
        return self.L.select(self._v[term], b)

    def domain(self):
        """Well-formedness of the encoding: counts non-negative, ids >= -1."""
        L = self.L
        return L.and_(*[v >= 0 for t in self.COUNTS for v in self._v[t]],
                      *[v >= -1 for t in self.IDS for v in self._v[t]])

    # the per-block terms the step rules speak of
    def count(self, kind: str, b):
        return self.get(kind, b)

    def ref(self, b):
        return self.get("ref", b)

    def on_free(self, b):
        return self.get("on_free", b)

    def evictable(self, b):
        return self.get("evictable", b)

    def storing(self, b):
        return self.get("storing", b)

    def loading(self, b):
        return self.get("loading", b)

    def pending(self, b):
        return self.L.or_(self.storing(b), self.loading(b))

    def backs(self, b):
        return self.get("backs", b)

    def meaning(self, b):
        return self.get("meaning", b)

    # the tier invariants' vocabulary (``spec.tiers.TierState``), for this pool
    def held(self, p, b, kind: str):
        return self.get({"mapped": "seq", "window": "seq"}.get(kind, kind), b)

    def held_total(self, p, b):
        return sum((self.get(k, b) for k in KINDS[1:]), self.get(KINDS[0], b))

    def keys_naming(self, p, b):
        return self.get("cache", b)

    def key_meanings(self, p, b):
        return [self.meaning(b)]

    def is_pending(self, p, b):
        return self.pending(b)

    def is_storing(self, p, b):
        return self.storing(b)

    def is_evictable(self, p, b):
        return self.evictable(b)

    def backs_another(self, p, b):
        return self.backs(b)

    def content(self, *pb):
        return self.get("content", pb[-1])  # content(p, b) as the tiers spec, content(b)

    def pool_view(self, p=None) -> _PoolView:
        """The pool as a block-manager state, for its per-block invariants."""
        return _PoolView(self)


class _PoolView:
    """``TierPoolSymState`` as the block-manager vocabulary ``spec.invariants`` reads per
    block: ``holders(b)`` counts every holder's references (``TierState.pool_view``)."""

    def __init__(self, s: TierPoolSymState):
        self.s = s

    def blocks(self):
        return self.s.blocks()

    def ref(self, b):
        return self.s.ref(b)

    def holders(self, b):
        return self.s.held_total(None, b)

    def free_count(self, b):
        return self.s.on_free(b)


def _read(state, t: str, b):
    return state.get(t, b)


def same(L, pre, post, b, *terms: str):
    """Block ``b``'s ``terms`` are unchanged."""
    return L.and_(*[_read(post, t, b) == _read(pre, t, b) for t in terms])


def frame(L, pre, post, a, *changed: str) -> Iterator[Clause]:
    """Every block other than ``a`` is unchanged; so are ``a``'s terms not in ``changed``."""
    yield from logic.frame(L, pre, post, a, BLOCK_TERMS, _read, changed)


def _alone_after(L, pre, post, a):
    """Left to the cache alone after the step (and backing no device key): evictable."""
    return L.and_(post.count("cache", a) >= 1, post.ref(a) == post.count("cache", a),
                  L.not_(pre.backs(a)))


def take_free(kind: str):
    def rule(L, pre, post, a, arg=None) -> Iterator[Clause]:
        yield "requires", "on the free list", pre.on_free(a) >= 1
        yield "requires", "what it will hold: a prefix id or nothing", arg >= -1
        yield "ensures", "leaves the free list", post.on_free(a) == 0
        yield "ensures", f"one {kind} reference", L.and_(
            post.count(kind, a) == pre.count(kind, a) + 1, post.ref(a) == pre.ref(a) + 1)
        yield "ensures", "not evictable", L.not_(post.evictable(a))
        yield "ensures", "holds what it is given", post.content(a) == arg
        yield from frame(L, pre, post, a, kind, "ref", "on_free", "evictable", "content")

    rule.__doc__ = (f"A {kind} takes a block from the free list: one reference, off the free "
                    "list, holding ``arg`` (-1: nothing written yet; a swap's copy: the prefix "
                    "it moved).")
    return rule


def hold(kind: str):
    def rule(L, pre, post, a, arg=None) -> Iterator[Clause]:
        yield "requires", "held", pre.ref(a) >= 1
        if kind == "job":  # (a store's source, a load's hit: never a pending destination)
            yield ("requires", "never a block another transfer is still writing",
                   L.not_(pre.pending(a)))
        yield "ensures", f"one more {kind} reference", L.and_(
            post.count(kind, a) == pre.count(kind, a) + 1, post.ref(a) == pre.ref(a) + 1)
        yield "ensures", "not evictable (a hit revives it)", L.not_(post.evictable(a))
        yield from frame(L, pre, post, a, kind, "ref", "evictable")

    rule.__doc__ = (f"A {kind} gains a reference to a held block (a job pins a store's source "
                    "or a load's hit; a request's device hit; a connector's pin): it is no "
                    "longer evictable.")
    return rule


def drop(kind: str):
    def rule(L, pre, post, a, arg=None) -> Iterator[Clause]:
        yield "requires", f"a {kind} reference", pre.count(kind, a) >= 1
        if kind == "job":
            yield ("requires", "not a destination still pending (completion lands it first)",
                   L.not_(pre.pending(a)))
        yield "ensures", f"one {kind} reference less", L.and_(
            post.count(kind, a) == pre.count(kind, a) - 1, post.ref(a) == pre.ref(a) - 1)
        yield "ensures", "free at 0", post.on_free(a) == pre.on_free(a) + L.ite(
            post.ref(a) == 0, 1, 0)
        yield "ensures", "left to the cache alone: evictable", post.evictable(a) == L.ite(
            _alone_after(L, pre, post, a), True, pre.evictable(a))
        yield from frame(L, pre, post, a, kind, "ref", "on_free", "evictable")

    rule.__doc__ = (f"A {kind} lets go of one reference: at 0 the block is free; left to the "
                    "cache alone (backing no device key) it is evictable.")
    return rule


def _start(flag: str, what: str):
    def rule(L, pre, post, a, arg=None) -> Iterator[Clause]:
        yield "requires", "the job holds it", pre.count("job", a) >= 1
        yield "requires", "not pending already", L.not_(pre.pending(a))
        yield "requires", "taken fresh: no key names it", pre.count("cache", a) == 0
        yield "requires", "the prefix its copy writes", arg >= 0
        yield "ensures", f"a pending {what}'s destination", post.get(flag, a)
        yield "ensures", "the ghost follows the copy", post.content(a) == arg
        yield from frame(L, pre, post, a, flag, "content")

    rule.__doc__ = (f"A {what}'s destination, which its job holds, is pending until the "
                    f"completion; ``arg`` the prefix the copy writes.")
    return rule


def land(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A transfer's destination stops pending: a load's copy landed (or, failed, the engine
    recomputed the same prefix), a failed store's destination (dropped next)."""
    yield "requires", "pending", pre.pending(a)
    yield "requires", "a store's destination lands unkeyed (else: publish)", L.implies(
        pre.storing(a), pre.count("cache", a) == 0)
    yield "ensures", "no longer pending", L.and_(L.not_(post.storing(a)),
                                                 L.not_(post.loading(a)))
    yield from frame(L, pre, post, a, "storing", "loading")


def publish(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A store's completion: the job's reference on its destination becomes the cache's,
    under a key naming what the copy wrote; it stops pending, and is evictable once the
    cache alone holds it."""
    yield "requires", "a pending store's destination", pre.storing(a)
    yield "requires", "the job holds it", pre.count("job", a) >= 1
    yield "requires", "no key names it yet", pre.count("cache", a) == 0
    yield "requires", "the copy wrote a prefix", pre.content(a) >= 0
    yield "ensures", "the job's reference becomes the cache's", L.and_(
        post.count("job", a) == pre.count("job", a) - 1,
        post.count("cache", a) == pre.count("cache", a) + 1, post.ref(a) == pre.ref(a))
    yield "ensures", "the key names what the copy wrote", post.meaning(a) == pre.content(a)
    yield "ensures", "no longer pending", L.not_(post.storing(a))
    yield "ensures", "evictable once the cache alone holds it", post.evictable(a) == \
        _alone_after(L, pre, post, a)
    yield from frame(L, pre, post, a, "job", "cache", "ref", "meaning", "storing", "evictable")


def release(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A prefetch's page it does not keep: the job's reference passes to the release queue
    (a pin, SGLang's ``host_mem_release_queue``), unkeyed and no longer pending; the
    queue's drain (``drop[pin]``) frees it. The queue takes over the job's one reference:
    the page is released once, by one owner."""
    yield "requires", "the job holds it", pre.count("job", a) >= 1
    yield "requires", "no key names it", pre.count("cache", a) == 0
    yield "ensures", "the job's reference becomes the release queue's", L.and_(
        post.count("job", a) == pre.count("job", a) - 1,
        post.count("pin", a) == pre.count("pin", a) + 1, post.ref(a) == pre.ref(a))
    yield "ensures", "no longer pending", L.and_(L.not_(post.storing(a)),
                                                 L.not_(post.loading(a)))
    yield from frame(L, pre, post, a, "job", "pin", "storing", "loading")


def register(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A cache keys a held block no key names yet, under what it holds (a device prefix
    cache on a written full block; a load's destination published at once): never a
    pending store's destination. Others hold it: not evictable."""
    yield "requires", "held", pre.ref(a) >= 1
    yield "requires", "no key names it yet", pre.count("cache", a) == 0
    yield "requires", "never a pending store's destination", L.not_(pre.storing(a))
    yield "requires", "it holds a prefix", pre.content(a) >= 0
    yield "ensures", "the cache's reference", L.and_(
        post.count("cache", a) == 1, post.ref(a) == pre.ref(a) + 1)
    yield "ensures", "the key names what it holds", post.meaning(a) == pre.content(a)
    yield "ensures", "not evictable", L.not_(post.evictable(a))
    yield from frame(L, pre, post, a, "cache", "ref", "meaning", "evictable")


def demote(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A write-back: a free host block is cached (the cache alone holds it) under a key
    naming what the device block held, ``arg``."""
    yield "requires", "on the free list", pre.on_free(a) >= 1
    yield "requires", "a prefix", arg >= 0
    yield "ensures", "the cache alone holds it", L.and_(
        post.count("cache", a) == 1, post.ref(a) == pre.ref(a) + 1, post.on_free(a) == 0)
    yield "ensures", "holds the prefix its key names", L.and_(post.content(a) == arg,
                                                              post.meaning(a) == arg)
    yield "ensures", "evictable unless it backs a device key", post.evictable(a) == \
        L.not_(pre.backs(a))
    yield from frame(L, pre, post, a, "cache", "ref", "on_free", "content", "meaning",
                     "evictable")


def evict(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """The cache evicts a block it alone holds: its key is gone, the block is free."""
    yield "requires", "cached", pre.count("cache", a) >= 1
    yield "requires", "held by the cache alone", pre.ref(a) == pre.count("cache", a)
    yield "ensures", "its key is gone, the block free", L.and_(
        post.count("cache", a) == 0, post.ref(a) == 0, post.on_free(a) == pre.on_free(a) + 1,
        post.meaning(a) == -1)
    yield "ensures", "not evictable, backs nothing", L.and_(L.not_(post.evictable(a)),
                                                            L.not_(post.backs(a)))
    yield from frame(L, pre, post, a, "cache", "ref", "on_free", "meaning", "evictable",
                     "backs")


def write(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A token written into a block its writer holds alone, never one a job holds: the
    block then holds ``arg`` (a prefix id, -1 while not a complete one)."""
    yield "requires", "held by a sequence", pre.count("seq", a) >= 1
    yield "requires", "held by the writer alone", pre.ref(a) == 1
    yield "requires", "never one a job holds", pre.count("job", a) == 0
    yield "requires", "a prefix id or none", arg >= -1
    yield "ensures", "holds the written prefix", post.content(a) == arg
    yield from frame(L, pre, post, a, "content")


def back(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """The device cache gains a key this cached block is cached under (an inclusive
    cache's backup): not evictable while it does."""
    yield "requires", "cached", pre.count("cache", a) >= 1
    yield "ensures", "backs a device key, not evictable", L.and_(post.backs(a),
                                                                 L.not_(post.evictable(a)))
    yield from frame(L, pre, post, a, "backs", "evictable")


def unback(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """The device cache's key is gone: a block the cache alone holds is evictable again."""
    yield "requires", "backs a device key", pre.backs(a)
    yield "ensures", "backs nothing", L.not_(post.backs(a))
    yield "ensures", "evictable if the cache alone holds it", post.evictable(a) == L.and_(
        pre.count("cache", a) >= 1, pre.ref(a) == pre.count("cache", a))
    yield from frame(L, pre, post, a, "backs", "evictable")


STEPS = {
    "take_free[seq]": take_free("seq"),
    "take_free[job]": take_free("job"),
    "hold[seq]": hold("seq"),
    "hold[job]": hold("job"),
    "hold[pin]": hold("pin"),
    "drop[seq]": drop("seq"),
    "drop[job]": drop("job"),
    "drop[pin]": drop("pin"),
    "start_store": _start("storing", "store"),
    "start_load": _start("loading", "load"),
    "start_prefetch": _start("storing", "prefetch"),
    "release": release,
    "land": land,
    "publish": publish,
    "register": register,
    "demote": demote,
    "evict": evict,
    "write": write,
    "back": back,
    "unback": unback,
}
