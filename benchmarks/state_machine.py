"""``make_state_machine`` against ``verify`` on the corpus (issue 35 §2): the seconds each
takes to fail every buggy allocator, and whether the machine's message carries the very
trace ``verify`` prints (up to sequence numbers).

Each entry (``tests/corpus/buggy.py``) is checked twice in this process: ``verify`` at 8
blocks of 2, 3,000 operations, seed 0 (its shrunk counterexample), then the Hypothesis
state machine at the same pool (``database=None``: no example replayed from an earlier run;
at most ``--examples`` examples, derandomized: the same examples on every run; its own
settings otherwise), run to its failure by unittest. A row per entry, then the totals::

    python3 benchmarks/state_machine.py
    python3 benchmarks/state_machine.py --entries no-copy-on-write cow-full-blocks
"""

from __future__ import annotations

import io
import re
import sys
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import settings  # noqa: E402

from kvcheck.cli.commands.common import OneLineParser, positive_int  # noqa: E402


def _ops(text: str) -> list[str]:
    return [re.sub(r"\d+", "N", line.strip()) for line in text.splitlines()
            if re.match(r"\s*(>>)?\s*\d+\. ", line)]


def one(name: str, cls, examples: int) -> dict:
    from kvcheck.report.text import render
    from kvcheck.verify import make_state_machine, verify

    start = time.perf_counter()
    r = verify(cls, 8, 2, 3000, 0)
    verify_s = time.perf_counter() - start
    machine = make_state_machine(cls, num_blocks=8, block_size=2)
    machine.TestCase.settings = settings(machine.TestCase.settings, database=None,
                                         max_examples=examples, derandomize=True)
    start = time.perf_counter()
    result = unittest.TextTestRunner(stream=io.StringIO()).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(machine.TestCase))
    machine_s = time.perf_counter() - start
    message = (result.failures or result.errors or [(None, "")])[0][1]
    part = message[message.find("kvcheck shrank"):]
    part = part[:part.find("VIOLATION")]
    same = r.trace is not None and _ops(render(r.trace)) == _ops(part) and bool(part)
    return {"name": name, "verify": verify_s, "found": r.verdict == "fail",
            "machine": machine_s, "failed": not result.wasSuccessful(),
            "minimal": "1-minimal" in message, "same": same,
            "length": len(r.trace.ops) if r.trace else 0}


def main(argv=None) -> int:
    from corpus.buggy import CORPUS

    p = OneLineParser(prog="benchmarks/state_machine.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", nargs="+", metavar="NAME", help="corpus entries (default: all)")
    p.add_argument("--examples", type=positive_int, default=200,
                   help="the machine's most examples (default: %(default)s)")
    args = p.parse_args(argv)
    names = args.entries or sorted(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        p.error(f"--entries: no corpus entry {unknown[0]!r}")
    rows = []
    print(f"{'entry':36} {'verify s':>8} {'machine s':>9}  failed  kvcheck-minimal  same-trace")
    for name in names:
        row = one(name, CORPUS[name][0], args.examples)
        rows.append(row)
        print(f"{name:36} {row['verify']:8.2f} {row['machine']:9.2f}  {row['failed']!s:6}  "
              f"{row['minimal']!s:15}  {row['same']}", flush=True)
    print(f"total: {len(rows)} entries; verify found {sum(r['found'] for r in rows)} in "
          f"{sum(r['verify'] for r in rows):.1f} s; the machine failed on "
          f"{sum(r['failed'] for r in rows)} in {sum(r['machine'] for r in rows):.1f} s, "
          f"{sum(r['minimal'] for r in rows)} with kvcheck's minimal trace, "
          f"{sum(r['same'] for r in rows)} the same trace as verify")
    return 0


if __name__ == "__main__":
    sys.exit(main())
