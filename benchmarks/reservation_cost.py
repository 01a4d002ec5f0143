"""A multi-token reservation is checked in time proportional to the blocks it touches,
not to its number of tokens (issue 14).

Two measurements, fast mode, the all-operations reference (``reference-engine``), one run:
  * one block touched: ``append_slots(seq, n)`` of n = 1 .. 60,000 tokens into a block of
    65,536 slots; the seconds per checked reservation should stay flat in n;
  * k blocks touched: ``append_slots(seq, k * B)`` at B = 16 for k = 1 .. 256; the seconds
    per touched block should stay flat in k.
Each is a fresh pool, one sequence, the reservation repeated (allocate, reserve, roll
back) and timed best of ``--repeat``. Prints ``case n seconds/op ratio_to_first``.

    python3 benchmarks/reservation_cost.py
"""

from __future__ import annotations

import time

from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import Op
from kvcheck.targets.loading import build, resolve


def per_op(num_blocks: int, block_size: int, n: int, rounds: int, repeat: int) -> float:
    """Seconds per checked append_slots of ``n`` tokens (the rollback after it not timed)."""
    factory = resolve("reference-engine")[1]
    best = float("inf")
    for _ in range(repeat):
        oracle = Oracle(build(factory, num_blocks, block_size), mode="fast", timeout=None)
        assert oracle.step(Op("allocate", seq=0, n_tokens=1)) is None
        spent = 0.0
        for _ in range(rounds):
            op = Op("append_slots", seq=0, n_tokens=n)
            start = time.perf_counter()
            v = oracle.step(op)
            spent += time.perf_counter() - start
            assert v is None, v
            assert oracle.step(Op("rollback", seq=0, n_tokens=n)) is None
        best = min(best, spent / rounds)
    return best


def main() -> int:
    print("case n seconds/op ratio_to_first")
    first = None
    for n in (1, 100, 10_000, 60_000):
        t = per_op(4, 65_536, n, 200, 3)
        first = first or t
        print(f"one-block {n} {t:.2e} {t / first:.2f}")
    first = None
    for k in (1, 16, 256):
        t = per_op(600, 16, k * 16, 50, 3) / k
        first = first or t
        print(f"per-block(k={k}) {k * 16} {t:.2e} {t / first:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
