"""Breadth-first BMC's per-choice enumeration against the first (whole-step) one: the same
states up to renaming at every depth, and a weakened contract still caught at its
shortest depth (the one the classic unrolling finds) by it and by ``bmc_lemmas``, with a
trace the reference runs."""

from collections import defaultdict

import pytest

from kvcheck.impl.block_manager import EagerForkBlockManager, EngineBlockManager
from kvcheck.models.blocks.runs import replay
from kvcheck.proofs.bmc import bmc, bmc_bfs, bmc_lemmas, exact_key
from kvcheck.spec import contracts
from kvcheck.spec.symbolic import SymScope

SMALL = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=4)


def _per_depth(enumeration: str, depth: int) -> tuple[list[set], object]:
    record: list = []
    r = bmc_bfs(SMALL, depth, enumeration=enumeration, record=record)
    first: dict = {}  # each state up to renaming -> the depth it is first reached at
    for d, vals in record:
        first.setdefault(exact_key(vals, SMALL), d)
    by = defaultdict(set)
    for key, d in first.items():
        by[d].add(key)
    return [by[d] for d in range(depth + 1)], r


def test_choice_enumeration_reaches_the_states_the_step_one_does():
    # (depth 3: the whole-step enumeration takes 6 s there, 40 s at depth 4)
    new, rn = _per_depth("choice", 3)
    old, ro = _per_depth("step", 3)
    assert rn.complete and ro.complete and rn.violated is None and ro.violated is None
    # every state first reached at the same depth: the same BFS layers up to renaming
    assert [len(x) for x in new] == [len(x) for x in old]
    assert new == old
    assert len(new[3]) > 90  # (the scope is not trivial: 96 states first reached at depth 3)


def test_exact_key_identifies_renamings_only():
    # two sequences with one block each, in either slot and on either block: one state
    N, S, T = SMALL.num_blocks, SMALL.seqs, SMALL.table_slots

    def vals(tables, lengths):
        ref = [sum(b in t for t in tables.values()) for b in range(N)]
        free = [int(r == 0) for r in ref]
        live = [q in tables for q in range(S)]
        length = [lengths.get(q, 0) for q in range(S)]
        nb = [len(tables.get(q, ())) for q in range(S)]
        tab = [(list(tables.get(q, ())) + [0] * T)[:T] for q in range(S)]
        return ref + free + live + length + nb + sum(tab, []) + [0] * S

    a = exact_key(vals({0: [0], 1: [1]}, {0: 1, 1: 2}), SMALL)
    b = exact_key(vals({2: [3], 0: [1]}, {2: 1, 0: 2}), SMALL)
    c = exact_key(vals({0: [0], 1: [0]}, {0: 1, 1: 2}), SMALL)  # shared: another state
    assert a == b and a != c


def _without(kind: str, clause: str):
    rule = contracts.CONTRACTS[kind]

    def weaker(L, pre, post, op, dom):
        for name, element, formula in rule(L, pre, post, op, dom):
            if not name.startswith(clause):
                yield name, element, formula
    return {**contracts.CONTRACTS, kind: weaker}


# weakened contracts whose violation needs fresh blocks taken by forks, rebases and
# multi-block appends (the symmetry breaking the choice enumeration adds)
SEEDED = [
    ("fork", "a block copied at fork time was free"),
    ("rebase", "refcount +1 per entry of the child's table"),
    ("append_slots", "new blocks exactly"),
    ("allocate", "blocks handed out are distinct"),
]


@pytest.mark.parametrize("kind,clause", SEEDED)
def test_a_seeded_bug_is_found_at_its_shortest_depth(kind, clause):
    weak = _without(kind, clause)
    found = bmc_bfs(SMALL, 4, contracts=weak)
    shortest = bmc(SMALL, 4, contracts=weak)
    assert shortest.violated is not None
    assert found.violated is not None and found.depth == shortest.depth == len(found.ops)
    assert found.ops[-1].kind == kind
    # the run up to the faulty step is legal: both references take it
    for ref in (EngineBlockManager, EagerForkBlockManager):
        assert replay(ref, SMALL.num_blocks, SMALL.block_size, found.ops[:-1]).violation is None


@pytest.mark.parametrize("kind,clause", SEEDED)
def test_a_seeded_bug_is_found_at_its_shortest_depth_by_bmc_lemmas(kind, clause):
    """kvcheck prove's route on the same seeded bugs. A test of its own, run after the
    enumeration's: with both in one test, the enumeration of the next bug, after the
    whole-file run of test_choice_enumeration..., stayed in one Z3 check for over ten
    minutes (seen 2026-12-01; each alone takes seconds; the cause is not yet found)."""
    weak = _without(kind, clause)
    shortest = bmc(SMALL, 4, contracts=weak)
    lemmas = bmc_lemmas(SMALL, 4, contracts=weak)
    assert lemmas.violated is not None and lemmas.depth == shortest.depth == len(lemmas.ops)
    assert lemmas.ops[-1].kind == kind


def test_an_unknown_enumeration_is_refused():
    with pytest.raises(ValueError, match="enumeration"):
        bmc_bfs(SMALL, 1, enumeration="sideways")
