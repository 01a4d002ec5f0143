"""``kvcheck verify-prefix``: check a prefix-caching allocator with shared-prefix workloads.

The prefix model (``kvcheck.models.prefix``) run by the one checker: ``kvcheck.verify``
drives it and shrinks a violation to a trace of the one format (``model: "prefix"``),
which ``kvcheck replay`` and ``kvcheck report`` read like any other.
"""

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
    positive_int,
    stopped_note,
    write_output,
)


def add_parser(sub) -> None:
    p = sub.add_parser("verify-prefix", help="check a prefix-caching allocator",
                       description="Drive TARGET with seeded shared-prefix workloads (cache hits, "
                                   "evictions, reuse) under the prefix-cache oracle; on a "
                                   "violation print a shrunk counterexample. Exit 0 when every "
                                   "rule held, 1 on a violation, 2 on bad input.")
    add_target(p, "prefix", "prefix-caching allocator")
    add_pool(p, 16, 4)
    p.add_argument("--ops", type=positive_int, default=5000, metavar="N",
                   help="operations to run (default: %(default)s)")
    add_seed(p)
    add_trace_out(p)
    add_json(p)
    add_junit(p)
    add_timeout(p)
    p.add_argument("--full", action="store_true",
                   help="check the whole allocator after every operation: slower, the same "
                        "verdicts (default: off: the block manager's structure is checked where "
                        "each operation touched it and everywhere in a sweep every max(1024, 2 x "
                        "blocks) operations and at the end; the cache is read whole after every "
                        "operation in both modes)")
    add_shrink_seconds(p, 30.0)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.report.text import render
    from kvcheck.verify import verify

    check_outputs((args.trace_out, "--trace-out"), (args.junit, "--junit"))
    bar = Progress(args.ops, "verify-prefix", "operations") if not args.json else None
    try:
        r = verify(args.target, args.blocks, args.block_size, args.ops, args.seed,
                   timeout=args.timeout, mode="full" if args.full else "fast",
                   shrink_budget=args.shrink_seconds, progress=bar,
                   shrink_progress=bar.shrinking if bar else None, model="prefix")
    finally:
        if bar:
            bar.close()
    stats = r.state.stats
    written = True
    if args.trace_out and r.trace is not None:
        written = write_output(args.trace_out, r.trace.dumps() + "\n", "--trace-out")
    if args.junit:
        from kvcheck.report.text import render as _render

        text = "" if r.trace is None else _render(r.trace)
        where = (f"{args.blocks} blocks x {args.block_size} tokens, {r.ops} operations, "
                 f"seed {args.seed}")
        written &= write_output(args.junit, junit_run('verify-prefix', args.target, where, r.seconds,
                                                      r.violation, text) + "\n", "--junit")
    if args.json:
        emit_json({**r.to_json(), "stats": stats.to_json(), "coverage": stats.coverage(),
                   "original_length": r.original_length if not r.ok else r.ops})
        return exit_code(0 if r.ok else 1, written)
    if r.ok:
        missed = stats.coverage()["missed"]
        note = f"; never exercised: {', '.join(missed)}" if missed else ""
        print(f"PASS {args.target}: {r.ops} operations on {args.blocks} blocks x "
              f"{args.block_size} slots (seed {args.seed}); {stats.allocations} allocations, "
              f"{stats.hit_allocations} with cache hits ({stats.hit_blocks} blocks shared), "
              f"{stats.revived} evictable blocks revived, {stats.evicted} evicted for reuse, "
              f"{stats.oob} out-of-blocks{note}; every structural and prefix-cache rule held "
              f"[{r.seconds:.2f} s]")
        return exit_code(0, written)
    shrunk = ("not shrunk" if r.trace.minimality.startswith("not shrunk")
              else f"shrunk to {len(r.trace.ops)}")
    print(f"FAIL {args.target}: violation after {r.original_length} operations "
          f"(seed {args.seed}); {shrunk}{stopped_note(r.trace.minimality)}:")
    print(render(r.trace, source=args.trace_out if written else None))
    if args.trace_out and written:
        print(f"trace written to {args.trace_out}")
    return exit_code(1, written)
