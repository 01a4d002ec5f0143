"""``kvcheck report``: a trace of any model as one self-contained HTML page, or as ITF."""

from __future__ import annotations

from pathlib import Path

from kvcheck.cli.commands.common import check_outputs


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="draw a trace as a self-contained HTML page, or export ITF",
                       description="Write TRACE (a kvcheck trace of any model) as one HTML page "
                                   "(inline CSS, SVG and JS; no network access) showing, step by "
                                   "step, what each operation did, each sequence's block table, "
                                   "the refcounts and the free pool, with the violating step, "
                                   "its evidence and the block or sequence it is about "
                                   "highlighted; or (--itf) in Apalache's Informal Trace Format "
                                   "for TLA+ tooling. Exit 0 when written, 2 on bad input.")
    p.add_argument("trace", metavar="TRACE", help="trace file written by --trace-out (required)")
    p.add_argument("-o", "--output", metavar="FILE.html",
                   help="where to write the page (required unless --itf is given; default: "
                        "no page)")
    p.add_argument("--itf", metavar="FILE.itf.json",
                   help="also (or only) write the trace in Apalache's Informal Trace Format "
                        "(default: not written)")
    p.set_defaults(run=run, parser=p)


def run(args) -> int:
    from kvcheck.check.trace import Trace
    from kvcheck.errors import UsageError
    from kvcheck.report import itf
    from kvcheck.report.html import render_html

    if not args.output and not args.itf:  # an argument error: argparse's one line, exit 2
        args.parser.error("nothing to write: give -o FILE.html, --itf FILE.itf.json, or both")
    check_outputs((args.output, "-o"), (args.itf, "--itf"))
    trace = Trace.load(args.trace)
    outputs = []
    if args.output:
        outputs.append((args.output, "-o", render_html(trace, source=str(args.trace))))
    if args.itf:
        outputs.append((args.itf, "--itf", itf.dumps(trace) + "\n"))
    for path, flag, text in outputs:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot write {flag} {path}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    v = trace.violation
    what = "no violation" if v is None else f"violation at step {v.step}: {v.name}"
    for path, flag, _ in outputs:
        kind = "report" if flag == "-o" else "ITF trace"
        print(f"{kind} written to {path} ({len(trace.ops)} step(s), {what})")
    return 0
