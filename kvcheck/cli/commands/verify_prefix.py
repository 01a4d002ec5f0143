"""``kvcheck verify-prefix``: check a prefix-caching allocator with shared-prefix workloads."""

from __future__ import annotations

import json

from kvcheck.cli.commands.common import (
    Progress,
    add_json,
    add_pool,
    add_seed,
    add_shrink_seconds,
    add_target,
    add_timeout,
    add_trace_out,
    check_outputs,
    emit_json,
    exit_code,
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
    add_timeout(p)
    add_shrink_seconds(p, 30.0)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.models.prefix.oracle import render, verify_prefix

    check_outputs((args.trace_out, "--trace-out"))
    bar = Progress(args.ops, "verify-prefix", "operations") if not args.json else None
    try:
        r = verify_prefix(args.target, args.blocks, args.block_size, args.ops, args.seed,
                          timeout=args.timeout, shrink_budget=args.shrink_seconds, progress=bar,
                          shrink_progress=bar.shrinking if bar else None)
    finally:
        if bar:
            bar.close()
    written = True
    if args.trace_out and not r.ok:
        written = write_output(args.trace_out, json.dumps(r.trace_json(), indent=1) + "\n",
                               "--trace-out")
    if args.json:
        emit_json(r.to_json())
        return exit_code(0 if r.ok else 1, written)
    st = r.stats
    if r.ok:
        print(f"PASS {args.target}: {r.ops} operations on {args.blocks} blocks x "
              f"{args.block_size} slots (seed {args.seed}); {st.allocations} allocations, "
              f"{st.hit_allocations} with cache hits ({st.hit_blocks} blocks shared), "
              f"{st.revived} evictable blocks revived, {st.evicted} evicted for reuse, "
              f"{st.oob} out-of-blocks; every structural and prefix-cache rule held "
              f"[{r.seconds:.2f} s]")
        return 0
    print(f"FAIL {args.target}: violation after {r.original_length} operations "
          f"(seed {args.seed}); shrunk to {len(r.trace)}{stopped_note(r.minimality)}:")
    print(render(r))
    if args.trace_out and written:
        print(f"trace written to {args.trace_out}")
    return 1
