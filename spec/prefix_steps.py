"""Prefix caching: the manager's per-block step rules, written once.

A prefix-caching manager's operations (``allocate`` with hits, ``append_slot``,
``fork``, ``free_seq``; see ``kvcheck.impl.prefix_cache``) are sequences of
*block steps*, each acting on one block ``a`` and leaving every other block
as it was:

    take_free        a block from the plain free list, for new content
    take_evictable   the LRU evictable block, for new content (its key first
                     leaves the cache)
    hit              a cache hit shares a cached full block
    write            one token written into a block its writer holds alone
    register         a block that became full gets its key
    release          one holder lets go (free_seq, the source of a copy-on-write)
    fork             one more holder (fork shares every block of the parent)
    unregister       a key leaves the cache of an in-use block (before a rollback
                     makes the block partial)
    truncate         a rollback cuts a holder's tokens inside block ``a``: the block
                     is partial in that table, only its first ``arg`` slots kept

E.g. ``allocate`` of a 2.5-block prompt with one hit is ``hit``, then
``take_free``/``take_evictable``, B ``write``s and ``register`` for the second
block and ``take_*`` plus B/2 ``write``s for the third; a copy-on-write is
``take_*``, ``write``s of the copied tokens and ``release`` of the source.
The engine's operations beyond the seed's four are sequences of the same steps:
``rollback`` is, for each block it makes partial, ``unregister`` (if keyed) then
``truncate`` (and ``release`` of a block it gives back); ``rebase`` is ``fork`` of
each of the source's blocks then ``release`` of each of the child's old ones;
``preempt`` is ``free_seq``'s ``release``s; ``append_slots`` is ``take_*``,
``write``, ``register`` and ``release`` (a replaced shared block) as above.

Each rule is a generator of ``(clause, name, formula)`` over the prefix
vocabulary of ``kvcheck.spec.prefix`` (a ``pre`` and a ``post`` state):
``clause`` is ``"requires"`` (holds before: when the step may be taken) or
``"ensures"`` (relates before and after). ``arg`` is the step's one free value:
for ``write`` the prefix id of the block's content once this token fills it,
for ``hit`` the prefix id the lookup asked for; other rules ignore it.

These rules restate no invariant: they say what each step does, the way the
reference does it, and ``kvcheck.proofs.prefix_induction`` proves that every
prefix invariant is preserved by every rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import logic

Clause = tuple[str, str, Any]

BLOCK_TERMS = ("ref", "on_free", "on_evictable", "cache_entries", "partial", "filled", "content",
               "meaning")


def _read(state, t: str, b):
    return getattr(state, t)(b)


def same(L, pre, post, b, *terms: str):
    """Block ``b``'s ``terms`` are unchanged."""
    return L.and_(*[_read(post, t, b) == _read(pre, t, b) for t in terms])


def frame(L, pre, post, a, *changed: str) -> Iterator[Clause]:
    """Every block other than ``a`` is unchanged; so are ``a``'s terms not in ``changed``."""
    yield from logic.frame(L, pre, post, a, BLOCK_TERMS, _read, changed)


def _fresh(L, pre, post, a) -> Iterator[Clause]:
    """A block taken for new content: one holder, nothing written yet."""
    yield "ensures", "refcount 1", post.ref(a) == 1
    yield "ensures", "nothing written yet", L.and_(post.filled(a) == 0, post.content(a) == -1)
    yield "ensures", "held past its table's last full block", post.partial(a)


