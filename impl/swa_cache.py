"""Reference store with a second device pool behind a mapping: a full-attention pool and a
sliding-window (SWA) pool, as SGLang's ``SWATokenToKVPoolAllocator`` keeps them (issue 33;
the rules: ``kvcheck.spec.tiers``, ``mapped`` tables and ``slide``; the target protocol:
docs/tiers.md; ``kvcheck verify-tiers reference-swa``).

``SWACache(num_blocks, block_size, host_blocks)`` has two pools of ``num_blocks`` blocks
each, ``device`` (full attention: every token's KV) and ``swa`` (the sliding-window
layers' KV, only for tokens still in the window); ``host_blocks`` is ignored (no host
pool). A request's device table has one block per ``block_size`` tokens; its SWA table
has one entry per device block: the SWA block its tokens map to (SGLang's
``full_to_swa_index_mapping`` at block granularity: both pools page in step), or None
once the window has moved past the block.

``slide(seq, upto)`` moves the window past the first ``upto`` tokens: every SWA block
holding one of them is released whole (a block the window's edge cuts goes too, its
mapping cleared for all its tokens, as SGLang's ``free_swa`` does from 0.5.14); the device
keeps them all. Free lists are deques (taken from the front, returned at the back); a
refcount counts the tables naming a block. Every operation either succeeds or raises
(``OutOfBlocks``, ``MisuseError``) with nothing changed.
"""

from __future__ import annotations

from collections import deque

from .errors import MisuseError, OutOfBlocks

DEVICE, SWA = "device", "swa"


class SWACache:
    capabilities = frozenset({"allocate", "append", "free", "slide"})

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.n, self.B = num_blocks, block_size
        self.free_list = {p: deque(range(num_blocks)) for p in (DEVICE, SWA)}
        self.refs = {p: [0] * num_blocks for p in (DEVICE, SWA)}
        self.tables: dict[int, list[int]] = {}
        self.swa: dict[int, list[int | None]] = {}
        self.lengths: dict[int, int] = {}

    # -- operations -----------------------------------------------------------------
    def _take(self, k: int) -> tuple[list[int], list[int]]:
        if min(len(self.free_list[DEVICE]), len(self.free_list[SWA])) < k:
            raise OutOfBlocks(f"need {k} blocks in each pool; free: device "
                              f"{len(self.free_list[DEVICE])}, swa {len(self.free_list[SWA])}")
        out = []
        for p in (DEVICE, SWA):
            got = [self.free_list[p].popleft() for _ in range(k)]
            for b in got:
                self.refs[p][b] += 1
            out.append(got)
        return out[0], out[1]

    def _release(self, p: str, b: int) -> None:
        self.refs[p][b] -= 1
        if self.refs[p][b] == 0:
            self.free_list[p].append(b)

    def allocate(self, seq: int, tokens) -> None:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        if not tokens:
            raise MisuseError("a request has at least one token")
        dev, swa = self._take(-(-len(tokens) // self.B))
        self.tables[seq], self.swa[seq] = dev, list(swa)
        self.lengths[seq] = len(tokens)

    def append(self, seq: int, token) -> tuple[int, int]:
        n = self._live(seq)
        if n % self.B == 0:
            dev, swa = self._take(1)
            self.tables[seq] += dev
            self.swa[seq] += swa
        self.lengths[seq] = n + 1
        return self.tables[seq][n // self.B], n % self.B

    def free(self, seq: int) -> None:
        self._live(seq)
        for b in self.tables.pop(seq):
            self._release(DEVICE, b)
        for b in self.swa.pop(seq):
            if b is not None:
                self._release(SWA, b)
        del self.lengths[seq]

    def slide(self, seq: int, upto: int) -> None:
        n = self._live(seq)
        if not 0 <= upto <= (n - 1) // self.B * self.B:
            raise MisuseError(f"the window keeps the newest token's block: upto {upto} of {n}")
        row = self.swa[seq]
        for i in range(-(-upto // self.B)):  # every block one of those tokens is in, whole
            if row[i] is not None:
                self._release(SWA, row[i])
                row[i] = None

    def _live(self, seq: int) -> int:
        if seq not in self.tables:
            raise MisuseError(f"unknown sequence {seq!r}")
        return self.lengths[seq]

    # -- observation --------------------------------------------------------------------
    def pools(self) -> dict:
        return {DEVICE: self.n, SWA: self.n}

    def refcount(self, pool: str, b: int) -> int:
        return self.refs[pool][b]

    def free_blocks(self, pool: str) -> list[int]:
        return list(self.free_list[pool])

    def table(self, seq: int):
        return (DEVICE, list(self.tables[seq])) if seq in self.tables else None

    def mapped(self, seq: int) -> dict:
        return {SWA: list(self.swa[seq])}

    def live_seqs(self) -> list[int]:
        return list(self.tables)

    def pending_jobs(self) -> dict:
        return {}

    def cache_entries(self, pool: str) -> list:
        return []

    def evictable_blocks(self, pool: str) -> list:
        return []
