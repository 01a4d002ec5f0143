"""The third-party adapters load and honour the seed semantics under random operations.

A small checker of its own (independent of ``kvcheck.oracle``) drives each adapter
with random *valid* operations and, after every step, compares everything
observable against a shadow model of sequence lengths:

* a sequence of ``len`` tokens holds ``ceil(len / block_size)`` blocks;
* ``refcount(b)`` == number of table entries naming ``b``;
* ``b`` is on the free list iff its refcount is 0, at most once; ``num_free``
  agrees;
* ``append_slot`` returns offset ``len % block_size``; takes a fresh block only at a
  block boundary; copies on write iff the partial tail is shared (``cow_src`` the
  old tail, the new block fresh); the sole holder writes in place;
* ``fork`` gives the child the parent's table, every block +1;
* ``OutOfBlocks`` is raised only when the request really needs more blocks than are
  free, and leaves every observable unchanged (allocate is all-or-nothing).

Where a third-party allocator deviates *by design* in a documented way, the
deviation is asserted explicitly below (and written up in docs/thirdparty-notes.md).
"""

from __future__ import annotations

import importlib
import random

import pytest
from kvcheck.impl.errors import OutOfBlocks

ADAPTERS = {
    "vllm-v1": "kvcheck.impl.thirdparty.vllm_v1:make",
    "vllm-v1-nocache": "kvcheck.impl.thirdparty.vllm_v1:make_no_cache",
}


def factory(name: str):
    module, _, attr = ADAPTERS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def snapshot(t, seqs) -> tuple:
    return (
        {s: list(t.block_table(s)) for s in seqs},
        {s: t.seq_len(s) for s in seqs},
        [t.refcount(b) for b in range(t.num_blocks)],
        sorted(t.free_blocks()),
        t.num_free(),
    )


def check_state(t, lens: dict[int, int]) -> None:
    bs = t.block_size
    counts = [0] * t.num_blocks
    for s, n in lens.items():
        table = list(t.block_table(s))
        assert len(table) == ceil_div(n, bs), (s, n, table)
        own = t.seq_len(s)
        assert own is None or own == n, (s, own, n)
        for b in table:
            assert 0 <= b < t.num_blocks, (s, b)
            counts[b] += 1
    refs = [t.refcount(b) for b in range(t.num_blocks)]
    assert refs == counts, (refs, counts)
    free = list(t.free_blocks())
    assert len(free) == len(set(free)), f"duplicate on free list: {free}"
    assert set(free) == {b for b in range(t.num_blocks) if refs[b] == 0}, (free, refs)
    assert t.num_free() == len(free)


class Driver:
    """Random valid operations on one target, checked step by step."""

    def __init__(self, t, rng: random.Random, max_tokens: int):
        self.t = t
        self.rng = rng
        self.max_tokens = max_tokens
        self.lens: dict[int, int] = {}
        self.next_seq = 0
        self.ooms = 0
        self.ops = 0

    def step(self) -> None:
        t, rng, lens = self.t, self.rng, self.lens
        choices = ["allocate"] * 3
        if lens:
            choices += ["append_slot"] * 6 + ["free_seq"] * 2
            if "fork" in t.capabilities:
                choices += ["fork"] * 2
        op = rng.choice(choices)
        before = snapshot(t, lens)
        refs = before[2]
        self.ops += 1
        try:
            if op == "allocate":
                seq, n = self.next_seq, rng.randint(1, self.max_tokens)
                self.next_seq += 1
                need = ceil_div(n, t.block_size)
                t.allocate(seq, n)
                assert need <= before[4], "allocate succeeded beyond the free blocks"
                lens[seq] = n
                assert all(refs[b] == 0 for b in t.block_table(seq)), "allocate reused a live block"
            elif op == "append_slot":
                seq = rng.choice(sorted(lens))
                n = lens[seq]
                old = before[0][seq]
                block, offset, cow = t.append_slot(seq)
                lens[seq] = n + 1
                new = list(t.block_table(seq))
                assert offset == n % t.block_size
                assert block == new[-1]
                if n % t.block_size == 0:
                    assert new[:-1] == old and cow is None and refs[block] == 0
                elif refs[old[-1]] > 1:
                    assert cow == old[-1] and refs[block] == 0 and new[:-1] == old[:-1]
                else:
                    assert cow is None and new == old
            elif op == "fork":
                parent, child = rng.choice(sorted(lens)), self.next_seq
                self.next_seq += 1
                t.fork(parent, child)
                lens[child] = lens[parent]
                assert list(t.block_table(child)) == before[0][parent]
                assert t.table_identity(child) is None or (
                    t.table_identity(child) != t.table_identity(parent)
                )
            else:
                seq = rng.choice(sorted(lens))
                t.free_seq(seq)
                del lens[seq]
        except OutOfBlocks:
            self.ooms += 1
            assert snapshot(t, lens) == before, f"{op} failed with OutOfBlocks but changed state"
            if op == "allocate":
                assert ceil_div(n, t.block_size) > before[4], "spurious OutOfBlocks on allocate"
            elif op == "append_slot":
                assert before[4] == 0, "spurious OutOfBlocks on append_slot"
            else:
                raise AssertionError(f"{op} may not run out of blocks") from None
        check_state(t, lens)


def drive(name: str, num_blocks: int, block_size: int, steps: int, seed: int) -> Driver:
    rng = random.Random(seed)
    d = Driver(factory(name)(num_blocks, block_size), rng, max_tokens=3 * block_size + 1)
    check_state(d.t, d.lens)
    for _ in range(steps):
        d.step()
    return d


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_loads(name):
    t = factory(name)(4, 2)
    assert t.num_blocks == 4 and t.block_size == 2
    assert sorted(t.free_blocks()) == [0, 1, 2, 3]
    assert t.capabilities <= {"allocate", "append_slot", "fork", "free_seq"}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@pytest.mark.parametrize("num_blocks,block_size", [(6, 2), (16, 4), (3, 3)])
def test_random_operations(name, num_blocks, block_size):
    d = drive(name, num_blocks, block_size, steps=1500, seed=num_blocks * 31 + block_size)
    assert d.ooms > 0, "the run never exercised out-of-blocks"
