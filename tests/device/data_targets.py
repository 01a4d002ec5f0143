"""Data targets that misbehave in the data calls only (the bookkeeping is the reference's):
the device model reports each as a violation, never raises."""

from __future__ import annotations

import time

import torch

from kvcheck.impl.device import DeviceBlockManager

SMALL = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "backend": "torch"}


class _Small(DeviceBlockManager):
    def __init__(self, num_blocks, block_size, **kw):
        super().__init__(num_blocks, block_size, **{**SMALL, **kw})


class RaisingGather(_Small):
    """gather_many raises once a sequence has three tokens."""

    def gather_many(self, seqs):
        if any(self.lens[q] >= 3 for q in seqs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().gather_many(seqs)


class GarbageGather(_Small):
    """gather_many returns one pair too few once there are two sequences."""

    def gather_many(self, seqs):
        got = super().gather_many(seqs)
        return got[:-1] if len(seqs) > 1 else got


class NotTensors(_Small):
    """gather_many returns a list for the K of an odd-numbered sequence."""

    def gather_many(self, seqs):
        got = super().gather_many(seqs)
        return [(k.tolist(), v) if q % 2 else (k, v) for q, (k, v) in zip(seqs, got, strict=True)]


class WrongDtype(_Small):
    """gather_many reads back float32 (the values right, the bits not)."""

    def gather_many(self, seqs):
        return [(k.float(), v.float()) for k, v in super().gather_many(seqs)]


class HangingRunStep(_Small):
    """run_step never returns once a copy-on-write copy is needed."""

    def run_step(self, reserved, k, v):
        if any(src is not None for _, _, src in reserved):
            while True:
                time.sleep(0.01)
        super().run_step(reserved, k, v)


class BadKvShape(_Small):
    """kv_shape says nonsense."""

    def kv_shape(self, n):
        return (n,)


class BadBlockData(_Small):
    """block_data returns one tensor."""

    def block_data(self, block):
        return torch.zeros(3)


def _bug(name):
    import device_bugs

    cls = getattr(device_bugs, name)

    def make(num_blocks, block_size, **shape):
        return cls(num_blocks, block_size, **{**SMALL, **shape})

    make.__qualname__ = f"{name} (small, torch)"
    return make


# The corpus bugs as command-line targets (data_targets.py:write_before_copy), small and on
# the torch backend (quick under the Triton interpreter too).
write_before_copy = _bug("WriteBeforeCopy")
swapped_copy = _bug("SwappedCopy")


def correct(num_blocks, block_size, **shape):
    return DeviceBlockManager(num_blocks, block_size, **{**SMALL, **shape})


class AbortInRunStep(_Small):
    """run_step ends the process (as a crash in a kernel's C code would) on a copy."""

    def run_step(self, reserved, k, v):
        if any(src is not None for _, _, src in reserved):
            import os

            os.abort()
        super().run_step(reserved, k, v)


class MetaGather(_Small):
    """gather_many returns tensors on the meta device (no data at all)."""

    def gather_many(self, seqs):
        return [(k.to("meta"), v.to("meta")) for k, v in super().gather_many(seqs)]


class SparseBlockData(_Small):
    """block_data returns sparse tensors."""

    def block_data(self, block):
        k, v = super().block_data(block)
        return k.float().to_sparse(), v.float().to_sparse()
