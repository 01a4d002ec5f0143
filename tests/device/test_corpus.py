"""Every device bug in ``device_bugs`` is caught by the data oracle, with a short trace."""

from __future__ import annotations

from functools import partial

import device_bugs as bugs
import pytest
from conftest import DEVICE, SHAPE

from kvcheck.models.device.oracle import data_verify, run_steps

READ_BACK, SHARED = ("data", "read-back"), ("data", "shared block written")
# What each bug may be reported as (the first check it breaks depends on the trace:
# a stray write into a shared block is overwritten when the block's last sharer
# writes the same slot in the same batch, and then only the read-back sees it).
EXPECTED = {
    bugs.SwappedCopy: {SHARED, READ_BACK},
    bugs.StaleCopySource: {READ_BACK},
    bugs.WriteBeforeCopy: {READ_BACK},
    bugs.WriteIntoShared: {SHARED, READ_BACK},
    bugs.CopyFullBlock: {("contract", "append_slot: a full block is never copied")},
    bugs.OffByOneSlotKernel: {READ_BACK},
}


def _factory(bug, backend):
    kw = {} if bug is bugs.OffByOneSlotKernel else {"backend": backend}
    return partial(bug, dtype="float16", device=DEVICE, **SHAPE, **kw)


@pytest.mark.parametrize("bug", bugs.BUGS, ids=lambda b: b.__name__)
def test_caught_and_shrunk(bug):
    f = _factory(bug, "torch")
    r = data_verify(f, 12, 4, ops=400, seed=0)
    assert not r.ok, f"{bug.__name__} escaped"
    assert r.violation.key in EXPECTED[bug], r.render()
    assert len(r.trace) <= 5, r.render()
    # The shrunk trace is a replayable counterexample.
    v, _ = run_steps(f, 12, 4, [s.request() for s in r.trace])
    assert v is not None and v.key == r.violation.key


@pytest.mark.parametrize("bug", [bugs.WriteBeforeCopy, bugs.SwappedCopy],
                         ids=lambda b: b.__name__)
def test_caught_on_the_triton_kernels_too(bug):
    r = data_verify(_factory(bug, "triton"), 12, 4, ops=400, seed=0, do_shrink=False)
    assert not r.ok and r.violation.key in EXPECTED[bug]


def test_write_before_copy_needs_a_batch_with_a_copy():
    r = data_verify(_factory(bugs.WriteBeforeCopy, "torch"), 12, 4, ops=400, seed=0)
    kinds = [s.kind for s in r.trace]
    assert "fork" in kinds
    last = r.trace[-1]
    results = last.result if isinstance(last.result, list) else [last.result]
    assert any(res is not None and res[2] is not None for res in results)
