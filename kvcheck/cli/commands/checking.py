"""What the commands that check a model with random operations share (``verify``,
``verify-prefix``, ``verify-device``): their flags, the run through ``kvcheck.verify``,
and the one way a result is written (``--trace-out``, ``--junit``) and printed (text or
``--json``). A command only says which model, its defaults, its own flags and how a
pass reads."""

from __future__ import annotations

from collections.abc import Callable

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
    mix_weights,
    positive_int,
    shrink_budget,
    stopped_note,
    write_output,
)

# The weights each model's driver reads (``--mix``; the drivers' ``WEIGHTS``, not imported
# here so that building the parser loads no model).
BLOCK_MIX = ("allocate", "fork", "free_seq", "append_slots", "rollback", "rebase", "preempt",
             "drop_behind_window", "max_prompt")
PREFIX_MIX = ("allocate", "fork", "free_seq", "rollback", "rebase", "preempt")

FULL_HELP = ("check the whole state after every operation: slower, exact (default: off: check "
             "what each operation touched, and everything in a sweep every max(1024, 2 x "
             "blocks) operations and at the end)")


def add_run_flags(p, target: str, what: str, blocks: int, block_size: int, ops: int,
                  full_help: str = FULL_HELP, ops_help: str = "",
                  out_of_blocks: bool = True, extra: Callable | None = None,
                  mix: tuple[str, ...] = ()) -> None:
    """The flags of a checking command, in the order ``--help`` shows them; ``extra(p)``
    adds the command's own after the seed; ``mix`` names the weights its driver reads
    (``--mix``)."""
    add_target(p, target, what)
    add_pool(p, blocks, block_size)
    p.add_argument("--ops", type=positive_int, default=ops, metavar="N",
                   help=f"operations to run{ops_help} (default: %(default)s)")
    add_seed(p)
    if mix:
        p.add_argument("--mix", type=mix_weights, metavar="NAME=W,...",
                       help=f"the driver's operation mix, as a campaign run draws it: "
                            f"{', '.join(k for k in mix if k != 'max_prompt')} multiply the "
                            f"chance of that operation (append_slot takes the rest)"
                            + (", max_prompt is the longest prompt in tokens" if "max_prompt" in mix
                               else "") + " (default: the driver's own mix)")
    p.set_defaults(mix_keys=mix)
    if extra is not None:
        extra(p)
    add_trace_out(p)
    add_junit(p)
    add_json(p)
    if out_of_blocks:
        add_out_of_blocks(p)
    add_timeout(p)
    p.add_argument("--full", action="store_true", help=full_help)
    add_shrink_seconds(p)


def run(args, command: str, model: str, **verify_kwargs):
    """Check the model with the parsed ``args``: the ``kvcheck.verify.Result``."""
    from kvcheck.check.watchdog import Interrupted
    from kvcheck.errors import UsageError
    from kvcheck.targets.loading import load_exception
    from kvcheck.verify import verify

    oob = load_exception(args.out_of_blocks) if getattr(args, "out_of_blocks", None) else None
    check_outputs((args.trace_out, "--trace-out"), (args.junit, "--junit"))
    if getattr(args, "mix", None):
        unknown = sorted(set(args.mix) - set(args.mix_keys))
        if unknown:
            raise UsageError(f"--mix: {unknown[0]} is not a weight of this driver (it reads "
                             f"{', '.join(args.mix_keys)})")
        verify_kwargs["extra"] = {**verify_kwargs.get("extra", {}), "weights": dict(args.mix)}
    bar = Progress(args.ops, command, "operations", show=not args.json)
    try:
        return verify(args.target, args.blocks, args.block_size, args.ops, args.seed, oob,
                      args.timeout, mode="full" if args.full else "fast", progress=bar,
                      shrink_budget=shrink_budget(args), shrink_progress=bar.shrinking,
                      model=model, **verify_kwargs)
    except KeyboardInterrupt:  # Ctrl-C: the line stays, and how far the run got (exit 130)
        raise Interrupted(bar.interrupted(args.seed)) from None
    finally:
        bar.close()


def report(args, result, command: str, passed: Callable[[object], str] | None = None,
           json_extra: Callable[[object], dict] | None = None) -> int:
    """Write ``--trace-out`` and ``--junit``, print ``result`` (text or ``--json``); the exit
    code. ``passed(result)`` words a pass after ``PASS TARGET: ``."""
    from kvcheck.report.text import render

    written = True
    if args.trace_out and result.trace is not None:
        written = write_output(args.trace_out, result.trace.dumps_for(args.trace_out) + "\n", "--trace-out")
    if args.junit:
        text = "" if result.trace is None else render(result.trace)
        where = (f"{args.blocks} blocks x {args.block_size} tokens, {result.ops} operations, "
                 f"seed {args.seed}")
        written &= write_output(args.junit, junit_run(command, args.target, where, result.seconds,
                                                      result.violation, text) + "\n", "--junit")
    from kvcheck.targets import vacuity
    from kvcheck.targets.loading import engine_source

    vac = vacuity.of_result(result)  # what this verdict could not have checked (declared)
    engine = engine_source(args.target)  # the engine release a third-party target ran
    if args.json:
        emit_json({**result.to_json(), **(json_extra(result) if json_extra else {}),
                   **({"vacuous": vac} if vac else {}), **({"engine": engine} if engine else {})})
        return exit_code(0 if result.ok else 1, written)
    _print_deviations(result)
    if result.ok:
        words = passed(result) if passed else (
            f"{result.ops} operations on {args.blocks} blocks x {args.block_size} slots "
            f"(seed {args.seed}), every invariant and contract held")
        if getattr(result, "deviations", None):
            words += (f" except the {len(result.deviations)} allowed deviations listed above")
        if getattr(result, "refused", 0):  # a pass never hides how much was refused
            words += (f"; {result.refused} of them refused by the target's declared policy "
                      f"(each checked to change nothing)")
        print(f"PASS {args.target}: {words} [{result.seconds:.2f} s, "
              f"{result.ops / max(result.seconds, 1e-9):,.0f} ops/s]")
        if getattr(result, "counts", None):
            print(f"  operations: {counts_words(result.counts)}")
    else:
        shrunk = ("not shrunk" if result.trace.minimality.startswith("not shrunk")
                  else f"shrunk to {len(result.trace.ops)}")
        print(f"FAIL {args.target}: violation after {result.original_length} operations "
              f"(seed {args.seed}); {shrunk}{stopped_note(result.trace.minimality)}:")
        print(render(result.trace, source=args.trace_out if written else None))
        if args.trace_out and written:
            print(f"trace written to {args.trace_out}")
    if vac:
        print(vacuity.line(vac))
    if engine:
        print(f"engine: {engine}")
    return exit_code(0 if result.ok else 1, written)


def counts_words(counts: dict) -> str:
    """``allocate 20 (2 out of blocks), fork 38, ...``: each operation the run made."""
    words = {"oob": "out of blocks", "refused": "refused"}
    parts = []
    for kind, by in counts.items():
        total = sum(by.values())
        rest = [f"{n:,} {words.get(o, o)}" for o, n in by.items() if o != "ok"]
        parts.append(f"{kind} {total:,}" + (f" ({', '.join(rest)})" if rest else ""))
    return ", ".join(parts)


def _print_deviations(result) -> None:
    """Allowed deviations are never silent: one line per clause, with its first occurrence."""
    from kvcheck.verify import deviation_summary

    for clause, d in deviation_summary(getattr(result, "deviations", [])).items():
        first = d["first"]
        print(f"ALLOWED {d['count']} x {clause} (first at operation {first['step']}: "
              f"{first['operation']})")
