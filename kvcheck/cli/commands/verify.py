"""``kvcheck verify``: check an allocator against the spec with random operations."""

from __future__ import annotations

from kvcheck.cli.commands import checking


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check an allocator against the spec with random operations",
                       description="Drive TARGET with seeded random operations under the oracle; "
                                   "on a violation print a minimal counterexample. Exit 0 when "
                                   "every invariant and contract held, 1 on a violation, 2 on "
                                   "bad input.")
    checking.add_run_flags(p, "reference", "allocator", 32, 4, 10_000, 60.0, mix=checking.BLOCK_MIX)
    p.set_defaults(run=run)


def run(args) -> int:
    return report(args, checking.run(args, "verify", "blocks"))


def report(args, result) -> int:
    """Write ``--trace-out``/``--junit`` and print ``result``; the exit code (the supervisor
    reports a run the target ended through this too)."""
    return checking.report(args, result, "verify")
