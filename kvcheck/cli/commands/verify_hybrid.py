"""``kvcheck verify-hybrid``: check a hybrid pool (KV-cache groups sharing one pool).

The hybrid model (``kvcheck.models.hybrid``) run by the one checker: ``kvcheck.verify``
drives it and shrinks a violation to a trace of the one format (``model: "hybrid"``),
which ``kvcheck replay`` and ``kvcheck report`` read like any other.
"""

from __future__ import annotations

from kvcheck.cli.commands import checking
from kvcheck.defaults import RUN

HYBRID_MIX = ("allocate", "free_seq")
FULL_HELP = ("accepted for symmetry with the other checking commands: the hybrid oracle reads "
             "the whole pool after every operation in both modes (default: off, the same "
             "checks)")


def add_parser(sub) -> None:
    from kvcheck.targets.registry import HYBRID_TARGETS

    names = ", ".join(sorted(HYBRID_TARGETS))
    p = sub.add_parser("verify-hybrid", help="check a hybrid pool (full + sliding-window groups)",
                       description="Drive TARGET (a hybrid pool: one table per KV-cache group per "
                                   "request, one shared pool; registered: " + names + ") with "
                                   "seeded shared-prefix workloads under the hybrid oracle; on a "
                                   "violation print a shrunk counterexample. Exit 0 when every "
                                   "rule held, 1 on a violation, 2 on bad input.")
    d = RUN["hybrid"]
    checking.add_run_flags(p, "reference-hybrid", "hybrid pool", d["num_blocks"], d["block_size"],
                           d["ops"], FULL_HELP, mix=HYBRID_MIX)
    p.set_defaults(run=run)


def run(args) -> int:
    return checking.report(args, checking.run(args, "verify-hybrid", "hybrid"), "verify-hybrid",
                           _passed, _json)


def _passed(r) -> str:
    st = r.state.stats
    return (f"{r.ops} operations on {r.state.nb} blocks x {r.state.bs} slots, groups with "
            f"windows {list(r.state.windows)} (0 = full attention); {st['allocate']} allocations, "
            f"{st['hits']} with cache hits, {st['dropped']} sliding-window drops, {st['oob']} "
            f"out-of-blocks; every block-manager, hybrid-pool and per-operation rule held")


def _json(r) -> dict:
    return {"stats": dict(r.state.stats), "windows": list(r.state.windows),
            "original_length": r.original_length if not r.ok else r.ops}
