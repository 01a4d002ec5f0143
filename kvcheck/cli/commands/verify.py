"""``kvcheck verify``: check an allocator against the spec with random operations."""

from __future__ import annotations

from kvcheck.cli.commands import checking
from kvcheck.defaults import RUN


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check an allocator against the spec with random operations",
                       description="Drive TARGET with seeded random operations under the oracle; "
                                   "on a violation print a minimal counterexample. Exit 0 when "
                                   "every invariant and contract held, 1 on a violation, 2 on "
                                   "bad input.")
    d = RUN["blocks"]
    checking.add_run_flags(p, "reference", "allocator", d["num_blocks"], d["block_size"], d["ops"],
                           extra=_allow_flag,
                           mix=checking.BLOCK_MIX)
    p.set_defaults(run=run)


def _allow_flag(p) -> None:
    p.add_argument("--allow", action="append", default=[], metavar="CLAUSE",
                   help="a documented, deliberate deviation of the target: a contract clause as "
                        "a violation names it ('fork: child's table is its own object', or the "
                        "clause alone) or an invariant's name. Each violation of it is counted "
                        "and reported, the run takes what the target did as its state and "
                        "checks on, so one deviation cannot hide a later bug (repeatable; "
                        "default: none)")


def allowed_clauses(names: list[str], never: frozenset = frozenset()) -> frozenset:
    """``--allow``'s names, each checked against the spec's (``UsageError``: unknown).
    ``never``: rules of the spec the command checks but cannot allow (verify-prefix's
    prefix-cache invariants: an allowed deviation is resynchronised past by the block
    manager's oracle, and every prefix rule is then checked again)."""
    from kvcheck.errors import UsageError
    from kvcheck.spec.contracts import clause_names
    from kvcheck.spec.invariants import INVARIANTS

    known = set(clause_names()) | {inv.name for inv in INVARIANTS}
    known |= {name.split(": ", 1)[1] for name in clause_names()}
    for name in names:
        if name in never and name not in known:
            raise UsageError(f"--allow {name!r}: a prefix-cache rule cannot be allowed (--allow "
                             f"takes the block manager's clauses and invariants; a prefix rule "
                             f"is checked again after every allowed deviation)")
        if name not in known:
            raise UsageError(f"--allow {name!r}: no clause or invariant of the spec has that "
                             f"name (the names are those a violation prints, e.g. "
                             f"'fork: child's table is its own object' or 'refcount_conservation')")
    return frozenset(names)


def run(args) -> int:
    allow = allowed_clauses(args.allow)
    return report(args, checking.run(args, "verify", "blocks", allow=allow))


def report(args, result) -> int:
    """Write ``--trace-out``/``--junit`` and print ``result``; the exit code (the supervisor
    reports a run the target ended through this too)."""
    return checking.report(args, result, "verify")
