"""Smoke tests of issue 14's benchmarks: ``benchmarks/overhead_ops.py`` (the four-operation
workload before and after, same run) and ``benchmarks/reservation_cost.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script, *args):
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def _have(rev: str) -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}^{{commit}}"],
                       capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _have("be47485"), reason="the revision compared with is not in this clone")
def test_overhead_prints_a_ratio_on_the_same_operations():
    r = _run("overhead_ops.py", "--blocks", "100", "--ops", "2000", "--repeat", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "BLOCKS before_ops/s after_ops/s cost_after/cost_before same_ops"
    blocks, before, after, ratio, same = lines[1].split()
    assert blocks == "100" and float(before) > 0 and float(after) > 0 and same == "yes"
    assert lines[-1].startswith("worst cost ratio after/before:")


def test_overhead_refuses_an_unknown_revision():
    r = _run("overhead_ops.py", "--before", "no-such-revision", "--blocks", "100")
    assert r.returncode != 0 and "cannot read revision" in r.stderr


def test_reservation_cost_prints_every_case():
    r = _run("reservation_cost.py")
    assert r.returncode == 0, r.stderr
    cases = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    assert cases.count("one-block") == 4 and sum(c.startswith("per-block") for c in cases) == 3
