"""The reference tiered store with its K/V: ``TieredCache`` whose pools hold real data
(torch tensors, the device pool on the GPU when there is one) moved by every copy a
store, load or swap makes (``kvcheck verify-tiers reference-tiers-data``; the data level:
``kvcheck.models.tiers.data``).

Each pool is a tensor ``[blocks, block_size, KV_WIDTH]``: the device pool on ``device``
(default: CUDA when available, else the CPU), the host pool on the CPU. Token i of a
request is computed (``kv(tokens[:i + 1])``, the model kvcheck stands in for) into slot
i % B of table block i // B when the request computes it: an allocation's tokens, a
load's tokens past its hits, an appended token, and a failed load's hit blocks (the
engine recomputes what it could not copy). A store copies its device sources into its
host destinations when it completes successfully (the sources are pinned, unchanged
until then); a load copies its host hits into its device destinations when it completes;
a swap copies the table's blocks into the fresh ones, position by position.
"""

from __future__ import annotations

from .tiered_cache import DEVICE, HOST, LOAD, STORE, TieredCache

KV_WIDTH = 8  # kvcheck.models.tiers.data.KV_WIDTH


class DataTieredCache(TieredCache):
    """``TieredCache`` with its K/V (see the module doc)."""

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 device: str | None = None):
        super().__init__(num_blocks, block_size, host_blocks)
        import torch

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        B = self.block_size
        self.kv_data = {
            DEVICE: torch.zeros(self.sizes[DEVICE], B, KV_WIDTH, device=self.device),
            HOST: torch.zeros(max(self.sizes[HOST], 1), B, KV_WIDTH),
        }
        self._kv = None

    # -- the data protocol (kvcheck.models.tiers.data) ---------------------------------
    def use_kv(self, kv) -> None:
        self._kv = kv

    def block_data(self, pool: str, b: int):
        return self.kv_data[pool][b]

    def pool_data(self, pool: str):
        return self.kv_data[pool][: self.sizes[pool]]

    # -- writes and copies ---------------------------------------------------------------
    def _compute(self, seq: int, start: int, end: int) -> None:
        """Tokens start .. end - 1 of a live request computed into its device blocks."""
        if self._kv is None or end <= start:
            return
        toks, table, B = self.tokens[seq], self.tables[seq], self.block_size
        rows = self.torch.stack([self._kv(tuple(toks[: i + 1])) for i in range(start, end)])
        blocks = self.torch.tensor([table[i // B] for i in range(start, end)])
        slots = self.torch.tensor([i % B for i in range(start, end)])
        dev = self.kv_data[DEVICE]
        dev[blocks.to(dev.device), slots.to(dev.device)] = rows.to(dev.device)

    def _copy(self, src_pool: str, src: list[int], dst_pool: str, dst: list[int]) -> None:
        """Whole blocks, position by position (one gather, one scatter)."""
        if not src:
            return
        a, b = self.kv_data[src_pool], self.kv_data[dst_pool]
        index = self.torch.tensor(src, device=a.device)
        b[self.torch.tensor(dst, device=b.device)] = a[index].to(b.device)

    # -- operations ----------------------------------------------------------------------
    def allocate(self, seq: int, tokens) -> None:
        super().allocate(seq, tokens)
        self._compute(seq, 0, len(self.tokens[seq]))

    def load(self, seq: int, tokens):
        job = super().load(seq, tokens)
        hits = len(self.jobs[job].dst) if job is not None else 0
        self._compute(seq, hits * self.block_size, len(self.tokens[seq]))
        return job

    def append(self, seq: int, token):
        where = super().append(seq, token)
        n = len(self.tokens[seq])
        self._compute(seq, n - 1, n)
        return where

    def complete(self, job: int, ok: bool = True) -> None:
        j = self.jobs.get(job)
        super().complete(job, ok)
        if j is None:
            return
        if j.kind == STORE and ok:
            self._copy(DEVICE, j.src, HOST, j.dst)
        elif j.kind == LOAD and ok:
            self._copy(HOST, j.src, DEVICE, j.dst)
        elif j.kind == LOAD and j.seq in self.tables:  # failed: recompute the hit blocks
            self._compute(j.seq, 0, len(j.dst) * self.block_size)

    def _swap(self, seq: int, src: str, dst: str) -> dict[int, int]:
        moved = super()._swap(seq, src, dst)
        self._copy(src, list(moved), dst, list(moved.values()))
        return moved
