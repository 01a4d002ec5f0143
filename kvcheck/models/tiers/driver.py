"""The tiers model's seeded workload: requests with shared prefixes (so that stored blocks
are found again), stores, loads, decode steps, evictions and frees, and completions of
pending jobs in an order the driver chooses (some of them failing), so that completions
interleave with allocations, evictions and aborts.

``--mix`` weights: ``allocate``, ``load``, ``store``, ``complete``, ``evict``, ``free``,
``swap``, ``slide``, ``prefetch`` (each multiplies that operation's chance; append takes the
rest) and ``fail`` (the chance that a completion fails, default 0.2). A prefetch's
completion fills a leading part of its pages: none, all, or (half the time) a strict part
between, the partial case being where a release goes wrong."""

from __future__ import annotations

import random

from kvcheck.models.tiers.model import _make
from kvcheck.models.tiers.oracle import lookahead_slots

WEIGHTS = {"allocate": 1.0, "load": 1.5, "store": 1.5, "complete": 2.0, "evict": 0.4,
           "free": 1.0, "swap": 0.6, "slide": 1.5, "prefetch": 1.0}  # append: the rest (of 10)
FAIL = 0.2
VOCAB = 2  # few token values: identical blocks recur


class TiersDriver:
    def __init__(self, seed: int, scope, target, weights=None):
        self.rng = random.Random(seed)
        self.bs = scope.block_size
        weights = dict(weights or {})
        self.fail = float(weights.pop("fail", FAIL))
        self.w = {k: w * float(weights.get(k, 1.0)) for k, w in WEIGHTS.items()}
        self.caps = frozenset(getattr(target, "capabilities", ()))
        self.failures = frozenset(getattr(target, "failures", ("store", "load")))
        self.lookahead = lookahead_slots(target)  # (a swap-in's: the engine's constant)
        self.next_seq = 0
        self.prompts: list[tuple] = []

    def _prompt(self, state) -> tuple:
        rng, B = self.rng, self.bs
        n = rng.randint(1, 3 * B + 1)
        pool = self.prompts + [tuple(t) for t in state.tokens.values()]
        toks: list = []
        if pool and rng.random() < 0.75:
            base = rng.choice(pool)
            toks = list(base[: rng.randint(1, len(base))])
        while len(toks) < n:
            toks.append(rng.randrange(VOCAB))
        return tuple(toks)

    def next_op(self, state):
        rng, w = self.rng, self.w
        live = state.live()
        pending = state.pending()
        choices = [("allocate", w["allocate"]), ("load", w["load"] if "load" in self.caps
                                                 else 0.0)]
        if live:
            choices += [("store", w["store"] if "store" in self.caps else 0.0),
                        ("free", w["free"]),
                        ("swap", w["swap"] if "swap_out" in self.caps else 0.0),
                        ("slide", w["slide"] if "slide" in self.caps else 0.0)]
        if pending:
            choices.append(("complete", w["complete"]))
        choices.append(("evict", w["evict"] if "evict" in self.caps else 0.0))
        choices.append(("prefetch", w["prefetch"] if "prefetch" in self.caps else 0.0))
        roll = rng.random() * 10
        what = "append" if live else "allocate"
        for name, weight in choices:
            if roll < weight:
                what = name
                break
            roll -= weight
        if what in ("allocate", "load") and (len(live) >= 6 or (
                live and state.num_free() < 2 and rng.random() < 0.6)):
            what = "free"  # (a full pool: a request ends rather than many failing to start)
        if what in ("allocate", "load", "prefetch"):
            seq = self.next_seq
            self.next_seq += 1
            toks = self._prompt(state)
            self.prompts = (self.prompts + [toks])[-12:]
            return _make(what, seq=seq, tokens=toks)
        if what == "complete":
            q, j = rng.choice(pending)
            fails = rng.random() < self.fail  # (drawn for every completion: same stream)
            job = state.jobs[q, j]
            if job["kind"] == "prefetch":  # (a prefetch's only: other runs draw as before)
                n = len(job["keys"])
                filled = rng.randint(1, n - 1) if n > 1 and rng.random() < 0.5 else \
                    rng.choice((0, n))
                return _make("complete", seq=q, job=j, ok=True, filled=filled)
            return _make("complete", seq=q, job=j,
                         ok=not fails or job["kind"] not in self.failures)
        if what == "evict":
            return _make("evict", n=rng.randint(1, 3))
        seq = rng.choice(live)
        if what == "swap":
            if state.pool_of(seq) != "host":
                return _make("swap_out", seq=seq)
            return _make("swap_in", seq=seq, lookahead=self.lookahead)
        if what == "slide":  # forward by a few tokens, never into the newest token's block
            lo, hi = state.slid.get(seq, 0) + 1, (len(state.tokens[seq]) - 1) // self.bs * self.bs
            if lo <= hi:
                return _make("slide", seq=seq, upto=rng.randint(lo, min(hi, lo + self.bs)))
            what = "append"
        if what == "append" and len(state.tokens[seq]) > 6 * self.bs:
            what = "free"
        if what in ("store", "free"):
            return _make(what, seq=seq)
        return _make("append", seq=seq, token=rng.randrange(VOCAB))
