"""Prefix-oracle speed: checked operations per second, fast and full mode, as
``kvcheck verify-prefix`` runs them, against the same operations on the bare cache.

For each pool size this times ``kvcheck.verify.verify(model="prefix")`` on the bundled
reference prefix cache (seeded shared-prefix driver, watchdog on, the fast mode's
periodic and final full checks included; shrinking off because nothing fails), in fast
mode and in full mode (fewer operations at large pools: a full check reads the whole
cache every step), then replays the fast run's operation sequence (its first 20,000
operations) on a bare ``PrefixCachingBlockManager`` with no oracle. Prints one line per
pool size and, last, the fast mode's cost per checked operation at the largest pool over
the smallest (the issue's "within 2x" target). Ratios are measured within one run.

Rates are operations per second of this process's CPU time (``time.process_time``: what
one core gives it, whatever else the machine runs); ``--wall`` uses the wall clock. The
fast runs are at least one sweep period long (``max(20,000, 2 x blocks + 1)`` operations
by default), so the periodic full check is in the cost as well as the final one.

    python3 benchmarks/prefix_oracle.py                     # 100, 1,024, 10,000, 100,000 blocks
    python3 benchmarks/prefix_oracle.py --blocks 1024 --ops 20000 --full-ops 1000
"""

from __future__ import annotations

import sys
import time

from kvcheck.cli.commands.common import OneLineParser, positive_int
from kvcheck.impl.errors import OutOfBlocks
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.models.prefix.model import MODEL
from kvcheck.models.prefix.oracle import PrefixOracle
from kvcheck.targets.loading import build, resolve
from kvcheck.verify import verify

SIZES = (100, 1_024, 10_000, 100_000)
FULL_OPS = {100: 3_000, 1_024: 1_000, 10_000: 100, 100_000: 10}


CLOCK = time.process_time


def checked_rate(num_blocks: int, block_size: int, ops: int, seed: int, mode: str) -> float:
    start = CLOCK()
    r = verify("prefix", num_blocks, block_size, ops, seed, mode=mode, do_shrink=False,
               model="prefix")
    seconds = CLOCK() - start
    if not r.ok:
        sys.exit(f"the reference prefix cache failed at {num_blocks} blocks ({mode}): {r.violation}")
    return r.ops / seconds


def op_sequence(num_blocks: int, block_size: int, ops: int, seed: int) -> list:
    """The operations ``verify`` runs for this seed (the same driver loop, fast mode)."""
    from kvcheck.check.model import Options

    _, factory = resolve("prefix")
    target = build(factory, num_blocks, block_size)
    oracle = PrefixOracle(target, mode="fast", timeout=None)
    scope = MODEL.scope_from_json({"num_blocks": num_blocks, "block_size": block_size})
    driver = MODEL.driver(seed, scope, target, Options(mode="fast"))
    out = []
    for _ in range(ops):
        op = driver.next_op(oracle)
        if not oracle.valid(op):
            continue
        oracle.step(op)
        out.append(op)
    return out


def bare_rate(num_blocks: int, block_size: int, ops: list) -> float:
    """The same operations on the bare reference prefix cache, no oracle (best of three)."""
    calls = []
    for op in ops:
        if op.kind == "allocate":
            calls.append((op.kind, (op.seq, op.n_tokens, list(op.tokens))))
        elif op.kind == "append_slot":
            calls.append((op.kind, (op.seq, op.tokens[0])))
        elif op.kind == "fork":
            calls.append((op.kind, (op.seq, op.child)))
        else:
            calls.append((op.kind, (op.seq,)))
    best = float("inf")
    for _ in range(3):
        m = PrefixCachingBlockManager(num_blocks, block_size)
        methods = {k: getattr(m, k) for k in ("allocate", "append_slot", "fork", "free_seq")}
        start = CLOCK()
        for kind, args in calls:
            try:
                methods[kind](*args)
            except OutOfBlocks:
                pass
        best = min(best, CLOCK() - start)
    return len(calls) / best


def main(argv=None) -> int:
    p = OneLineParser(prog="benchmarks/prefix_oracle.py", description="prefix-oracle speed, fast and full mode")
    p.add_argument("--blocks", type=positive_int, action="append",
                   help="pool size (repeatable; default 100, 1,024, 10,000, 100,000)")
    p.add_argument("--block-size", type=positive_int, default=4)
    p.add_argument("--ops", type=positive_int, default=None,
                   help="fast-mode operations (default: max(20,000, 2 x blocks + 1))")
    p.add_argument("--full-ops", type=positive_int, default=None,
                   help="full-mode operations (default: fewer at larger pools)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wall", action="store_true", help="rates by the wall clock")
    a = p.parse_args(argv)
    global CLOCK
    CLOCK = time.perf_counter if a.wall else time.process_time
    sizes = a.blocks or SIZES
    verify("prefix", 16, a.block_size, 50, a.seed, do_shrink=False, model="prefix")  # warm up
    print("blocks  bare_ops/s  fast_ops/s  full_ops/s  fast_slowdown  fast_us/op  full/fast")
    cost = {}
    for nb in sizes:
        ops = a.ops or max(20_000, 2 * nb + 1)
        fast = checked_rate(nb, a.block_size, ops, a.seed, "fast")
        full = checked_rate(nb, a.block_size, a.full_ops or FULL_OPS.get(nb, 100), a.seed, "full")
        bare = bare_rate(nb, a.block_size, op_sequence(nb, a.block_size, min(ops, 20_000), a.seed))
        cost[nb] = 1e6 / fast
        print(f"{nb:>6}  {bare:>10.0f}  {fast:>10.0f}  {full:>10.1f}  {bare / fast:>12.1f}x"
              f"  {cost[nb]:>10.1f}  {fast / full:>8.1f}x", flush=True)
    if len(cost) > 1:
        lo, hi = min(cost), max(cost)
        print(f"fast cost per checked op, {hi} vs {lo} blocks: {cost[hi] / cost[lo]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
