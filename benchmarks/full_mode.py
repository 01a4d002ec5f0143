"""The full mode's compiled contracts and shrinking's halved pools: what a full-mode step
and a shrink cost with them and without them, alternated in one run.

The full mode checks each step's contract over the whole state: every block of the pool
and every sequence. Shrinking replays every candidate in it, and so do ``kvcheck replay``
and ``verify --mode full``. Where the spec's contract was evaluated clause by clause,
a step at 1,024 blocks read every block through the spec's generators. Now
``Oracle._passes_compiled`` runs the contract compiled from the spec's text over every
block and the operation's own sequences, and the spec itself over the other sequences;
the clause-by-clause evaluation runs only where that fails, and names the clause. And
shrinking first halves a pool above ``kvcheck.check.shrink.HALVE_ABOVE`` blocks while the
run still fails the same way, so its later replays run at a small pool. *Without*
(``_CONTRACTS`` emptied, ``HALVE_ABOVE`` made infinite, for the session) is the earlier
code path exactly.

Three parts, each side timed by this process's CPU time, the two sides alternated
(without, with, with, without, ...) ``--repeat`` times, the best of each side shown:

* ``full``: ``verify`` of the reference in full mode, no shrinking, at each pool size:
  checked operations per second;
* ``corpus``: ``verify`` of every corpus entry (``tests/corpus/buggy.py``) at its
  defaults, shrinking on: the seconds to the shrunk counterexample, summed;
* ``large``: the corpus entries that campaign runs at large pools find, each run as the
  campaign's worker runs it (``kvcheck.campaign.worker.execute``): seconds to the shrunk
  counterexample;
* ``pool``: ``verify --blocks 1024`` (``--pool-blocks``) of every fifth corpus entry
  (or ``--entries``), shrinking on: the seconds to the shrunk counterexamples, summed.

Both sides must find the same shrunk counterexamples (the same operations) in the first
two parts, the same violations in the last two (where halving the pool first may lead
the shrink elsewhere: the trace lengths are printed): the script stops with an error
otherwise.

    python3 benchmarks/full_mode.py
    python3 benchmarks/full_mode.py --parts full --blocks 32 1024 10000 --repeat 3
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kvcheck.cli.commands.common import OneLineParser, positive_int

ROOT = Path(__file__).resolve().parents[1]
BUGGY = ROOT / "tests" / "corpus" / "buggy.py"
# (entry, campaign seed, run): runs of plan 3 at a large pool that find the entry
LARGE = (("slots-cow-first-block-only", 1, 7),)


def corpus() -> dict:
    """``tests/corpus/buggy.py``'s ``CORPUS`` (tests/ put on the path once)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from corpus.buggy import CORPUS

    return CORPUS


def target(entry: str) -> str:
    """The corpus entry as a target spec (``path:Class``)."""
    return f"{BUGGY}:{corpus()[entry][0].__name__}"


class Without:
    """The session without the compiled full-mode contracts and without shrinking's
    halving (the earlier code path)."""

    def __enter__(self):
        import kvcheck.check.shrink as shrink
        import kvcheck.models.blocks.oracle as oracle_mod

        self.saved = dict(oracle_mod._CONTRACTS), shrink.HALVE_ABOVE
        oracle_mod._CONTRACTS.clear()
        shrink.HALVE_ABOVE = float("inf")

    def __exit__(self, *exc):
        import kvcheck.check.shrink as shrink
        import kvcheck.models.blocks.oracle as oracle_mod

        oracle_mod._CONTRACTS.update(self.saved[0])
        shrink.HALVE_ABOVE = self.saved[1]


class With:
    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


def full_rate(blocks: int, ops: int) -> tuple[float, str]:
    from kvcheck.verify import verify

    start = time.process_time()
    r = verify("reference", blocks, 4, ops, 0, mode="full", do_shrink=False)
    seconds = time.process_time() - start
    if not r.ok:
        sys.exit(f"the reference failed in full mode at {blocks} blocks: {r.violation}")
    return r.ops / seconds, "pass"


def verify_seconds(entries: list[str], blocks: int | None = None,
                   exact: bool | None = None) -> tuple[float, str, int]:
    """``verify`` of each entry, shrinking on, at its defaults or at ``blocks`` blocks: the
    CPU seconds summed, what each found (``exact``, by default at the defaults: the shrunk
    trace itself; else the violation, where a change to shrinking may lead it elsewhere)
    and the shrunk traces' lengths summed."""
    if exact is None:
        exact = blocks is None
    import json

    from kvcheck.verify import verify

    total, found, length = 0.0, [], 0
    for name in entries:
        start = time.process_time()
        r = verify(target(name)) if blocks is None else verify(target(name), blocks, 4, 10_000, 0)
        total += time.process_time() - start
        if r.ok:
            found.append(f"{name}: pass")
        elif exact:
            found.append(json.dumps([r.violation.key, r.trace.to_json()["ops"]], default=str))
        else:
            found.append(f"{name}: {r.violation.key}")
        length += len(r.trace.ops) if r.trace is not None else 0
    return total, "\n".join(found), length


