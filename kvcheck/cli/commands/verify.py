"""``kvcheck verify``: check an allocator against the spec with random operations."""

from __future__ import annotations

from kvcheck.cli.commands.common import (
    Progress,
    add_json,
    add_junit,
    add_out_of_blocks,
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
    positive_int,
    stopped_note,
    write_output,
)


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check an allocator against the spec with random operations",
                       description="Drive TARGET with seeded random operations under the oracle; "
                                   "on a violation print a minimal counterexample. Exit 0 when "
                                   "every invariant and contract held, 1 on a violation, 2 on "
                                   "bad input.")
    add_target(p, "reference")
    add_pool(p, 32, 4)
    p.add_argument("--ops", type=positive_int, default=10_000, metavar="N",
                   help="operations to run (default: %(default)s)")
    add_seed(p)
    add_trace_out(p)
    add_junit(p)
    add_json(p)
    add_out_of_blocks(p)
    add_timeout(p)
    p.add_argument("--full", action="store_true",
                   help="check the whole state after every operation: slower, exact (default: "
                        "off: check what each operation touched, and everything in a sweep every "
                        "max(1024, 2 x blocks) operations and at the end)")
    add_shrink_seconds(p, 60.0)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.targets.loading import load_exception
    from kvcheck.verify import verify

    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    check_outputs((args.trace_out, "--trace-out"), (args.junit, "--junit"))
    bar = Progress(args.ops, "verify", "operations") if not args.json else None
    try:
        result = verify(args.target, args.blocks, args.block_size, args.ops, args.seed, oob,
                        args.timeout, mode="full" if args.full else "fast", progress=bar,
                        shrink_budget=args.shrink_seconds,
                        shrink_progress=bar.shrinking if bar else None)
    finally:
        if bar:
            bar.close()
    return report(args, result)


def report(args, result) -> int:
    """Write ``--trace-out`` and print ``result`` (text or ``--json``); the exit code."""
    from kvcheck.report.text import render

    written = True
    if args.trace_out and result.trace is not None:
        written = write_output(args.trace_out, result.trace.dumps() + "\n", "--trace-out")
    if getattr(args, "junit", None):
        text = "" if result.trace is None else render(result.trace)
        scope = f"{args.blocks} blocks x {args.block_size} tokens, {result.ops} operations, " \
                f"seed {args.seed}"
        written &= write_output(args.junit, junit_run("verify", args.target, scope, result.seconds,
                                                      result.violation, text) + "\n", "--junit")
    if args.json:
        emit_json(result.to_json())
    elif result.ok:
        print(f"PASS {args.target}: {result.ops} operations on {args.blocks} blocks x "
              f"{args.block_size} slots (seed {args.seed}), every invariant and contract held "
              f"[{result.seconds:.2f} s, {result.ops / max(result.seconds, 1e-9):,.0f} ops/s]")
    else:
        shrunk = ("not shrunk" if result.trace.minimality.startswith("not shrunk")
                  else f"shrunk to {len(result.trace.ops)}")
        print(f"FAIL {args.target}: violation after {result.original_length} operations "
              f"(seed {args.seed}); {shrunk}{stopped_note(result.trace.minimality)}:")
        print(render(result.trace, source=args.trace_out if written else None))
        if args.trace_out and written:
            print(f"trace written to {args.trace_out}")
    return exit_code(0 if result.ok else 1, written)
