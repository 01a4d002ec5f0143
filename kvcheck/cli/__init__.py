"""The ``kvcheck`` command line.

Each subcommand lives in ``kvcheck.commands.<name>`` and provides
``add_parser(subparsers)`` and ``run(args) -> int``. Exit codes everywhere
(``kvcheck.errors``): 0 = everything holds, 1 = a violation was found (shown), 2 = bad
input, 4 = inconclusive (a budget cut work short), 130 = interrupted, 3 = a bug in kvcheck.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kvcheck.cli.commands.common import OneLineParser
from kvcheck.errors import UsageError

__all__ = ["UsageError", "build_parser", "main"]

COMMANDS = [
    "verify",
    "prove",
    "verify-scheduler",
    "simulate",
    "verify-prefix",
    "verify-hybrid",
    "verify-tiers",
    "verify-engine",
    "verify-device",
    "plan",
    "replay",
    "report",
    "campaign",
    "install",
    "attach",
]




DESCRIPTION = (
    "kvcheck checks the block manager of an LLM inference engine (as in vLLM): the allocator "
    "that hands out fixed-size blocks of the paged KV cache to sequences, and lets forked "
    "sequences share them. It runs your allocator against a written specification and either says "
    "everything held or shows a minimal counterexample, explained step by step and replayable; "
    "it also proves the specification itself with Z3, and checks schedulers and prefix caches. "
    "Exit codes: 0 everything holds, 1 a violation (shown), 2 bad input, 4 inconclusive (a "
    "budget or timeout cut work short: nothing failed, not everything was decided), 130 "
    "interrupted.")
EPILOG = "Run 'kvcheck COMMAND --help' for a command's options."


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvcheck", description=DESCRIPTION, epilog=EPILOG)
    from kvcheck import __version__

    parser.add_argument("--version", action="version", version=f"kvcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"kvcheck.cli.commands.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None, isolate: bool | None = None) -> int:
    """Run the command line; its exit code.

    ``isolate`` (default: when run as the ``kvcheck`` program, i.e. ``argv`` is None)
    runs a command that drives target code in a supervised child process
    (``kvcheck.supervise``), so that a target ending or wedging the process is
    reported, never mistaken for a verdict."""
    import signal

    from kvcheck.check import interrupts

    # Ctrl-C while starting up (importing) is deferred, then acted on where it is safe
    # (kvcheck.check.interrupts): dispatch, the supervisor's and a campaign's loops.
    previous = signal.getsignal(signal.SIGINT)
    interrupts.defer()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        from kvcheck.cli import supervise

        if isolate is None:
            isolate = argv is None
        if isolate and args.command in supervise.SUPERVISED and supervise.available():
            try:
                return supervise.run(args, dispatch)
            except BrokenPipeError:
                return _broken_pipe()
        return dispatch(args)
    finally:
        if interrupts.deferring() and previous is not None:
            signal.signal(signal.SIGINT, previous)
        interrupts.clear()


def dispatch(args) -> int:
    """Run one parsed command: bad input is one line on stderr and exit 2, never a traceback."""
    from kvcheck.check import interrupts
    from kvcheck.check.trace import TraceError
    from kvcheck.impl.errors import StandInGap
    from kvcheck.targets.loading import TargetError

    try:
        if not getattr(args, "defers_interrupts", False):  # (a campaign polls for Ctrl-C)
            interrupts.restore()  # a Ctrl-C while starting up interrupts here
        return args.run(args)
    except (UsageError, TargetError, TraceError) as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return 2
    except StandInGap as exc:  # kvcheck's stand-in, not the engine: no verdict
        print(f"kvcheck: error: cannot run this release as it is: {exc} (kvcheck's gap, not "
              f"a verdict on the engine)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # (a command may say how far it got)
        print(f"kvcheck: interrupted{' ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except MemoryError:  # a last resort: kvcheck's own state is bounded by the run
        print("kvcheck: error: out of memory: this run needs more memory than the machine "
              "allows (try a smaller pool, block size, prompt or fewer operations)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into something that stopped reading
        return _broken_pipe()
    except Exception as exc:  # noqa: BLE001 - a bug in kvcheck itself: one line, not a traceback
        if os.environ.get("KVCHECK_DEBUG"):
            raise
        from kvcheck.errors import describe_exception

        print(f"kvcheck: internal error: {describe_exception(exc)} (a bug in kvcheck; "
              f"KVCHECK_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 3


def _broken_pipe() -> int:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


if __name__ == "__main__":
    sys.exit(main())
