"""``kvcheck verify-scheduler``: check a scheduler's policy over seeded workloads."""

from __future__ import annotations

import json
from pathlib import Path

from kvcheck.commands.common import emit_json, nonneg_int, positive_float, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("verify-scheduler", help="check a scheduler against the policy spec",
                       description="Drive a seed-shaped scheduler (factory(bm, watermark_blocks) "
                                   "with waiting, running, step()) over seeded workloads on its "
                                   "block manager (--block-manager, else the BlockManager its "
                                   "module defines, else the reference); check the policy spec "
                                   "and the pool invariants at every step; shrink a failing "
                                   "workload.")
    p.add_argument("target", nargs="?", default="reference",
                   help="registered name (reference, swap), module:attr or file.py:attr "
                        "(default: reference)")
    p.add_argument("--block-manager", metavar="module:Attr",
                   help="the block manager to give the scheduler: reference, module:Attr or "
                        "file.py:Attr, a factory (num_blocks, block_size) of a seed-shaped one "
                        "(tables, ref, free, lens); default: the module-level BlockManager of "
                        "the scheduler's module, else the reference")
    p.add_argument("--out-of-blocks", metavar="module:Name",
                   help="the block manager's out-of-blocks exception class, to name it when it "
                        "escapes the scheduler (default: any named OutOfBlocks)")
    p.add_argument("--blocks", type=positive_int, default=16, help="pool size (default 16)")
    p.add_argument("--block-size", type=positive_int, default=4, help="tokens per block (4)")
    p.add_argument("--watermark", type=nonneg_int, default=1, help="watermark blocks (default 1)")
    p.add_argument("--requests", type=positive_int, default=12,
                   help="requests per workload (default 12)")
    p.add_argument("--workloads", type=positive_int, default=20,
                   help="seeded workloads, seeds SEED, SEED+1, ... (default 20)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed (default 0)")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help="seconds one step may take before it counts as a hang (default 10)")
    p.add_argument("--trace-out", metavar="FILE", help="write the counterexample as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.loading import load_exception
    from kvcheck.scheduler_oracle import render, verify
    from kvcheck.workload import WorkloadError, check_scope

    try:
        check_scope(args.blocks, args.block_size, args.watermark)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    if args.trace_out and Path(args.trace_out).is_dir():
        raise UsageError(f"--trace-out {args.trace_out} is a directory")
    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    result = verify(args.target, args.blocks, args.block_size, args.watermark, args.requests,
                    args.seed, args.workloads, args.timeout, block_manager=args.block_manager,
                    out_of_blocks=oob)
    data = result.to_json()
    data.update(block_size=args.block_size, watermark=args.watermark)
    if args.trace_out and not result.ok:
        try:
            Path(args.trace_out).write_text(json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write {args.trace_out}: {exc.strerror}") from None
    if args.json:
        emit_json(data)
    elif result.ok:
        pp = len(result.findings)
        print(f"PASS {result.label}: {result.workloads} workloads of {args.requests} requests on "
              f"{args.blocks} blocks x {args.block_size} slots of the {result.block_manager} "
              f"block manager, watermark {args.watermark} "
              f"(seed {args.seed}): {result.steps} steps, policy spec and pool invariants held "
              f"at every step, every request finished, no block leaked [{result.seconds:.2f} s]")
        if pp:
            f = result.findings[0]
            print(f"finding: {pp} preemption ping-pong(s) (a sequence preempted again before it "
                  f"decoded a token); first: {f.text}")
    else:
        print(f"FAIL {result.label}: violation in workload {result.workloads} (seed "
              f"{args.seed + result.workloads - 1}); {result.original_requests} requests shrunk "
              f"to {len(result.workload or [])}:")
        print(render(result, args.block_size, args.watermark))
        if args.trace_out:
            print(f"counterexample written to {args.trace_out}")
    return 0 if result.ok else 1
