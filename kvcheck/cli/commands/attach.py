"""``kvcheck attach ENGINE==VERSION FILES``: an engine's own unit tests, with kvcheck inside."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "attach", help="run an engine release's own unit tests with kvcheck's invariants "
                       "checked after every call of its KV-cache manager",
        description="Download the release's sdist tests (once, into ~/.cache/kvcheck/attach or "
                    "$KVCHECK_ATTACH_DIR; an sdist in $KVCHECK_SDIST_DIR is used offline), run the "
                    "named test files with pytest on the release's own files (kvcheck install's "
                    "copy; modules that cannot be imported here make the tests that reach them "
                    "'not run'), and check kvcheck's block-manager and prefix-cache invariants on "
                    "every KV-cache manager state a test produces (v1's KVCacheManager, v0's "
                    "block space manager). Prints, per file: passed, failed "
                    "by the engine's own assertions, failed by kvcheck (with the clause), not run "
                    "(with the reason). Exit 0 nothing failed (and kvcheck checked states), 1 a "
                    "test failed, 2 bad input or a download that could not be done, 4 nothing "
                    "failed but kvcheck checked no state. The same checks inside any pytest run: "
                    "-p kvcheck.cli.attach.plugin --kvcheck-attach=DIR (docs/attach.md).")
    p.add_argument("release", metavar="ENGINE==VERSION",
                   help="the release whose tests to run (vllm-v1 or vllm-v0, e.g. "
                        "vllm-v1==0.33.0, vllm-v0==0.8.5) (required)")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="test files of the sdist (test_prefix_caching.py: under tests/v1/core/ "
                        "for vllm-v1, tests/core/ or tests/core/block/ for vllm-v0; or a path "
                        "under tests/), optionally FILE::TEST (required)")
    p.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                   help="only the tests matching pytest's -k expression (default: all)")
    p.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[],
                   metavar="ARG", help="one more argument for the pytest run (repeatable; e.g. "
                                       "--pytest-arg=-p --pytest-arg=myplugin; default: none)")
    p.add_argument("--verbose", action="store_true",
                   help="list every test failed by the engine (default: the first five per file)")
    p.set_defaults(run=run)


def run(args) -> int:
    import sys

    from kvcheck.cli import attach
    from kvcheck.errors import UsageError

    extra = (["-k", args.keyword] if args.keyword else []) + list(args.pytest_args)
    try:
        outcome = attach.run(args.release, args.files, extra,
                             say=lambda m: print(m, file=sys.stderr))
    except attach.AttachError as exc:
        raise UsageError(str(exc)) from None
    print(attach.render(outcome, args.release, verbose=args.verbose))
    if any(f.kvcheck or f.engine for f in outcome.files.values()):
        return 1
    if outcome.checks == 0:  # nothing failed, but kvcheck judged nothing either
        print("kvcheck attach: no manager state was checked (inconclusive)", file=sys.stderr)
        return 4
    return 0
