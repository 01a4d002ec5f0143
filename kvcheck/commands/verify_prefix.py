"""``kvcheck verify-prefix``: check a prefix-caching allocator with shared-prefix workloads."""

from __future__ import annotations

import json
from pathlib import Path

from kvcheck.commands.common import block_size, emit_json, nonneg_int, positive_float, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("verify-prefix", help="check a prefix-caching allocator",
                       description="Drive TARGET with seeded shared-prefix workloads (cache hits, "
                                   "evictions, reuse) under the prefix-cache oracle; on a "
                                   "violation print a shrunk counterexample.")
    p.add_argument("target", nargs="?", default="prefix",
                   help="registered name, module:attr or file.py:attr (default: prefix)")
    p.add_argument("--blocks", type=positive_int, default=16, help="pool size (default 16)")
    p.add_argument("--block-size", type=block_size, default=4,
                   help="tokens per block (default 4; at most 65536, the largest block a trace "
                        "records)")
    p.add_argument("--ops", type=positive_int, default=5000, help="operations (default 5000)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed (default 0)")
    p.add_argument("--trace-out", metavar="FILE", help="write the counterexample as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help="seconds one operation may take before it counts as a hang (default 10)")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.prefix_oracle import render, verify_prefix

    if args.trace_out and Path(args.trace_out).is_dir():
        raise UsageError(f"--trace-out {args.trace_out} is a directory")
    r = verify_prefix(args.target, args.blocks, args.block_size, args.ops, args.seed,
                      timeout=args.timeout)
    if args.trace_out and not r.ok:
        try:
            Path(args.trace_out).write_text(json.dumps(r.trace_json(), indent=1) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write {args.trace_out}: {exc.strerror}") from None
    if args.json:
        emit_json(r.to_json())
        return 0 if r.ok else 1
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
          f"(seed {args.seed}); shrunk to {len(r.trace)}:")
    print(render(r))
    if args.trace_out:
        print(f"trace written to {args.trace_out}")
    return 1
