"""Misbehaving allocators are reported as violations, never as kvcheck crashes."""

from __future__ import annotations

import json

import pytest

from kvcheck.cli import main
from kvcheck.impl.block_manager import BlockManager
from kvcheck.targets.protocol import SeedAdapter
from kvcheck.verify import verify

from corpus.buggy import HangOnCow


class RaisesOnAppend(BlockManager):
    def append_slot(self, seq):
        raise RuntimeError("internal error")


class ReturnsNone(BlockManager):
    def append_slot(self, seq):
        super().append_slot(seq)


class ReturnsPair(BlockManager):
    def append_slot(self, seq):
        return super().append_slot(seq)[:2]


class ReturnsText(BlockManager):
    def append_slot(self, seq):
        b, off, cow = super().append_slot(seq)
        return str(b), off, cow


class ReturnsOutOfRange(BlockManager):
    def append_slot(self, seq):
        b, off, cow = super().append_slot(seq)
        return b + self.num_blocks, off, cow


class TableOutOfRange(BlockManager):
    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        self.tables[seq][0] = self.num_blocks + 5


class NoneInTable(BlockManager):
    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        self.tables[seq].append(None)


class TextTable(BlockManager):
    def fork(self, parent, child):
        super().fork(parent, child)
        self.tables[child] = "garbage"


class _BadRefs(list):
    def __getitem__(self, i):
        v = super().__getitem__(i)
        return "one" if v == 1 else v


class GarbageRefs(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = _BadRefs(self.ref)


class _RaisingRefs(list):
    def __getitem__(self, i):
        if super().__getitem__(i) > 1:
            raise ZeroDivisionError("refcount store corrupted")
        return super().__getitem__(i)


class RaisingRefs(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.ref = _RaisingRefs(self.ref)


class GarbageFreeList(BlockManager):
    def free_seq(self, seq):
        super().free_seq(seq)
        self.free.append(None)


class TextFreeList(BlockManager):
    def free_seq(self, seq):
        super().free_seq(seq)
        self.free.append("7")


CASES = [
    (RaisesOnAppend, {"crash"}, "RuntimeError"),
    (ReturnsNone, {"malformed"}, "expected (block, offset, cow_src)"),
    (ReturnsPair, {"malformed"}, "expected (block, offset, cow_src)"),
    (ReturnsText, {"malformed"}, "expected (block, offset, cow_src)"),
    (ReturnsOutOfRange, {"contract"}, ""),
    (TableOutOfRange, {"contract", "invariant"}, ""),
    # (None in a table or on the free list is the null placeholder of a sliding-window
    # table, issue 15: an extra null entry breaks allocate's contract, a null on the free
    # list the free-list rules, no longer an unreadable observation)
    (NoneInTable, {"contract", "invariant"}, "null"),
    (TextTable, {"malformed"}, ""),
    (GarbageRefs, {"malformed"}, "'one'"),
    (RaisingRefs, {"malformed"}, "ZeroDivisionError"),
    (GarbageFreeList, {"contract", "invariant"}, ""),
    (TextFreeList, {"malformed"}, "an entry of free is '7'"),
]


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("cls,kinds,text", CASES, ids=[c[0].__name__ for c in CASES])
def test_reported_not_raised(cls, kinds, text, mode):
    r = verify(cls, 8, 2, 2000, 0, mode=mode, timeout=5.0, shrink_budget=10)
    assert r.verdict == "fail"
    assert r.violation.kind in kinds, r.violation
    assert text in r.violation.witness, r.violation.witness


def test_hang_is_a_violation(capsys):
    """The watchdog raises inside the allocator's endless loop."""
    code = main(["verify", "tests/corpus/buggy.py:HangOnCow", "--blocks", "8", "--block-size",
                 "2", "--ops", "500", "--timeout", "0.5", "--json"])
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["violation"]["violation"]["kind"] == "hang"
    assert "did not return within 0.5 s" in out["violation"]["violation"]["witness"]


def test_hang_via_api():
    r = verify(HangOnCow, 8, 2, 500, 0, timeout=0.5, do_shrink=False)
    assert r.verdict == "fail" and r.violation.kind == "hang"


class Reboxer(BlockManager):
    """Legal but unusual: every allocate replaces each other table with an equal copy.
    The replaced lists are freed, and CPython hands their ids to new lists at once;
    with raw ids as table identities a new table then looked like an alias of a
    sequence whose (stale) identity the oracle still remembered."""

    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        for q in self.tables:
            if q != seq:
                self.tables[q] = list(self.tables[q])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replaced_table_objects_are_not_aliases(seed):
    r = verify(Reboxer, 16, 2, 3000, seed)
    assert r.ok, r.violation


class _BulkRefcounts(SeedAdapter):
    """The optional ``refcounts()`` (whole pool in one call) misbehaving."""

    how = "raise"

    def refcounts(self):
        if self.how == "raise":
            raise RuntimeError("boom")
        if self.how == "short":
            return [0] * (self.num_blocks - 1)
        return [None] * self.num_blocks


@pytest.mark.parametrize("how,says", [("raise", "refcounts() raised RuntimeError: boom"),
                                      ("short", "refcounts() returned 7 values for 8 blocks"),
                                      ("garbage", "refcounts()[0] is None, expected an integer")])
def test_bulk_refcounts_garbage_is_a_violation(how, says):
    def factory(nb, bs):
        t = _BulkRefcounts(BlockManager(nb, bs), nb, bs)
        t.how = how
        return t

    r = verify(factory, 8, 2, 200, 0, do_shrink=False)
    assert r.verdict == "fail" and r.violation.kind == "malformed", r.violation
    assert r.violation.witness == says


STOPPED_CHILD = """
import sys, time
from kvcheck.check.watchdog import OperationTimeout, Watchdog
with Watchdog(2.0) as wd:
    wd.enter()
    print("in", flush=True)
    try:
        for _ in range(%d):
            time.sleep(0.05)
        print("returned", flush=True)
    except OperationTimeout:
        print("timeout", flush=True)
    finally:
        wd.leave()
"""


@pytest.mark.parametrize("sleeps,says", [(18, "returned"), (100, "timeout")])
def test_time_the_process_spent_stopped_is_not_the_calls(sleeps, says):
    """A call of 0.9 s (under a 2 s timeout) that the process spends 3 s stopped in
    (SIGSTOP: a campaign holding the runs beside a shrinking one), once the watchdog has seen
    it start, did not hang; a call of 5 s, stopped the same way, still did."""
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD % sleeps], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "in"
        time.sleep(0.7)  # (the watchdog looks every 0.5 s)
        p.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        p.send_signal(signal.SIGCONT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert out.strip() == says, out
