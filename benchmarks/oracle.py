"""Oracle speed: checked operations per second, fast mode, as ``kvcheck verify`` runs.

For each pool size this times ``kvcheck.verify.verify`` on the reference
(seeded random driver, fast-mode oracle, watchdog on, periodic sweeps and the
final sweep included; shrinking off because nothing fails), then replays the
very same operation sequence on a bare reference ``BlockManager`` with no
oracle, and prints both rates, the cost of checking per operation, and the
ratio of cost per checked operation at the largest vs the smallest pool.
Beside them: the same driver loop calling the reference with no checking at
all (what any checker in this loop starts from), and the rate with the spec
evaluated directly per operation (``compiled=False``) with the speed-up the
compiled checks give, all measured in the same run.

    python3 benchmarks/oracle.py                      # 100 .. 100,000 blocks
    python3 benchmarks/oracle.py --blocks 10000 --ops 300000
    python3 benchmarks/oracle.py --profile 10000      # cProfile of one run, top 25
"""

from __future__ import annotations

import sys
import time

from kvcheck.cli.commands.common import OneLineParser, nonneg_int, positive_int
from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import OutOfBlocks
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.targets.loading import build, resolve
from kvcheck.verify import verify

SIZES = (100, 1_000, 10_000, 100_000)


def checked_rate(num_blocks: int, block_size: int, ops: int, seed: int,
                 compiled: bool = True) -> tuple[float, int]:
    start = time.perf_counter()
    result = verify("reference", num_blocks, block_size, ops, seed, do_shrink=False,
                    compiled=compiled)
    seconds = time.perf_counter() - start
    if not result.ok:
        sys.exit(f"the reference failed at {num_blocks} blocks: {result.violation}")
    return result.ops / seconds, result.ops


def op_sequence(num_blocks: int, block_size: int, ops: int, seed: int) -> list:
    """The operations ``verify`` runs for this seed (recorded with the same driver loop)."""
    _, factory = resolve("reference")
    oracle = Oracle(build(factory, num_blocks, block_size), mode="fast", timeout=None)
    driver = RandomDriver(seed, num_blocks, block_size, oracle.target.capabilities)
    out = []
    for _ in range(ops):
        op = driver.next_op(oracle.live_seqs(), oracle.ghost.num_free())
        if not oracle.valid(op):
            continue
        oracle.step(op)
        out.append(op)
    return out


def unchecked_rate(num_blocks: int, block_size: int, ops: int, seed: int) -> float:
    """The same driver loop calling the reference through its adapter, checking nothing:
    what any checker in this loop starts from (best of three)."""
    _, factory = resolve("reference")
    best = float("inf")
    for _ in range(3):
        target = build(factory, num_blocks, block_size)
        driver = RandomDriver(seed, num_blocks, block_size, target.capabilities)
        live: list[int] = []
        pos: dict[int, int] = {}
        free = target.impl.free
        start = time.perf_counter()
        for _ in range(ops):
            op = driver.next_op(live, len(free))
            try:
                if op.kind == "append_slot":
                    target.append_slot(op.seq)
                elif op.kind == "allocate":
                    target.allocate(op.seq, op.n_tokens)
                    pos[op.seq] = len(live)
                    live.append(op.seq)
                elif op.kind == "fork":
                    target.fork(op.seq, op.child)
                    pos[op.child] = len(live)
                    live.append(op.child)
                else:
                    target.free_seq(op.seq)
                    i, last = pos.pop(op.seq), live.pop()
                    if last != op.seq:
                        live[i], pos[last] = last, i
            except OutOfBlocks:
                pass
        best = min(best, time.perf_counter() - start)
    return ops / best


def bare_rate(num_blocks: int, block_size: int, ops: list) -> float:
    """The same operations on the bare reference, no oracle (best of three)."""
    calls = []
    for op in ops:
        if op.kind == "allocate":
            calls.append((op.kind, (op.seq, op.n_tokens)))
        elif op.kind == "fork":
            calls.append((op.kind, (op.seq, op.child)))
        else:
            calls.append((op.kind, (op.seq,)))
    best = float("inf")
    for _ in range(3):
        bm = BlockManager(num_blocks, block_size)
        methods = {k: getattr(bm, k) for k in ("allocate", "append_slot", "fork", "free_seq")}
        start = time.perf_counter()
        for kind, args in calls:
            try:
                methods[kind](*args)
            except OutOfBlocks:
                pass
        best = min(best, time.perf_counter() - start)
    return len(calls) / best


def main(argv=None) -> int:
    ap = OneLineParser(prog="benchmarks/oracle.py", description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=positive_int, nargs="*", default=list(SIZES))
    ap.add_argument("--block-size", type=positive_int, default=4)
    ap.add_argument("--ops", type=positive_int, default=200_000,
                    help="operations per pool size (default 200,000, at least 2x the pool)")
    ap.add_argument("--seed", type=nonneg_int, default=0)
    ap.add_argument("--profile", type=positive_int, metavar="BLOCKS",
                    help="profile one run instead")
    ap.add_argument("--no-interpreted", action="store_true",
                    help="skip the comparison run that evaluates the spec itself per operation")
    ap.add_argument("--interpreted-ops", type=positive_int, default=50_000,
                    help="operations for that comparison run (default 50,000)")
    args = ap.parse_args(argv)
    if args.profile:
        import cProfile
        import pstats

        cProfile.runctx("verify('reference', n, bs, ops, seed, do_shrink=False)", globals(),
                        {"n": args.profile, "bs": args.block_size, "ops": args.ops,
                         "seed": args.seed}, "/tmp/kvcheck-oracle.prof")
        pstats.Stats("/tmp/kvcheck-oracle.prof").sort_stats("tottime").print_stats(25)
        return 0
    print(f"reference, fast mode, block size {args.block_size}, seed {args.seed}, "
          f"Python {sys.version.split()[0]}")
    print(f"{'blocks':>8} {'ops':>8} {'checked ops/s':>14} {'bare ops/s':>12} "
          f"{'us/checked op':>14} {'us/bare op':>11} {'unchecked ops/s':>16} "
          f"{'interpreted ops/s':>18} {'compiled x':>11}")
    cost = {}
    for n in args.blocks:
        ops = max(args.ops, 2 * n)
        rate, done = checked_rate(n, args.block_size, ops, args.seed)
        bare = bare_rate(n, args.block_size, op_sequence(n, args.block_size, ops, args.seed))
        slow = "-"
        if not args.no_interpreted:
            slow_rate, _ = checked_rate(n, args.block_size, min(ops, args.interpreted_ops),
                                        args.seed, compiled=False)
            slow = f"{slow_rate:>18,.0f} {rate / slow_rate:>10.2f}x"
        loop = unchecked_rate(n, args.block_size, ops, args.seed)
        cost[n] = 1e6 / rate
        print(f"{n:>8,} {done:>8,} {rate:>14,.0f} {bare:>12,.0f} {cost[n]:>14.2f} "
              f"{1e6 / bare:>11.3f} {loop:>16,.0f} {slow}", flush=True)
    lo, hi = min(cost), max(cost)
    if lo != hi:
        print(f"cost per checked op at {hi:,} vs {lo:,} blocks: {cost[hi] / cost[lo]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
