"""``benchmarks/prefix_oracle.py`` runs (fast and full mode, bare replay, the cost ratio) and
refuses bad arguments with one line and exit 2. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/prefix_oracle.py", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_a_small_run_prints_every_column_and_the_cost_ratio():
    r = _run("--blocks", "16", "--blocks", "64", "--ops", "300", "--full-ops", "100")
    assert r.returncode == 0, r.stderr
    head, *rows, ratio = r.stdout.splitlines()
    for column in ("bare_ops/s", "fast_ops/s", "full_ops/s", "fast_slowdown", "fast_us/op"):
        assert column in head
    assert [row.split()[0] for row in rows] == ["16", "64"]
    for row in rows:
        assert all(float(x.rstrip("x")) > 0 for x in row.split()[1:])
    assert ratio.startswith("fast cost per checked op, 64 vs 16 blocks: ") and ratio.endswith("x")


@pytest.mark.parametrize("args", [("--blocks", "0"), ("--block-size", "x"), ("--ops", "-5"),
                                  ("--full-ops", "0")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "error" in r.stderr
