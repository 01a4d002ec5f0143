"""Reference scheduler over the reference block manager (recompute preemption).

Shape (the seed's, and what ``kvcheck verify-scheduler`` drives):

    Scheduler(bm, watermark_blocks=1)
    waiting   deque of (seq, n_tokens): requests to prefill, head first
    running   list of seq ids, oldest first
    step()    -> list of the seq ids that got one decode slot, in order
    add(seq, n_tokens, max_new_tokens=0)   queue a request (validated)
    finish(seq)                            retire a running sequence

Policy (written declaratively in ``kvcheck.spec.scheduler``):
  * admission is FCFS: the head of ``waiting`` is admitted while the free
    blocks minus its need stay at or above the watermark; the first request
    that does not fit stops admission (nothing behind it skips ahead);
  * decode is oldest first, one slot per running sequence per step;
  * when a slot cannot be had (out of blocks) the newest running sequence is
    preempted, possibly the one being decoded: its blocks are freed and it is
    put back at the front of ``waiting`` with its full current length
    (prompt plus every token generated), to be recomputed on re-admission.
"""

from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .errors import MisuseError, OutOfBlocks


class UnservableRequest(MisuseError):
    """A request that can never be admitted (it would block the queue forever)."""


def blocks_for(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


class Scheduler:
    def __init__(self, bm: BlockManager, watermark_blocks: int = 1):
        if isinstance(watermark_blocks, bool) or not isinstance(watermark_blocks, int) \
                or watermark_blocks < 0:
            raise MisuseError(f"watermark_blocks must be a non-negative integer, "
                              f"got {watermark_blocks!r}")
        if watermark_blocks >= bm.num_blocks:
            raise MisuseError(f"watermark_blocks={watermark_blocks} leaves no block of the "
                              f"{bm.num_blocks}-block pool to admit anything")
        self.bm = bm
        self.watermark = watermark_blocks
        self.waiting: deque[tuple[int, int]] = deque()
        self.running: list[int] = []

    # -- requests ---------------------------------------------------------------
    def max_admissible_tokens(self) -> int:
        """The longest length that can ever be (re-)admitted."""
        return (self.bm.num_blocks - self.watermark) * self.bm.block_size

    def add(self, seq: int, n_tokens: int, max_new_tokens: int = 0) -> None:
        """Queue ``seq`` with an ``n_tokens`` prompt (to grow by ``max_new_tokens``).

        Refused (``MisuseError``) for a duplicate id, a non-positive length, or
        a request that could never be served: one whose prompt, or any length
        it may be preempted at (up to ``n_tokens + max_new_tokens - 1``), needs
        more than the pool minus the watermark, or whose final length needs
        more than the whole pool.
        """
        for name, value, low in (("seq", seq, 0), ("n_tokens", n_tokens, 1),
                                 ("max_new_tokens", max_new_tokens, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                kind = "positive" if low else "non-negative"
                raise MisuseError(f"{name} must be a {kind} integer, got {value!r}")
        if seq in self.bm.tables or seq in self.running or any(q == seq for q, _ in self.waiting):
            raise MisuseError(f"sequence {seq} is already queued or running")
        bs, pool = self.bm.block_size, self.bm.num_blocks
        longest_requeue = n_tokens + max(max_new_tokens - 1, 0)
        need = blocks_for(longest_requeue, bs)
        if need > pool - self.watermark:
            raise UnservableRequest(
                f"sequence {seq} can never be admitted: {longest_requeue} tokens need {need} "
                f"blocks of {bs}, but the pool of {pool} minus the watermark of "
                f"{self.watermark} leaves {pool - self.watermark}")
        final = blocks_for(n_tokens + max_new_tokens, bs)
        if final > pool:
            raise UnservableRequest(
                f"sequence {seq} can never finish: {n_tokens + max_new_tokens} tokens need "
                f"{final} blocks of {bs}, the pool has {pool}")
        self.waiting.append((seq, n_tokens))

    def finish(self, seq: int) -> None:
        """Retire a running sequence and free its blocks."""
        if seq not in self.running:
            raise MisuseError(f"sequence {seq!r} is not running")
        self.running.remove(seq)
        self.bm.free_seq(seq)

    # -- one step ---------------------------------------------------------------
    def _admit(self, seq: int, n_tokens: int) -> None:
        """Prefill: give ``seq`` its blocks (recompute of whatever it held before)."""
        self.bm.allocate(seq, n_tokens)

    def _evict(self, seq: int) -> None:
        """Drop a preempted sequence's blocks (recompute mode: just free them)."""
        self.bm.free_seq(seq)

    def step(self) -> list[int]:
        bm = self.bm
        while self.waiting:
            seq, n = self.waiting[0]
            if len(bm.free) - blocks_for(n, bm.block_size) < self.watermark:
                break
            self.waiting.popleft()
            self._admit(seq, n)
            self.running.append(seq)
        decoded: list[int] = []
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            try:
                bm.append_slot(seq)
            except OutOfBlocks:
                victim = self.running.pop()
                n = bm.lens[victim]
                self._evict(victim)
                self.waiting.appendleft((victim, n))
                continue  # retry seq, unless it was the victim (then the loop ends)
            decoded.append(seq)
            i += 1
        return decoded
