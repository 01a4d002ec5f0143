"""The symbolic state: the same vocabulary as ``Snapshot``, over Z3 variables.

A scope fixes the pool (``num_blocks`` x ``block_size``), the number of
sequence slots and the most tokens a sequence may hold; a table then has at
most ``ceil(max_tokens / block_size)`` entries. Sequences are slots
``0..seqs-1``; a slot is in use when ``live(q)``.

Defined terms (``holders``, ``occurrences``, ``zero_refs``) are given by their
definitions from ``kvcheck.spec.state``, unrolled; ``free_entries`` is the sum
of the pool blocks' multiplicities on the free list (an abstract free list
holds nothing else). Implementation observations: the abstract model gives
every slot its own table object, keeps one token count and no free count
apart from its free list, so ``sharers(q)`` is 1, ``impl_length(q)`` is
``length(q)`` and ``num_free()`` is ``free_entries()`` (the very same term)
by construction — unless ``observed=True``, which adds variables for all
three (used to compare with concrete states of implementations, which may
alias or miscount).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .logic import Z3Logic
from .state import NULL


@dataclass(frozen=True)
class SymScope:
    num_blocks: int
    block_size: int
    seqs: int
    max_tokens: int

    @property
    def table_slots(self) -> int:
        return -(-self.max_tokens // self.block_size)

    @property
    def width(self) -> int:
        biggest = max(self.num_blocks, self.max_tokens, self.seqs * self.table_slots, 4) + 1
        return (2 * biggest).bit_length() + 2

    def describe(self) -> str:
        return (f"{self.seqs} seqs x {self.num_blocks} blocks x {self.block_size} slots, "
                f"<= {self.max_tokens} tokens/seq")


class SymState:
    def __init__(self, L: Z3Logic, scope: SymScope, name: str, observed: bool = False):
        self.L = L
        self.scope = scope
        self.num_blocks = scope.num_blocks
        self.block_size = scope.block_size
        z3 = L.z3
        N, S, T = scope.num_blocks, scope.seqs, scope.table_slots
        self._ref = [L.var(f"{name}.ref{b}") for b in range(N)]
        self._free = [L.var(f"{name}.free{b}") for b in range(N)]
        self._live = [z3.Bool(f"{name}.live{q}") for q in range(S)]
        self._len = [L.var(f"{name}.len{q}") for q in range(S)]
        self._res = [L.var(f"{name}.res{q}") for q in range(S)]
        self._nb = [L.var(f"{name}.nb{q}") for q in range(S)]
        self._tab = [[L.var(f"{name}.t{q}_{i}") for i in range(T)] for q in range(S)]
        self._ident = [L.var(f"{name}.id{q}") for q in range(S)] if observed else None
        self._ilen = [L.var(f"{name}.ilen{q}") for q in range(S)] if observed else None
        self._nfree = L.var(f"{name}.nfree") if observed else None

    # -- domains -----------------------------------------------------------------
    def blocks(self):
        return range(self.scope.num_blocks)

    def seqs(self):
        return range(self.scope.seqs)

    def positions(self, q):
        return range(self.scope.table_slots)

    # -- base vocabulary -----------------------------------------------------------
    def ref(self, b):
        return self.L.select(self._ref, b)

    def free_count(self, b):
        return self.L.select(self._free, b)

    def live(self, q):
        return self._live[q]

    def length(self, q):
        return self._len[q]

    def impl_length(self, q):
        return self._len[q] if self._ilen is None else self._ilen[q]

    def reserved(self, q):
        return self._res[q]

    def nblocks(self, q):
        return self._nb[q]

    def table(self, q, i):
        return self.L.select(self._tab[q], i)

    def tail(self, q):
        return self.table(q, self._nb[q] - 1)

    # -- defined terms ---------------------------------------------------------------
    def free_entries(self):
        return self.L.z3.Sum(self._free)

    def num_free(self):
        return self.free_entries() if self._nfree is None else self._nfree

    def zero_refs(self):
        return self.L.count(r == 0 for r in self._ref)

    def _entry(self, q, i, b):
        """Entry i of live sequence q's table names block b."""
        L = self.L
        return L.and_(i < self._nb[q], self._tab[q][i] == b)

    def holders(self, b):
        L = self.L
        return L.count(L.and_(self._live[q], self._entry(q, i, b))
                       for q in self.seqs() for i in self.positions(q))

    def occurrences(self, q, b):
        return self.L.count(self._entry(q, i, b) for i in self.positions(q))

    def sharers(self, q):
        if self._ident is None:
            return 1
        L = self.L
        return L.count(L.and_(self._live[r], self._ident[r] == self._ident[q]) for r in self.seqs())

    def same_table(self, q, other, r, upto=None):
        L = self.L
        agree = [L.implies(i < (self._nb[q] if upto is None else upto),
                           self._tab[q][i] == other._tab[r][i]) for i in self.positions(q)]
        if upto is None:
            agree.append(self._nb[q] == other._nb[r])
        return L.all_(agree)

    def dropped(self, q: int, skip):
        """The state ``drop_behind_window`` leaves (``spec.state.Dropped``'s meaning, over
        the same variables): slot ``q``'s first ``skip`` entries (a term) null, each block
        they named one reference less per entry, on the free list when that was its last."""
        L = self.L
        out = copy.copy(self)
        tab, nb = self._tab[q], self._nb[q]
        out._tab = list(self._tab)
        out._tab[q] = [L.ite(i < skip, NULL, tab[i]) for i in range(len(tab))]
        refs, frees, back = [], [], []
        for b in range(self.scope.num_blocks):
            gone = L.count(L.and_(i < skip, i < nb, tab[i] == b) for i in range(len(tab)))
            ref = self._ref[b] - gone
            freed = L.and_(gone > 0, ref == 0)
            refs.append(ref)
            frees.append(self._free[b] + L.ite(freed, 1, 0))
            back.append(freed)
        out._ref, out._free = refs, frees
        if self._nfree is not None:
            out._nfree = self._nfree + L.count(back)
        return out

    # -- binding to a concrete state ---------------------------------------------------
    def equals_snapshot(self, snap, slot_of: dict) -> list:
        """Constraints making this state equal ``snap`` (sequence q -> slot ``slot_of[q]``).

        Table identities are left to the caller (they are objects, not numbers).
        """
        L = self.L
        out = []
        for b in self.blocks():
            out += [self._ref[b] == snap.ref(b), self._free[b] == snap.free_count(b)]
        for q, slot in slot_of.items():
            live = snap.live(q)
            out.append(self._live[slot] == live)
            if not live:
                continue
            t = [snap.table(q, i) for i in snap.positions(q)]
            out += [self._len[slot] == snap.length(q), self._nb[slot] == len(t),
                    self._res[slot] == snap.reserved(q)]
            out += [self._tab[slot][i] == b for i, b in enumerate(t)]
            if self._ilen is not None:
                out.append(self._ilen[slot] == snap.impl_length(q))
        if self._nfree is not None:
            out.append(self._nfree == snap.num_free())
        used = set(slot_of.values())
        out += [L.not_(self._live[s]) for s in self.seqs() if s not in used]
        return out
