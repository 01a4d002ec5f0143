"""Seed-shaped allocators written in other legal shapes: immutable tuple tables,
a sparse ``ref`` mapping. Legal shapes pass; observation failures name what the
user wrote (``ref[3]``, ``tables[2]``, ``free``), not a ``Target`` method."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.targets.protocol import SeedAdapter
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


# -- 2. ``ref`` as a sparse mapping; messages in the allocator's own terms ---------------
class SparseRef(BlockManager):
    """Legal: ``ref`` is a dict holding only blocks in use (refcount 0 = absent)."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = {}

    def _take(self):
        block = self.free.popleft()
        self.ref[block] = 1
        return block

    def _release(self, block):
        count = self.ref[block] - 1
        if count:
            self.ref[block] = count
        else:
            del self.ref[block]
            self.free.append(block)


class DefaultDictRef(BlockManager):
    """Legal: ``ref`` is a ``defaultdict(int)`` that starts empty."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = defaultdict(int)


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("cls", [SparseRef, DefaultDictRef])
def test_sparse_ref_mapping_passes(cls, mode):
    r = verify(cls, 16, 2, 3000, 0, mode=mode, do_shrink=False)
    assert r.ok, r.violation


def test_observing_a_sparse_ref_does_not_write_to_it():
    impl = DefaultDictRef(8, 2)
    t = SeedAdapter(impl, 8, 2)
    assert t.refcounts() == [0] * 8 and t.refcount(5) == 0
    assert dict(impl.ref) == {}
    impl.allocate(0, 3)
    assert t.refcounts() == [1, 1] + [0] * 6 and dict(impl.ref) == {0: 1, 1: 1}


def test_bulk_refcounts_of_a_list_and_a_mapping():
    impl = BlockManager(4, 2)
    impl.allocate(0, 3)
    assert SeedAdapter(impl, 4, 2).refcounts() == [1, 1, 0, 0]
    impl.ref = {1: 2}
    assert SeedAdapter(impl, 4, 2).refcounts() == [0, 2, 0, 0]


class _RaisesAt3(list):
    def __getitem__(self, i):
        if i == 3:
            raise KeyError(i)
        return super().__getitem__(i)


class RefRaises(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = _RaisesAt3(self.ref)


class ShortRef(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = self.ref[:-1]


class GarbageRef(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = {b: "zero" for b in range(num_blocks)}


class _BadTables(dict):
    def __getitem__(self, q):
        if q == 2:
            raise RuntimeError("table store offline")
        return super().__getitem__(q)


class TablesRaise(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.tables = _BadTables()


class TextTable(BlockManager):
    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child] = "garbage"


class _BadFree(deque):
    def __iter__(self):
        raise OSError("free list unreadable")


class FreeRaises(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free = _BadFree(self.free)


class TextFree(BlockManager):
    def free_seq(self, seq):
        super().free_seq(seq)
        self.free.append("7")


MESSAGES = [
    (RefRaises, "ref[3] raised KeyError"),
    (ShortRef, "ref[7] raised IndexError"),
    (GarbageRef, "ref[0] is 'zero', expected an integer"),
    (TablesRaise, "tables[2] raised RuntimeError: table store offline"),
    (TextTable, "is 'g', expected an integer"),
    (FreeRaises, "free raised OSError: free list unreadable"),
    (TextFree, "an entry of free is '7', expected an integer"),
]
TARGET_METHODS = ("refcount(", "refcounts(", "block_table(", "free_blocks(", "num_free(",
                  "table_identity(", "seq_len(")


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("cls,says", MESSAGES, ids=[c.__name__ for c, _ in MESSAGES])
def test_observation_failures_name_what_the_allocator_wrote(cls, says, mode):
    r = verify(cls, 8, 2, 2000, 0, mode=mode, do_shrink=False)
    assert r.verdict == "fail" and r.violation.kind == "malformed", r.violation
    assert says in r.violation.witness, r.violation.witness
    if cls is TextTable:
        assert r.violation.witness.startswith("an entry of tables["), r.violation.witness
    assert not any(m in r.violation.witness for m in TARGET_METHODS), r.violation.witness
