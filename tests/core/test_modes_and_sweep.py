"""Fast and full mode agree; the fast mode's sweep catches corruption of untouched state."""

from __future__ import annotations

import random

import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.verify import verify

from corpus.buggy import CORPUS


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_modes_agree_on_corpus(name, seed):
    cls = CORPUS[name][0]
    fast = verify(cls, 12, 3, 3000, seed, mode="fast", do_shrink=False)
    full = verify(cls, 12, 3, 3000, seed, mode="full", do_shrink=False)
    assert fast.verdict == full.verdict == "fail"
    assert fast.violation.kind == full.violation.kind, (fast.violation, full.violation)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("nb,bs", [(4, 1), (16, 4), (40, 2)])
def test_modes_agree_on_reference(nb, bs, seed):
    fast = verify(BlockManager, nb, bs, 1500, seed, mode="fast")
    full = verify(BlockManager, nb, bs, 1500, seed, mode="full")
    assert fast.ok and full.ok and fast.ops == full.ops


class BumpsAnother(BlockManager):
    """Corrupts state the operation does not touch: now and then an append bumps the
    refcount of a block that only *other* sequences hold."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self._rng = random.Random(7)

    def append_slot(self, seq):
        out = super().append_slot(seq)
        mine = set(self.tables[seq])
        others = sorted({b for q, t in self.tables.items() if q != seq for b in t} - mine)
        if others and self._rng.random() < 0.05:
            self.ref[self._rng.choice(others)] += 1
        return out


def test_fast_mode_catches_untouched_corruption():
    """Caught when a holder is next touched (its block's refcount differs from the
    verified ghost) or by the sweep, whichever comes first."""
    r = verify(BumpsAnother, 64, 4, 5000, 0, mode="fast", do_shrink=False)
    assert r.verdict == "fail"
    assert r.violation.kind in ("contract", "invariant"), r.violation


def test_sweep_alone_catches_it():
    """Corruption of a block nobody holds is invisible to the per-operation check
    (nothing names that block) and found by the sweep."""
    from kvcheck.models.blocks.oracle import Oracle
    from kvcheck.spec.contracts import Op
    from kvcheck.targets.loading import build

    o = Oracle(build(BlockManager, 16, 4), mode="fast", sweep_every=10**9)
    assert o.step(Op("allocate", seq=0, n_tokens=5)) is None
    o.target.impl.ref[9] += 1  # no table names block 9: untouched by every operation
    assert o.step(Op("append_slot", seq=0)) is None
    v = o.sweep()
    assert v is not None and v.element == 9, v
