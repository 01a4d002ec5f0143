"""Issue 18: what checking costs against the engine itself, per target and pool size.

For each target and pool size it records the operation sequence ``kvcheck verify``'s
driver issues (the block-manager model's seeded random driver, the oracle in the loop,
exactly the operations a checked run performs), then in the same run:

* *bare*: replays that sequence on a fresh instance of the same adapter, calling the
  target's operations directly (``kvcheck.models.blocks.model.call``), no oracle, no
  observation, no watchdog; an out-of-blocks or refused operation is caught and
  passed over, as the engine's caller would;
* *checked*: ``kvcheck.verify.verify`` on the same target, seed and shape, fast mode,
  watchdog on, sweeps included (what ``kvcheck verify`` runs), no shrinking.

Each side is the best of ``--repeat`` runs, timed by the wall clock or, with
``--clock cpu``, by this process's CPU time (steadier on a loaded shared machine:
time spent waiting for a core is not counted on either side). It prints one line
per target and size:

    TARGET BLOCKS bare_ops/s checked_ops/s slowdown

    python3 benchmarks/overhead.py                                 # every target, 32 and 1,024 blocks
    python3 benchmarks/overhead.py --targets reference --blocks 100 10000 100000
    python3 benchmarks/overhead.py --targets vllm-v0 --ops 5000 --repeat 3
    python3 benchmarks/overhead.py --clock cpu                     # CPU time, not wall time

A third-party target whose sources are not installed is reported as skipped
(``bash scripts/install_thirdparty.sh`` installs them). The figures are ratios
measured in one run on a shared machine: compare columns of one run.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.model import call
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.targets.loading import TargetError, build, resolve
from kvcheck.verify import verify

# vLLM v0 unguarded fails at once (docs/findings.md F1: allocate leaks on out of blocks);
# its scheduler's guard (``make_guarded``: can_allocate / can_append_slots first) is what
# the engine runs, and what passes, so that is what is timed.
ALIASES = {"vllm-v0": "kvcheck.impl.thirdparty.vllm_v0:make_guarded"}
TARGETS = ("reference", "vllm-v1", "nano-vllm", "vllm-v0")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # what both sides are timed by (``--clock``)
BLOCKS = (32, 1_024)


def record(name: str, num_blocks: int, block_size: int, ops: int, seed: int) -> list:
    """The operations a checked run of ``name`` performs (the driver loop of ``verify``)."""
    _, factory = resolve(ALIASES.get(name, name))
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


def bare_rate(name: str, num_blocks: int, block_size: int, ops: list, repeat: int) -> float:
    """``ops`` on a fresh instance of the adapter, nothing checked (best of ``repeat``)."""
    _, factory = resolve(ALIASES.get(name, name))
    best = float("inf")
    for _ in range(repeat):
        target = build(factory, num_blocks, block_size)
        start = clock()
        for op in ops:
            try:
                call(target, op)
            except Exception:  # out of blocks or a declared refusal: the caller passes over it
                pass
        best = min(best, clock() - start)
    return len(ops) / best


def checked_rate(name: str, num_blocks: int, block_size: int, ops: int, seed: int,
                 repeat: int) -> tuple[float, int]:
    best, done = float("inf"), 0
    for _ in range(repeat):
        start = clock()
        result = verify(ALIASES.get(name, name), num_blocks, block_size, ops, seed, do_shrink=False)
        seconds = clock() - start
        if not result.ok:
            sys.exit(f"{name} failed at {num_blocks} blocks: {result.violation}")
        best, done = min(best, seconds), result.ops
    return done / best, done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    ap.add_argument("--blocks", nargs="+", type=int, default=list(BLOCKS))
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="time by the wall clock (default) or by this process's CPU time")
    args = ap.parse_args(argv)
    if args.ops < 1 or args.repeat < 1 or args.block_size < 1 or min(args.blocks) < 1:
        ap.error("--ops, --repeat, --block-size and --blocks must be positive")
    global clock
    clock = CLOCKS[args.clock]
    print("TARGET BLOCKS bare_ops/s checked_ops/s slowdown", flush=True)
    for name in args.targets:
        for n in args.blocks:
            try:
                ops = record(name, n, args.block_size, args.ops, args.seed)
            except TargetError as exc:
                print(f"{name} {n} skipped: {str(exc).splitlines()[0]}", flush=True)
                continue
            bare = bare_rate(name, n, args.block_size, ops, args.repeat)
            checked, _ = checked_rate(name, n, args.block_size, args.ops, args.seed, args.repeat)
            print(f"{name} {n} {bare:.0f} {checked:.0f} {bare / checked:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
