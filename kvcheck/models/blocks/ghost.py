"""The oracle's incremental view of state, for checking in O(touched).

``Ghost`` is the last *verified* state: copies of every table, the refcounts,
derived counters (holders, refcount-0 blocks, table identities). ``After``
is the state after one operation as the allocator shows it, observed only
for what the operation touched (its sequences and their blocks, before and
after); everything else reads through to the ghost.

Both speak the state vocabulary of ``kvcheck.spec.state``. In this fast mode
free-list *membership* is not read per operation: ``free_count(b)`` is
derived from the refcount (1 iff refcount 0), ``free_entries()`` likewise
(the blocks with refcount 0), ``num_free()`` is the allocator's own count, and
the free list's contents are audited in full by the oracle's periodic sweep.
"""

from __future__ import annotations

from collections import Counter

from kvcheck.spec.state import TableTerms
from kvcheck.targets.observe import (
    read_identity,
    read_len,
    read_num_free,
    read_ref,
    read_refs_of,
    read_table,
)


class Ghost(TableTerms):
    """Verified state, updated by ``commit`` after each checked operation."""

    def __init__(self, num_blocks: int, block_size: int, refs: list[int], num_free: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refs = refs
        self.tables: dict[int, tuple[int, ...]] = {}
        self.lengths: dict[int, int] = {}
        self.reservations: dict[int, int] = {}  # seq -> slots reserved beyond its tokens (if any)
        self.identities: dict[int, object] = {}
        self.impl_lengths: dict[int, int | None] = {}
        self.holders_count: dict[int, int] = {}  # block -> table entries naming it
        self.ident_count: dict[object, int] = {}  # table identity -> live sequences with it
        self.zero = sum(1 for r in refs if r == 0)
        self.free_len = num_free
        self._occ: dict[int, Counter] = {}

    @classmethod
    def from_snapshot(cls, snap) -> Ghost:
        g = cls(snap.num_blocks, snap.block_size, list(snap.refs), snap.num_free())
        for q, t in snap.tables.items():
            g.tables[q] = t
            g.lengths[q] = snap.lengths[q]
            if snap.reserved(q):
                g.reservations[q] = snap.reserved(q)
            g.identities[q] = snap.identities.get(q)
            g.impl_lengths[q] = snap.impl_lengths.get(q)
        g.holders_count = dict(Counter(b for t in g.tables.values() for b in t))
        g.ident_count = dict(Counter(v for v in g.identities.values() if v is not None))
        return g

    # -- vocabulary ------------------------------------------------------------
    def seqs(self):
        return list(self.tables)

    def ref(self, b):
        return self.refs[b] if 0 <= b < self.num_blocks else 0

    def free_count(self, b):
        return 1 if 0 <= b < self.num_blocks and self.refs[b] == 0 else 0

    def free_entries(self):
        return self.zero

    def num_free(self):
        return self.free_len

    def zero_refs(self):
        return self.zero

    def live(self, q):
        return q in self.tables

    def length(self, q):
        return self.lengths.get(q, 0)

    def reserved(self, q):
        return self.reservations.get(q, 0)

    def impl_length(self, q):
        n = self.impl_lengths.get(q)
        return self.lengths.get(q, 0) if n is None else n

    def table_tuple(self, q):
        return self.tables.get(q, ())

    def holders(self, b):
        return self.holders_count.get(b, 0)

    def sharers(self, q):
        ident = self.identities.get(q)
        return 1 if ident is None else self.ident_count.get(ident, 0)

    # -- update ------------------------------------------------------------------
    def commit(self, after: After) -> None:
        """Adopt ``after`` (which passed every check) as the verified state."""
        if self._occ:
            self._occ.clear()
        tables, lengths, impl_lengths = self.tables, self.lengths, self.impl_lengths
        identities, ic = self.identities, self.ident_count
        for q, table in after.tables.items():
            old = identities.pop(q, None)
            if old is not None:
                k = ic[old] - 1
                if k:
                    ic[old] = k
                else:
                    del ic[old]
            if table is None:
                tables.pop(q, None)
                lengths.pop(q, None)
                impl_lengths.pop(q, None)
                self.reservations.pop(q, None)
            else:
                tables[q] = table
                lengths[q] = after.lengths[q]
                r = after.reservations.get(q, 0)
                if r:
                    self.reservations[q] = r
                else:
                    self.reservations.pop(q, None)
                impl_lengths[q] = after._impl_lens[q]
                ident = identities[q] = after._idents[q]
                if ident is not None:
                    ic[ident] = ic.get(ident, 0) + 1
        hc = self.holders_count
        for b, d in after.holder_delta.items():
            hc[b] = hc.get(b, 0) + d
        self.zero = after.zero_refs()
        refs = self.refs
        for b, r in after.refs.items():  # keys are pool blocks (After.ref checks)
            refs[b] = r
        self.free_len = after.num_free()


_NO = object()  # "not touched by this operation"


def _count_change(old: tuple, new: tuple, delta: dict[int, int]) -> None:
    """Add to ``delta`` each block's change in entries from ``old`` to ``new``."""
    k = len(old)
    if len(new) >= k and new[:k] == old:  # grew at the end (append, allocate)
        old, new = (), new[k:]
    elif len(new) < k and old[: len(new)] == new:  # shrank at the end (free)
        old, new = old[len(new):], ()
    for b in new:
        delta[b] = delta.get(b, 0) + 1
    for b in old:
        delta[b] = delta.get(b, 0) - 1


class After(TableTerms):
    """The allocator's state after one operation, observed where it was touched.

    ``seqs`` are the sequences the operation names; ``lengths`` their token
    counts as the oracle computes them (absent = no longer live). Everything
    is observed once, up front (``__init__``), so evaluating many clauses
    costs no extra calls into the target; only blocks outside ``blocks`` are
    read on demand.

    The compiled checks (``kvcheck.models.blocks.inline``) read ``tables``,
    ``lengths``, ``refs``, ``impl_lengths`` and ``sharer_counts`` directly.
    """

    def __init__(self, target, ghost: Ghost, seqs: tuple, lengths: dict[int, int], extra=(),
                 seen: tuple | None = None):
        """Observe ``seqs`` (their tables, own lengths, table identities) and the
        refcount of every pool block their tables name before or after, plus the
        blocks in ``extra`` (what the operation returned): ``self.blocks``.

        ``seen``: what a fused step (``kvcheck.models.blocks.fused``) has already read,
        ``({seq: (table, own length, identity)}, refcounts, free count or None)``: taken
        as observed, not read again."""
        self.target = target
        self.ghost = ghost
        self.num_blocks = n = ghost.num_blocks
        self.block_size = ghost.block_size
        self.touched = seqs
        self.lengths = lengths
        # touched seq -> slots reserved after the operation: as before, until the oracle
        # sets what the operation changed (``Oracle._reserve``)
        gr = ghost.reservations
        self.reservations: dict[int, int] = {q: gr[q] for q in seqs if q in gr} if gr else {}
        self._num_free: int | None = None
        self._zero: int | None = None
        self._occ: dict[int, Counter] = {}
        gt, gi = ghost.tables, ghost.identities
        tables: dict[int, tuple | None] = {}
        impl_lens: dict[int, int | None] = {}
        idents: dict[int, object] = {}
        resolved: dict[int, int] = {}
        delta: dict[int, int] = {}
        blocks = set(extra)
        blocks.discard(None)
        for q in seqs:
            old = gt.get(q)
            new = tables[q] = read_table(target, q, old) if seen is None else seen[0][q][0]
            if old:
                blocks.update(old)
            if new is None:
                impl_lens[q] = idents[q] = None
                resolved[q] = lengths.get(q, 0)
                if old:
                    _count_change(old, (), delta)
                continue
            if new is not old:  # (read_table hands back the verified tuple when equal)
                blocks.update(new)
                _count_change(old or (), new, delta)
            if seen is None:
                m = impl_lens[q] = read_len(target, q)
                idents[q] = read_identity(target, q, gi.get(q))
            else:
                _, m, idents[q] = seen[0][q]
                impl_lens[q] = m
            resolved[q] = lengths.get(q, 0) if m is None else m
        self.tables = tables
        self._impl_lens = impl_lens
        self._idents = idents
        self.impl_lengths = resolved
        self.holder_delta = {b: d for b, d in delta.items() if d} if delta else {}
        ic, counts = ghost.ident_count, {}
        if len(seqs) == 1:  # (the common case: the loop below, for one sequence)
            q = seqs[0]
            mine = idents[q]
            counts[q] = 1 if mine is None else ic.get(mine, 0) + (mine == mine) - (gi.get(q) == mine)
        else:
            for q in seqs:
                mine = idents[q]
                if mine is None:
                    counts[q] = 1
                    continue
                k = ic.get(mine, 0)
                for r in seqs:
                    k += (idents[r] == mine) - (gi.get(r) == mine)
                counts[q] = k
        self.sharer_counts = counts
        if blocks and (min(blocks) < 0 or max(blocks) >= n):
            blocks = {b for b in blocks if 0 <= b < n}
        self.blocks = blocks
        if seen is None:
            self.refs = read_refs_of(target, blocks)
        else:
            self.refs = dict(seen[1])  # (its blocks, and any it read on demand)
            self._num_free = seen[2]

    # -- vocabulary ------------------------------------------------------------
    def seqs(self):
        live = [q for q in self.ghost.tables if q not in self.tables]
        return live + [q for q, t in self.tables.items() if t is not None]

    def ref(self, b):
        r = self.refs.get(b)
        if r is None:
            if not (type(b) is int and 0 <= b < self.num_blocks):
                return 0
            r = self.refs[b] = read_ref(self.target, b)
        return r

    def free_count(self, b):
        return 1 if 0 <= b < self.num_blocks and self.ref(b) == 0 else 0

    def free_entries(self):
        return self.zero_refs()

    def num_free(self):
        if self._num_free is None:
            self._num_free = read_num_free(self.target)
        return self._num_free

    def zero_refs(self):
        z = self._zero
        if z is None:
            g = self.ghost
            z, grefs = g.zero, g.refs
            for b, r in self.refs.items():
                z += (r == 0) - (grefs[b] == 0)
            self._zero = z
        return z

    def live(self, q):
        t = self.tables.get(q, _NO)
        if t is _NO:
            return q in self.ghost.tables
        return t is not None

    def length(self, q):
        if q in self.tables:
            return self.lengths.get(q, 0)
        return self.ghost.lengths.get(q, 0)

    def reserved(self, q):
        if q in self.tables:
            return self.reservations.get(q, 0)
        return self.ghost.reservations.get(q, 0)

    def impl_len(self, q):
        """The allocator's own length of touched ``q`` (None if it keeps none)."""
        return self._impl_lens.get(q)

    def impl_length(self, q):
        if q in self.tables:
            return self.impl_lengths[q]
        return self.ghost.impl_length(q)

    def table_tuple(self, q):
        t = self.tables.get(q, _NO)
        if t is _NO:
            return self.ghost.tables.get(q, ())
        return t or ()

    def holders(self, b):
        return self.ghost.holders_count.get(b, 0) + self.holder_delta.get(b, 0)

    def ident(self, q):
        """The identity of touched ``q``'s table (None if unobservable or gone)."""
        return self._idents.get(q)

    def sharers(self, q):
        if q not in self.tables:
            return self.ghost.sharers(q)
        return self.sharer_counts[q]

