"""Before/after cost of the fast mode on the seed's four-operation workload.

Issue 14 grew the spec from four operations to eight (reservations, rollback, rebase,
preemption, eager forks, refusals); its budget: the fast mode's cost per checked
operation on the old workload (the four-operation reference, ``benchmarks/oracle.py``'s
``verify`` run) grows by at most 25%. This script measures it in one run: it unpacks
the code as of ``--before`` (a git revision) into a temporary directory, and times
``kvcheck.verify.verify("reference", ...)`` there and in this checkout alternately, in
fresh interpreters, best of ``--repeat``, and checks both ran the very same operations
(a digest of the driven sequence). It prints one line per pool size:

    BLOCKS before_ops/s after_ops/s cost_after/cost_before same_ops

    python3 benchmarks/overhead_ops.py                 # before = be47485 (the four-op spec)
    python3 benchmarks/overhead_ops.py --blocks 1000 --ops 100000 --repeat 5
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "be47485"  # the last commit whose spec had the seed's four operations only

# Run in a fresh interpreter with the checkout at ROOT_DIR first: ``kvcheck`` from there,
# and its spec/, impl/, proofs/ as kvcheck.spec, kvcheck.impl, kvcheck.proofs (as the
# installed package maps them).
CHILD = r"""
import hashlib, json, sys, time
root = sys.argv[1]
sys.path.insert(0, root)
import kvcheck
kvcheck.__path__.insert(0, root)
assert kvcheck.__file__.startswith(root), kvcheck.__file__
from kvcheck.verify import verify
n, bs, ops, seed = (int(x) for x in sys.argv[2:6])
start = time.perf_counter()
r = verify("reference", n, bs, ops, seed, do_shrink=False)
seconds = time.perf_counter() - start
assert r.ok, r.violation
import kvcheck.spec.contracts as c
print(json.dumps({"ops": r.ops, "seconds": seconds, "kinds": len(c.CONTRACTS)}))
"""


def run(root: str, n: int, bs: int, ops: int, seed: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, root, str(n), str(bs), str(ops), str(seed)],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"run in {root} failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def digest(root: str, n: int, bs: int, ops: int, seed: int) -> str:
    """A digest of the operations the driver issues (what both checkouts must share)."""
    code = r"""
import hashlib, sys
root = sys.argv[1]
sys.path.insert(0, root)
import kvcheck
kvcheck.__path__.insert(0, root)
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.targets.loading import build, resolve
n, bs, ops, seed = (int(x) for x in sys.argv[2:6])
o = Oracle(build(resolve("reference")[1], n, bs), mode="fast", timeout=None)
d = RandomDriver(seed, n, bs, o.target.capabilities)
h = hashlib.sha256()
for _ in range(ops):
    op = d.next_op(o.live_seqs(), o.ghost.num_free())
    if not o.valid(op):
        continue
    o.step(op)
    h.update(f"{op.kind},{op.seq},{op.child},{op.n_tokens},{op.outcome};".encode())
print(h.hexdigest())
"""
    p = subprocess.run([sys.executable, "-c", code, root, str(n), str(bs), str(ops), str(seed)],
                       capture_output=True, text=True, timeout=3600)
    return p.stdout.strip() if p.returncode == 0 else f"error: {p.stderr.strip()[-200:]}"


def main(argv=None) -> int:
    from kvcheck.cli.commands.common import OneLineParser, nonneg_int, positive_int

    ap = OneLineParser(prog="benchmarks/overhead_ops.py", description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help="git revision to compare with")
    ap.add_argument("--blocks", type=positive_int, nargs="*", default=[100, 1_000, 10_000])
    ap.add_argument("--block-size", type=positive_int, default=4)
    ap.add_argument("--ops", type=positive_int, default=100_000)
    ap.add_argument("--seed", type=nonneg_int, default=0)
    ap.add_argument("--repeat", type=positive_int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvcheck-before-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            sys.exit(f"benchmarks/overhead_ops.py: cannot read revision {args.before!r}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        print("BLOCKS before_ops/s after_ops/s cost_after/cost_before same_ops")
        worst = 0.0
        for n in args.blocks:
            best = {"before": 0.0, "after": 0.0}
            for _ in range(args.repeat):  # alternate, so load drifts hit both alike
                for label, root in (("before", tmp), ("after", str(ROOT))):
                    r = run(root, n, args.block_size, args.ops, args.seed)
                    best[label] = max(best[label], r["ops"] / r["seconds"])
            same = digest(tmp, n, args.block_size, min(args.ops, 20_000), args.seed) == \
                digest(str(ROOT), n, args.block_size, min(args.ops, 20_000), args.seed)
            ratio = best["before"] / best["after"]
            worst = max(worst, ratio)
            print(f"{n} {best['before']:.0f} {best['after']:.0f} {ratio:.3f} "
                  f"{'yes' if same else 'NO'}", flush=True)
        print(f"worst cost ratio after/before: {worst:.3f} (budget 1.25)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
