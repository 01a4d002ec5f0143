"""The prefix-caching manager as a symbolic transition system, for Z3.

Per-block abstraction: a state is a ``PrefixSymState`` (refcount, list
multiplicities, cache entries, partial, filled, content prefix id, key meaning
per block; the two reported list sizes). One step is a block step of
``kvcheck.spec.prefix_steps`` (take a free / an evictable block, hit, write a
token, register a key, release, fork) acting on one block, the rest framed.
Nothing here restates the spec: the model adds only the initial state, the
scope bounds, the fresh values a step picks, and one auxiliary lemma the
induction needs (``content_complete``: content is a complete prefix exactly
when every slot is written), proved alongside the invariants.

Scope (``PrefixModelScope``): ``num_blocks`` x ``block_size`` as in
``PrefixScope``; at most ``holders`` holders of one block (the number of
sequences: hit and fork are not taken beyond it, which keeps bit-vectors
exact); prefix ids are bounded integers in ``[0, prefixes)`` (they are only
ever compared, so any ``prefixes`` >= 2 * num_blocks loses nothing: a state
names at most one content and one meaning per block).
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from kvcheck.spec.invariants import Invariant
from kvcheck.spec.logic import Z3Logic
from kvcheck.spec.prefix import PREFIX_INVARIANTS, PrefixScope, PrefixSymState
from kvcheck.spec.prefix_steps import STEPS


@dataclass(frozen=True)
class PrefixModelScope:
    num_blocks: int
    block_size: int
    holders: int = 8
    prefixes: int | None = None  # default 2 * num_blocks

    @property
    def prefix(self) -> PrefixScope:
        return PrefixScope(self.num_blocks, self.block_size)

    @property
    def ids(self) -> int:
        return self.prefixes or 2 * self.num_blocks

    @property
    def width(self) -> int:
        return max(self.prefix.width, (4 * max(self.holders, self.ids) + 4).bit_length() + 3)

    def describe(self) -> str:
        return (f"{self.num_blocks} blocks x {self.block_size} slots, <= {self.holders} holders "
                f"per block, {self.ids} prefix ids")


def _scope(scope) -> PrefixModelScope:
    if isinstance(scope, PrefixModelScope):
        return scope
    return PrefixModelScope(scope.num_blocks, scope.block_size)


def content_complete(L, s, b):
    """(Model lemma) a block's content is a complete prefix exactly when every
    slot of it is written (-1 = not a complete prefix, ``spec.prefix``)."""
    return (s.content(b) >= 0) == (s.filled(b) == s.block_size)


CONTENT_COMPLETE = Invariant("content_complete (model lemma)", "block", content_complete)


def holders_bound(L, s, b, holders: int):
    """(Scope) at most ``holders`` holders of a block."""
    return s.ref(b) <= holders


class PrefixModel:
    def __init__(self, scope, steps=None, invariants=None, encoding: str = "bv"):
        if encoding not in ("int", "bv"):
            raise ValueError(f"encoding must be 'int' or 'bv', not {encoding!r}")
        self.scope = sc = _scope(scope)
        self.encoding = encoding
        self.L = Z3Logic(None if encoding == "int" else sc.width)
        self.steps = dict(steps or STEPS)
        self.invariants: list[Invariant] = list(invariants or PREFIX_INVARIANTS)
        self.lemmas: list[Invariant] = [CONTENT_COMPLETE]  # auxiliary, proved alongside
        self.bound = Invariant("scope_bound", "block",
                               lambda L, s, b: holders_bound(L, s, b, sc.holders))

    def state(self, name: str) -> PrefixSymState:
        return PrefixSymState(self.L, self.scope.prefix, name)

    def init(self, s: PrefixSymState):
        """Every block once on the plain free list: refcount 0, no key, nothing
        written; the lists' reported sizes N and 0."""
        L = self.L
        return L.and_(*[L.and_(s.ref(b) == 0, s.on_free(b) == 1, s.on_evictable(b) == 0,
                               s.cache_entries(b) == 0, L.not_(s.partial(b)), s.filled(b) == 0,
                               s.content(b) == -1, s.meaning(b) == -1) for b in s.blocks()],
                      s.free_list_len() == self.scope.num_blocks, s.evictable_len() == 0)

    def well_formed(self, s: PrefixSymState, blocks=None):
        """The encoding's domain and the scope bound (on ``blocks``, default all)."""
        L = self.L
        blocks = s.blocks() if blocks is None else blocks
        ids = self.scope.ids
        return L.and_(s.domain(), *[L.and_(self.bound.holds_for(L, s, b), s.content(b) < ids,
                                           s.meaning(b) < ids) for b in blocks])

    def step(self, kind: str, s: PrefixSymState, s2: PrefixSymState, block: int, tag: str):
        """The block step ``kind`` on ``block``: its rule, plus the scope's limits."""
        L, sc = self.L, self.scope
        arg = L.var(f"{tag}.{kind}.arg")
        parts = [f for _, _, f in self.steps[kind](L, s, s2, block, arg)]
        parts += [arg >= 0, arg < sc.ids]
        if kind in ("hit", "fork"):
            parts.append(s.ref(block) < sc.holders)
        return L.and_(*parts), arg


def all_steps(model: PrefixModel, s, s2, tag: str):
    """The step relation s -> s2 (any rule on any block), with a selector per disjunct."""
    sels, bodies = [], []
    for kind in model.steps:
        for b in s.blocks():
            sel = z3.Bool(f"{tag}.sel.{kind}.{b}")
            body, _ = model.step(kind, s, s2, b, tag=f"{tag}.{b}")
            sels.append((sel, kind, b))
            bodies.append(z3.Implies(sel, body))
    return z3.And(*bodies, z3.Or([x[0] for x in sels])), sels
