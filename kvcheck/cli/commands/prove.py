"""``kvcheck prove``: bounded proofs of the spec and bounded exploration of a target."""

from __future__ import annotations

from kvcheck.cli.commands.common import (
    Progress,
    add_json,
    add_out_of_blocks,
    add_pool,
    add_shrink_seconds,
    add_target,
    add_trace_out,
    check_outputs,
    emit_json,
    exit_code,
    positive_float,
    positive_int,
    shrink_budget,
    write_output,
)


def add_parser(sub) -> None:
    p = sub.add_parser("prove", help="prove the spec with Z3 and check a target exhaustively "
                                     "within a small scope",
                       description="What is proved about the spec: Z3 k-induction, BMC and "
                                   "coverage. What is checked on TARGET: Z3 witness runs and "
                                   "breadth-first exploration of its code; CrossHair on the "
                                   "reference. Two groups in one table. Exit 0 (PASS) when "
                                   "everything holds, 1 (FAIL) on a counterexample or a "
                                   "disproved property, 4 (INCONCLUSIVE) when nothing failed "
                                   "but --budget or --effort left something undecided, 2 on "
                                   "bad input. Every solver query is bounded in Z3's resource "
                                   "units (--effort), not in seconds, so the verdict is the "
                                   "same on an idle and a loaded machine.")
    add_target(p, "reference")
    add_pool(p, 6, 2)
    p.add_argument("--seqs", type=positive_int, default=3, metavar="N",
                   help="sequence slots: the most sequences alive at once, in sequences "
                        "(default: %(default)s)")
    p.add_argument("--depth", type=positive_int, default=6, metavar="N",
                   help="operations per run, how deep BMC, the witnesses and BFS go "
                        "(default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, metavar="TOKENS",
                   help="the most tokens one sequence may hold (default: 3 x tokens per block)")
    p.add_argument("--budget", type=positive_float, default=300.0, metavar="SECONDS",
                   help="wall-clock limit for everything, in seconds: only an outer limit, "
                        "whatever it cuts short is INCONCLUSIVE, never PASS or FAIL "
                        "(default: %(default)g)")
    p.add_argument("--effort", type=positive_float, default=1.0, metavar="X",
                   help="the solvers' allowances times X: each Z3 query's resource units, the "
                        "ordered pairs' units in all, CrossHair's CPU seconds per contract; "
                        "counted in work, not time, so the same on any machine "
                        "(default: %(default)g)")
    p.add_argument("--no-pairs", action="store_true",
                   help="skip ordered pairs of outcome classes (default: off: pairs are searched)")
    p.add_argument("--no-crosshair", action="store_true",
                   help="skip CrossHair (default: off: CrossHair runs when TARGET is reference)")
    add_json(p)
    p.add_argument("--junit", metavar="FILE",
                   help="write JUnit XML to FILE, one test case per row, a suite for the spec "
                        "and one for the target (default: not written)")
    add_trace_out(p)
    p.add_argument("--target-only", action="store_true",
                   help="skip what is proved about the spec (induction, BMC, coverage); run only "
                        "what checks TARGET: Z3 witness runs, BFS, CrossHair on the reference "
                        "(default: off)")
    p.add_argument("--model", choices=("blocks", "tiers"), default="blocks",
                   help="what to prove: blocks, the block manager's spec and TARGET (the "
                        "default); tiers, the tiers spec alone (several pools, jobs, the "
                        "cache: 1-induction of every per-block tier invariant over the tiers' "
                        "block steps on one pool of --blocks blocks, at most --seqs "
                        "references per holder kind per block, witnesses to --depth steps; "
                        "no target is run: kvcheck verify-tiers checks one)")
    add_out_of_blocks(p)
    add_shrink_seconds(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import FAIL, INCONCLUSIVE, PASS, UsageError
    from kvcheck.prove import Settings, prove, prove_tiers
    from kvcheck.report.junit import junit_xml
    from kvcheck.report.text import render
    from kvcheck.targets.loading import load_exception

    check_outputs((args.junit, "--junit"), (args.trace_out, "--trace-out"))
    oob = load_exception(args.out_of_blocks) if args.out_of_blocks else None
    st = Settings(args.blocks, args.block_size, args.seqs, args.depth, args.max_tokens,
                  args.budget, not args.no_pairs, not args.no_crosshair,
                  target_only=args.target_only, shrink_budget=shrink_budget(args),
                  effort=args.effort)
    if st.tokens > 64 or st.num_blocks > 64 or st.seqs > 8:
        raise UsageError("scope too large for bounded proofs: keep blocks and tokens <= 64, seqs <= 8")
    if getattr(args, "model", "blocks") == "tiers" and (args.target_only
                                                         or args.target != "reference"):
        raise UsageError("--model tiers proves the tiers spec and runs no target (no TARGET, "
                         "no --target-only): kvcheck verify-tiers checks a tiers target")
    bar = None if args.json else Progress(label="prove")
    try:
        say = bar.say if bar and bar.enabled else None
        report = (prove_tiers(st, say) if getattr(args, "model", "blocks") == "tiers" else
                  prove(args.target, st, say, out_of_blocks=oob))
    finally:
        if bar:
            bar.close()
    written = True
    if args.junit:
        written &= write_output(args.junit, junit_xml(report.junit_suites(), "kvcheck prove") + "\n",
                                "--junit")
    if args.trace_out and report.counterexample is not None:
        written &= write_output(args.trace_out, report.counterexample.dumps_for(args.trace_out) + "\n",
                                "--trace-out")
    vac = _vacuous(args) if report.target_checked else {}  # what the target declares
    # this verdict could not check
    code = {"pass": PASS, "fail": FAIL, "inconclusive": INCONCLUSIVE}[report.verdict]
    if args.json:
        emit_json({**report.to_json(), **({"vacuous": vac} if vac else {})})
        return exit_code(code, written)
    print(table(report))
    for r in report.warnings():  # coverage a deeper run would show: never a failure
        print(f"warning: {r.property}: {r.detail.removeprefix('warning: ')}")
    if report.not_decided():
        print(report.not_decided())
    print(f"{report.verdict.upper()} {report.target}: {report.summary()} "
          f"[{report.seconds:.1f} s]")
    if report.counterexample is not None:
        print(render(report.counterexample, "Shortest counterexample"))
    if vac:
        from kvcheck.targets import vacuity

        print(vacuity.line(vac))
    return exit_code(code, written)


def _vacuous(args) -> dict:
    """``kvcheck.targets.vacuity.vacuous`` of the target, built at the run's scope."""
    from kvcheck.targets import vacuity
    from kvcheck.targets.loading import TargetError, build, resolve

    try:
        _, factory = resolve(args.target)
        return vacuity.vacuous(build(factory, args.blocks, args.block_size))
    except TargetError:
        return {}


def table(report) -> str:
    """The rows in two groups: what was proved about the spec, what was checked on the target."""
    from kvcheck.prove import SPEC, TARGET

    rows = report.rows
    ew = max([len("engine"), *(len(r.engine) for r in rows)])
    pw, rw = 52, max([len("result"), *(len(r.result) for r in rows)])
    lines = []
    titles = {SPEC: "Proved about the spec (Z3 over kvcheck's own specification; says nothing "
                    "about the target's code):",
              TARGET: f"Checked on the target {report.target} (its code, run under the oracle):"}
    for group in (SPEC, TARGET):
        if group == SPEC and not report.spec_checked:
            lines.append("Proved about the spec: skipped (--target-only)")
            continue
        if group == TARGET and not report.target_checked:
            from kvcheck.prove import NO_TARGET

            lines.append(f"Checked on a target: none ({NO_TARGET})")
            continue
        lines.append(titles[group])
        lines.append(f"  {'engine':{ew}} {'property':{pw}} {'result':{rw}} {'time':>8}  "
                     f"scope / detail")
        for r in report.group(group):
            lines.append(f"  {r.engine:{ew}} {r.property[:pw]:{pw}} {r.result:{rw}} "
                         f"{r.seconds:7.2f}s  {r.scope}")
            if r.detail:
                lines.append(f"  {'':{ew}}   {r.detail}")
    return "\n".join(lines)
