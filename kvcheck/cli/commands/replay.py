"""``kvcheck replay``: re-run a counterexample trace on a target.

Exit 1 if the run breaks the spec (the recorded violation reproduces, or a
different one shows up: both are said), 0 if the target passes the whole
trace, 2 on bad input (an unreadable or invalid trace, an unknown target).
A trace found on one allocator replays on any other: only the operations
are re-run; the recorded results and states are for reading, not checked.
An operation the target does not offer, or one that no longer applies after
an earlier step went differently, is skipped (and counted); when that is the
recorded violating step the replay is NOT REPRODUCED (exit 4, INCONCLUSIVE),
never a PASS: what the trace was to show was not checked. A trace whose operations are not
valid in its own history (a hand-edited one) is bad input.
"""

from __future__ import annotations

import sys

from kvcheck.cli.commands.common import (
    add_json,
    add_junit,
    add_out_of_blocks,
    add_timeout,
    add_trace_out,
    check_outputs,
    emit_json,
    exit_code,
    junit_run,
    write_output,
)


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="re-run a counterexample trace on a target",
                       description="Re-run the operations of TRACE (a kvcheck trace JSON file) "
                                   "on TARGET under the oracle. Exit 1 if it breaks the spec, "
                                   "0 if every check holds, 2 on bad input.")
    p.add_argument("trace", metavar="TRACE",
                   help="trace file written by --trace-out (required); prompts of at most "
                        "16,777,216 tokens (a longer one is refused)")
    p.add_argument("--target",
                   help="the allocator to run it on: a registered name, module:attr or "
                        "file.py:attr (default: the one recorded in TRACE)")
    add_out_of_blocks(p)
    add_timeout(p)
    p.add_argument("--pytest-out", metavar="FILE",
                   help="also write a standalone pytest reproducer of the trace for the target "
                        "to FILE (default: not written)")
    add_trace_out(p, "the replayed run as a trace")
    add_junit(p)
    add_json(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.check.model import Options, model_named
    from kvcheck.check.portable import TargetNotFound, located
    from kvcheck.check.run import replay
    from kvcheck.check.trace import Trace
    from kvcheck.check.watchdog import Watchdog
    from kvcheck.errors import UsageError
    from kvcheck.report.pytest_out import pytest_source
    from kvcheck.report.text import render
    from kvcheck.targets.loading import TargetError, load_exception, resolve

    check_outputs((args.pytest_out, "--pytest-out"), (args.trace_out, "--trace-out"),
                  (args.junit, "--junit"))
    trace = Trace.load(args.trace)
    _runnable(trace, args.trace)
    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    if args.target:
        target = args.target
    else:
        try:
            target, note = located(trace.target, trace.source, trace.target_file)
        except TargetNotFound as exc:
            raise TargetError(f"{exc}: choose the target with --target") from None
        if note:
            print(f"kvcheck: {note}", file=sys.stderr)
    model = model_named(trace.model)
    try:
        with Watchdog(args.timeout):
            label, factory = model.resolve(target) or resolve(target)
    except TargetError as exc:
        if args.target:
            raise
        raise TargetError(f"{exc} (the target recorded in {args.trace}; choose one with "
                          f"--target)") from None
    r = replay(model, factory, trace.scope, trace.ops,
               Options(timeout=args.timeout, out_of_blocks=oob, extra=dict(trace.settings)),
               record=True)
    if r.violation is None and not r.ops:
        raise UsageError(f"none of the {len(trace.ops)} operation(s) of {args.trace} could run on "
                         f"{label}: nothing was checked")
    skipped = _skipped(model, trace, r)
    got = r.violation
    want = trace.violation
    missed = None  # the recorded violating step, where it did not run
    if got is None and want is not None and 1 <= want.step <= len(trace.ops) and \
            want.step - 1 not in _ran(model, trace, r):
        missed = want.step
    if missed is not None:
        verdict = "not-reproduced"
    elif got is None:
        verdict = "pass"
    elif want is not None and got.key == want.key:
        verdict = "reproduced"
    else:
        verdict = "different"
    rerun = Trace(label, trace.num_blocks, trace.block_size, r.ops, got, trace.seed, r.states,
                  model=trace.model, extra=trace.extra, settings=trace.settings)
    written = wrote_pytest = True
    if args.pytest_out:
        written = wrote_pytest = write_output(
            args.pytest_out, pytest_source(trace, target, args.timeout, args.pytest_out), "--pytest-out")
    if args.trace_out:
        rerun.minimality = f"replayed from a trace recorded on {trace.target}"
        written &= write_output(args.trace_out, rerun.dumps_for(args.trace_out) + "\n", "--trace-out")
        rerun.minimality = ""
    missed_words = None
    if missed is not None:
        missed_words = (f"step {missed} ({model.describe(model.request(trace.ops[missed - 1]))}) "
                        f"did not run: the target does not offer it, or it no longer applies "
                        f"after an earlier step went differently")
    if args.junit:
        scope = f"{len(r.ops)} of {len(trace.ops)} operation(s) of {args.trace}"
        written &= write_output(args.junit, junit_run(
            "replay", label, scope, 0.0, got, render(rerun, title="Replay"),
            skipped=f"not reproduced: {missed_words}" if missed_words else None) + "\n",
            "--junit")
    verdict_code = {"pass": 0, "not-reproduced": 4}.get(verdict, 1)  # 4: INCONCLUSIVE
    if args.json:
        emit_json({"verdict": verdict, "target": label, "ran": len(r.ops), "skipped": skipped,
                   **({"did_not_run": missed} if missed is not None else {}),
                   "recorded": None if want is None else want.to_json(),
                   "violation": None if got is None else got.to_json()})
        return exit_code(verdict_code, written)
    recorded = "no violation" if want is None else (
        f"step {want.step} ({want.kind}) {want.name}")
    note = (f"; {skipped} operation(s) skipped (the target does not offer them, or they no "
            f"longer apply after an earlier step went differently)" if skipped else "")
    if verdict == "not-reproduced":
        done = len(r.ops) - r.implied
        print(f"NOT REPRODUCED on {label}: {missed_words}, so the recorded violation (step "
              f"{want.step} ({want.kind}) {want.name}) was not checked; the {done} of "
              f"{len(trace.ops)} operation(s) that ran held every invariant and contract")
        return exit_code(verdict_code, written)
    if verdict == "pass":
        done = len(r.ops) - r.implied  # the trace's own operations that ran
        ran = f"all {done}" if not skipped else f"{done} of {len(trace.ops)}"
        print(f"PASS {label}: {ran} operation(s) of {args.trace} ran on "
              f"{trace.num_blocks} blocks x {trace.block_size} slots and every invariant and "
              f"contract held (recorded: {recorded}){note}")
        return exit_code(0, written)
    if verdict == "reproduced":
        print(f"REPRODUCED on {label}: step {got.step} ({got.kind}) {got.name}{note}")
    else:
        print(f"FAIL {label}: a different violation than recorded ({recorded}): "
              f"step {got.step} ({got.kind}) {got.name}{note}")
    print(render(rerun, title="Replay"))
    if args.pytest_out and wrote_pytest:
        print(f"pytest reproducer written to {args.pytest_out}")
    return 1


def _runnable(trace, name: str) -> None:
    """Refuse a prompt longer than kvcheck runs (``kvcheck.check.trace.MAX_PROMPT``)."""
    from kvcheck.check.trace import MAX_PROMPT
    from kvcheck.errors import UsageError

    for i, op in enumerate(trace.ops):
        if op.kind == "allocate" and getattr(op, "n_tokens", 0) > MAX_PROMPT:
            raise UsageError(f"{name}: ops[{i}] allocates {op.n_tokens} tokens; kvcheck runs "
                             f"prompts of at most {MAX_PROMPT} tokens (beyond any model's "
                             f"context window)")


def _ran(model, trace, r) -> set[int]:
    """The positions in ``trace.ops`` of the requests the replay ran. A replay runs the
    requests in order, skipping those not valid then; matching each operation that ran to
    the first request like it after the previous match is exact: a request skipped just
    before an identical one that ran would have met the same state, and run."""
    own = r.ops[:len(r.ops) - r.implied]
    wanted = [_key(model, o) for o in trace.ops]
    out, i = set(), 0
    for o in own:
        k = _key(model, o)
        while i < len(wanted) and wanted[i] != k:
            i += 1
        out.add(i)
        i += 1
    return out


def _key(model, op) -> str:
    d = model.op_to_json(model.request(op))
    d.pop("result", None)
    return repr(sorted(d.items()))


def _skipped(model, trace, r) -> int:
    """Requested operations that did not run before the run ended (not counting those the
    model ran itself to end the run)."""
    own = r.ops[:len(r.ops) - r.implied]
    if r.violation is None:
        return len(trace.ops) - len(own)

    def key(op) -> str:
        d = model.op_to_json(model.request(op))
        d.pop("result", None)
        return repr(sorted(d.items()))

    # Ran up to the violation: count requests not run before the last one that did.
    wanted = [key(o) for o in trace.ops]
    i = 0
    for o in own:
        k = key(o)
        while i < len(wanted) and wanted[i] != k:
            i += 1
        i += 1
    return i - len(own)
