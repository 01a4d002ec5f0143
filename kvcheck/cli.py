"""The ``kvcheck`` command line.

Each subcommand lives in ``kvcheck.commands.<name>`` and provides
``add_parser(subparsers)`` and ``run(args) -> int``. Exit codes everywhere:
0 = everything holds, 1 = a violation was found, 2 = bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvcheck.commands.common import OneLineParser
from kvcheck.errors import UsageError

__all__ = ["UsageError", "build_parser", "main"]

COMMANDS = [
    "verify",
    "prove",
    "verify-scheduler",
    "simulate",
    "verify-prefix",
    "plan",
    "replay",
    "report",
]




def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvcheck", description=__doc__.splitlines()[0])
    from kvcheck import __version__

    parser.add_argument("--version", action="version", version=f"kvcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"kvcheck.commands.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from kvcheck.loading import TargetError
    from kvcheck.trace import TraceError

    try:
        return args.run(args)
    except (UsageError, TargetError, TraceError) as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvcheck: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # a last resort: kvcheck's own state is bounded by the run
        print("kvcheck: error: out of memory: this run needs more memory than the machine "
              "allows (try a smaller pool, block size, prompt or fewer operations)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into something that stopped reading
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
