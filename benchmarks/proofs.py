"""Speed of the Z3 engines against the issue's goals, measured in one run.

Goals: every invariant proved at 4 sequence slots x 16 blocks in under 10 s;
BMC to depth 8 at 3 x 6 in under 60 s. Prints measured times and the ratio
to each goal (< 1 meets it), plus the encoding comparison behind the choice
of a bit-vector/integer portfolio.

    python3 benchmarks/proofs.py [--quick]
    python3 benchmarks/proofs.py --bmc [--bmc-budget S]

``--bmc`` only: breadth-first BMC (issue 18: depth 10 at 4 slots x 8 blocks in
under 120 s), in this one run, route by route (``--bmc-routes``): ``lemmas``, what
``kvcheck prove`` uses (``bmc_lemmas``: the invariants their 1-induction proves closed
at every depth, the rest asked on one incremental unrolling; its time includes the
induction's), ``unrolled`` (the same unrolling with no invariant closed), ``choice``
(``bmc_bfs``, the explicit enumeration ``kvcheck prove`` used before) and, on request,
``step`` (``bmc_bfs``'s first enumeration) and ``alone`` (``bmc_lemmas`` checking
refcount_conservation alone, which is not inductive by itself: what the unrolling costs
for an invariant no induction closes): depth completed, seconds, and the ratio to
the goal (seconds / goal when every depth was done; the budget ratio and the depth
reached when it ran out); the enumerations also print distinct states and transitions.
"""

from __future__ import annotations

import argparse
import time

from kvcheck.proofs.bmc import bmc, bmc_bfs, bmc_lemmas, witnesses
from kvcheck.proofs.induction import prove_invariants
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.symbolic import SymScope

ROUTES = ("lemmas", "unrolled", "choice")


def bmc_only(budget: float | None, routes=ROUTES) -> None:
    cases = [(SymScope(num_blocks=6, block_size=2, seqs=3, max_tokens=6), 8, 60.0),
             (SymScope(num_blocks=8, block_size=2, seqs=4, max_tokens=8), 10, 120.0)]
    for scope, depth, goal in cases:
        left = goal if budget is None else budget
        print(f"bfs bmc at {scope.describe()}, to depth {depth}, goal {goal:g} s, "
              f"budget {left:g} s")
        for route in routes:
            if route in ("lemmas", "unrolled", "alone"):
                only = [i for i in INVARIANTS if i.name == "refcount_conservation"]
                r = bmc_lemmas(scope, depth, budget=left, induction=route != "unrolled",
                               invariants=only if route == "alone" else None)
                extra = (f"{len(r.closed)} invariants closed by induction in "
                         f"{r.induction_seconds:.1f} s, {len(r.unrolled)} unrolled")
            else:
                r = bmc_bfs(scope, depth, budget=left, enumeration=route)
                extra = (f"{r.states} states, {r.transitions} transitions, new states per "
                         f"depth {r.per_depth}")
            done = r.complete  # (every depth asked was answered: no budget ran out)
            verdict = (f"ratio {r.seconds / goal:.2f}" if done else
                       f"budget ran out: ratio > {r.seconds / goal:.2f}")
            found = f", {r.violated} broken" if r.violated else ""
            print(f"  {route:8s}: depth {r.depth} of {depth} in {r.seconds:6.1f} s{found}, "
                  f"{extra} ({verdict})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the single-encoding comparison")
    ap.add_argument("--bmc", action="store_true",
                    help="only breadth-first BMC, both enumerations (issue 18's goal)")
    ap.add_argument("--bmc-routes", default=",".join(ROUTES),
                    help="with --bmc: comma-separated routes (lemmas, unrolled, choice, step, "
                         "alone)")
    ap.add_argument("--bmc-budget", type=float, default=None,
                    help="seconds per BMC run (default: the goal's; 60 without --bmc)")
    args = ap.parse_args()
    if args.bmc:
        routes = [r for r in args.bmc_routes.split(",") if r]
        bad = [r for r in routes if r not in (*ROUTES, "step", "alone")]
        if bad:
            ap.error(f"unknown BMC route(s): {', '.join(bad)}")
        bmc_only(args.bmc_budget, routes)
        return
    if args.bmc_budget is None:
        args.bmc_budget = 60.0

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
    c = bmc_lemmas(small, 8, budget=args.bmc_budget)
    print(f"  bmc_lemmas (kvcheck prove): depth {c.depth} of 8 in {c.seconds:.1f} s, "
          f"{len(c.closed)} invariants closed by induction, {len(c.unrolled)} unrolled "
          f"(goal 60 s: ratio {c.seconds / 60:.2f}{'' if c.complete else ', budget ran out'})")
    b = bmc_bfs(small, 8, budget=args.bmc_budget)
    print(f"  breadth-first enumeration: depth {b.depth} of 8 in {b.seconds:.1f} s, "
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
