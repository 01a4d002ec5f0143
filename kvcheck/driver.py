"""Seeded random driver: generates valid operations against the oracle's view.

Deterministic from the seed (replayable). The mix keeps the pool under
pressure so out-of-blocks, copy-on-write and shared frees all happen: the
fuller the pool, the more it frees; the emptier, the more it allocates.
"""

from __future__ import annotations

import random

from kvcheck.spec.contracts import Op


class RandomDriver:
    def __init__(self, seed: int, num_blocks: int, block_size: int, capabilities):
        self.rng = random.Random(seed)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caps = capabilities
        self.next_id = 0
        self.max_prompt = 3 * block_size

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def next_op(self, live: list[int], free_blocks: int) -> Op:
        rng, caps = self.rng, self.caps
        fullness = 1.0 - free_blocks / self.num_blocks if self.num_blocks else 1.0
        if not live or (rng.random() < 0.25 * (1.0 - fullness) + 0.03 and "allocate" in caps):
            return Op("allocate", seq=self._new_id(), n_tokens=rng.randint(1, self.max_prompt))
        r = rng.random()
        if r < 0.12 and "fork" in caps:
            return Op("fork", seq=rng.choice(live), child=self._new_id())
        if r < 0.12 + 0.2 * fullness + 0.02 and "free_seq" in caps:
            return Op("free_seq", seq=rng.choice(live))
        if "append_slot" in caps:
            return Op("append_slot", seq=rng.choice(live))
        return Op("allocate", seq=self._new_id(), n_tokens=rng.randint(1, self.max_prompt))
