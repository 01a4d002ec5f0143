"""The sparse shadow memory reads back exactly what slot-by-slot memory would.

A plain model (a dict per block of slot -> token, a list of tokens per
sequence) and ``ShadowMemory`` are driven through the same random calls,
legal and not (tables naming the wrong blocks, shared blocks, blocks never
written, stale content left by earlier owners, copies), and must report the
same first mismatch, with the same token read and the same writer.
"""

from __future__ import annotations

import random

import pytest

from kvcheck.models.blocks.shadow import ShadowMemory


class SlotModel:
    def __init__(self, block_size):
        self.bs = block_size
        self.slots: dict[int, dict[int, int]] = {}
        self.expected: dict[int, list[int]] = {}
        self.owner_of: list[int] = []

    def _fresh(self, seq):
        self.owner_of.append(seq)
        return len(self.owner_of) - 1

    def allocate(self, seq, n, table):
        toks = [self._fresh(seq) for _ in range(n)]
        self.expected[seq] = toks
        for i, tok in enumerate(toks):
            self.slots.setdefault(table[i // self.bs], {})[i % self.bs] = tok

    def append(self, seq, block, offset, cow_src):
        if cow_src is not None:
            self.slots[block] = dict(self.slots.get(cow_src, {}))
        tok = self._fresh(seq)
        self.slots.setdefault(block, {})[offset] = tok
        self.expected[seq].append(tok)

    def fork(self, parent, child):
        self.expected[child] = list(self.expected[parent])

    def free(self, seq):
        self.expected.pop(seq, None)

    def mismatch(self, seq, table, first=0):
        want = self.expected[seq]
        for i in range((first // self.bs) * self.bs, len(want)):
            b = table[i // self.bs] if i // self.bs < len(table) else None
            read = self.slots.get(b, {}).get(i % self.bs)
            if read != want[i]:
                return i, read, want[i]
        return None

    def owner(self, tok):
        return self.owner_of[tok] if 0 <= tok < len(self.owner_of) else None


def _drive(seed: int, steps: int):
    rng = random.Random(seed)
    bs = rng.randint(1, 6)
    nb = rng.randint(2, 10)
    a, b = SlotModel(bs), ShadowMemory(bs)
    tables: dict[int, list[int]] = {}  # what each sequence's table "really" is
    nxt = 0
    checked = mismatched = 0
    for _ in range(steps):
        r = rng.random()
        live = list(tables)
        if not live or r < 0.2:
            n = rng.randint(1, 3 * bs)
            table = [rng.randrange(nb) for _ in range(-(-n // bs))]
            for m in (a, b):
                m.allocate(nxt, n, table)
            tables[nxt] = table
            nxt += 1
        elif r < 0.65:
            q = rng.choice(live)
            n = len(a.expected[q])
            t = tables[q]
            offset, cow = n % bs, None
            if offset == 0:
                t.append(rng.randrange(nb))
            elif rng.random() < 0.3:  # a copy, into any block (even a shared one)
                cow, t[-1] = t[-1], rng.randrange(nb)
            if rng.random() < 0.1:  # the allocator names some other slot
                offset = rng.randrange(bs)
            for m in (a, b):
                m.append(q, t[-1], offset, cow)
        elif r < 0.8:
            q = rng.choice(live)
            for m in (a, b):
                m.fork(q, nxt)
            tables[nxt] = list(tables[q])
            nxt += 1
        elif r < 0.9:
            q = rng.choice(live)
            for m in (a, b):
                m.free(q)
            del tables[q]
        if rng.random() < 0.05:
            b = b.clone()
        for blk in range(-1, nb + 1):  # every block holds the same slots
            assert _slots(b.content(blk)) == a.slots.get(blk, {}), (seed, blk)
        for q, t in tables.items():
            for table in (t, _perturbed(rng, t, nb)):
                first = rng.randrange(len(a.expected[q]))
                for f in (0, first):
                    want, got = a.mismatch(q, table, f), b.mismatch(q, table, f)
                    assert got == want, (seed, q, table, f, got, want)
                    checked += 1
                    if want is not None:
                        mismatched += 1
                        assert b.owner(want[1]) == (None if want[1] is None else
                                                     a.owner(want[1]))
                        assert b.owner(want[2]) == a.owner(want[2])
    return checked, mismatched


def _slots(runs) -> dict[int, int]:
    return {a + i: t + i for a, t, c in zip(runs[0::3], runs[1::3], runs[2::3], strict=True)
            for i in range(c)}


def _perturbed(rng, table, nb):
    t = list(table)
    how = rng.randrange(4)
    if how == 0 and t:
        t[rng.randrange(len(t))] = rng.randrange(-1, nb + 1)
    elif how == 1 and t:
        t.pop()
    elif how == 2:
        t.append(rng.randrange(nb))
    elif how == 3 and len(t) > 1:
        i, j = rng.sample(range(len(t)), 2)
        t[i], t[j] = t[j], t[i]
    return t


@pytest.mark.parametrize("seed", range(40))
def test_sparse_shadow_reads_back_like_slots(seed):
    checked, mismatched = _drive(seed, 120)
    assert checked > 50 and 0 < mismatched < checked


def test_a_huge_prompt_is_one_run_per_block():
    sh = ShadowMemory(65536)
    n = 2_000_000_000
    table = list(range(-(-n // 65536)))
    sh.allocate(0, n, table)
    assert all(sh.content(b) == (0, 65536 * b, 65536) for b in table[:-1])  # one run each
    assert sh.mismatch(0, table) is None
    sh.append(0, table[-1], n % 65536, None)
    assert sh.mismatch(0, table, n) is None
    sh.fork(0, 1)
    bad = [*table[:5], table[7], *table[6:]]
    assert sh.mismatch(1, bad) == (5 * 65536, 7 * 65536, 5 * 65536)
    assert sh.owner(n) == 0 and sh.owner(n + 1) is None
