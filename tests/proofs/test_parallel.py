"""Z3 queries on worker processes (``kvcheck.proofs.parallel``): the verdicts of one process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from kvcheck.proofs.induction import prove_invariants
from kvcheck.proofs.parallel import Workers
from kvcheck.spec.symbolic import SymScope

HOME = os.getpid()


def _children() -> set[int]:
    out = set()
    for task in Path(f"/proc/{HOME}/task").iterdir():
        try:
            out |= {int(x) for x in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def _where(task):
    return task, os.getpid()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_tasks_are_answered_in_order_by_the_workers_which_end_with_the_pool():
    before = _children()
    with Workers(_where, 3) as pool:
        got = pool.map(list(range(40)))
        assert [t for t, _ in got] == list(range(40))
        pids = {p for _, p in got}
        assert HOME not in pids and len(pids) >= 2, pids  # on the workers
        assert pool.map([7]) == [(7, HOME)]  # one task: answered here
        assert [t for t, _ in pool.map(list(range(5)))] == list(range(5))  # the same workers
    assert _children() == before


def _dies_in_workers(task):
    if os.getpid() != HOME and task % 3 == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return task * task


def test_a_worker_that_dies_is_dropped_and_its_task_answered_here():
    before = _children()
    with Workers(_dies_in_workers, 2) as pool:
        assert pool.map(list(range(12))) == [t * t for t in range(12)]
        assert pool.workers == []  # both died (each was sent a multiple of 3 soon enough)
        assert pool.map(list(range(4))) == [0, 1, 4, 9]  # here alone
    assert _children() == before


def test_a_task_that_cannot_be_sent_is_answered_here():
    tasks = [1, lambda: 2, 3]  # a lambda does not pickle
    with Workers(lambda t: t if isinstance(t, int) else t(), 2) as pool:
        assert pool.map(tasks) == [1, 2, 3]


def test_one_worker_answers_everything_here():
    with Workers(_where, 1) as pool:
        assert pool.map([1, 2, 3]) == [(1, HOME), (2, HOME), (3, HOME)]
        assert pool.workers is None  # never forked


def test_the_induction_gives_the_same_rows_on_workers_as_in_one_process():
    scope = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=6)
    one = prove_invariants(scope, workers=1)
    two = prove_invariants(scope, workers=2)
    assert [(p.property, p.result, p.detail) for p in two] == \
        [(p.property, p.result, p.detail) for p in one]
    assert all(p.result == "proved" for p in one)


def _fork_forgets_refcount(L, pre, post, op, dom):
    """A spec mutation: fork leaves refcounts unchanged."""
    from kvcheck.spec import contracts

    for name, element, formula in contracts.fork(L, pre, post, op, dom):
        if name.startswith("refcount +1"):
            formula = post.ref(element) == pre.ref(element)
        yield name, element, formula


def test_a_broken_contract_is_caught_on_workers_too():
    from kvcheck.spec import contracts

    broken = {**contracts.CONTRACTS, "fork": _fork_forgets_refcount}
    scope = SymScope(num_blocks=4, block_size=2, seqs=3, max_tokens=6)
    one = [(p.property, p.result, p.detail) for p in prove_invariants(scope, contracts=broken,
                                                                      workers=1)]
    two = [(p.property, p.result, p.detail) for p in prove_invariants(scope, contracts=broken,
                                                                      workers=2)]
    assert two == one
    assert ("refcount_conservation", "violated", "not preserved by fork") in two, two
