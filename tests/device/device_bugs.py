"""A corpus of device-side bugs: each a ``DeviceBlockManager`` with one mistake.

The bookkeeping (free list, refcounts, tables) is right in all but
``CopyFullBlock``; the rest only move the data wrongly, so only the data
oracle can see them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvcheck.impl.device import DeviceBlockManager
from kvcheck.impl.device.kernels import _pow2
from kvcheck.impl.errors import OutOfBlocks


class SwappedCopy(DeviceBlockManager):
    """copy-on-write with source and destination swapped: the fresh block is
    copied over the shared one."""

    def run_step(self, reserved, k, v):
        bs = self.block_size
        self.store.copy_blocks([(block, src) for block, _, src in reserved if src is not None])
        self.store.write_slots([block * bs + off for block, off, _ in reserved], k, v)


class StaleCopySource(DeviceBlockManager):
    """the copy's source is looked up in the table *after* the table was
    updated, so the new block is copied onto itself."""

    def run_step(self, reserved, k, v):
        bs = self.block_size
        self.store.copy_blocks([(block, block) for block, _, src in reserved if src is not None])
        self.store.write_slots([block * bs + off for block, off, _ in reserved], k, v)


class WriteBeforeCopy(DeviceBlockManager):
    """the batched step launches the slot writes before the block copies."""

    def run_step(self, reserved, k, v):
        bs = self.block_size
        self.store.write_slots([block * bs + off for block, off, _ in reserved], k, v)
        self.store.copy_blocks([(src, block) for block, _, src in reserved if src is not None])


class WriteIntoShared(DeviceBlockManager):
    """copies on write but then writes the token into the old, shared block."""

    def run_step(self, reserved, k, v):
        bs = self.block_size
        self.store.copy_blocks([(src, block) for block, _, src in reserved if src is not None])
        slots = [(block if src is None else src) * bs + off for block, off, src in reserved]
        self.store.write_slots(slots, k, v)


class CopyFullBlock(DeviceBlockManager):
    """a full, shared tail block is treated as copy-on-write: the new tail
    block is a copy of the full one and ``cow_src`` says so."""

    def reserve_slot(self, seq):
        table = self._live(seq)
        n = self.lens[seq]
        if n % self.block_size == 0 and self.ref[table[-1]] > 1:
            if not self.free:
                raise OutOfBlocks("no free block")
            new = self._take()
            table.append(new)
            self.lens[seq] = n + 1
            return new, 0, table[-2]
        return super().reserve_slot(seq)


@triton.jit
def _off_by_one_write(kc_ptr, vc_ptr, k_ptr, v_ptr, slots_ptr, n_tokens, n_slots,
                      cache_layer_stride, new_layer_stride, row,
                      TOK: tl.constexpr, ROW: tl.constexpr):
    layer = tl.program_id(1).to(tl.int64)
    toks = tl.program_id(0) * TOK + tl.arange(0, TOK)
    tmask = toks < n_tokens
    slots = tl.load(slots_ptr + toks, mask=tmask, other=-1).to(tl.int64)
    # (still masked to the cache: the wrong slot, never memory outside the tensor, which
    # under the interpreter would corrupt the test process once a shrunk pool makes the
    # last slot of the last block the one written)
    tmask = tmask & (slots >= 0) & (slots + 1 < n_slots)
    cols = tl.arange(0, ROW)
    mask = tmask[:, None] & (cols < row)[None, :]
    src = layer * new_layer_stride + toks.to(tl.int64)[:, None] * row + cols[None, :]
    dst = layer * cache_layer_stride + (slots[:, None] + 1) * row + cols[None, :]  # BUG: +1
    tl.store(kc_ptr + dst, tl.load(k_ptr + src, mask=mask), mask=mask)
    tl.store(vc_ptr + dst, tl.load(v_ptr + src, mask=mask), mask=mask)


class OffByOneSlotKernel(DeviceBlockManager):
    """the decode path's Triton slot-write kernel writes one slot too far
    (prefill uses the correct kernel)."""

    def __init__(self, num_blocks, block_size, **kw):
        super().__init__(num_blocks, block_size, backend="triton", **kw)

    def run_step(self, reserved, k, v):
        bs = self.block_size
        self.store.copy_blocks([(src, block) for block, _, src in reserved if src is not None])
        st = self.store
        L, nb, _, h, d = st.key.shape
        row, n = h * d, len(reserved)
        slots = torch.tensor([b * bs + o for b, o, _ in reserved], dtype=torch.int64,
                             device=st.device)
        tok = _pow2(n)
        _off_by_one_write[(triton.cdiv(n, tok), L)](
            st.key, st.value, k.contiguous(), v.contiguous(), slots, n, nb * bs,
            nb * bs * row, n * row, row, TOK=tok, ROW=_pow2(row))


BUGS = [SwappedCopy, StaleCopySource, WriteBeforeCopy, WriteIntoShared, CopyFullBlock,
        OffByOneSlotKernel]

READ_BACK, SHARED = ("data", "read-back"), ("data", "shared block written")
# What each bug may be reported as (the first check it breaks depends on the trace:
# a stray write into a shared block is overwritten when the block's last sharer
# writes the same slot in the same batch, and then only the read-back sees it).
EXPECTED = {
    SwappedCopy: {SHARED, READ_BACK},
    StaleCopySource: {READ_BACK},
    WriteBeforeCopy: {READ_BACK},
    WriteIntoShared: {SHARED, READ_BACK},
    CopyFullBlock: {("contract", "append_slot: a full block is never copied")},
    OffByOneSlotKernel: {READ_BACK},
}
# The shrunk length of each before the device model was one of the checker's models (its
# own chunk-deleting shrinker, same run): never longer now.
LENGTH_BEFORE = {SwappedCopy: 3, StaleCopySource: 3, WriteBeforeCopy: 3,
                 WriteIntoShared: 3, CopyFullBlock: 3, OffByOneSlotKernel: 2}
