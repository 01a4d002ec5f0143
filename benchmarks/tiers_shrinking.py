"""Shrinking the tiers corpus with and without request groups (``Model.shrink_groups``):
the seconds to each shrunk counterexample and its length, both sides in one run.

The tiers model groups a request's operations (its jobs' completions included); the
shrinker deletes whole groups, in halves, quarters ..., before single operations.
*Without* (``shrink_groups`` returning None, for the session) is the earlier path
exactly. Each entry of ``tests/corpus/tiers.py`` at 8 device + 4 host blocks of 2, 3,000
operations, at the seed its test uses, without then with; CPU time of this process::

    python3 benchmarks/tiers_shrinking.py
    python3 benchmarks/tiers_shrinking.py --entries swap-in-floor-admission store-evicts-pinned
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kvcheck.cli.commands.common import OneLineParser  # noqa: E402

SEED = {"load-past-first-miss": 1, "swap-in-floor-admission": 1}  # tests/core/test_tiers.py's


def shrink(cls, seed: int) -> tuple[float, int, int, str]:
    from kvcheck.models.tiers.model import TierScope
    from kvcheck.verify import verify

    start = time.process_time()
    r = verify(cls, 8, 2, 3000, seed, model="tiers", scope=TierScope(8, 2, 4))
    return time.process_time() - start, r.original_length, len(r.trace.ops), r.violation.name


def main(argv=None) -> int:
    from kvcheck.models.tiers.model import TiersModel

    from corpus.tiers import CORPUS

    p = OneLineParser(prog="benchmarks/tiers_shrinking.py",
                      description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", nargs="+", metavar="NAME", help="corpus entries (default: all)")
    args = p.parse_args(argv)
    names = args.entries or sorted(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"--entries: no tiers corpus entry {unknown[0]!r}")
    grouped = TiersModel.shrink_groups
    print(f"{'entry':28} {'run':>5}  {'without':>14}  {'with':>14}")
    totals = [0.0, 0.0]
    for name in names:
        cls, seed = CORPUS[name][0], SEED.get(name, 0)
        TiersModel.shrink_groups = lambda self, ops: None
        try:
            s0, n, k0, v0 = shrink(cls, seed)
        finally:
            TiersModel.shrink_groups = grouped
        s1, _, k1, v1 = shrink(cls, seed)
        if v0 != v1:
            p.error(f"{name}: the two sides found different violations ({v0!r}, {v1!r})")
        totals[0] += s0
        totals[1] += s1
        print(f"{name:28} {n:5d}  {s0:6.2f} s {k0:3d} op  {s1:6.2f} s {k1:3d} op", flush=True)
    print(f"total: {len(names)} entries, {totals[0]:.1f} s without, {totals[1]:.1f} s with "
          f"({totals[0] / max(totals[1], 1e-9):.1f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
