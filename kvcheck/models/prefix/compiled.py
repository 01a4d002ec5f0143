"""The prefix invariants compiled from their text (``kvcheck.compile``), once, at import.

``invariants(s)`` is True iff every invariant of ``spec.prefix.PREFIX_INVARIANTS``
holds on the whole of ``s`` (a ``PrefixSnapshot``): one function, one pass over the
pool, every term read once, the hot ones inline (``INLINE``: each template means
exactly what the ``PrefixSnapshot`` method it stands for does; tested against the
methods). The oracle runs it after every step and, only when it is False, evaluates
the spec itself to name the invariant and the block. To read the generated code::

    python3 -c "from kvcheck.models.prefix import compiled as c; print(c.invariants_source())"
"""

from __future__ import annotations

from kvcheck.compile.codecache import define
from kvcheck.compile.emit import function_source, simple
from kvcheck.compile.terms import Term
from kvcheck.compile.tracer import TL, TDomain, TState, Untraceable, trace
from kvcheck.spec import prefix as P
from kvcheck.spec.prefix import PREFIX_INVARIANTS

SYMS = {"post": "post", "all_blocks": "range(post.num_blocks)", "N": "post.num_blocks",
        "B": "post.block_size"}


class PrefixTState(TState):
    """A symbolic prefix state: the prefix vocabulary (``spec.prefix``) as terms."""

    def on_free(self, b):
        return self._call("on_free", b)

    def on_evictable(self, b):
        return self._call("on_evictable", b)

    def cache_entries(self, b):
        return self._call("cache_entries", b)

    def cached(self, b):
        return self._call("cached", b)

    def partial(self, b):
        return self._call("partial", b)

    def filled(self, b):
        return self._call("filled", b)

    def content(self, b):
        return self._call("content", b)

    def meaning(self, b):
        return self._call("meaning", b)

    def content_ok(self, b):
        return self._call("content_ok", b)

    def free_list_len(self):
        return self._call("free_list_len")

    def evictable_len(self):
        return self._call("evictable_len")


def _binds(role: str, *fields: str) -> dict[str, str]:
    return {f"{role}_{f}": f"{role}.{f}" for f in fields}


# PrefixSnapshot's vocabulary, inline (``meaning`` stays a call, ``content_ok`` one but
# for a block under one key).
INLINE = {
    "ref": lambda r, b: (f"({r}_refs[{b}] if 0 <= {b} < {r}_num_blocks else 0)",
                         _binds(r, "refs", "num_blocks")) if simple(b) else None,
    "on_free": lambda r, b: (f"{r}_free_list.get({b}, 0)", _binds(r, "free_list")),
    "on_evictable": lambda r, b: (f"{r}_evictable.get({b}, 0)", _binds(r, "evictable")),
    "cache_entries": lambda r, b: (f"len({r}__keys.get({b}, ()))", _binds(r, "_keys")),
    "cached": lambda r, b: (f"({b} in {r}__keys)", _binds(r, "_keys")),
    "partial": lambda r, b: (f"({b} in {r}__partial)", _binds(r, "_partial")),
    "filled": lambda r, b: (f"{r}_filled_map.get({b}, 0)", _binds(r, "filled_map")),
    "content": lambda r, b: (f"{r}_content_map.get({b}, -1)", _binds(r, "content_map")),
    # content_ok: one key (the usual case) compared inline, else the method
    "content_ok": lambda r, b: (
        f"({r}_meanings.get({r}__keys[{b}][0], -1) == {r}_content_map.get({b}, -1) >= 0 "
        f"if len({r}__keys.get({b}, ())) == 1 else {r}_content_ok({b}))",
        _binds(r, "meanings", "_keys", "content_map", "content_ok")) if simple(b) else None,
    "free_list_len": lambda r: (f"{r}__free_len", _binds(r, "_free_len")),
    "evictable_len": lambda r: (f"{r}__evict_len", _binds(r, "_evict_len")),
}


def invariants_source(inline: bool = True) -> str:
    post = PrefixTState("post")

    def clauses():
        for inv in PREFIX_INVARIANTS:
            if inv.domain == "global":
                yield inv.predicate(TL, post)
                continue
            for b in TDomain(Term("sym", "all_blocks")):
                yield inv.predicate(TL, post, b)

    return function_source("prefix_invariants", ["post"], trace(clauses), SYMS,
                           {"post": INLINE} if inline else {})


def compile_invariants(inline: bool = True):
    """The compiled check (``inline=False``: every term a method call), or None where the
    tracer cannot represent the spec's text."""
    try:
        source = invariants_source(inline)
    except Untraceable:  # the spec says something the tracer cannot represent: evaluate it
        return None
    return define(source, "<kvcheck compiled prefix invariants>", "prefix_invariants")


invariants = compile_invariants()


# -- the fast mode's check: the per-block invariants on the blocks a step touched -------------
BLOCK_INVARIANTS = [inv for inv in PREFIX_INVARIANTS if inv.domain == "block"]
"""What the fast mode checks per step, on the touched blocks only (the global ones,
``pool_sizes``, in its full checks: sweeps, the end, and any step whose list sizes do
not add up, see ``kvcheck.models.prefix.incremental``)."""


def touched_invariants_source(inline: bool = True) -> str:
    post = PrefixTState("post")

    def clauses():
        for inv in BLOCK_INVARIANTS:
            for b in TDomain(Term("sym", "touched")):
                yield inv.predicate(TL, post, b)

    return function_source("prefix_touched_invariants", ["post", "touched"], trace(clauses),
                           {**SYMS, "touched": "touched"}, {"post": INLINE} if inline else {})


def compile_touched(inline: bool = True):
    """``f(post, blocks)``: every per-block prefix invariant holds on ``blocks`` (or None
    where the tracer cannot represent the spec's text)."""
    try:
        source = touched_invariants_source(inline)
    except Untraceable:
        return None
    return define(source, "<kvcheck compiled touched prefix invariants>",
                  "prefix_touched_invariants")


touched_invariants = compile_touched()


# -- allocate with cache hits: the fast mode's compiled step check ------------------------------
def _allocate_with_hits():
    """``{outcome: f(pre, post, op, blocks, live, hits)}`` for OK and OOB:
    ``spec.prefix.allocate_with_hits`` (``hits`` the blocks served from the cache) and the
    block manager's fast invariants, compiled from their text as the block manager's
    step checks are (``kvcheck.models.blocks.compiled.step_with``); None where the tracer
    cannot represent the spec's text."""
    from kvcheck.models.blocks import compiled as block_checks
    from kvcheck.models.blocks.ghost import After, Ghost
    from kvcheck.spec.contracts import OK, OOB

    try:
        return {o: block_checks.step_with(P.allocate_with_hits, "allocate", o, ("hits",), Ghost, After)
                for o in (OK, OOB)}
    except Untraceable:
        return None


allocate_with_hits = _allocate_with_hits()
