"""``kvcheck verify-device``: check a device-backed KV store's data, real K/V read back bit for bit."""

from __future__ import annotations

import argparse

from kvcheck.cli.commands import checking
from kvcheck.cli.commands.common import positive_int
from kvcheck.defaults import RUN

MAX_SHAPE = 1048576  # the largest store size a trace's scope records


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1, got {text}")
    return value


def store_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_SHAPE:
        raise argparse.ArgumentTypeError(f"at most {MAX_SHAPE} (the largest a trace records), "
                                         f"got {value}")
    return value


FULL_HELP = ("check the whole structure after every operation: slower, exact (default: off: "
             "what each operation touched, and everything in a sweep every max(1024, 2 x blocks) "
             "reservations and at the end; the K/V is read back whole after every operation "
             "either way)")


def _own_flags(p) -> None:
    p.add_argument("--batch-prob", type=probability, default=RUN["device"]["batch_prob"],
                   metavar="P",
                   help="where the driver appends a token, the fraction of times a batched "
                        "decode step over a random set of the live sequences runs instead "
                        "(default: %(default)g)")
    p.add_argument("--layers", type=store_size, metavar="N",
                   help="layers of the store, passed to TARGET's factory as num_layers=N "
                        "(default: the factory's own)")
    p.add_argument("--kv-heads", type=store_size, metavar="N",
                   help="KV heads of the store, passed as num_kv_heads=N (default: the "
                        "factory's own)")
    p.add_argument("--head-dim", type=store_size, metavar="N",
                   help="head dimension of the store, in elements, passed as head_dim=N "
                        "(default: the factory's own)")


def add_parser(sub) -> None:
    p = sub.add_parser("verify-device",
                       help="check a device-backed KV store's data: real K/V read back bit for bit",
                       description="Drive TARGET (a block manager whose K/V lives in a paged "
                                   "store: a data target) with seeded random operations and "
                                   "batched decode steps, each token carrying random K/V; after "
                                   "every step every live sequence is read back through TARGET "
                                   "and compared bit for bit, and the structure is checked "
                                   "against the spec. On a violation print a minimal "
                                   "counterexample. Exit 0 when everything held, 1 on a "
                                   "violation, 2 on bad input.")
    d = RUN["device"]
    checking.add_run_flags(p, "device", "data target", d["num_blocks"], d["block_size"], d["ops"],
                           FULL_HELP,
                           ops_help=", a decode step counting as one", out_of_blocks=False,
                           extra=_own_flags, mix=checking.BLOCK_MIX)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.models.device import DeviceScope

    scope = DeviceScope(args.blocks, args.block_size, args.layers, args.kv_heads, args.head_dim)
    result = checking.run(args, "verify-device", "device", scope=scope,
                          extra={"batch_prob": args.batch_prob})

    def passed(r) -> str:
        stats = dict(getattr(r.state, "stats", None) or {})
        return (f"{r.ops} operations ({stats.get('decode_steps', 0)} batched decode steps, "
                f"{stats.get('copies', 0)} copy-on-write copies) on {scope.describe()} (seed "
                f"{args.seed}): every invariant and contract held and every live sequence read "
                f"back its own K/V bit for bit after every operation")

    def json_extra(r) -> dict:
        return {"model": "device", "stats": dict(getattr(r.state, "stats", None) or {})}

    return checking.report(args, result, "verify-device", passed, json_extra)
