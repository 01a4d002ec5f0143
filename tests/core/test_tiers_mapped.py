"""A second device pool behind a mapping (issue 33): a request's mapped table in
``spec.tiers`` (SGLang's SWA pool behind ``full_to_swa_index_mapping``), ``slide``, and the
reference ``impl/swa_cache.py`` (``reference-swa``); buggy variants of it, one per rule
(they subclass ``SWACache``, not ``TieredCache``, so they live here rather than in
``tests/corpus/tiers.py``, whose hand-written checks speak of host pools)."""

from __future__ import annotations

from collections import Counter

import pytest

from kvcheck.impl.swa_cache import SWA, SWACache
from kvcheck.models.tiers.model import MODEL, TierScope, _make
from kvcheck.spec import tiers as T
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.state import NULL
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

SCOPE = TierScope(8, 2, 1)


def run(target, ops=1500, seed=0, scope=SCOPE):
    return verify(target, scope.num_blocks, scope.block_size, ops, seed, model="tiers",
                  scope=scope)


# -- the spec's clauses, on states written by hand ----------------------------------------
def state(mapped, free_swa, refs_swa, table=(0, 1), length=4):
    """One request (seq 0) of ``length`` tokens, device table ``table``; 4 blocks of 2 in
    each pool; its SWA entries ``mapped`` (NULL: released)."""
    free_dev = [b for b in range(4) if b not in table]
    return T.TierState(2, {T.DEVICE: 4, SWA: 4},
                       {T.DEVICE: [1 if b in table else 0 for b in range(4)], SWA: refs_swa},
                       {T.DEVICE: Counter(free_dev), SWA: Counter(free_swa)},
                       {0: tuple(table)}, {0: T.DEVICE}, {0: length},
                       mapped={SWA: {0: tuple(mapped)}})


def broken(fn, pre, post, op):
    return [name for name, _, holds in fn(PY, pre, post, op) if not holds]


def invariants_broken(s, pool):
    view = s.pool_view(pool)
    out = []
    for inv in INVARIANTS:
        xs = (None,) if inv.domain == "global" else (
            view.blocks() if inv.domain == "block" else view.seqs())
        out += [inv.name for x in xs if not inv.holds_for(PY, view, x)]
    return out


PRE = state((0, 1), [2, 3], [1, 1, 0, 0])
SLIDE1 = _make("slide", seq=0, upto=1)


def test_slide_contract_on_hand_written_states():
    released = state((NULL, 1), [2, 3, 0], [0, 1, 0, 0])  # 0.5.14: the cut block whole
    assert broken(T.slide, PRE, released, SLIDE1) == []
    assert broken(T.slide, PRE, PRE, SLIDE1) == []  # the cut block kept (a rounding caller)
    stale = state((0, 1), [2, 3, 0], [1, 1, 0, 0])  # 0.5.13: freed, still mapped
    assert broken(T.slide, PRE, stale, SLIDE1) == [T.MAPPING_KEEPS]
    both = state((NULL, NULL), [2, 3, 0, 1], [0, 0, 0, 0])  # into the window
    assert broken(T.slide, PRE, both, SLIDE1) == ["slide: a block in the window is kept"]
    assert "slide: a block wholly behind the window is released" in broken(
        T.slide, PRE, PRE, _make("slide", seq=0, upto=2))
    device_freed = state((NULL, 1), [2, 3, 0], [0, 1, 0, 0], table=(0, 1))
    device_freed.free[T.DEVICE][0] += 1
    assert broken(T.slide, PRE, device_freed, SLIDE1) == ["slide: other blocks untouched"]


def test_a_mapped_table_is_a_sequence_of_its_pool():
    assert invariants_broken(PRE, SWA) == []
    assert invariants_broken(state((NULL, 1), [2, 3, 0], [0, 1, 0, 0]), SWA) == []
    stale = state((0, 1), [2, 3, 0], [1, 1, 0, 0])
    assert "free_list" in invariants_broken(stale, SWA)  # held and free
    twice = state((NULL, 1), [2, 3, 0, 0], [0, 1, 0, 0])
    assert "free_list" in invariants_broken(twice, SWA)  # on the free list twice
    assert "null_entries" in invariants_broken(state((0, NULL), [1, 2, 3], [1, 0, 0, 0]), SWA)
    assert "table_length" in invariants_broken(state((0,), [1, 2, 3], [1, 0, 0, 0]), SWA)
    assert PRE.held_by(SWA, 1) == Counter({"mapped": 1})