def take_free(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A block from the plain free list is taken for new content: it leaves the
    free list with refcount 1; the cache is not touched (the free list holds
    unkeyed blocks), so it has no key until its tokens are written."""
    yield "requires", "on the plain free list", pre.on_free(a) >= 1
    yield "ensures", "leaves the free list", post.on_free(a) == 0
    yield "ensures", "free list size - 1", L.and_(
        post.free_list_len() == pre.free_list_len() - 1,
        post.evictable_len() == pre.evictable_len())
    yield from _fresh(L, pre, post, a)
    yield from frame(L, pre, post, a, "ref", "on_free", "partial", "filled", "content")


def take_evictable(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """An evictable block is taken for new content: its key is removed from
    the cache first, then it leaves the evictable list with refcount 1."""
    yield "requires", "on the evictable list", pre.on_evictable(a) >= 1
    yield "ensures", "its key leaves the cache", L.and_(
        post.cache_entries(a) == pre.cache_entries(a) - 1,
        post.meaning(a) == L.ite(post.cache_entries(a) >= 1, pre.meaning(a), -1))
    yield "ensures", "leaves the evictable list", post.on_evictable(a) == 0
    yield "ensures", "evictable size - 1", L.and_(
        post.evictable_len() == pre.evictable_len() - 1,
        post.free_list_len() == pre.free_list_len())
    yield from _fresh(L, pre, post, a)
    yield from frame(L, pre, post, a, "ref", "on_evictable", "cache_entries", "meaning", "partial",
                     "filled", "content")


def hit(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A cache hit: the lookup of the requested prefix ``arg`` finds block ``a``
    (cached under a key naming ``arg``); one more holder, and an evictable
    block leaves the evictable list (it is revived)."""
    yield "requires", "cached under the requested prefix's key", L.and_(
        pre.cached(a), arg >= 0, pre.meaning(a) == arg)
    yield "ensures", "refcount + 1", post.ref(a) == pre.ref(a) + 1
    yield "ensures", "off the evictable list", post.on_evictable(a) == 0
    yield "ensures", "evictable size - 1 if it was evictable", L.and_(
        post.evictable_len() == pre.evictable_len() - L.ite(pre.on_evictable(a) >= 1, 1, 0),
        post.free_list_len() == pre.free_list_len())
    yield from frame(L, pre, post, a, "ref", "on_evictable")


def write(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """One token is written into block ``a`` by its only holder (a shared block
    is copied first). The token that fills the block completes its content:
    the prefix ``arg`` (the block's tokens chained with every token before);
    until then the block holds no complete prefix and is partial."""
    yield "requires", "held by the writer alone", pre.ref(a) == 1
    yield "requires", "room in the block", pre.filled(a) < pre.block_size
    yield "requires", "a prefix id", arg >= 0
    yield "ensures", "one more slot written", post.filled(a) == pre.filled(a) + 1
    full = post.filled(a) == pre.block_size
    yield "ensures", "content: the prefix once full, none before", (
        post.content(a) == L.ite(full, arg, -1))
    yield "ensures", "partial until full", post.partial(a) == L.not_(full)
    yield "ensures", "lists unchanged", L.and_(post.free_list_len() == pre.free_list_len(),
                                               post.evictable_len() == pre.evictable_len())
    yield from frame(L, pre, post, a, "filled", "content", "partial")


def register(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A block that became full registers its key: only an in-use block, full
    in its tables and with every slot written, with no key yet. The key names
    the block's whole prefix (it chains the parent's key)."""
    yield "requires", "in use", pre.ref(a) >= 1
    yield "requires", "full in its tables", L.not_(pre.partial(a))
    yield "requires", "every slot written", pre.filled(a) == pre.block_size
    yield "requires", "no key yet", L.not_(pre.cached(a))
    yield "ensures", "a key names it", post.cache_entries(a) == pre.cache_entries(a) + 1
    yield "ensures", "the key names its prefix", post.meaning(a) == pre.content(a)
    yield "ensures", "lists unchanged", L.and_(post.free_list_len() == pre.free_list_len(),
                                               post.evictable_len() == pre.evictable_len())
    yield from frame(L, pre, post, a, "cache_entries", "meaning")


def release(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """One holder lets go: refcount - 1. At 0 no table holds the block; a keyed
    block goes to the evictable list, an unkeyed one to the plain free list.
    Its content and key stay (that is what a later hit revives)."""
    yield "requires", "in use", pre.ref(a) >= 1
    yield "ensures", "refcount - 1", post.ref(a) == pre.ref(a) - 1
    last = post.ref(a) == 0
    to_evict = L.and_(last, pre.cached(a))
    to_free = L.and_(last, L.not_(pre.cached(a)))
    yield "ensures", "keyed: to the evictable list", L.and_(
        post.on_evictable(a) == pre.on_evictable(a) + L.ite(to_evict, 1, 0),
        post.evictable_len() == pre.evictable_len() + L.ite(to_evict, 1, 0))
    yield "ensures", "unkeyed: to the free list", L.and_(
        post.on_free(a) == pre.on_free(a) + L.ite(to_free, 1, 0),
        post.free_list_len() == pre.free_list_len() + L.ite(to_free, 1, 0))
    yield "ensures", "held by no table at 0", (
        post.partial(a) == L.and_(L.not_(last), pre.partial(a)))
    yield from frame(L, pre, post, a, "ref", "on_evictable", "on_free", "partial")


def fork(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A fork shares an in-use block: refcount + 1, nothing else changes."""
    yield "requires", "in use", pre.ref(a) >= 1
    yield "ensures", "refcount + 1", post.ref(a) == pre.ref(a) + 1
    yield "ensures", "lists unchanged", L.and_(post.free_list_len() == pre.free_list_len(),
                                               post.evictable_len() == pre.evictable_len())
    yield from frame(L, pre, post, a, "ref")


def unregister(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A key leaves the cache of an in-use block (the reference's rollback, before it
    makes the block partial: the next token is written into it in place, over the KV
    the key names); the block keeps its holders and what it holds."""
    yield "requires", "in use", pre.ref(a) >= 1
    yield "requires", "cached", pre.cached(a)
    yield "ensures", "its key leaves the cache", L.and_(
        post.cache_entries(a) == pre.cache_entries(a) - 1,
        post.meaning(a) == L.ite(post.cache_entries(a) >= 1, pre.meaning(a), -1))
    yield "ensures", "lists unchanged", L.and_(post.free_list_len() == pre.free_list_len(),
                                               post.evictable_len() == pre.evictable_len())
    yield from frame(L, pre, post, a, "cache_entries", "meaning")


def truncate(L, pre, post, a, arg=None) -> Iterator[Clause]:
    """A rollback cuts a holder's tokens inside block ``a``, keeping its first ``arg``
    slots: the block is partial in that table, and for its writer (the next token lands
    in slot ``arg``, in place) it holds no complete prefix. Only an unkeyed block: a
    keyed one loses its key first (``unregister``)."""
    yield "requires", "in use", pre.ref(a) >= 1
    yield "requires", "no key (unregistered first)", L.not_(pre.cached(a))
    yield "requires", "slots kept: fewer than a block", L.and_(arg >= 0, arg < pre.block_size,
                                                             arg <= pre.filled(a))
    yield "ensures", "partial in the table", post.partial(a)
    yield "ensures", "only the kept slots count, no complete prefix", L.and_(
        post.filled(a) == arg, post.content(a) == -1)
    yield "ensures", "lists unchanged", L.and_(post.free_list_len() == pre.free_list_len(),
                                               post.evictable_len() == pre.evictable_len())
    yield from frame(L, pre, post, a, "partial", "filled", "content")


STEPS = {
    "take_free": take_free,
    "take_evictable": take_evictable,
    "hit": hit,
    "write": write,
    "register": register,
    "release": release,
    "fork": fork,
    "unregister": unregister,
    "truncate": truncate,
}
