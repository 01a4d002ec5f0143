"""State invariants of a paged block manager, written once.

Each invariant is a predicate over one element of a domain, written in the
logic layer (``kvcheck.spec.logic``) against the state vocabulary
(``kvcheck.spec.state``):

    domain "block":  holds for every block id b
    domain "seq":    holds for every live sequence q
    domain "global": holds once for the whole state

``needs`` names observations beyond refcounts and tables: ``free_list``
means the invariant reads the free list's *membership*, which the oracle's
fast mode audits periodically rather than after every operation.

The step invariants (isolation, exception safety) relate two states and live
in ``kvcheck.spec.contracts``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .state import NULL


@dataclass(frozen=True)
class Invariant:
    name: str
    domain: str  # "block" | "seq" | "global"
    predicate: Callable[..., Any]
    needs: frozenset[str] = frozenset()

    @property
    def doc(self) -> str:
        return " ".join((self.predicate.__doc__ or "").split())

    def holds_for(self, L, s, x=None):
        """The formula for element ``x`` (omit for global invariants)."""
        return self.predicate(L, s) if self.domain == "global" else self.predicate(L, s, x)

    def formula(self, L, s):
        """The invariant over the whole of ``s``'s domain."""
        if self.domain == "global":
            return self.predicate(L, s)
        elements = s.blocks() if self.domain == "block" else s.seqs()
        if self.domain == "seq":
            return L.all_(L.implies(s.live(q), self.predicate(L, s, q)) for q in elements)
        return L.all_(self.predicate(L, s, b) for b in elements)


INVARIANTS: list[Invariant] = []


def invariant(domain: str, needs: tuple[str, ...] = ()):
    def register(fn):
        INVARIANTS.append(Invariant(fn.__name__, domain, fn, frozenset(needs)))
        return fn

    return register


@invariant("seq")
def valid_block_ids(L, s, q):
    """Every entry of a live sequence's block table names a block of the pool
    (0 <= id < num_blocks) or is the null placeholder NULL (a position wholly
    behind a sliding window, whose block was released)."""
    return L.all_(
        L.implies(i < s.nblocks(q), L.or_(
            s.table(q, i) == NULL,
            L.and_(0 <= s.table(q, i), s.table(q, i) < s.num_blocks)))
        for i in s.positions(q)
    )


@invariant("seq")
def null_entries(L, s, q):
    """Null entries lie wholly behind the attention window: they form a prefix
    of the table, and every one sits before the block holding the sequence's
    last token (so a null position is never written, and every slot a token
    or a reservation still needs is a pool block)."""
    last = L.ceil_div(s.length(q), s.block_size) - 1  # the block holding the last token
    return L.all_(
        L.implies(L.and_(i < s.nblocks(q), s.table(q, i) == NULL),
                  L.and_(i < last, L.or_(i == 0, s.table(q, i - 1) == NULL)))
        for i in s.positions(q)
    )


@invariant("block")
def refcount_conservation(L, s, b):
    """Every block's refcount equals the number of block-table entries, over
    all live sequences, that reference it (a null entry names no block and
    holds no reference)."""
    return s.ref(b) == s.holders(b)


@invariant("block", needs=("free_list",))
def free_list(L, s, b):
    """A block is on the free list exactly when its refcount is 0, and at
    most once."""
    return L.and_(0 <= s.free_count(b), s.free_count(b) <= 1,
                  (s.free_count(b) == 1) == (s.ref(b) == 0))


@invariant("global", needs=("free_list",))
def free_list_in_pool(L, s):
    """The free list holds nothing but pool blocks (never the null
    placeholder): its length is the sum of the pool blocks' multiplicities on
    it."""
    return L.count(s.free_count(b) >= 1 for b in s.blocks()) == s.free_entries()


@invariant("global", needs=("free_list",))
def num_free_agrees(L, s):
    """The allocator's own count of free blocks (what it reports as num_free)
    is the length of its free list."""
    return s.num_free() == s.free_entries()


@invariant("global")
def free_list_size(L, s):
    """The allocator's count of free blocks is the number of blocks with
    refcount 0 (a consequence of free_list, free_list_in_pool and
    num_free_agrees that needs only the count, so the oracle checks it after
    every operation)."""
    return s.num_free() == s.zero_refs()


@invariant("seq")
def table_length(L, s, q):
    """A sequence of len tokens with res slots reserved beyond them holds
    exactly ceil((len + res) / block_size) blocks (with nothing reserved, the
    seed's ceil(len / block_size)): a block is taken only for a slot that
    crosses a block boundary, whether it holds a token or is reserved for one.
    A null entry keeps its position (entry i covers tokens i*B..i*B+B-1), so
    dropping blocks behind a window leaves the length as it was."""
    return L.and_(s.length(q) >= 1, s.reserved(q) >= 0,
                  s.nblocks(q) == L.ceil_div(s.length(q) + s.reserved(q), s.block_size))


@invariant("seq")
def waste_bound(L, s, q):
    """Paging wastes at most block_size - 1 token slots per sequence: every
    block but the last is full of tokens or reserved slots, so the unused
    slots of a table all sit in its one partial tail (per branch under forks,
    since each fork owns its own tail). Null entries hold no pool slots and
    waste none: the pool blocks of a table hold its window, reservations and at
    most block_size - 1 unused slots."""
    return s.nblocks(q) * s.block_size - s.length(q) - s.reserved(q) <= s.block_size - 1


@invariant("seq")
def length_agrees(L, s, q):
    """The allocator's own token count for a sequence (if it keeps one)
    equals the number of tokens the sequence was given."""
    return s.impl_length(q) == s.length(q)


@invariant("seq")
def no_aliasing(L, s, q):
    """Two live sequences never share one block-table object (a shared list
    would let one sequence's append rewrite the other's table)."""
    return s.sharers(q) == 1


def by_name(name: str) -> Invariant:
    for inv in INVARIANTS:
        if inv.name == name:
            return inv
    raise KeyError(name)