# -- the reference and its buggy variants ------------------------------------------------
class FreesCutBlockKeepsEntry(SWACache):
    """SGLang 0.5.13's ``free_swa``: the block the window's edge cuts goes back to the free
    list, its entry kept (the page's other token still maps to it). Shortest: allocate 3
    tokens, slide(upto=1)."""

    def slide(self, seq, upto):
        row = self.swa[seq]
        for i in range(-(-upto // self.B)):
            if row[i] is not None and i < upto // self.B:
                self._release(SWA, row[i])
                row[i] = None
            elif row[i] is not None:
                self.free_list[SWA].append(row[i])  # bug: freed, still named


class FreeSkipsSwa(SWACache):
    """free returns the device blocks only: the SWA blocks leak. Shortest: allocate,
    free."""

    def free(self, seq):
        for b in self.tables.pop(seq):
            self._release("device", b)
        self.swa.pop(seq)  # bug: never released
        del self.lengths[seq]


class SlidesOneTooFar(SWACache):
    """slide releases one block more than the window left (the block after the cut).
    Shortest: allocate 5 tokens, slide(upto=1)."""

    def slide(self, seq, upto):
        super().slide(seq, min(upto + self.B, (self.lengths[seq] - 1) // self.B * self.B))


class AppendSkipsSwa(SWACache):
    """append takes a device block at a boundary but no SWA block: the new token has no
    sliding-window KV. Shortest: allocate 2 tokens, append."""

    def append(self, seq, token):
        n = self._live(seq)
        if n % self.B == 0:
            dev, swa = self._take(1)
            self.tables[seq] += dev
            self._release(SWA, swa[0])  # bug: the SWA side not kept
        self.lengths[seq] = n + 1
        return self.tables[seq][n // self.B], n % self.B


class KeepsCutBlock(SWACache):
    """Legal: the block the window's edge cuts stays until the window passes it whole
    (SGLang's own caller rounds the eviction cursor down to a page)."""

    def slide(self, seq, upto):
        super().slide(seq, upto // self.B * self.B)


BUGGY = {
    FreesCutBlockKeepsEntry: ("contract", T.MAPPING_KEEPS, 2),
    FreeSkipsSwa: ("contract", "free: a refcount drops by the entries the request held", 2),
    SlidesOneTooFar: ("contract", "slide: a block in the window is kept", 2),
    AppendSkipsSwa: ("invariant", f"{SWA}: table_length", 2),
}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_passes(seed):
    r = run("reference-swa", 2000, seed, TierScope(12, 2, 1))
    assert r.ok, r.violation
    assert r.state.stats["slide"] > 100 and r.state.stats["free"] and r.state.stats["oob"]
    assert sorted(r.state.sizes) == [T.DEVICE, SWA]  # no host pool: it has no host operation


@pytest.mark.parametrize("cls", list(BUGGY), ids=lambda c: c.__name__)
def test_every_mapped_pool_bug_is_caught_with_a_minimal_trace(cls):
    kind, name, bound = BUGGY[cls]
    r = run(cls)
    assert r.verdict == "fail"
    assert (r.violation.kind, r.violation.name) == (kind, name), r.violation
    assert len(r.trace.ops) <= bound, [MODEL.describe(op) for op in r.trace.ops]
    assert r.trace.minimality.startswith("1-minimal"), r.trace.minimality


def test_a_cut_block_kept_until_the_window_passes_it_is_legal():
    for seed, scope in ((0, SCOPE), (1, TierScope(6, 4, 1))):
        r = run(KeepsCutBlock, 1500, seed, scope)
        assert r.ok, (seed, r.violation)


def test_a_pool_behind_a_mapping_needs_mapped():
    class NoMapped:  # the reference, its mapped tables unobservable
        capabilities = SWACache.capabilities

        def __init__(self, *args):
            self.inner = SWACache(*args)

        def __getattr__(self, name):
            if name == "mapped":
                raise AttributeError(name)
            return getattr(self.inner, name)

    with pytest.raises(TargetError, match="no mapped"):
        run(NoMapped, 10)


def test_breadth_first_exploration_slides():
    """BFS offers a slide one token past the last: it finds 0.5.13's free_swa in two moves
    and nothing on the reference."""
    from kvcheck.check.explore import explore
    from kvcheck.check.model import Options
    from kvcheck.models.tiers.model import TierExploreScope

    found = explore(MODEL, FreesCutBlockKeepsEntry, TierExploreScope(2, 2, 1, depth=4),
                    Options())
    assert found.violation is not None and found.violation.name == T.MAPPING_KEEPS
    assert [op.kind for op in found.ops] == ["allocate", "slide"]
    clean = explore(MODEL, SWACache, TierExploreScope(3, 2, 1, depth=4), Options())
    assert clean.violation is None and clean.complete and clean.explored > 10, clean
