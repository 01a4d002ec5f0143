"""The state vocabulary the spec is written in, and its concrete snapshot.

Abstract state of a paged block manager (pool of ``num_blocks`` blocks of
``block_size`` token slots):

    ref(b)            the allocator's refcount of block b
    free_count(b)     how many times b is on the free list
    free_entries()    length of the free list as observed (every entry, pool id or not)
    num_free()        the allocator's own count of free blocks (what it reports: a
                      ``Target``'s ``num_free()``; a seed-shaped one's ``len(free)``)
    live(q)           sequence q exists
    length(q)         tokens sequence q holds (the oracle's count, not the allocator's)
    reserved(q)       slots q's table holds for it beyond its tokens: lookahead slots a
                      multi-token reservation asked for, or slots a rollback kept (the
                      oracle's count, like length; 0 unless an operation reserved some)
    impl_length(q)    the allocator's own count for q (== length(q) if it keeps none)
    nblocks(q)        entries in q's block table
    table(q, i)       block id at position i of q's table, or ``NULL`` (the null
                      placeholder of a position wholly behind a sliding attention
                      window: vLLM v1's null block; not a pool block, it holds no
                      reference, is never on the free list and is never written)

and terms *defined* from those (each state class computes them its own way,
but always with exactly this meaning):

    holders(b)        number of table entries, over live sequences, naming b
    occurrences(q, b) number of entries of q's table naming b
    zero_refs()       number of blocks whose refcount is 0
    sharers(q)        number of live sequences whose table is q's table *object*
    same_table(q, other, r)  q's table here equals r's table in state ``other``

Every state class (this ``Snapshot``, the oracle's incremental views, the
symbolic ``SymState``) provides these methods; ``invariants.py`` and
``contracts.py`` use nothing else. ``Dropped`` is a state derived from another
concrete one: what ``drop_behind_window`` leaves, for an engine call the spec
reads as that drop and another operation (``contracts.cyclic_pre``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

NULL = -1  # the null placeholder a table entry may be (no pool block has this id)
# The terms whose value is a block id, ``NULL`` where there is none (a null entry, a position
# past the table's end, the last block of an empty table): a report writes that ``null``.
BLOCK_VALUED = frozenset({"table", "tail"})
# The terms taking a block id, by the positions of their block arguments (a report writes a
# ``NULL`` there, read from a table, ``null``).
BLOCK_ARGS = {"ref": (0,), "free_count": (0,), "holders": (0,), "occurrences": (1,)}


class TableTerms:
    """The vocabulary every concrete state derives from ``table_tuple(q)`` (q's
    table as a tuple, ``()`` if q has none) and an ``_occ`` cache dict."""

    def table_tuple(self, q: int) -> tuple:
        raise NotImplementedError

    def positions(self, q: int) -> range:
        return range(len(self.table_tuple(q)))

    def nblocks(self, q: int) -> int:
        return len(self.table_tuple(q))

    def table(self, q: int, i: int) -> int:
        t = self.table_tuple(q)
        return t[i] if 0 <= i < len(t) else -1

    def tail(self, q: int) -> int:
        t = self.table_tuple(q)
        return t[-1] if t else -1

    def occurrences(self, q: int, b: int) -> int:
        occ = self._occ.get(q)
        if occ is None:
            occ = self._occ[q] = Counter(self.table_tuple(q))
        return occ.get(b, 0)

    def same_table(self, q: int, other, r: int, upto: int | None = None) -> bool:
        mine, theirs = self.table_tuple(q), other.table_tuple(r)
        return mine == theirs if upto is None else mine[:upto] == theirs[:upto]


class Snapshot(TableTerms):
    """A complete, immutable concrete state (copied out of an allocator)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        tables: Mapping[int, Sequence[int]],
        lengths: Mapping[int, int],
        refs: Sequence[int],
        free: Iterable[int],
        impl_lengths: Mapping[int, int | None] | None = None,
        identities: Mapping[int, object] | None = None,
        num_free: int | None = None,
        reserved: Mapping[int, int] | None = None,
    ):
        """``num_free``: the allocator's own count of free blocks (None: the free
        list's length, for a state that has no separate count)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.tables = {q: tuple(t) for q, t in tables.items()}
        self.lengths = dict(lengths)
        self.reservations = {q: r for q, r in (reserved or {}).items() if r}
        self.refs = list(refs)
        self.free = Counter(free)
        self._free_entries = sum(self.free.values())
        self._num_free = self._free_entries if num_free is None else num_free
        self.impl_lengths = dict(impl_lengths or {})
        self.identities = dict(identities or {})
        self._holders = Counter(b for t in self.tables.values() for b in t)
        self._ident_count = Counter(v for v in self.identities.values() if v is not None)
        self._zero = sum(1 for r in self.refs if r == 0)
        self._occ: dict[int, Counter] = {}

    # -- domains ---------------------------------------------------------------
    def blocks(self) -> range:
        return range(self.num_blocks)

    def seqs(self) -> list[int]:
        return list(self.tables)

    # -- base vocabulary -------------------------------------------------------
    def ref(self, b: int) -> int:
        return self.refs[b] if 0 <= b < self.num_blocks else 0

    def free_count(self, b: int) -> int:
        return self.free.get(b, 0)

    def free_entries(self) -> int:
        return self._free_entries

    def num_free(self) -> int:
        return self._num_free

    def live(self, q: int) -> bool:
        return q in self.tables

    def length(self, q: int) -> int:
        return self.lengths.get(q, 0)

    def impl_length(self, q: int) -> int:
        n = self.impl_lengths.get(q)
        return self.length(q) if n is None else n

    def reserved(self, q: int) -> int:
        return self.reservations.get(q, 0)

    # -- defined terms ---------------------------------------------------------
    def holders(self, b: int) -> int:
        return self._holders.get(b, 0)

    def zero_refs(self) -> int:
        return self._zero

    def sharers(self, q: int) -> int:
        ident = self.identities.get(q)
        return 1 if ident is None else self._ident_count[ident]

    def table_tuple(self, q: int) -> tuple:
        return self.tables.get(q, ())


class Dropped(TableTerms):
    """The state ``drop_behind_window`` leaves, derived from the concrete state ``pre``
    (any class with the vocabulary above): ``seq``'s first ``skip`` entries are null,
    each pool block they named loses one reference per entry, joining the free list
    when that was its last; everything else reads as in ``pre``. The state an engine
    call passes through when the spec reads it as that drop followed by another
    operation (a cyclic window: ``contracts.cyclic_pre``); never observed, so it is
    computed lazily, reading ``pre`` only through its vocabulary (evidence recorders
    see those reads). ``tests/core/test_cyclic.py`` checks it satisfies the drop's
    contract."""

    def __init__(self, pre, seq: int, skip: int):
        self.pre, self.seq, self.skip = pre, seq, skip
        self.num_blocks, self.block_size = pre.num_blocks, pre.block_size
        old = pre.table_tuple(seq)
        self._table = tuple(NULL if i < skip else b for i, b in enumerate(old))
        self._dropped = Counter(b for b in old[:skip] if b != NULL)
        self._freed: int | None = None
        self._occ: dict[int, Counter] = {}

    def _released(self) -> int:
        """How many blocks the drop returned to the free list."""
        if self._freed is None:
            self._freed = sum(1 for b in self._dropped if self.ref(b) == 0)
        return self._freed

    def blocks(self):
        return self.pre.blocks()

    def seqs(self):
        return self.pre.seqs()

    def ref(self, b: int) -> int:
        return self.pre.ref(b) - self._dropped.get(b, 0)

    def free_count(self, b: int) -> int:
        back = 1 if self._dropped.get(b) and self.ref(b) == 0 else 0
        return self.pre.free_count(b) + back

    def free_entries(self) -> int:
        return self.pre.free_entries() + self._released()

    def num_free(self) -> int:
        return self.pre.num_free() + self._released()

    def zero_refs(self) -> int:
        return self.pre.zero_refs() + self._released()

    def live(self, q: int) -> bool:
        return self.pre.live(q)

    def length(self, q: int) -> int:
        return self.pre.length(q)

    def reserved(self, q: int) -> int:
        return self.pre.reserved(q)

    def impl_length(self, q: int) -> int:
        return self.pre.impl_length(q)

    def holders(self, b: int) -> int:
        return self.pre.holders(b) - self._dropped.get(b, 0)

    def sharers(self, q: int) -> int:
        return self.pre.sharers(q)

    def table_tuple(self, q: int) -> tuple:
        return self._table if q == self.seq else self.pre.table_tuple(q)
