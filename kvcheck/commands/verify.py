"""``kvcheck verify``: check an allocator against the spec with random operations."""

from __future__ import annotations

from pathlib import Path

from kvcheck.commands.common import (
    Progress,
    block_size,
    emit_json,
    nonneg_int,
    positive_float,
    positive_int,
)


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check an allocator against the spec",
                       description="Drive TARGET with seeded random operations under the oracle; "
                                   "on a violation print a minimal counterexample.")
    p.add_argument("target", nargs="?", default="reference",
                   help="registered name, module:attr or file.py:attr (default: reference)")
    p.add_argument("--blocks", type=positive_int, default=32, help="pool size (default 32)")
    p.add_argument("--block-size", type=block_size, default=4,
                   help="tokens per block (default 4; at most 65536, the largest block a trace "
                        "records)")
    p.add_argument("--ops", type=positive_int, default=10_000, help="operations (default 10000)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed (default 0)")
    p.add_argument("--trace-out", metavar="FILE", help="write the counterexample as JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out-of-blocks", metavar="module:Name",
                   help="exception class signalling out-of-blocks (default: any named OutOfBlocks)")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help="seconds one operation may take before it counts as a hang (default 10)")
    p.add_argument("--full", action="store_true",
                   help="check the whole state after every operation (slow, exact)")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.explain import render
    from kvcheck.loading import load_exception
    from kvcheck.verify import verify

    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    if args.trace_out and Path(args.trace_out).is_dir():
        raise UsageError(f"--trace-out {args.trace_out} is a directory")
    bar = Progress(args.ops, "verify") if not args.json else None
    try:
        result = verify(args.target, args.blocks, args.block_size, args.ops, args.seed, oob,
                        args.timeout, mode="full" if args.full else "fast", progress=bar)
    finally:
        if bar:
            bar.close()
    if args.trace_out and result.trace is not None:
        try:
            result.trace.write(args.trace_out)
        except OSError as exc:
            raise UsageError(f"cannot write {args.trace_out}: {exc.strerror}") from None
    if args.json:
        emit_json(result.to_json())
    elif result.ok:
        print(f"PASS {args.target}: {result.ops} operations on {args.blocks} blocks x "
              f"{args.block_size} slots (seed {args.seed}), every invariant and contract held "
              f"[{result.seconds:.2f} s, {result.ops / max(result.seconds, 1e-9):,.0f} ops/s]")
    else:
        print(f"FAIL {args.target}: violation after {result.original_length} operations "
              f"(seed {args.seed}); shrunk to {len(result.trace.ops)}:")
        print(render(result.trace, source=args.trace_out))
        if args.trace_out:
            print(f"trace written to {args.trace_out}")
    return 0 if result.ok else 1
