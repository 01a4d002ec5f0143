"""The hybrid model's seeded workload: shared-prefix prompts (so that groups hit the cache),
decode steps that move sliding windows past their first blocks, and frees that leave cached
blocks to revive or evict."""

from __future__ import annotations

import random

from kvcheck.models.hybrid.model import _make

WEIGHTS = {"allocate": 3.0, "free_seq": 1.5}  # append_slot takes the rest (of 10)
# ``weights`` (optional, ``--mix``): multipliers of the chances of allocate and free_seq
VOCAB = 3  # few token values: identical blocks recur


class HybridDriver:
    def __init__(self, seed: int, scope, target, weights=None):
        self.rng = random.Random(seed)
        self.nb, self.bs = scope.num_blocks, scope.block_size
        self.w = {k: w * float((weights or {}).get(k, 1.0)) for k, w in WEIGHTS.items()}
        self.caps = frozenset(getattr(target, "capabilities", ("allocate", "append_slot",
                                                               "free_seq")))
        self.next_seq = 0
        self.prompts: list[tuple] = []

    def _prompt(self, state) -> tuple:
        rng, B = self.rng, self.bs
        n = rng.randint(1, 4 * B + 1)
        base: tuple = ()
        pool = self.prompts + [tuple(t) for t in state.tokens.values()]
        if pool and rng.random() < 0.7:
            base = rng.choice(pool)
            if rng.random() < 0.5:
                base = base[: rng.randint(1, len(base))]
        toks = list(base[:n]) if rng.random() < 0.8 else list(base)
        while len(toks) < max(n, 1) and (len(toks) < n or not toks):
            toks.append(rng.randrange(VOCAB))
        return tuple(toks)

    def next_op(self, state):
        rng = self.rng
        live = state.live()
        roll = rng.random() * 10
        starved = state.num_free() < 2 * len(getattr(state, "windows", (0,)))
        if not live or (roll < self.w["allocate"] and len(live) < 8 and not starved):
            seq = self.next_seq
            self.next_seq += 1
            toks = self._prompt(state)
            self.prompts = (self.prompts + [toks])[-16:]
            return _make("allocate", seq=seq, tokens=toks)
        seq = rng.choice(live)
        if (roll < self.w["allocate"] + self.w["free_seq"] or len(state.tokens[seq]) > 8 * self.bs
                or (starved and roll < 6)):
            return _make("free_seq", seq=seq)
        if "append_tokens" in self.caps and rng.random() < 0.25:
            n = rng.randint(2, 2 * self.bs + 1)
            return _make("append_tokens", seq=seq, tokens=[rng.randrange(VOCAB) for _ in range(n)])
        return _make("append_slot", seq=seq, token=rng.randrange(VOCAB))
