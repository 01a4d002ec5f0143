"""``benchmarks/full_mode.py`` runs, and refuses bad arguments with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/full_mode.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_a_small_run_prints_both_sides():
    r = _run("--parts", "full", "corpus", "--blocks", "16", "--ops", "200", "--repeat", "1",
             "--entries", "rollback-leaks", "fork-without-refcount")
    assert r.returncode == 0, r.stderr
    head, full, corpus = r.stdout.splitlines()
    assert head.split() == ["part", "case", "without", "with", "speed-up"]
    assert full.startswith("full    reference,     16 blocks") and full.endswith("x")
    assert corpus.startswith("corpus  2 entries at defaults") and corpus.endswith("x")
    without, with_ = (float(x) for x in corpus.split()[-3:-1])
    assert without > 0 and with_ > 0


@pytest.mark.parametrize("args", [("--parts", "all"), ("--blocks", "0"), ("--ops", "-5"),
                                  ("--repeat", "x"), ("--entries", "no-such-bug")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("benchmarks/full_mode.py: error: ")
