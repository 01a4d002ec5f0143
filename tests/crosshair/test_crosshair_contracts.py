"""CrossHair over the spec-derived contracts (``kvcheck.proofs.crosshair_*``).

The slow tests run ``crosshair check`` in subprocesses through
``run_crosshair``; the budgets are generous upper bounds (the runs take a
few seconds each), never timing assertions.
"""

from __future__ import annotations

import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.proofs import crosshair_contracts as cc
from kvcheck.proofs import crosshair_run as cr
from kvcheck.spec.contracts import Op

from corpus.buggy import ForkWithoutRefcount, NoCopyOnWrite

pytest.importorskip("crosshair")

TINY = "2,1,2,2,1"  # 2 blocks x 1 slot, 2 sequences, prompts <= 2, one prior operation


# -- the contract functions, run concretely (no CrossHair) -----------------------------
def test_decode_always_yields_an_allowed_operation():
    for live in ([], [0], [0, 2], [0, 1, 2]):
        for code in range(60):
            op = cc.decode(code, live)
            assert op is not None
            if op.kind in ("allocate", "fork"):
                new = op.seq if op.kind == "allocate" else op.child
                assert new not in live and new == min(set(range(cc.SCOPE.seqs)) - set(live))
            if op.kind != "allocate":
                assert op.seq in live
    assert {cc.decode(c, [0]).kind for c in range(8)} == set(cc.PROPERTIES)


def test_reference_steps_hold_and_prefixes_replay():
    state = cc.Reached([0, 2, 1])  # allocate(0, 1), fork(0, 1); the rest is past the scope
    assert [op.kind for op in state.ops] == ["allocate", "fork"][: cc.SCOPE.prefix]
    assert state.invariants_hold()
    step = cc.append_slot(state, 0)
    assert step.holds(), step
    assert cc.free_seq(state, 1).holds()


def test_contract_functions_report_the_specs_verdict(monkeypatch):
    monkeypatch.setattr(cc, "ALLOCATOR", ForkWithoutRefcount)
    state = cc.Reached([0])
    step = cc.fork(state, 0, 1)
    assert not step.holds()
    assert any(c.startswith("refcount +1 per entry of the child's table") for c in step.contract)
    assert "refcount_conservation" in step.invariants
    assert "refcount +1 per entry of the child's table" in repr(step)


def test_preconditions_come_from_the_spec():
    state = cc.Reached([])
    assert state.invariants_hold()
    assert state.allows(cc.allocate_op(0, 0))
    assert not state.allows(cc.append_slot_op(0))  # no sequence yet
    assert not state.allows(Op("fork", seq=0, child=0))


# -- parsing CrossHair's report ---------------------------------------------------------
def _parse(out: str, rc: int = 0, err: str = "") -> dict:
    return cr._parse("fork", rc, out, err, 1.0, "t", "s", "cmd")


def test_parse_verdicts():
    f = "/x/proofs/crosshair_contracts.py:12"
    assert _parse(f"{f}: info: Confirmed over all paths.\n")["result"] == cr.PROVED
    assert _parse(f"{f}: info: Not confirmed.\n")["result"] == cr.UNKNOWN
    pre = _parse(f"{f}: info: Unable to meet precondition.\n")
    assert pre["result"] == cr.UNKNOWN and "precondition" in pre["message"]
    bad = _parse(f"{f}: error: false when calling fork(Reached([0]), 0, 1) "
                 f"(which returns <fork(0, 1) -> ok; contract: x>)\n", rc=1)
    assert bad["result"] == cr.COUNTEREXAMPLE
    assert bad["counterexample"] == "fork(Reached([0]), 0, 1) -> <fork(0, 1) -> ok; contract: x>"
    crash = _parse("", rc=2, err="Traceback ...\nImportError: no module x\n")
    assert crash["result"] == cr.UNKNOWN and "ImportError" in crash["message"]


def test_budget_spent_before_start_reports_unknown():
    res = cr.run_crosshair(None, budget_seconds=1, per_condition_timeout=5)
    assert [r["property"] for r in res] == list(cc.PROPERTIES)
    assert all(r["result"] == cr.UNKNOWN and "not started" in r["message"] for r in res)


def test_bad_arguments():
    with pytest.raises(TypeError):
        cr.run_crosshair(42, budget_seconds=1)
    with pytest.raises(ValueError):
        cr.run_crosshair(None, budget_seconds=1, scope="1,2")


# -- CrossHair itself ---------------------------------------------------------------------
def test_crosshair_finds_fork_without_refcount():
    [res] = cr.run_crosshair(ForkWithoutRefcount, budget_seconds=100, per_condition_timeout=60,
                             properties=["fork"], scope=TINY)
    assert res["result"] == cr.COUNTEREXAMPLE, res
    assert "refcount +1 per entry of the child's table" in res["message"]
    assert res["target"] == "corpus.buggy:ForkWithoutRefcount"
    assert res["counterexample"].startswith("fork(")


def test_crosshair_finds_no_copy_on_write_by_target_string():
    # Needs two prior operations (allocate a partial block, fork it) before the write.
    [res] = cr.run_crosshair("corpus.buggy:NoCopyOnWrite", budget_seconds=100,
                             per_condition_timeout=60, properties=["append_slot"],
                             scope="3,2,2,3,2")
    assert res["result"] == cr.COUNTEREXAMPLE, res
    assert "a shared partial block is copied first" in res["message"]
    assert NoCopyOnWrite.__name__ in res["target"]


def test_reference_has_no_counterexample_and_is_proved_in_a_tiny_scope():
    res = cr.run_crosshair(BlockManager, budget_seconds=110, per_condition_timeout=60,
                           scope=TINY, jobs=2)
    assert [r["property"] for r in res] == list(cc.PROPERTIES)
    assert not [r for r in res if r["result"] == cr.COUNTEREXAMPLE], res
    assert all(r["result"] == cr.PROVED for r in res), res
