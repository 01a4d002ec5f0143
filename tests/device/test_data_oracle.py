"""The device model's run state on the device manager: passes on it, sees one wrong bit."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import DEVICE, SHAPE

from kvcheck.check.model import Options
from kvcheck.check.run import replay
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.device import DeviceBlockManager
from kvcheck.models.device import MODEL, DecodeStep, DeviceScope
from kvcheck.models.device.oracle import DataOracle
from kvcheck.report.text import render
from kvcheck.spec.contracts import Op
from kvcheck.verify import verify


def _factory(backend, dtype="bfloat16"):
    return partial(DeviceBlockManager, dtype=dtype, device=DEVICE, backend=backend, **SHAPE)


def data_verify(factory, num_blocks, block_size, **kw):
    return verify(factory, num_blocks, block_size, model="device", **kw)


def _why(r) -> str:
    return "" if r.trace is None else render(r.trace)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_backend_passes(seed, dtype):
    r = data_verify(_factory("torch", dtype), 12, 4, ops=300, seed=seed)
    assert r.ok, _why(r)


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_triton_kernels_pass(mode):
    r = data_verify(_factory("triton"), 10, 2, ops=120, seed=5, mode=mode)
    assert r.ok, _why(r)


def test_batches_run_and_are_checked():
    r = data_verify(_factory("torch"), 16, 4, ops=200, seed=1, extra={"batch_prob": 1.0})
    assert r.ok
    assert r.state.stats["decode_steps"] > 20 and r.state.stats["copies"] > 0
    d = DataOracle(_factory("torch")(16, 4), seed=0)
    history = [Op("allocate", seq=0, n_tokens=3), Op("fork", seq=0, child=1),
               DecodeStep(seqs=[1, 0])]
    for op in history:
        assert d.step(op) is None
    assert [s.kind for s in history] == ["allocate", "fork", "decode_step"]
    assert history[-1].reserved[0][2] is not None  # the first sharer copied
    assert history[-1].reserved[1][2] is None  # the last one writes in place
    with pytest.raises(ValueError, match="at most once"):
        d.step(DecodeStep(seqs=[0, 0]))
    with pytest.raises(ValueError, match="not live"):
        d.step(DecodeStep(seqs=[7]))
    assert not d.valid(DecodeStep(seqs=[])) and d.valid(DecodeStep(seqs=[0]))


def test_one_flipped_bit_is_a_read_back_violation():
    m = _factory("torch", "float16")(8, 4)
    d = DataOracle(m, seed=0)
    assert d.step(Op("allocate", seq=0, n_tokens=6)) is None
    block = m.tables[0][1]
    m.store.value.view(torch.int16)[1, block, 0, 1, 2] ^= 1  # one ulp, layer 1, position 4
    v = d.check()
    assert (v.kind, v.name, v.element, v.details["position"]) == ("data", "read-back", 0, 4)
    assert "K/V that no sequence was given" in v.witness


def test_a_slot_from_another_sequence_is_named():
    m = _factory("torch")(8, 4)
    d = DataOracle(m, seed=0)
    d.step(Op("allocate", seq=0, n_tokens=2))
    d.step(Op("allocate", seq=1, n_tokens=2))
    b0, b1 = m.tables[0][0], m.tables[1][0]
    m.store.key[:, b1, 1] = m.store.key[:, b0, 1]
    m.store.value[:, b1, 1] = m.store.value[:, b0, 1]
    v = d.check()
    assert "the K/V given to sequence 0 for its token 1" in v.witness


def test_replay_and_not_a_data_target():
    steps = data_verify(_factory("torch"), 8, 2, ops=40, seed=3)
    assert steps.ok
    r = replay(MODEL, _factory("torch"), DeviceScope(8, 2), [], Options())
    assert r.violation is None and r.ops == []
    with pytest.raises(TypeError, match="not a data target"):
        DataOracle(BlockManager(4, 4))
