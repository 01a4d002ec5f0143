"""What a data target offers, and the target as the structural oracle drives it (no torch).

A *data target* is a ``Target`` (``kvcheck.targets``) that also moves real K/V::

    allocate(seq, n, k, v)        append_slot(seq, k, v)
    reserve_slot(seq) -> (block, offset, cow_src)     (bookkeeping only)
    run_step(reserved, k, v)      (every copy-on-write copy, then every write)
    gather_many(seqs) -> [(k, v)] each [L, len, H, D]
    block_data(block) -> (k, v)   each [L, block_size, H, D] (raw, no table)
    kv_shape(n) -> (L, n, H, D)   and attribute ``store.dtype`` / ``store.device``

``kvcheck.impl.device.DeviceBlockManager`` is one.
"""

from __future__ import annotations

from kvcheck.targets.loading import TargetError
from kvcheck.targets.protocol import SeedAdapter

DATA_METHODS = ("reserve_slot", "run_step", "gather_many", "block_data", "kv_shape")
DECODE = "decode_step"  # the operation a data target offers beyond the four


class NotDataTarget(TargetError, TypeError):
    """The target cannot hold K/V the device model can check (bad input, exit 2)."""


def missing_methods(obj: object) -> list[str]:
    return [m for m in DATA_METHODS if not callable(getattr(obj, m, None))]


def is_data_target(obj: object) -> bool:
    return not missing_methods(obj)


class DataTarget:
    """The target as the structural ``Oracle`` drives it: the step's K/V attached to
    ``allocate`` and ``append_slot`` (``kv``), ``append_slot`` only reserving its slot
    inside a decode step (``reserve_only``), and, on a GPU, every call waiting for the
    device (``cuda``) so that an asynchronous kernel fault is the call's own.

    ``capabilities`` are the target's plus ``decode_step`` where it appends; every
    other attribute is the target's."""

    _READS = ("block_table", "refcount", "free_blocks", "num_free", "table_identity", "seq_len",
              "is_out_of_blocks")

    def __init__(self, target):
        gaps = missing_methods(target)
        if gaps:
            name = type(target.impl if isinstance(target, SeedAdapter) else target).__name__
            raise NotDataTarget(f"{name} is not a data target: missing "
                                f"{', '.join(gaps)} (the device model moves and reads K/V "
                                f"through them)")
        self.t = target
        self.num_blocks, self.block_size = target.num_blocks, target.block_size
        caps = frozenset(target.capabilities)
        self.capabilities = caps | {DECODE} if "append_slot" in caps else caps
        self.kv = None  # (k, v) for the next allocate / append_slot
        self.reserve_only = False  # inside a decode step: bookkeeping only
        self.cuda = False  # set by the oracle: synchronise after every call
        for name in self._READS:  # the hot reads, bound once
            if hasattr(target, name):
                setattr(self, name, getattr(target, name))

    def __getattr__(self, name):  # optional reads (refcounts, spelling), anything else
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            t = self.__dict__["t"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(t, name)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def allocate(self, seq, n_tokens):
        self.t.allocate(seq, n_tokens, *self.kv)
        self.sync()

    def append_slot(self, seq):
        if self.reserve_only:
            return self.t.reserve_slot(seq)
        result = self.t.append_slot(seq, *self.kv)
        self.sync()
        return result

    def fork(self, parent, child):
        self.t.fork(parent, child)
        self.sync()

    def free_seq(self, seq):
        self.t.free_seq(seq)
        self.sync()
