"""Bounded exhaustive exploration of implementations."""

import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.blocks.runs import Scope, explore

from corpus.buggy import CORPUS
from corpus.cyclic import BEYOND_BFS, BFS_MAX_TOKENS, CYCLIC


def _scope(name: str, depth: int) -> Scope:
    """4 blocks of 2, 3 sequences; prompts up to 4 tokens (a cyclic bug: past its window)."""
    return Scope(4, 2, 3, BFS_MAX_TOKENS if name in CYCLIC else 4, depth)


def test_reference_holds_within_scope():
    r = explore(BlockManager, Scope(4, 2, 3, 4, 8))
    assert r.violation is None and r.complete and r.depth == 8
    assert r.distinct > 100 and r.explored > r.distinct


@pytest.mark.parametrize("name", sorted(set(CORPUS) - set(BEYOND_BFS)))
def test_finds_each_planted_bug_with_a_shortest_trace(name):
    cls, kind, bound = CORPUS[name]
    r = explore(cls, _scope(name, 5))
    assert r.violation is not None and r.violation.kind == kind or r.violation.kind in (
        "contract", "invariant")
    assert len(r.ops) <= bound + 1
    shorter = explore(cls, _scope(name, len(r.ops) - 1))
    assert shorter.violation is None  # BFS: nothing shorter exists in this scope


def test_dedup_prunes():
    a = explore(BlockManager, Scope(4, 2, 2, 4, 5))
    b = explore(BlockManager, Scope(4, 2, 2, 4, 5), dedup=False)
    assert a.explored < b.explored


class ForgetfulCopy(BlockManager):
    """Copies of it forget everything (as some engines' objects do under deepcopy)."""

    def __deepcopy__(self, memo):
        return ForgetfulCopy(self.num_blocks, self.block_size)


def test_unfaithful_copies_are_detected_and_paths_replayed():
    scope = Scope(4, 2, 2, 4, 5)
    truth = explore(BlockManager, scope)
    r = explore(ForgetfulCopy, scope)
    assert r.violation is None
    assert (r.explored, r.distinct) == (truth.explored, truth.distinct)
