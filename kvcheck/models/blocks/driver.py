"""Seeded random driver: generates valid operations against the oracle's view.

Deterministic from the seed (replayable). The mix keeps the pool under
pressure so out-of-blocks, copy-on-write and shared frees all happen: the
fuller the pool, the more it frees; the emptier, the more it allocates.
"""

from __future__ import annotations

import random

from kvcheck.spec.contracts import Op


class RandomDriver:
    # ``weights`` (optional): multipliers of the chances of allocate, fork and free_seq
    # (append_slot takes the rest) and the longest prompt in tokens: a swarm run's mix.
    WEIGHTS = ("allocate", "fork", "free_seq", "max_prompt")

    def __init__(self, seed: int, num_blocks: int, block_size: int, capabilities,
                 weights: dict | None = None):
        self.rng = random.Random(seed)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caps = capabilities
        self.next_id = 0
        w = weights or {}
        self.max_prompt = int(w.get("max_prompt", 3 * block_size))
        self._w = tuple(float(w.get(k, 1.0)) for k in ("allocate", "fork", "free_seq"))
        self._can = {k: k in capabilities for k in ("allocate", "append_slot", "fork", "free_seq")}

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def next_op(self, live: list[int], free_blocks: int) -> Op:
        rand, can, (wa, wf, wr) = self.rng.random, self._can, self._w
        fullness = 1.0 - free_blocks / self.num_blocks if self.num_blocks else 1.0
        if not live or (rand() < (0.25 * (1.0 - fullness) + 0.03) * wa and can["allocate"]):
            return Op("allocate", self._new_id(), 0, 1 + int(rand() * self.max_prompt))
        r = rand()
        seq = live[int(rand() * len(live))]
        if r < 0.12 * wf and can["fork"]:
            return Op("fork", seq, self._new_id())
        if r < 0.12 * wf + 0.2 * fullness * wr + 0.02 * wr and can["free_seq"]:
            return Op("free_seq", seq)
        if can["append_slot"]:
            return Op("append_slot", seq)
        return Op("allocate", self._new_id(), 0, 1 + int(rand() * self.max_prompt))
