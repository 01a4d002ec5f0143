"""``kvcheck verify-device``: check a device-backed KV store's data, real K/V read back bit for bit."""

from __future__ import annotations

import argparse

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

MAX_SHAPE = 1048576  # the largest store size a trace's scope records


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text}")
    return value


def store_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_SHAPE:
        raise argparse.ArgumentTypeError(f"at most {MAX_SHAPE} (the largest a trace records), "
                                         f"got {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("verify-device",
                       help="check a device-backed KV store's data: real K/V read back bit for bit",
                       description="Drive TARGET (a block manager whose K/V lives in a paged "
                                   "store: a data target) with seeded random operations and "
                                   "batched decode steps, each token carrying random K/V; after "
                                   "every step every live sequence is read back through TARGET "
                                   "and compared bit for bit, and the structure is checked "
                                   "against the spec. On a violation print a minimal "
                                   "counterexample. Exit 0 when everything held, 1 on a "
                                   "violation, 2 on bad input.")
    add_target(p, "device", "data target")
    add_pool(p, 16, 4)
    p.add_argument("--ops", type=positive_int, default=2000, metavar="N",
                   help="operations to run, a decode step counting as one (default: "
                        "%(default)s)")
    add_seed(p)
    p.add_argument("--batch-prob", type=probability, default=0.3, metavar="P",
                   help="where the driver appends a token, the fraction of times a batched "
                        "decode step over a random set of the live sequences runs instead "
                        "(default: %(default)g)")
    p.add_argument("--layers", type=store_size, metavar="N",
                   help="layers of the store, passed to TARGET's factory as num_layers=N "
                        "(default: the factory's own)")
    p.add_argument("--kv-heads", type=store_size, metavar="N",
                   help="KV heads of the store, passed as num_kv_heads=N (default: the "
                        "factory's own)")
    p.add_argument("--head-dim", type=store_size, metavar="N",
                   help="head dimension of the store, in elements, passed as head_dim=N "
                        "(default: the factory's own)")
    add_trace_out(p)
    add_json(p)
    add_junit(p)
    add_timeout(p)
    p.add_argument("--full", action="store_true",
                   help="check the whole structure after every operation: slower, exact "
                        "(default: off: what each operation touched, and everything in a sweep "
                        "every max(1024, 2 x blocks) reservations and at the end; the K/V is "
                        "read back whole after every operation either way)")
    add_shrink_seconds(p, 30.0)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.models.device import DeviceScope
    from kvcheck.verify import verify

    check_outputs((args.trace_out, "--trace-out"), (args.junit, "--junit"))
    scope = DeviceScope(args.blocks, args.block_size, args.layers, args.kv_heads, args.head_dim)
    bar = Progress(args.ops, "verify-device", "operations") if not args.json else None
    try:
        result = verify(args.target, args.blocks, args.block_size, args.ops, args.seed,
                        timeout=args.timeout, mode="full" if args.full else "fast",
                        shrink_budget=args.shrink_seconds, progress=bar,
                        shrink_progress=bar.shrinking if bar else None, model="device",
                        scope=scope, extra={"batch_prob": args.batch_prob})
    finally:
        if bar:
            bar.close()
    return report(args, result, scope)


def report(args, result, scope) -> int:
    """Write ``--trace-out`` and print ``result`` (text or ``--json``); the exit code."""
    from kvcheck.report.text import render

    written = True
    if args.trace_out and result.trace is not None:
        written = write_output(args.trace_out, result.trace.dumps() + "\n", "--trace-out")
    if args.junit:
        from kvcheck.report.text import render as _render

        text = "" if result.trace is None else _render(result.trace)
        where = (f"{args.blocks} blocks x {args.block_size} tokens, "
                 f"{result.ops} operations, seed {args.seed}")
        written &= write_output(args.junit, junit_run('verify-device', args.target, where, result.seconds,
                                                      result.violation, text) + "\n", "--junit")
    stats = dict(getattr(result.state, "stats", None) or {})
    if args.json:
        emit_json({**result.to_json(), "model": "device", "stats": stats})
    elif result.ok:
        print(f"PASS {args.target}: {result.ops} operations ({stats.get('decode_steps', 0)} "
              f"batched decode steps, {stats.get('copies', 0)} copy-on-write copies) on "
              f"{scope.describe()} (seed {args.seed}): every "
              f"invariant and contract held and every live sequence read back its own K/V bit "
              f"for bit after every operation [{result.seconds:.2f} s, "
              f"{result.ops / max(result.seconds, 1e-9):,.0f} ops/s]")
    else:
        shrunk = ("not shrunk" if result.trace.minimality.startswith("not shrunk")
                  else f"shrunk to {len(result.trace.ops)}")
        print(f"FAIL {args.target}: violation after {result.original_length} operations "
              f"(seed {args.seed}); {shrunk}{stopped_note(result.trace.minimality)}:")
        print(render(result.trace, source=args.trace_out if written else None))
        if args.trace_out and written:
            print(f"trace written to {args.trace_out}")
    return exit_code(0 if result.ok else 1, written)
