"""The three kernels, Triton (interpreted on the CPU) and torch, against plain loops."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from kvcheck.impl.device import kernels
from kvcheck.impl.device.store import PagedKVStore

L, NB, BS, H, D = 2, 6, 4, 2, 3


def _cache(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn((L, NB, BS, H, D), generator=g).to(dtype).to(DEVICE)
    vc = torch.randn((L, NB, BS, H, D), generator=g).to(dtype).to(DEVICE)
    return kc, vc


def _ids(xs):
    return torch.tensor(xs, dtype=torch.int64, device=DEVICE)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def test_copy_blocks(backend, dtype):
    dt = getattr(torch, dtype)
    kc, vc = _cache(dt)
    want_k, want_v = kc.clone(), vc.clone()
    pairs = [(1, 4), (3, 0), (1, 5)]
    for s, d in pairs:
        want_k[:, d] = want_k[:, s]
        want_v[:, d] = want_v[:, s]
    kernels.copy_blocks(kc, vc, _ids([p[0] for p in pairs]), _ids([p[1] for p in pairs]),
                        backend)
    assert _same(kc, want_k) and _same(vc, want_v)


def test_write_slots_skips_padding(backend, dtype):
    dt = getattr(torch, dtype)
    kc, vc = _cache(dt)
    want_k, want_v = kc.clone(), vc.clone()
    slots = [5, -1, 0, 23, 12]
    g = torch.Generator().manual_seed(1)
    k = torch.randn((L, len(slots), H, D), generator=g).to(dt).to(DEVICE)
    v = torch.randn((L, len(slots), H, D), generator=g).to(dt).to(DEVICE)
    for i, s in enumerate(slots):
        if s >= 0:
            want_k[:, s // BS, s % BS] = k[:, i]
            want_v[:, s // BS, s % BS] = v[:, i]
    kernels.write_slots(kc, vc, k, v, _ids(slots), backend)
    assert _same(kc, want_k) and _same(vc, want_v)


def test_gather_through_tables(backend, dtype):
    dt = getattr(torch, dtype)
    kc, vc = _cache(dt)
    tables = [[5, 2], [0, 0], [3, 1]]  # padded rows; the kernel reads only what it needs
    toks = [(0, 0), (0, 5), (2, 7), (1, 1), (2, 0), (0, 3)]
    ko, vo = kernels.gather(kc, vc, _ids(tables), _ids([s for s, _ in toks]),
                            _ids([p for _, p in toks]), backend)
    for i, (s, p) in enumerate(toks):
        b = tables[s][p // BS]
        assert _same(ko[:, i], kc[:, b, p % BS]) and _same(vo[:, i], vc[:, b, p % BS])


def test_backends_agree_on_random_batches():
    g = torch.Generator().manual_seed(7)
    for trial in range(3):
        out = {be: _cache(torch.bfloat16, seed=trial) for be in ("triton", "torch")}
        src, dst = _ids([0, 2]), _ids([1, 3])
        slots = _ids([8, 9, 22])
        k = torch.randn((L, 3, H, D), generator=g).to(torch.bfloat16).to(DEVICE)
        v = torch.randn((L, 3, H, D), generator=g).to(torch.bfloat16).to(DEVICE)
        for be, (kc, vc) in out.items():
            kernels.copy_blocks(kc, vc, src, dst, be)
            kernels.write_slots(kc, vc, k, v, slots, be)
        assert _same(out["triton"][0], out["torch"][0])
        assert _same(out["triton"][1], out["torch"][1])


def test_store_counts_one_launch_per_batch(backend):
    st = PagedKVStore(NB, BS, L, H, D, "float16", DEVICE, backend)
    st.copy_blocks([(0, 1), (2, 3), (4, 5)])
    st.write_slots([1, 2, 3], *(torch.zeros((L, 3, H, D), dtype=torch.float16,
                                            device=DEVICE),) * 2)
    st.gather([[0], [1, 2]], [3, 5])
    assert st.launches == {"copy": 1, "write": 1, "gather": 1}


def test_backend_resolution(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels.resolve_backend("auto", cpu) == "torch"
    with pytest.raises(ValueError, match="interpreter"):
        kernels.resolve_backend("triton", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.resolve_backend("auto", cpu) == "triton"
    with pytest.raises(ValueError, match="backend must be one of"):
        kernels.resolve_backend("cuda-graphs", cpu)


def test_store_rejects_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="dtype"):
        PagedKVStore(4, 4, dtype="float64", device=DEVICE, backend="torch")
    with pytest.raises(ValueError, match="head_dim"):
        PagedKVStore(4, 4, head_dim=0, device=DEVICE, backend="torch")
    st = PagedKVStore(4, 4, 1, 1, 2, device=DEVICE, backend="torch")
    with pytest.raises(ValueError, match="shape"):
        st.check_kv(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3), 2)
