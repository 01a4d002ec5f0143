"""Seeded random driver: generates valid operations against the oracle's view.

Deterministic from the seed (replayable). The mix keeps the pool under
pressure so out-of-blocks, copy-on-write and shared frees all happen: the
fuller the pool, the more it frees; the emptier, the more it allocates.

The operations beyond the seed's four are mixed in only when the target offers
them (``capabilities``): multi-token reservations with lookahead, rollbacks of
rejected tokens, rebases of one live sequence onto another, and preemptions,
each preempted sequence re-admitted later with everything it had (an
allocation of the same id and length: a recompute), and sliding-window drops of
the blocks behind a window of up to two blocks (or behind the window the
target's engine drops behind itself, ``Target.drop_window``). A target with only the
seed's four operations sees exactly the stream it always did.
"""

from __future__ import annotations

import random

from kvcheck.spec.contracts import Op

_EXTRA = ("append_slots", "rollback", "rebase", "preempt", "drop_behind_window")


def weighted_cuts(plain: tuple[float, ...], widths: tuple[float, ...],
                  weights: list[float]) -> tuple[float, ...]:
    """Where a draw in [0, 1) falls for each of a few operations (``--mix``): the
    intervals' ends, each interval ``widths[i]`` wide times its weight. Without weights
    (all 1) the ends are ``plain``, the constants the drivers always used, so a seed's
    stream is the one it always was."""
    if all(k == 1.0 for k in weights):
        return plain
    out, edge = [], 0.0
    for width, k in zip(widths, weights, strict=True):
        edge += width * k
        out.append(edge)
    return tuple(out)


class RandomDriver:
    # ``weights`` (optional): multipliers of the chances of allocate, fork, free_seq and of
    # the operations beyond the seed's four the target offers (append_slot takes the rest),
    # and the longest prompt in tokens: a swarm run's mix, ``--mix``.
    WEIGHTS = ("allocate", "fork", "free_seq", *_EXTRA, "max_prompt")

    def __init__(self, seed: int, num_blocks: int, block_size: int, capabilities,
                 weights: dict | None = None, drop_window: int | None = None):
        self.rng = random.Random(seed)
        # the window a target's engine drops behind by itself (``Target.drop_window``):
        # its drops are drawn with that window, and more often (its appends wait for them)
        self.drop_window = drop_window
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caps = capabilities
        self.next_id = 0
        w = weights or {}
        self.max_prompt = int(w.get("max_prompt", 3 * block_size))
        self._w = tuple(float(w.get(k, 1.0)) for k in ("allocate", "fork", "free_seq"))
        self._can = {k: k in capabilities for k in ("allocate", "append_slot", "fork", "free_seq",
                                                    *_EXTRA)}
        self._extra = any(self._can[k] for k in _EXTRA)
        # where a draw in [0, 1) falls for each operation beyond the four (append_slots,
        # rollback, rebase, preempt: 0.12, 0.05, 0.03, 0.02 wide; the constants themselves
        # when no weight is given, so the stream is the one it always was) and the drop's
        # chance multiplier
        self._cuts = weighted_cuts((0.12, 0.17, 0.20, 0.22), (0.12, 0.05, 0.03, 0.02), [
            float(w.get(k, 1.0)) for k in ("append_slots", "rollback", "rebase", "preempt")])
        self._w_drop = float(w.get("drop_behind_window", 1.0))
        self.preempted: dict[int, int] = {}  # preempted seq -> its length, to re-admit

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def next_op(self, live: list[int], free_blocks: int, state=None) -> Op:
        """The next operation; ``state`` (the oracle: ``lengths``, ``reserved``) lets the
        operations beyond the seed's four be drawn."""
        rand, can, (wa, wf, wr) = self.rng.random, self._can, self._w
        if self._extra and state is not None:
            op = self._extra_op(live, state)
            if op is not None:
                return op
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
            # a reserved slot is written either way: by append_slots, or by append_slot
            # every other time (by the length's parity: no draw, so the rest of the stream
            # is the one it was)
            if state is not None and state.reserved.get(seq) and can["append_slots"] and \
                    state.lengths.get(seq, 0) % 2:
                return Op("append_slots", seq, n_tokens=1)
            return Op("append_slot", seq)
        return Op("allocate", self._new_id(), 0, 1 + int(rand() * self.max_prompt))

    def _extra_op(self, live: list[int], state) -> Op | None:
        """One of the operations beyond the seed's four, about one time in five."""
        rng, can, bs = self.rng, self._can, self.block_size
        hint = self.drop_window
        if can["drop_behind_window"] and live and \
                rng.random() < (0.05 if hint is None else 0.25) * self._w_drop:
            # sliding-window attention: a window of up to two blocks' worth of tokens
            seq = live[int(rng.random() * len(live))]
            if hint is not None:
                return Op("drop_behind_window", seq, n_tokens=hint)
            return Op("drop_behind_window", seq, n_tokens=1 + int(rng.random() * 2 * bs))
        r = rng.random()
        c_slots, c_rollback, c_rebase, c_preempt = self._cuts
        if r >= c_preempt:
            return None
        if self.preempted and r < 0.04 and can["allocate"]:  # re-admit for recompute
            seq = rng.choice(sorted(self.preempted))
            return Op("allocate", seq, 0, self.preempted.pop(seq))
        if not live:
            return None
        seq = live[int(rng.random() * len(live))]
        if r < c_slots and can["append_slots"]:
            return Op("append_slots", seq, n_tokens=1 + int(rng.random() * 2 * bs),
                      lookahead=int(rng.random() * (bs + 1)))
        n = state.lengths.get(seq, 0)
        if r < c_rollback and can["rollback"] and n >= 2:
            return Op("rollback", seq, n_tokens=1 + int(rng.random() * min(n - 1, bs + 1)))
        if r < c_rebase and can["rebase"] and len(live) >= 2:
            child = rng.choice([q for q in live if q != seq])
            return Op("rebase", seq, child)
        if can["preempt"] and r >= c_rebase:
            self.preempted[seq] = n
            return Op("preempt", seq)
        return None
