"""A block manager whose K/V data lives, and moves, in a paged store on a torch device.

The bookkeeping is the reference's (``kvcheck.impl.block_manager``: free list,
refcounts, block tables, copy-on-write fork), inherited unchanged; this class
adds the data:

``allocate(seq, n, k, v)``     prompt K/V ``[L, n, H, D]`` written into the new blocks
``append_slot(seq, k, v)``     the copy-on-write block copy on the device, *then*
                               the token's K/V written into its slot
``decode_step(seqs, k, v)``    one token for each of many sequences, as engines do
                               it: all slots reserved, every copy-on-write copy in
                               one kernel launch, then every slot write in one
                               launch (copies strictly before writes)
``gather(seq)`` / ``gather_many(seqs)``   K/V read back through the block tables

``k``/``v`` may be omitted: deterministic K/V is written instead, so the
structural oracle (which passes no data) drives the same code paths.

It speaks the ``kvcheck.target.Target`` protocol directly (``make`` is the
registered factory of ``kvcheck verify device``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..block_manager import BlockManager
from ..errors import MisuseError, OutOfBlocks
from .store import PagedKVStore

Reservation = tuple[int, int, "int | None"]  # (block, offset, cow_src)


class DeviceBlockManager(BlockManager):
    """Reference block manager + a ``PagedKVStore`` the data really moves in."""

    capabilities = frozenset(("allocate", "append_slot", "fork", "free_seq"))

    def __init__(self, num_blocks: int, block_size: int, *, num_layers: int = 1,
                 num_kv_heads: int = 1, head_dim: int = 8, dtype="float16", device=None,
                 backend: str = "auto"):
        super().__init__(num_blocks, block_size)
        try:
            self.store = PagedKVStore(num_blocks, block_size, num_layers, num_kv_heads,
                                      head_dim, dtype, device, backend)
        except ValueError as exc:
            raise MisuseError(str(exc)) from None
        self._counter = 0  # for deterministic K/V when none is given

    # -- data helpers ---------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.store.backend

    def kv_shape(self, n: int) -> tuple[int, int, int, int]:
        return self.store.kv_shape(n)

    def _kv(self, k, v, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The given K/V checked against ``kv_shape(n)``, or deterministic K/V."""
        if k is None and v is None:
            L, _, h, d = self.kv_shape(n)
            tok = torch.arange(self._counter, self._counter + n, device=self.store.device)
            self._counter += n
            grid = (tok.view(1, n, 1, 1) * 7 + torch.arange(L * h * d, device=tok.device)
                    .view(L, 1, h, d)) % 2039
            k = grid.to(self.store.dtype)
            return k, -k
        if k is None or v is None:
            raise MisuseError("give both k and v, or neither")
        try:
            return self.store.check_kv(k, v, n)
        except ValueError as exc:
            raise MisuseError(str(exc)) from None

    def _slots(self, table: Sequence[int], first: int, n: int) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(first, first + n)]

    # -- operations (reference semantics, with the data) ----------------------------------
    def allocate(self, seq: int, n_tokens: int, k=None, v=None) -> None:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
            raise MisuseError(f"n_tokens must be a positive integer, got {n_tokens!r}")
        k, v = self._kv(k, v, n_tokens)
        super().allocate(seq, n_tokens)
        self.store.write_slots(self._slots(self.tables[seq], 0, n_tokens), k, v)

    def reserve_slot(self, seq: int) -> Reservation:
        """The bookkeeping half of ``append_slot``: no data moves."""
        return super().append_slot(seq)

    def append_slot(self, seq: int, k=None, v=None) -> Reservation:
        self._live(seq)
        k, v = self._kv(k, v, 1)
        res = self.reserve_slot(seq)
        self.run_step([res], k, v)
        return res

    def run_step(self, reserved: Sequence[Reservation], k: torch.Tensor, v: torch.Tensor) -> None:
        """The data half of a step: one copy launch, then one write launch."""
        bs = self.block_size
        self.store.copy_blocks([(src, block) for block, _, src in reserved if src is not None])
        self.store.write_slots([block * bs + off for block, off, _ in reserved], k, v)

    def blocks_needed(self, seqs: Sequence[int]) -> int:
        """Fresh blocks that appending one token to each of ``seqs`` in order takes."""
        bs, refs, need = self.block_size, {}, 0
        for q in seqs:
            table = self._live(q)
            if self.lens[q] % bs == 0:
                need += 1
                continue
            tail = table[-1]
            r = refs.get(tail, self.ref[tail])
            if r > 1:
                need += 1
                refs[tail] = r - 1
        return need

    def decode_step(self, seqs: Sequence[int], k=None, v=None) -> list[Reservation]:
        """One new token for each of ``seqs`` (distinct, live): all or nothing.

        Returns each sequence's ``(block, offset, cow_src)``; raises
        ``OutOfBlocks`` (nothing changed) when the pool cannot serve them all.
        """
        seqs = list(seqs)
        if len(set(seqs)) != len(seqs):
            raise MisuseError("a decode step takes each sequence at most once")
        need = self.blocks_needed(seqs)  # raises MisuseError for an unknown sequence
        k, v = self._kv(k, v, len(seqs))
        if need > len(self.free):
            raise OutOfBlocks(f"decode step needs {need} blocks, {len(self.free)} free")
        reserved = [self.reserve_slot(q) for q in seqs]
        self.run_step(reserved, k, v)
        return reserved

    def gather_many(self, seqs: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each sequence's K/V ``[L, len, H, D]`` read through its block table, one launch."""
        tables = [self._live(q) for q in seqs]
        return self.store.gather(tables, [self.lens[q] for q in seqs])

    def gather(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gather_many([seq])[0]

    def block_data(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``block``'s raw K/V ``[L, block_size, H, D]`` (no table involved)."""
        return self.store.key[:, block], self.store.value[:, block]

    # -- Target protocol ----------------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        return self.tables[seq]

    def refcount(self, block: int) -> int:
        return self.ref[block]

    def free_blocks(self) -> Iterable[int]:
        return self.free

    def num_free(self) -> int:
        return len(self.free)

    def table_identity(self, seq: int) -> object | None:
        return self.tables[seq]

    def seq_len(self, seq: int) -> int | None:
        return self.lens[seq]

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def make(num_blocks: int, block_size: int, *, num_layers: int = 2, num_kv_heads: int = 2,
         head_dim: int = 4) -> DeviceBlockManager:
    """The registered ``device`` target: small K/V (2 layers, 2 heads, head_dim 4,
    float16) on ``cuda`` if present else ``cpu``, Triton where it can run. The store's
    shape may be given (``kvcheck verify-device --layers --kv-heads --head-dim``)."""
    return DeviceBlockManager(num_blocks, block_size, num_layers=num_layers,
                              num_kv_heads=num_kv_heads, head_dim=head_dim, dtype="float16")
