"""``kvcheck verify-scheduler``: check a scheduler's policy over seeded workloads."""

from __future__ import annotations

from kvcheck.cli.commands.common import (
    Progress,
    add_json,
    add_junit,
    add_pool,
    add_seed,
    add_shrink_seconds,
    add_target,
    add_timeout,
    add_trace_out,
    check_outputs,
    emit_json,
    exit_code,
    junit_run,
    nonneg_int,
    positive_int,
    shrink_budget,
    stopped_note,
    write_output,
)
from kvcheck.defaults import RUN


def add_parser(sub) -> None:
    p = sub.add_parser("verify-scheduler", help="check a scheduler against the policy spec",
                       description="Drive a seed-shaped scheduler (factory(bm, watermark_blocks) "
                                   "with waiting, running, step()) over seeded workloads on its "
                                   "block manager (--block-manager, else the BlockManager its "
                                   "module defines, else the reference); check the policy spec "
                                   "and the pool invariants at every step; shrink a failing "
                                   "workload to a replayable trace. Exit 0 when everything "
                                   "held, 1 on a violation, 2 on bad input.")
    add_target(p, "reference", "scheduler (registered: reference, swap)")
    p.add_argument("--block-manager", metavar="module:Attr",
                   help="the block manager to give the scheduler: reference, module:Attr or "
                        "file.py:Attr, a factory (num_blocks, block_size) of a seed-shaped one "
                        "(tables, ref, free, lens) (default: the module-level BlockManager of "
                        "the scheduler's module, else the reference)")
    p.add_argument("--out-of-blocks", metavar="module:Name",
                   help="the block manager's out-of-blocks exception class, to name it when it "
                        "escapes the scheduler (default: any exception class named OutOfBlocks)")
    d = RUN["scheduler"]
    add_pool(p, d["num_blocks"], d["block_size"])
    p.add_argument("--watermark", type=nonneg_int, default=d["watermark"], metavar="BLOCKS",
                   help="free blocks admission keeps in reserve, in blocks (default: %(default)s)")
    p.add_argument("--requests", type=positive_int, default=d["requests"], metavar="N",
                   help="requests per workload (default: %(default)s)")
    p.add_argument("--workloads", type=positive_int, default=d["workloads"], metavar="N",
                   help="seeded workloads to run, with seeds SEED, SEED+1, ... "
                        "(default: %(default)s)")
    add_seed(p)
    add_timeout(p, "scheduler step")
    add_trace_out(p, "the counterexample (the failing workload, step by step) as a JSON trace "
                     "(kvcheck replay, kvcheck report)")
    add_junit(p)
    add_json(p)
    add_shrink_seconds(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.models.scheduler.runs import verify
    from kvcheck.models.scheduler.workload import WorkloadError, check_scope
    from kvcheck.report.text import render
    from kvcheck.targets.loading import load_exception

    try:
        check_scope(args.blocks, args.block_size, args.watermark)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    check_outputs((args.trace_out, "--trace-out"), (args.junit, "--junit"))
    if args.out_of_blocks:
        load_exception(args.out_of_blocks)  # bad input before anything runs
    bar = Progress(args.workloads, "verify-scheduler", "workloads") if not args.json else None
    try:
        result = verify(args.target, args.blocks, args.block_size, args.watermark, args.requests,
                        args.seed, args.workloads, args.timeout, shrink_budget=shrink_budget(args),
                        block_manager=args.block_manager, out_of_blocks=args.out_of_blocks,
                        progress=bar, shrink_progress=(
                            (lambda n, k: bar.shrinking(n, k, "requests")) if bar else None))
    finally:
        if bar:
            bar.close()
    data = result.to_json()
    data.update(block_size=args.block_size, watermark=args.watermark)
    written = True
    if args.trace_out and not result.ok:
        written = write_output(args.trace_out, result.trace.dumps_for(args.trace_out) + "\n", "--trace-out")
    if args.junit:
        from kvcheck.report.text import render as _render

        text = "" if result.trace is None else _render(result.trace)
        where = (f"{args.blocks} blocks x {args.block_size} tokens, "
                 f"watermark {args.watermark}, "
                 f"{result.workloads} workload(s) of {args.requests} requests, "
                 f"seed {args.seed}")
        written &= write_output(args.junit, junit_run('verify-scheduler', result.label, where, result.seconds,
                                                      result.violation, text) + "\n", "--junit")
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
              f"to {len(result.workload or [])}{stopped_note(result.minimal)}:")
        print(render(result.trace, source=args.trace_out if args.trace_out and written else None))
        if args.trace_out and written:
            print(f"counterexample written to {args.trace_out}")
    return exit_code(0 if result.ok else 1, written)