def large_seconds(entry: str, seed: int, run: int) -> tuple[float, str, int]:
    from kvcheck.campaign import worker
    from kvcheck.campaign.plan import Settings, draw

    spec = draw(Settings(target(entry), seed=seed), run)
    start = time.process_time()
    out = worker.execute(spec)
    seconds = time.process_time() - start
    if out.get("verdict") != "fail":
        sys.exit(f"{entry} (campaign seed {seed}, run {run}) did not fail: {out.get('verdict')}")
    return seconds, out["violation"]["name"], len(out["trace"]["ops"])


def alternate(measure, repeat: int, higher_is_better: bool, lengths: dict | None = None,
              without: type = None):
    """``measure()`` without and with, alternated; (best without, best with). A measure
    returning a third value (a length) has it kept in ``lengths``, by side. ``without``:
    the context that makes the *without* side (default: this script's ``Without``)."""
    without = without or Without
    got = {without: [], With: []}
    found = {}
    for i in range(repeat):
        for side in ((without, With) if i % 2 == 0 else (With, without)):
            with side():
                value, what, *more = measure()
            got[side].append(value)
            if more and lengths is not None:
                lengths[side] = more[0]
            if found.setdefault(side, what) != what:
                sys.exit(f"{measure}: two sessions of one side found different results")
    if found[without] != found[With]:
        sys.exit(f"{measure}: the two sides found different results")
    pick = max if higher_is_better else min
    return pick(got[without]), pick(got[With])


def main(argv=None) -> int:
    p = OneLineParser(prog="benchmarks/full_mode.py", description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=("full", "corpus", "large", "pool"),
                   default=["full", "corpus", "large", "pool"])
    p.add_argument("--pool-blocks", type=positive_int, default=1024,
                   help="pool part: the pool size (default: %(default)s)")
    p.add_argument("--blocks", nargs="+", type=positive_int, default=[32, 1024])
    p.add_argument("--ops", type=positive_int, default=2000, help="full mode: operations per run")
    p.add_argument("--repeat", type=positive_int, default=2)
    p.add_argument("--entries", nargs="+", metavar="ENTRY",
                   help="corpus and pool parts: these entries only (default: every one; "
                        "pool: every fifth)")
    a = p.parse_args(argv)
    unknown = [e for e in a.entries or () if e not in corpus()]
    if unknown:
        p.error(f"unknown corpus entry {unknown[0]!r}")
    from kvcheck.verify import verify

    verify("reference", 16, 4, 50, 0, mode="full", do_shrink=False)  # warm up (imports, compiles)
    print("part    case                                  without      with   speed-up")
    if "full" in a.parts:
        for n in a.blocks:
            old, new = alternate(lambda n=n: full_rate(n, a.ops), a.repeat, True)
            print(f"full    reference, {n:>6} blocks (ops/s)   {old:>9.0f} {new:>9.0f} {new / old:>8.2f}x",
                  flush=True)
    if "corpus" in a.parts:
        entries = a.entries or sorted(corpus())
        old, new = alternate(lambda: verify_seconds(entries), a.repeat, False)
        label = "every entry" if not a.entries else f"{len(a.entries)} entries"
        print(f"corpus  {label + ' at defaults (s)':<38} {old:>9.2f} {new:>9.2f} {old / new:>8.2f}x",
              flush=True)
    if "large" in a.parts:
        for entry, seed, run in LARGE:
            lengths: dict = {}
            old, new = alternate(lambda e=entry, s=seed, r=run: large_seconds(e, s, r), a.repeat,
                                 False, lengths)
            label = f"{entry} (seed {seed}, run {run}) (s)"
            print(f"large   {label:<38} {old:>9.2f} {new:>9.2f} {old / new:>8.2f}x"
                  f"   (shrunk to {lengths[Without]} / {lengths[With]} operations)", flush=True)
    if "pool" in a.parts:
        entries = a.entries or sorted(corpus())[::5]
        lengths = {}
        old, new = alternate(lambda: verify_seconds(entries, a.pool_blocks), a.repeat, False,
                             lengths)
        label = f"{len(entries)} entries at {a.pool_blocks} blocks (s)"
        print(f"pool    {label:<38} {old:>9.2f} {new:>9.2f} {old / new:>8.2f}x"
              f"   (shrunk to {lengths[Without]} / {lengths[With]} operations in all)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
