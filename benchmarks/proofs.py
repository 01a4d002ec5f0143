"""Speed of the Z3 engines against the issue's goals, measured in one run.

Goals: every invariant proved at 4 sequence slots x 16 blocks in under 10 s;
BMC to depth 8 at 3 x 6 in under 60 s. Prints measured times and the ratio
to each goal (< 1 meets it), plus the encoding comparison behind the choice
of a bit-vector/integer portfolio.

    python3 benchmarks/proofs.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from kvcheck.proofs.bmc import bmc, bmc_bfs, witnesses
from kvcheck.proofs.induction import prove_invariants
from kvcheck.spec.symbolic import SymScope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the single-encoding comparison")
    ap.add_argument("--bmc-budget", type=float, default=60.0)
    args = ap.parse_args()

    big = SymScope(num_blocks=16, block_size=2, seqs=4, max_tokens=8)
    print(f"induction at {big.describe()}")
    encodings = ["auto"] if args.quick else ["auto", "bv", "int"]
    for enc in encodings:
        t0 = time.perf_counter()
        rows = prove_invariants(big, encoding=enc, timeout_ms=60_000)
        took = time.perf_counter() - t0
        proved = sum(r.result == "proved" for r in rows)
        print(f"  encoding {enc:4s}: {proved}/{len(rows)} proved in {took:6.2f} s "
              f"(goal 10 s: ratio {took / 10:.2f})")
        slow = sorted(rows, key=lambda r: -r.seconds)[:2]
        print("     slowest: " + ", ".join(f"{r.property} {r.seconds:.2f} s" for r in slow))

    small = SymScope(num_blocks=6, block_size=2, seqs=3, max_tokens=6)
    print(f"bmc at {small.describe()}, budget {args.bmc_budget:g} s")
    b = bmc_bfs(small, 8, budget=args.bmc_budget)
    print(f"  breadth-first (kvcheck prove): depth {b.depth} of 8 in {b.seconds:.1f} s, "
          f"{b.states} states, {b.transitions} transitions "
          f"(goal 60 s: ratio {b.seconds / 60:.2f}{'' if b.complete else ', budget ran out'})")
    r = bmc(small, 8, budget=args.bmc_budget)
    print(f"  classic unrolling: depth {r.depth} of 8 in {r.seconds:.1f} s "
          f"({'complete' if r.complete and r.depth == 8 else 'stopped by the budget'})")
    t0 = time.perf_counter()
    ws = witnesses(small, 5)
    print(f"  vacuity: {sum(1 for w in ws if w.depth)}/{len(ws)} outcome classes witnessed "
          f"in {time.perf_counter() - t0:.1f} s (deepest witness {max(w.depth or 0 for w in ws)})")


if __name__ == "__main__":
    main()
