"""``benchmarks/oracle.py`` runs, and refuses bad arguments with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/oracle.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_a_small_run_prints_every_column():
    r = _run("--blocks", "100", "--ops", "300", "--interpreted-ops", "200")
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()[1:3]
    for column in ("checked ops/s", "bare ops/s", "unchecked ops/s", "interpreted ops/s",
                   "compiled x"):
        assert column in head
    assert row.split()[0] == "100" and row.rstrip().endswith("x")


@pytest.mark.parametrize("args", [("--interpreted-ops", "0"), ("--blocks", "0"),
                                  ("--block-size", "x"), ("--ops", "-5"), ("--seed", "-1"),
                                  ("--profile", "0")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("benchmarks/oracle.py: error: ")
