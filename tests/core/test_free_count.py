"""The allocator's own count of free blocks (``num_free()``) must agree with its
free list (``free_blocks()``): the fast mode, ``--full`` and ``verify-prefix``
all judge a target whose count drifts from its list the same way."""

from __future__ import annotations

import pytest

from kvcheck.cli import main
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.targets.protocol import SeedAdapter
from kvcheck.verify import verify


def verify_prefix(target, num_blocks, block_size, ops, seed, **kw):
    """``kvcheck verify-prefix --full``'s check."""
    return verify(target, num_blocks, block_size, ops, seed, mode="full", model="prefix", **kw)


class CountsTableEntries(SeedAdapter):
    """A plausible bug: the free count is derived as pool size minus table entries,
    which counts a block shared by two tables (a fork, a cache hit) twice. The free
    list itself stays right."""

    def num_free(self):
        return self.num_blocks - sum(len(t) for t in self.impl.tables.values())


def miscounting(cls):
    return lambda nb, bs: CountsTableEntries(cls(nb, bs), nb, bs)


def honest(cls):
    return lambda nb, bs: SeedAdapter(cls(nb, bs), nb, bs)


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_verify_catches_a_free_count_that_disagrees_with_the_free_list(mode):
    r = verify(miscounting(BlockManager), 16, 2, 3000, 0, mode=mode, shrink_budget=20)
    assert not r.ok
    assert r.violation.kind in ("contract", "invariant"), r.violation
    assert r.trace is not None and len(r.trace.ops) <= 3, r.trace.ops
    assert verify(honest(BlockManager), 16, 2, 3000, 0, mode=mode).ok


def test_modes_name_the_same_rule():
    fast = verify(miscounting(BlockManager), 16, 2, 3000, 0, do_shrink=False)
    full = verify(miscounting(BlockManager), 16, 2, 3000, 0, mode="full", do_shrink=False)
    assert (fast.violation.step, fast.violation.name) == (full.violation.step, full.violation.name)


def test_verify_prefix_catches_it():
    r = verify_prefix(miscounting(PrefixCachingBlockManager), 16, 4, 3000, 0, shrink_budget=20)
    assert not r.ok
    assert r.violation.kind in ("contract", "invariant"), r.violation
    assert verify_prefix(honest(PrefixCachingBlockManager), 16, 4, 3000, 0).ok


def test_cli_full_exits_1(capsys):
    target = f"{__file__}:MiscountingReference"
    assert main(["verify", target, "--full", "--blocks", "16", "--block-size", "2",
                 "--ops", "2000"]) == 1
    assert "VIOLATION" in capsys.readouterr().out


MiscountingReference = miscounting(BlockManager)


class CountsOneMore(SeedAdapter):
    def num_free(self):
        return len(self.impl.free) + 1


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_the_invariant_names_the_disagreement(mode):
    r = verify(lambda nb, bs: CountsOneMore(BlockManager(nb, bs), nb, bs), 16, 2, 100, 0,
               mode=mode, do_shrink=False)
    assert (r.violation.kind, r.violation.name, r.violation.step) == (
        "invariant", "num_free_agrees", 0), r.violation
    assert r.violation.witness == ("the allocator counts 17 free blocks (its num_free), but its "
                                   "free list holds 16 entries")
