"""The paged KV store: the K and V cache tensors and the three kernels on them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import kernels

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def default_device() -> torch.device:
    """``cuda`` when a GPU is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


class PagedKVStore:
    """K and V caches ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``.

    Never-written slots hold NaN, so a read of one never looks like real data.
    """

    def __init__(self, num_blocks: int, block_size: int, num_layers: int = 1,
                 num_kv_heads: int = 1, head_dim: int = 8, dtype="float16",
                 device=None, backend: str = "auto"):
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.dtype = as_dtype(dtype)
        self.device = torch.device(device) if device is not None else default_device()
        self.backend = kernels.resolve_backend(backend, self.device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key = torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
        self.value = torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
        self.launches = {"copy": 0, "write": 0, "gather": 0}  # kernel launches, for tests

    @property
    def token_shape(self) -> tuple[int, int, int]:
        """Shape of one token's K (or V) over all layers, per token: (L, H, D)."""
        return (self.num_layers, self.num_kv_heads, self.head_dim)

    def kv_shape(self, n: int) -> tuple[int, int, int, int]:
        """Shape of ``n`` tokens' K (or V): ``[num_layers, n, num_kv_heads, head_dim]``."""
        return (self.num_layers, n, self.num_kv_heads, self.head_dim)

    def check_kv(self, k, v, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``k``/``v`` as tensors of shape ``kv_shape(n)`` on this device and dtype."""
        want = self.kv_shape(n)
        out = []
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a tensor of shape {want}, got {got}")
            out.append(t.to(device=self.device, dtype=self.dtype))
        return out[0], out[1]

    def _ids(self, xs: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(xs), dtype=torch.int64, device=self.device)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """One launch: block ``src`` -> ``dst`` for every ``(src, dst)`` pair."""
        if not pairs:
            return
        self.launches["copy"] += 1
        src = self._ids([p[0] for p in pairs])
        dst = self._ids([p[1] for p in pairs])
        kernels.copy_blocks(self.key, self.value, src, dst, self.backend)

    def write_slots(self, slots: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """One launch: token ``i`` of ``k``/``v`` into slot ``slots[i]``."""
        if not len(slots):
            return
        self.launches["write"] += 1
        kernels.write_slots(self.key, self.value, k, v, self._ids(slots), self.backend)

    def gather(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One launch: every sequence's K/V read back through its block table."""
        if not tables:
            return []
        self.launches["gather"] += 1
        width = max(1, max(len(t) for t in tables))
        padded = [list(t) + [0] * (width - len(t)) for t in tables]
        tab = torch.tensor(padded, dtype=torch.int64, device=self.device)
        lens = self._ids(lengths)
        total = sum(lengths)  # known on the host: no device sync, no size computation
        tok_seq = torch.repeat_interleave(torch.arange(len(tables), device=self.device), lens,
                                          output_size=total)
        starts = torch.cumsum(lens, 0) - lens
        tok_pos = torch.arange(total, device=self.device) - starts[tok_seq]
        ko, vo = kernels.gather(self.key, self.value, tab, tok_seq, tok_pos, self.backend)
        out, at = [], 0
        for n in lengths:
            out.append((ko[:, at : at + n], vo[:, at : at + n]))
            at += n
        return out
