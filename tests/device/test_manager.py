"""DeviceBlockManager: reference bookkeeping, and the data really moves."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, SHAPE

from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.device import DeviceBlockManager, make
from kvcheck.impl.errors import MisuseError, OutOfBlocks


def _mgr(backend, dtype="bfloat16", blocks=8, bs=4):
    return DeviceBlockManager(blocks, bs, dtype=dtype, device=DEVICE, backend=backend, **SHAPE)


def _kv(m, n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m.kv_shape(n), generator=g).to(m.store.dtype).to(DEVICE),
            torch.randn(m.kv_shape(n), generator=g).to(m.store.dtype).to(DEVICE))


def _eq(a, b):
    return torch.equal(a.cpu(), b.cpu())


def test_prompt_append_fork_cow_free(backend, dtype):
    m = _mgr(backend, dtype)
    k, v = _kv(m, 6, 0)
    m.allocate(0, 6, k, v)
    gk, gv = m.gather(0)
    assert _eq(gk, k) and _eq(gv, v)
    m.fork(0, 1)
    k1, v1 = _kv(m, 1, 1)
    block, off, src = m.append_slot(1, k1, v1)  # partial shared tail: copy-on-write
    assert (off, src) == (2, m.tables[0][-1]) and block != src
    assert _eq(m.gather(1)[0], torch.cat([k, k1], 1)) and _eq(m.gather(1)[1], torch.cat([v, v1], 1))
    assert _eq(m.gather(0)[0], k)  # the parent is untouched
    m.free_seq(0)
    assert _eq(m.gather(1)[0], torch.cat([k, k1], 1))
    assert m.num_free() == 8 - 2


def test_decode_step_matches_reference_bookkeeping_and_data(backend):
    m, ref = _mgr(backend, blocks=12), BlockManager(12, 4)
    k, v = _kv(m, 5, 2)
    for impl in (m, ref):
        impl.allocate(0, 5)
        impl.fork(0, 1)
        impl.fork(0, 2)
        impl.allocate(3, 4)  # full tail
    m_k = {q: m.gather(q)[0] for q in (0, 1, 2, 3)}
    del k, v
    seqs = [2, 0, 3, 1]
    nk, nv = _kv(m, 4, 3)
    before = dict(m.store.launches)
    got = m.decode_step(seqs, nk, nv)
    assert got == [ref.append_slot(q) for q in seqs]
    assert sum(1 for r in got if r[2] is not None) == 2  # two copies, in one launch
    assert m.store.launches["copy"] == before["copy"] + 1
    assert m.store.launches["write"] == before["write"] + 1
    for i, q in enumerate(seqs):
        assert _eq(m.gather(q)[0], torch.cat([m_k[q], nk[:, i : i + 1]], 1))
        assert _eq(m.gather(q)[1][:, -1], nv[:, i])


def test_decode_step_is_all_or_nothing(backend):
    m = _mgr(backend, blocks=3)
    m.allocate(0, 4)  # full: needs a fresh block
    m.allocate(1, 2)
    m.fork(1, 2)  # shared partial tail: needs a copy
    assert m.blocks_needed([0, 1, 2]) == 2  # the second sharer writes in place
    m.allocate(3, 1)  # the last free block
    state = (dict(m.tables), dict(m.lens), list(m.ref), list(m.free))
    data = m.store.key.clone()
    with pytest.raises(OutOfBlocks):
        m.decode_step([0, 1])
    assert (dict(m.tables), dict(m.lens), list(m.ref), list(m.free)) == state
    assert torch.equal(m.store.key.cpu().view(torch.int16), data.cpu().view(torch.int16))


@pytest.mark.parametrize("call, err", [
    (lambda m: m.decode_step([0, 0]), "at most once"),
    (lambda m: m.decode_step([0, 9]), "unknown sequence"),
    (lambda m: m.append_slot(0, torch.zeros(3)), "both k and v"),
    (lambda m: m.append_slot(0, torch.zeros(3), torch.zeros(3)), "shape"),
    (lambda m: m.allocate(5, 2, *(torch.zeros(2, 3, 2, 3),) * 2), "shape"),
    (lambda m: m.allocate(0, 2), "already exists"),
])
def test_misuse_changes_nothing(call, err):
    m = _mgr("torch")
    m.allocate(0, 3)
    state = (dict(m.tables), dict(m.lens), list(m.ref), list(m.free), m._counter)
    with pytest.raises(MisuseError, match=err):
        call(m)
    assert (dict(m.tables), dict(m.lens), list(m.ref), list(m.free), m._counter) == state


def test_plain_api_writes_deterministic_kv(backend):
    a, b = _mgr(backend, "float16"), _mgr(backend, "float16")
    for m in (a, b):
        m.allocate(0, 3)
        assert m.append_slot(0) == (0, 3, None)
    assert _eq(a.gather(0)[0], b.gather(0)[0])
    assert not torch.isnan(a.gather(0)[0].float()).any()


def test_registered_factory_and_bad_sizes():
    m = make(8, 4)
    assert m.capabilities == {"allocate", "append_slot", "fork", "free_seq"}
    assert m.store.device.type == DEVICE.type
    with pytest.raises(MisuseError):
        make(0, 4)
    with pytest.raises(MisuseError, match="dtype"):
        DeviceBlockManager(4, 4, dtype="int8")
