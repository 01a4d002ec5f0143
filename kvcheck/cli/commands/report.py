"""``kvcheck report``: a counterexample trace as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

from kvcheck.cli.commands.common import check_outputs


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="draw a counterexample trace as a self-contained HTML page",
                       description="Write TRACE as one HTML page (inline CSS, SVG and JS; no "
                                   "network access) showing, step by step, each sequence's block "
                                   "table, the refcounts and the free pool, with the violating "
                                   "step and block highlighted. Exit 0 when written, 2 on bad "
                                   "input.")
    p.add_argument("trace", metavar="TRACE", help="trace file written by --trace-out (required)")
    p.add_argument("-o", "--output", metavar="FILE.html", required=True,
                   help="where to write the page (required)")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.check.trace import Trace
    from kvcheck.errors import UsageError
    from kvcheck.report.html import render_html

    check_outputs((args.output, "-o"))
    trace = Trace.load(args.trace)
    page = render_html(trace, source=str(args.trace))
    try:
        Path(args.output).write_text(page, encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot write -o {args.output}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    v = trace.violation
    what = "no violation" if v is None else f"violation at step {v.step}: {v.name}"
    print(f"report written to {args.output} ({len(trace.ops)} step(s), {what})")
    return 0
