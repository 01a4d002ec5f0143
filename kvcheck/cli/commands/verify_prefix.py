"""``kvcheck verify-prefix``: check a prefix-caching allocator with shared-prefix workloads.

The prefix model (``kvcheck.models.prefix``) run by the one checker: ``kvcheck.verify``
drives it and shrinks a violation to a trace of the one format (``model: "prefix"``),
which ``kvcheck replay`` and ``kvcheck report`` read like any other.
"""

from __future__ import annotations

from kvcheck.cli.commands import checking
from kvcheck.defaults import RUN

FULL_HELP = ("check the whole allocator and its whole cache after every operation: slower, the "
             "same verdicts (default: off: the fast mode checks the block manager's structure "
             "and, where the target's cache can be read block by block (the bundled references), "
             "the cache where each operation touched it, and everything in a full check every "
             "max(1024, 2 x blocks) operations and at the end; a cache readable only whole is "
             "read whole after every operation)")


def add_parser(sub) -> None:
    p = sub.add_parser("verify-prefix", help="check a prefix-caching allocator",
                       description="Drive TARGET with seeded shared-prefix workloads (cache hits, "
                                   "evictions, reuse) under the prefix-cache oracle; on a "
                                   "violation print a shrunk counterexample. Exit 0 when every "
                                   "rule held, 1 on a violation, 2 on bad input.")
    from kvcheck.cli.commands.verify import _allow_flag

    d = RUN["prefix"]
    checking.add_run_flags(p, "prefix", "prefix-caching allocator", d["num_blocks"], d["block_size"],
                           d["ops"], FULL_HELP,
                           mix=checking.PREFIX_MIX, extra=_allow_flag)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.cli.commands.verify import allowed_clauses
    from kvcheck.spec.prefix import PREFIX_INVARIANTS, clause_names

    # the prefix model's own contract clauses (allocate with hits, the cache hits, the
    # cached-token count, commit, a failed call's cache) as well as the block manager's
    ours = clause_names()
    ours = {*ours, *(name.split(": ", 1)[1] for name in ours)}
    allowed_clauses([name for name in args.allow if name not in ours],
                    frozenset(inv.name for inv in PREFIX_INVARIANTS))
    allow = frozenset(args.allow)
    return checking.report(args, checking.run(args, "verify-prefix", "prefix", allow=allow),
                           "verify-prefix", _passed, _json)


def _passed(r) -> str:
    stats = r.state.stats
    missed = stats.coverage()["missed"]
    note = f"; never exercised: {', '.join(missed)}" if missed else ""
    return (f"{r.ops} operations on {r.state.target.num_blocks} blocks x "
            f"{r.state.target.block_size} slots; {stats.allocations} allocations, "
            f"{stats.hit_allocations} with cache hits ({stats.hit_blocks} blocks shared), "
            f"{stats.revived} evictable blocks revived, {stats.evicted} evicted for reuse, "
            f"{stats.oob} out-of-blocks"
            f"{f', {stats.refused} refused by its policy' if stats.refused else ''}{note}; "
            "every structural and prefix-cache rule held")


def _json(r) -> dict:
    stats = r.state.stats
    return {"stats": stats.to_json(), "coverage": stats.coverage(),
            "original_length": r.original_length if not r.ok else r.ops}
