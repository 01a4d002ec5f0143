"""A data target misbehaving in a data call is a violation of the right kind, never raised:
an exception, a hang, a result of the wrong shape or dtype; and what cannot be a data target
at all is bad input."""

from __future__ import annotations

import data_targets as dt
import pytest

from kvcheck.impl.block_manager import BlockManager
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

CASES = [
    (dt.RaisingGather, "crash", "gather_many", "illegal memory access"),
    (dt.GarbageGather, "malformed", "gather", "returned 1 results"),
    (dt.NotTensors, "malformed", "gather", "expected (k, v) tensors"),
    (dt.WrongDtype, "data", "read-back", "torch.float32"),
    (dt.HangingRunStep, "hang", "run_step", "did not return within"),
    (dt.BadKvShape, "malformed", "kv_shape", "kv_shape(1) returned (1,)"),
    (dt.BadBlockData, "malformed", "block_data", "expected (k, v)"),
    (dt.MetaGather, "malformed", "gather", "not a dense tensor kvcheck can read"),
    (dt.SparseBlockData, "malformed", "block_data", "each a dense tensor"),
]


@pytest.mark.parametrize("cls,kind,name,words", CASES, ids=lambda x: getattr(x, "__name__", x))
def test_misbehaviour_is_a_violation(cls, kind, name, words):
    r = verify(cls, 8, 2, ops=300, seed=1, timeout=0.5, model="device", shrink_budget=3.0)
    assert not r.ok
    assert (r.violation.kind, r.violation.name) == (kind, name), r.violation
    assert words in r.violation.witness, r.violation.witness
    assert r.trace.violation.step == len(r.trace.ops)  # it ends the trace
    if kind != "hang":  # (each candidate still hanging costs a timeout: not within 3 s)
        assert len(r.trace.ops) <= 3 and r.trace.minimality.startswith("1-minimal")


def test_not_a_data_target_is_bad_input():
    with pytest.raises(TargetError, match="BlockManager is not a data target: missing "
                                          "reserve_slot"):
        verify(BlockManager, 8, 2, ops=10, model="device")
