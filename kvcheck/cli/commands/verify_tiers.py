"""``kvcheck verify-tiers``: check a tiered KV store (device and host pools, transfers that
complete later).

The tiers model (``kvcheck.models.tiers``) run by the one checker: ``kvcheck.verify``
drives it and shrinks a violation to a trace of the one format (``model: "tiers"``), which
``kvcheck replay`` and ``kvcheck report`` read like any other.
"""

from __future__ import annotations

from kvcheck.cli.commands import checking
from kvcheck.defaults import RUN

TIERS_MIX = ("allocate", "load", "store", "complete", "evict", "free", "swap", "fail")
FULL_HELP = ("accepted for symmetry with the other checking commands: the tiers oracle reads "
             "every pool after every operation in both modes (default: off, the same checks)")


def add_parser(sub) -> None:
    from kvcheck.cli.commands.common import positive_int

    p = sub.add_parser("verify-tiers", help="check a tiered KV store (device and host pools, "
                                             "transfers in flight)",
                       description="Drive TARGET (a tiered store, docs/tiers.md: a device and a "
                                   "host pool, stores and loads that complete later; registered: "
                                   "reference-tiers) with seeded shared-prefix workloads, "
                                   "completing pending jobs in the driver's order (some fail), "
                                   "under the tiers oracle; on a violation print a shrunk "
                                   "counterexample. Exit 0 when every rule held, 1 on a "
                                   "violation, 2 on bad input.")
    d = RUN["tiers"]

    def host(q) -> None:
        q.add_argument("--host-blocks", type=positive_int, default=None, metavar="N",
                       help="the host pool, in blocks (default: half of --blocks, at least 1)")

    checking.add_run_flags(p, "reference-tiers", "tiered store", d["num_blocks"], d["block_size"],
                           d["ops"], full_help=FULL_HELP, mix=TIERS_MIX, extra=host)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.models.tiers.model import TierScope, default_host

    scope = TierScope(args.blocks, args.block_size, args.host_blocks or default_host(args.blocks))
    return checking.report(args, checking.run(args, "verify-tiers", "tiers", scope=scope),
                           "verify-tiers", _passed, _json)


def _passed(r) -> str:
    st, s = r.state.stats, r.state
    pools = " + ".join(f"{n} {p}" for p, n in s.sizes.items())
    slides = f"{st['slide']} slides, " if s.mapped_pools else ""
    return (f"{r.ops} operations on {pools} blocks x {s.bs} slots; "
            f"{st['store']} stores, {st['load']} loads, {st['complete']} completions, "
            f"{st['evict']} evictions, {st['swap_out'] + st['swap_in']} swaps, {slides}"
            f"{st['oob']} out-of-blocks; every per-pool, tier and per-operation rule held"
            + (f"; {s.data.reads:,} blocks' K/V read back, every one right" if s.data else ""))


def _json(r) -> dict:
    return {"stats": dict(r.state.stats),
            "original_length": r.original_length if not r.ok else r.ops}
