"""``kvcheck replay``: re-run a counterexample trace on a target.

Exit 1 if the run breaks the spec (the recorded violation reproduces, or a
different one shows up: both are said), 0 if the target passes the whole
trace, 2 on bad input (an unreadable or invalid trace, an unknown target).
A trace found on one allocator replays on any other: only the operations
are re-run; the recorded results and states are for reading, not checked.
"""

from __future__ import annotations

from pathlib import Path

from kvcheck.commands.common import emit_json, positive_float


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="re-run a counterexample trace on a target",
                       description="Re-run the operations of TRACE (a kvcheck trace JSON file) "
                                   "on TARGET under the oracle. Exit 1 if it breaks the spec, "
                                   "0 if every check holds, 2 on bad input.")
    p.add_argument("trace", metavar="TRACE",
                   help="trace file written by --trace-out (prompts of at most 16,777,216 "
                        "tokens: a longer one is refused)")
    p.add_argument("--target", help="allocator to run it on (default: the one recorded)")
    p.add_argument("--out-of-blocks", metavar="module:Name",
                   help="exception class signalling out-of-blocks (default: any named OutOfBlocks)")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help="seconds one operation may take before it counts as a hang (default 10)")
    p.add_argument("--pytest-out", metavar="FILE",
                   help="also write a standalone pytest reproducer of the trace for the target")
    p.add_argument("--trace-out", metavar="FILE", help="write the replayed run as a trace")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _writable(path: str | None, flag: str) -> None:
    from kvcheck.errors import UsageError

    if path and Path(path).is_dir():
        raise UsageError(f"{flag} {path} is a directory")


def _write(path: str, text: str, flag: str) -> None:
    from kvcheck.errors import UsageError

    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def run(args) -> int:
    from kvcheck.explain import render
    from kvcheck.loading import TargetError, load_exception, resolve
    from kvcheck.pytest_out import pytest_source
    from kvcheck.shrink import replay
    from kvcheck.trace import Trace

    _writable(args.pytest_out, "--pytest-out")
    _writable(args.trace_out, "--trace-out")
    trace = Trace.load(args.trace)
    _runnable(trace, args.trace)
    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    target = args.target or trace.target
    try:
        label, factory = resolve(target)
    except TargetError as exc:
        if args.target:
            raise
        raise TargetError(f"{exc} (the target recorded in {args.trace}; choose one with "
                          f"--target)") from None
    r = replay(factory, trace.num_blocks, trace.block_size, trace.ops, oob, args.timeout,
               record=True)
    skipped = _skipped(trace, r)
    got = r.violation
    want = trace.violation
    if got is None:
        verdict = "pass"
    elif want is not None and got.key == want.key:
        verdict = "reproduced"
    else:
        verdict = "different"
    rerun = Trace(label, trace.num_blocks, trace.block_size, r.ops, got, trace.seed, r.states)
    if args.pytest_out:
        _write(args.pytest_out, pytest_source(trace, target, args.timeout), "--pytest-out")
    if args.trace_out:
        rerun.minimality = f"replayed from a trace recorded on {trace.target}"
        _write(args.trace_out, rerun.dumps() + "\n", "--trace-out")
        rerun.minimality = ""
    if args.json:
        emit_json({"verdict": verdict, "target": label, "ran": len(r.ops), "skipped": skipped,
                   "recorded": None if want is None else want.to_json(),
                   "violation": None if got is None else got.to_json()})
        return 0 if got is None else 1
    recorded = "no violation" if want is None else (
        f"step {want.step} ({want.kind}) {want.name}")
    note = (f"; {skipped} operation(s) skipped (the target does not offer them, or they no "
            f"longer apply after an earlier step went differently)" if skipped else "")
    if verdict == "pass":
        ran = f"all {len(r.ops)}" if not skipped else f"{len(r.ops)} of {len(trace.ops)}"
        print(f"PASS {label}: {ran} operation(s) of {args.trace} ran on "
              f"{trace.num_blocks} blocks x {trace.block_size} slots and every invariant and "
              f"contract held (recorded: {recorded}){note}")
        return 0
    if verdict == "reproduced":
        print(f"REPRODUCED on {label}: step {got.step} ({got.kind}) {got.name}{note}")
    else:
        print(f"FAIL {label}: a different violation than recorded ({recorded}): "
              f"step {got.step} ({got.kind}) {got.name}{note}")
    print(render(rerun, title="Replay"))
    if args.pytest_out:
        print(f"pytest reproducer written to {args.pytest_out}")
    return 1


def _runnable(trace, name: str) -> None:
    """Refuse a prompt longer than kvcheck runs (``kvcheck.trace.MAX_PROMPT``)."""
    from kvcheck.errors import UsageError
    from kvcheck.trace import MAX_PROMPT

    for i, op in enumerate(trace.ops):
        if op.kind == "allocate" and op.n_tokens > MAX_PROMPT:
            raise UsageError(f"{name}: ops[{i}] allocates {op.n_tokens} tokens; kvcheck runs "
                             f"prompts of at most {MAX_PROMPT} tokens (beyond any model's "
                             f"context window)")


def _skipped(trace, r) -> int:
    """Requested operations that did not run before the run ended."""
    if r.violation is None:
        return len(trace.ops) - len(r.ops)
    # Ran up to the violation: count requests not run before the last one that did.
    wanted = [(o.kind, o.seq, o.child, o.n_tokens) for o in trace.ops]
    i = 0
    for o in r.ops:
        key = (o.kind, o.seq, o.child, o.n_tokens)
        while i < len(wanted) and wanted[i] != key:
            i += 1
        i += 1
    return i - len(r.ops)
