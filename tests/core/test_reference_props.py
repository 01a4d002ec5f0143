"""Property-based and stateful tests of the reference block manager."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck import Oracle, SeedAdapter, make_state_machine
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import MisuseError, OutOfBlocks
from kvcheck.spec.contracts import Op

# -- the Hypothesis state machine over the reference, both oracle modes ----------------
TestReferenceFull = make_state_machine(BlockManager, num_blocks=6, block_size=2).TestCase
TestReferenceFull.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestReferenceFast = make_state_machine(BlockManager, num_blocks=5, block_size=3,
                                       mode="fast").TestCase
TestReferenceFast.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_state_machine_by_registered_name():
    machine = make_state_machine("reference", num_blocks=4, block_size=2)
    assert {"allocate", "append_slot", "fork", "free_seq"} <= set(dir(machine))


# -- the seed's worked example ---------------------------------------------------------
def test_worked_example_exactly():
    """fork seq 0 at 6 tokens (4-token blocks): seq 0 copies block 1 into block 2,
    then seq 1 writes block 1 in place."""
    bm = BlockManager(8, 4)
    bm.allocate(0, 6)
    assert bm.tables[0] == [0, 1]
    bm.fork(0, 1)
    assert bm.ref[:2] == [2, 2]
    assert bm.append_slot(0) == (2, 2, 1)
    assert bm.append_slot(1) == (1, 2, None)
    assert bm.tables == {0: [0, 2], 1: [0, 1]} and bm.ref[:3] == [2, 1, 1]


@settings(max_examples=200, deadline=None)
@given(block_size=st.integers(2, 8), data=st.data())
def test_worked_example_generalised(block_size, data):
    """Any partial last block shared by a fork: the first writer copies it, the
    second then owns it alone and writes in place; the oracle agrees at each step."""
    full = data.draw(st.integers(0, 3), label="full blocks")
    partial = data.draw(st.integers(1, block_size - 1), label="tokens in the tail")
    n = full * block_size + partial
    need = full + 1
    num_blocks = data.draw(st.integers(need + 1, need + 6), label="pool")
    oracle = Oracle(SeedAdapter(BlockManager(num_blocks, block_size), num_blocks, block_size),
                    mode="full")
    bm = oracle.target.impl
    ops = [Op("allocate", seq=0, n_tokens=n), Op("fork", seq=0, child=1),
           Op("append_slot", seq=0), Op("append_slot", seq=1)]
    for op in ops[:2]:
        assert oracle.step(op) is None
    tail = bm.tables[0][-1]
    assert oracle.step(ops[2]) is None
    assert ops[2].cow_src == tail and ops[2].block != tail and ops[2].offset == partial
    assert bm.ref[tail] == 1
    assert oracle.step(ops[3]) is None
    assert (ops[3].block, ops[3].offset, ops[3].cow_src) == (tail, partial, None)
    assert oracle.sweep() is None


# -- misuse: a clear MisuseError, and nothing changed ---------------------------------
def _state(bm):
    return (list(bm.free), list(bm.ref), {q: list(t) for q, t in bm.tables.items()},
            dict(bm.lens), {q: id(t) for q, t in bm.tables.items()})


def _busy():
    bm = BlockManager(6, 2)
    bm.allocate(0, 3)
    bm.fork(0, 1)
    bm.append_slot(1)
    return bm


MISUSE = [
    ("append to unknown", lambda bm: bm.append_slot(7), "unknown sequence 7"),
    ("free unknown", lambda bm: bm.free_seq(7), "unknown sequence 7"),
    ("fork unknown parent", lambda bm: bm.fork(7, 8), "unknown sequence 7"),
    ("allocate duplicate", lambda bm: bm.allocate(0, 2), "sequence 0 already exists"),
    ("fork onto live id", lambda bm: bm.fork(0, 1), "sequence 1 already exists"),
    ("fork onto itself", lambda bm: bm.fork(0, 0), "sequence 0 already exists"),
    ("zero tokens", lambda bm: bm.allocate(5, 0), "n_tokens must be a positive integer"),
    ("negative tokens", lambda bm: bm.allocate(5, -3), "n_tokens must be a positive integer"),
    ("bool tokens", lambda bm: bm.allocate(5, True), "n_tokens must be a positive integer"),
    ("str tokens", lambda bm: bm.allocate(5, "4"), "n_tokens must be a positive integer"),
]


@pytest.mark.parametrize("name,call,message", MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_and_changes_nothing(name, call, message):
    bm = _busy()
    before = _state(bm)
    with pytest.raises(MisuseError, match=message):
        call(bm)
    assert _state(bm) == before


@pytest.mark.parametrize("nb,bs", [(0, 4), (-1, 4), (4, 0), (4, -2), (True, 4), (4, 2.0)])
def test_non_positive_sizes(nb, bs):
    with pytest.raises(MisuseError, match="must be a positive integer"):
        BlockManager(nb, bs)


def test_misuse_is_a_value_error_not_out_of_blocks():
    assert issubclass(MisuseError, ValueError) and not issubclass(MisuseError, OutOfBlocks)


# -- exception safety of append_slot under OutOfBlocks --------------------------------
@pytest.mark.parametrize("case", ["boundary", "copy-on-write"])
def test_append_out_of_blocks_changes_nothing(case):
    bm = BlockManager(3, 2)
    if case == "boundary":
        bm.allocate(0, 4)  # two full blocks
        bm.allocate(1, 1)  # the last free block
    else:
        bm.allocate(0, 3)  # [full, partial]
        bm.fork(0, 1)
        bm.allocate(2, 1)
    assert not bm.free
    before = _state(bm)
    with pytest.raises(OutOfBlocks):
        bm.append_slot(0)
    assert _state(bm) == before

    # the oracle agrees the failure was allowed and changed nothing (exception_safety)
    oracle = Oracle(SeedAdapter(BlockManager(3, 2), 3, 2), mode="full")
    setup = ([Op("allocate", seq=0, n_tokens=4), Op("allocate", seq=1, n_tokens=1)]
             if case == "boundary" else
             [Op("allocate", seq=0, n_tokens=3), Op("fork", seq=0, child=1),
              Op("allocate", seq=2, n_tokens=1)])
    for op in [*setup, Op("append_slot", seq=0)]:
        assert oracle.step(op) is None
    assert op.outcome == "oob"


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["allocate", "append_slot", "fork", "free_seq"]),
                              st.integers(0, 3), st.integers(1, 6)), max_size=25))
def test_random_runs_with_out_of_blocks_keep_state(ops):
    """On any run, every OutOfBlocks leaves the full state as it was, and the
    oracle (full mode) finds nothing."""
    oracle = Oracle(SeedAdapter(BlockManager(3, 2), 3, 2), mode="full")
    bm, nxt = oracle.target.impl, 10
    for kind, q, n in ops:
        op = Op(kind, seq=q, child=nxt, n_tokens=n)
        nxt += 1
        if not oracle.valid(op):
            continue
        before = _state(bm)
        assert oracle.step(op) is None
        if op.outcome == "oob":
            assert _state(bm) == before
    assert oracle.sweep() is None
