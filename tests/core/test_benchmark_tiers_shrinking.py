"""``benchmarks/tiers_shrinking.py`` runs (a smoke test: two entries, both sides), and refuses
bad arguments with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/tiers_shrinking.py", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_two_entries_both_sides():
    r = _run("--entries", "swap-out-counts-cached", "frees-pinned-block")
    assert r.returncode == 0, r.stderr
    head, *rows, total = r.stdout.splitlines()
    assert head.split() == ["entry", "run", "without", "with"] and len(rows) == 2
    for row in rows:
        words = row.split()
        assert words[3] == "s" and words[5] == "op" and words[7] == "s" and words[9] == "op", row
        assert 1 <= int(words[4]) <= int(words[1]) and 1 <= int(words[8]) <= int(words[1])
    assert total.startswith("total: 2 entries, ") and total.endswith(" x)")


def test_bad_arguments():
    r = _run("--entries", "no-such-bug")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("benchmarks/tiers_shrinking.py: error: ")
