"""allocate with cache hits, compiled: the fast mode judges a successful or out-of-blocks
allocate by ``spec.prefix.allocate_with_hits`` compiled from its text (after the cache-hit
checks), and reports exactly what the spec evaluated directly reports (``compiled=False``)
and what the full mode reports, on allocators that break the contract's clauses."""

from __future__ import annotations

import random

import pytest

from kvcheck.check.model import Options
from kvcheck.check.run import drive
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.models.blocks import BlockScope
from kvcheck.models.prefix import compiled as compiled_checks
from kvcheck.models.prefix.model import MODEL
from kvcheck.spec.contracts import OK, OOB, REFUSED


class _Mutant(PrefixCachingBlockManager):
    """The reference, whose allocate now and then (seeded) does one thing wrong."""

    RATE = 0.08

    def __init__(self, num_blocks, block_size, seed=0):
        super().__init__(num_blocks, block_size)
        self._rng = random.Random(seed)

    def allocate(self, seq, n_tokens, token_ids=None):
        got = super().allocate(seq, n_tokens, token_ids)
        if self._rng.random() < self.RATE:
            self.corrupt(seq)
        return got

    def corrupt(self, seq):
        raise NotImplementedError


class ExtraReference(_Mutant):
    """A block handed out gets two references (refcount + 2)."""

    def corrupt(self, seq):
        self.ref[self.tables[seq][0]] += 1


class DuplicateBlock(_Mutant):
    """The last block handed out is the first one again (released as it came)."""

    def corrupt(self, seq):
        t = self.tables[seq]
        if len(t) >= 2 and t[-1] != t[0]:
            last = t[-1]
            self._release(last)
            t[-1] = t[0]
            self.ref[t[0]] += 1


class SharesAnInUseMiss(_Mutant):
    """The last block handed out is another sequence's block in use (not a cache hit)."""

    def corrupt(self, seq):
        t = self.tables[seq]
        mine = set(t)
        others = sorted(b for q, ts in self.tables.items() if q != seq for b in ts if b not in mine)
        if others:
            self._release(t[-1])
            t[-1] = self._rng.choice(others)
            self.ref[t[-1]] += 1


class ShortTable(_Mutant):
    """The table holds one block too few for the prompt (the block released)."""

    def corrupt(self, seq):
        t = self.tables[seq]
        if len(t) >= 2:
            self._release(t.pop())


MUTANTS = (ExtraReference, DuplicateBlock, SharesAnInUseMiss, ShortTable)


def _run(cls, seed, mode, compiled=True, blocks=16, ops=800):
    def factory(num_blocks, block_size):
        return cls(num_blocks, block_size, seed)

    r = drive(MODEL, factory, BlockScope(blocks, 2), Options(mode=mode, compiled=compiled), seed, ops)
    v = r.state.violation
    return None if v is None else (v.step, v.name)


def test_the_compiled_allocate_is_built_and_used():
    assert compiled_checks.allocate_with_hits is not None
    r = drive(MODEL, PrefixCachingBlockManager, BlockScope(16, 2), Options(mode="fast"), 0, 300)
    steps = r.state.s._steps["allocate"]
    assert set(steps) == {OK, OOB, REFUSED} and all(steps.values())
    assert r.state.violation is None and r.state.stats.hit_allocations and r.state.stats.oob


@pytest.mark.parametrize("cls", MUTANTS, ids=lambda c: c.__name__)
def test_compiled_interpreted_and_full_report_the_same_allocate_violation(cls):
    clauses = set()
    for seed in range(6):
        fast = _run(cls, seed, "fast")
        assert fast == _run(cls, seed, "fast", compiled=False), (cls.__name__, seed)
        full = _run(cls, seed, "full")
        assert full is not None and fast is not None, (cls.__name__, seed, fast, full)
        assert fast[1] == full[1], (cls.__name__, seed, fast, full)
        assert fast[0] >= full[0]
        clauses.add(fast[1])
    assert all(name.startswith("allocate: ") for name in clauses), clauses


def test_mirror_content_ok_and_the_inline_template_mean_the_snapshots_method():
    """``Mirror.content_ok`` (one key without a generator) and the compiled checks'
    inline ``content_ok`` (one key compared inline) agree with ``PrefixSnapshot``'s on
    blocks under no key, one key and two keys, matching or not."""
    from kvcheck.models.prefix.incremental import Mirror
    from kvcheck.spec.prefix import PrefixSnapshot

    r = drive(MODEL, PrefixCachingBlockManager, BlockScope(16, 2), Options(mode="fast"), 1, 400)
    m = r.state.mirror
    assert isinstance(m, Mirror) and m._keys
    plain = compiled_checks.compile_touched(inline=False)
    rng = random.Random(3)
    keys = sorted(m.meanings, key=repr)
    seen = set()
    for _ in range(300):
        b = rng.randrange(m.num_blocks)
        m._keys.pop(b, None)
        ks = tuple(rng.sample(keys, rng.choice((0, 1, 1, 2))))
        if ks:
            m._keys[b] = ks
        if ks and rng.random() < 0.5:
            m.content_map[b] = m.meanings[ks[0]]  # what its (first) key names
        elif rng.random() < 0.3:
            m.content_map[b] = rng.choice((-1, *(m.meanings[k] for k in keys[:3])))
        want = PrefixSnapshot.content_ok(m, b)
        assert m.content_ok(b) == want
        assert compiled_checks.touched_invariants(m, [b]) == plain(m, [b])
        seen.add((len(ks), want))
    assert {(1, True), (1, False), (2, False), (0, False)} <= seen
