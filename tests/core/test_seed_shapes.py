"""Seed-shaped allocators written in other legal shapes: immutable tuple tables,
a sparse ``ref`` mapping. Legal shapes pass; observation failures name what the
user wrote (``ref[3]``, ``tables[2]``, ``free``), not a ``Target`` method."""

from __future__ import annotations

import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.target import SeedAdapter
from kvcheck.verify import verify

from corpus.buggy import AliasingFork


# -- 1. immutable tables never alias ---------------------------------------------------
class TupleTables(BlockManager):
    """Legal: every table is a tuple; fork builds an equal but separate tuple."""

    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        self.tables[seq] = tuple(self.tables[seq])

    def append_slot(self, seq):
        self.tables[seq] = list(self.tables[seq])
        try:
            return super().append_slot(seq)
        finally:
            self.tables[seq] = tuple(self.tables[seq])

    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child] = tuple(list(self.tables[child]))
        assert self.tables[child] is not self.tables[parent]


class SharedTupleTables(TupleTables):
    """Legal too: fork hands the child the parent's very tuple (it cannot be rewritten)."""

    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child] = self.tables[parent]


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("cls", [TupleTables, SharedTupleTables])
def test_tuple_tables_are_not_aliases(cls, mode):
    r = verify(cls, 16, 2, 3000, 0, mode=mode, do_shrink=False)
    assert r.ok, r.violation


class HandleTarget(SeedAdapter):
    """A custom Target whose table identity is a hashable handle (a tuple), by design:
    equal handles mean one shared table."""

    def __init__(self, impl, nb, bs):
        super().__init__(impl, nb, bs)
        self._handles: dict[int, tuple] = {}
        self._objects: list = []  # keeps every table alive, so ids stay unique

    def table_identity(self, seq):
        table = self.impl.tables[seq]
        if id(table) not in self._handles:
            self._objects.append(table)
            self._handles[id(table)] = ("table", len(self._handles))
        return self._handles[id(table)]


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_a_hashable_handle_still_names_a_shared_table(mode):
    r = verify(lambda nb, bs: HandleTarget(AliasingFork(nb, bs), nb, bs), 16, 2, 3000, 0,
               mode=mode, do_shrink=False)
    assert not r.ok
    assert r.violation.name in ("fork: child's table is its own object", "no_aliasing")
    ok = verify(lambda nb, bs: HandleTarget(BlockManager(nb, bs), nb, bs), 16, 2, 3000, 0,
                mode=mode, do_shrink=False)
    assert ok.ok, ok.violation
