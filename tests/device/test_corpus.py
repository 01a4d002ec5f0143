"""Every device bug in ``device_bugs`` is caught by the device model, with a short trace;
fast and full mode agree on every one of them and on the correct store."""

from __future__ import annotations

from functools import partial

import device_bugs as bugs
import pytest
from conftest import DEVICE, SHAPE

from kvcheck.check.model import Options
from kvcheck.check.run import drive, replay
from kvcheck.check.trace import Trace
from kvcheck.impl.device import DeviceBlockManager
from kvcheck.models.device import MODEL, DeviceScope
from kvcheck.report.text import render
from kvcheck.verify import verify

EXPECTED, LENGTH_BEFORE = bugs.EXPECTED, bugs.LENGTH_BEFORE


def _factory(bug, backend):
    kw = {} if bug is bugs.OffByOneSlotKernel else {"backend": backend}
    return partial(bug, dtype="float16", device=DEVICE, **SHAPE, **kw)


def data_verify(factory, num_blocks, block_size, **kw):
    return verify(factory, num_blocks, block_size, model="device", **kw)


@pytest.mark.parametrize("bug", bugs.BUGS, ids=lambda b: b.__name__)
def test_caught_and_shrunk(bug):
    f = _factory(bug, "torch")
    r = data_verify(f, 12, 4, ops=400, seed=0)
    assert not r.ok, f"{bug.__name__} escaped"
    assert r.violation.key in EXPECTED[bug], render(r.trace)
    assert len(r.trace.ops) <= LENGTH_BEFORE[bug], render(r.trace)
    assert r.trace.minimality.startswith("1-minimal"), r.trace.minimality
    # The shrunk trace is a replayable counterexample, also once written and read back.
    loaded = Trace.loads(r.trace.dumps())
    assert loaded.model == "device"
    v = replay(MODEL, f, loaded.scope, loaded.ops, Options()).violation
    assert v is not None and v.key == r.violation.key


@pytest.mark.parametrize("bug", [bugs.WriteBeforeCopy, bugs.SwappedCopy],
                         ids=lambda b: b.__name__)
def test_caught_on_the_triton_kernels_too(bug):
    r = data_verify(_factory(bug, "triton"), 12, 4, ops=400, seed=0, do_shrink=False)
    assert not r.ok and r.violation.key in EXPECTED[bug]


def test_write_before_copy_needs_a_batch_with_a_copy():
    r = data_verify(_factory(bugs.WriteBeforeCopy, "torch"), 12, 4, ops=400, seed=0)
    kinds = [s.kind for s in r.trace.ops]
    assert "fork" in kinds
    last = r.trace.ops[-1]
    results = last.reserved if last.kind == "decode_step" else [
        (last.block, last.offset, last.cow_src)]
    assert any(res is not None and res[2] is not None for res in results)


# -- fast and full mode: the same verdicts --------------------------------------------------
def _both_modes(factory, nb, bs, ops, seed, batch_prob=0.3):
    runs = []
    for mode in ("fast", "full"):
        options = Options(mode=mode, seed=seed, extra={"batch_prob": batch_prob})
        runs.append(drive(MODEL, factory, DeviceScope(nb, bs), options, seed, ops))
    fast, full = runs
    assert [MODEL.op_to_json(o) for o in fast.history] == \
           [MODEL.op_to_json(o) for o in full.history]
    assert (fast.violation is None) == (full.violation is None), (fast.violation, full.violation)
    if fast.violation is not None:
        a, b = fast.violation, full.violation
        assert (a.step, a.kind, a.name, a.element) == (b.step, b.kind, b.name, b.element)
    return fast


@pytest.mark.parametrize("bug", bugs.BUGS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_and_full_agree_on_the_corpus(bug, seed):
    run = _both_modes(_factory(bug, "torch"), 12, 4, 400, seed)
    assert run.violation is not None and run.violation.key in EXPECTED[bug]


@pytest.mark.parametrize("backend,ops", [("torch", 400), ("triton", 80)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_and_full_agree_on_the_correct_store(backend, ops, seed):
    f = partial(DeviceBlockManager, dtype="bfloat16", device=DEVICE, backend=backend, **SHAPE)
    run = _both_modes(f, 8, 2, ops, seed, batch_prob=0.5)
    assert run.violation is None and run.steps == ops
