"""The prefix model's seeded workload: shared prefixes under pool pressure.

Where a target offers the block manager's operations beyond the seed's four
(``capabilities``: ``rollback``, ``rebase``, ``preempt``, ``append_slots``), about
one operation in five is one of them, as in the block manager's driver: rollbacks of
up to a block and a token (often into a cached full block), rebases of one live
sequence onto another, preemptions (each preempted sequence re-admitted later with
every token it had: a recompute the cache may serve from its own freed blocks), and
``append_slots`` writing the slots a rollback left reserved (a decode step's
``append_slot`` writes them one at a time too). A target with only the seed's
operations sees exactly the stream it always did.

A target whose engine keeps a refused request waiting (``retries_refused``: its
scheduler leaves a group its admission check declined at the head of the queue and
tries it again) has its refused allocation drawn again, same id and prompt, as the
next allocation (the operations between are the running sequences' steps and frees).
No other target's stream changes."""

from __future__ import annotations

import random

from kvcheck.models.blocks.driver import weighted_cuts
from kvcheck.models.prefix.model import EXTRA_OPS, PrefixOp
from kvcheck.spec.outcomes import REFUSED


class PrefixDriver:
    """Seeded workload with shared prefixes: a few "system prompts" with random
    suffixes from a tiny vocabulary, decode tokens from the same vocabulary,
    and pool pressure, so hits, evictions, revivals and duplicates all happen."""

    # ``weights`` (optional): multipliers of the chances of allocate, fork and free_seq and
    # of rollback, rebase and preempt where the target offers them (append_slot takes the
    # rest): a swarm run's mix, ``--mix``.
    WEIGHTS = ("allocate", "fork", "free_seq", "rollback", "rebase", "preempt")

    def __init__(self, seed: int, num_blocks: int, block_size: int, capabilities,
                 weights: dict | None = None, retry_refused: bool = False):
        self.rng = random.Random(seed)
        self._w = tuple(float((weights or {}).get(k, 1.0)) for k in ("allocate", "fork", "free_seq"))
        self.num_blocks, self.bs, self.caps = num_blocks, block_size, capabilities
        rng = self.rng
        self.bases = [[rng.randrange(100, 200) for _ in range(block_size * rng.randint(1, 3))]
                      for _ in range(3)]
        self.next_id = 0
        self.last_prompt: list[int] | None = None  # the allocation just drawn (commits aside)
        self._extra = any(k in capabilities for k in EXTRA_OPS)
        # where a draw in [0, 1) falls for rollback, rebase and preempt (0.14, 0.04, 0.04
        # wide; the constants themselves without weights: the stream it always was)
        self._cuts = weighted_cuts((0.14, 0.18, 0.22), (0.14, 0.04, 0.04), [
            float((weights or {}).get(k, 1.0)) for k in ("rollback", "rebase", "preempt")])
        self.preempted: dict[int, tuple] = {}  # preempted seq -> its tokens, to re-admit
        self._retry = retry_refused
        self._last: PrefixOp | None = None  # the operation drawn last (its outcome filled in)
        self._waiting: PrefixOp | None = None  # a refused allocation, drawn again next

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _prompt(self) -> list[int]:
        rng, bs = self.rng, self.bs
        base = rng.choice(self.bases)
        cut = rng.choice((len(base), len(base), rng.randint(0, len(base))))
        toks = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 2 * bs))]
        return toks or [rng.randrange(3)]

    def next_op(self, live: list[int], free_blocks: int, uncommitted=None, state=None) -> PrefixOp:
        """The next operation; ``state`` (the oracle: ``lengths``, ``reserved``,
        ``tokens_of``) lets the operations beyond the seed's four be drawn."""
        if self._retry and self._last is not None and self._last.kind == "allocate":
            refused = self._last.outcome == REFUSED
            if refused:
                self._waiting = self._last
            elif self._waiting is not None and self._last.seq == self._waiting.seq:
                self._waiting = None  # admitted (or out of blocks) at last
        op = None
        if self._extra and state is not None:
            op = self._extra_op(live, state, uncommitted or ())
        if op is None:
            op = self._next(live, free_blocks, uncommitted)
        if op.kind != "commit":
            self.last_prompt = list(op.tokens) if op.kind == "allocate" else None
        self._last = op
        return op

    def _next(self, live: list[int], free_blocks: int, uncommitted=None) -> PrefixOp:
        rng, caps, (wa, wf, wr) = self.rng, self.caps, self._w
        if uncommitted:  # admitted, prompt not written yet: mostly written next, else freed
            r = rng.random()
            if r < 0.7:
                return PrefixOp("commit", seq=rng.choice(sorted(uncommitted)))
            if r < 0.8:
                return PrefixOp("free_seq", seq=rng.choice(sorted(uncommitted)))
            live = [q for q in live if q not in uncommitted]
        fullness = 1.0 - free_blocks / self.num_blocks if self.num_blocks else 1.0
        if not live or rng.random() < (0.3 * (1.0 - fullness) + 0.05) * wa:
            if self._waiting is not None:  # the head of the queue, tried again
                w = self._waiting
                return PrefixOp("allocate", seq=w.seq, n_tokens=w.n_tokens, tokens=w.tokens)
            if self.last_prompt is not None and rng.random() < 0.25:
                toks = self.last_prompt  # the same prompt again, back to back
            else:
                toks = self._prompt()
            return PrefixOp("allocate", seq=self._new_id(), n_tokens=len(toks), tokens=tuple(toks))
        r = rng.random()
        if r < 0.1 * wf and "fork" in caps:
            return PrefixOp("fork", seq=rng.choice(live), child=self._new_id())
        if r < 0.1 * wf + 0.3 * fullness * wr + 0.05 * wr:
            return PrefixOp("free_seq", seq=rng.choice(live))
        return PrefixOp("append_slot", seq=rng.choice(live), tokens=(rng.randrange(3),))

    def _extra_op(self, live: list[int], state, uncommitted) -> PrefixOp | None:
        """One of the operations beyond the seed's four, about one time in five (a
        sequence with reserved slots often writes them with append_slots first, else one
        by one with append_slot; a sequence admitted but not written yet may be
        preempted before its write)."""
        rng, caps, bs = self.rng, self.caps, self.bs
        reserved = state.reserved
        if uncommitted and "preempt" in caps and rng.random() < 0.1:
            seq = rng.choice(sorted(uncommitted))
            self.preempted[seq] = tuple(state.tokens_of(seq))
            return PrefixOp("preempt", seq=seq)
        live = [q for q in live if q not in uncommitted]
        if "append_slots" in caps:
            pending = [q for q in live if reserved.get(q)]
            if pending and rng.random() < 0.5:
                seq = rng.choice(pending)
                toks = tuple(rng.randrange(3) for _ in range(1 + int(rng.random() * bs)))
                return PrefixOp("append_slots", seq=seq, n_tokens=len(toks), tokens=toks)
        r = rng.random()
        c_rollback, c_rebase, c_preempt = self._cuts
        if r >= c_preempt:
            return None
        if self.preempted and r < 0.04:  # re-admitted for recompute, with every token it had
            seq = rng.choice(sorted(self.preempted))
            toks = self.preempted.pop(seq)
            return PrefixOp("allocate", seq=seq, n_tokens=len(toks), tokens=toks)
        if not live:
            return None
        seq = rng.choice(live)
        n = state.lengths.get(seq, 0)
        if r < c_rollback and "rollback" in caps and n >= 2:
            return PrefixOp("rollback", seq=seq, n_tokens=1 + int(rng.random() * min(n - 1, bs + 1)))
        if r < c_rebase and "rebase" in caps and len(live) >= 2:
            return PrefixOp("rebase", seq=seq, child=rng.choice([q for q in live if q != seq]))
        if r >= c_rebase and "preempt" in caps:
            self.preempted[seq] = tuple(state.tokens_of(seq))
            return PrefixOp("preempt", seq=seq)
        return None
