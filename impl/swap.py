"""Swap preemption: a victim's blocks go to a host pool and come back.

``SwapScheduler`` follows exactly the reference policy (same queues, same
admission and victim choice, so the same spec holds) and differs only in
what preemption does with the victim's KV blocks:

  * recompute  free them; re-admission prefills the whole sequence again;
  * swap       copy them to ``host`` (a reference ``BlockManager`` of its
               own, checked by the same invariants) and free the device
               blocks; re-admission allocates device blocks, copies back and
               frees the host copy. Nothing is recomputed.

``decide(n_tokens) -> "swap" | "recompute"`` picks per victim (default:
always swap); a victim that does not fit in the host pool is recomputed.
Counters: ``swapped_out`` / ``swapped_in`` tokens, ``recomputed`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from .block_manager import BlockManager
from .scheduler import Scheduler, blocks_for


class SwapScheduler(Scheduler):
    def __init__(self, bm: BlockManager, watermark_blocks: int = 1, host_blocks: int | None = None,
                 decide: Callable[[int], str] | None = None):
        super().__init__(bm, watermark_blocks)
        self.host = BlockManager(host_blocks or 4 * bm.num_blocks, bm.block_size)
        self.decide = decide or (lambda n: "swap")
        self.swapped_out = 0
        self.swapped_in = 0
        self.recomputed = 0
        self._admitted: set[int] = set()

    def _evict(self, seq: int) -> None:
        n = self.bm.lens[seq]
        room = len(self.host.free) >= blocks_for(n, self.bm.block_size)
        if room and self.decide(n) == "swap":
            self.host.allocate(seq, n)
            self.swapped_out += n
        self.bm.free_seq(seq)

    def _admit(self, seq: int, n_tokens: int) -> None:
        self.bm.allocate(seq, n_tokens)
        if seq in self.host.tables:
            self.host.free_seq(seq)
            self.swapped_in += n_tokens
        elif seq in self._admitted:
            self.recomputed += n_tokens
        self._admitted.add(seq)
