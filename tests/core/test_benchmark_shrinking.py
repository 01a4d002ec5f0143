"""``benchmarks/shrinking.py`` runs, and refuses bad arguments with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/shrinking.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_a_small_run_prints_both_sides():
    r = _run("--repeat", "1", "--entries", "rebase-double-release", "fork-without-refcount",
             "--top", "1", "--explore-scope", "4", "2", "2", "3", "3")
    assert r.returncode == 0, r.stderr
    head, corpus, top, explore = r.stdout.splitlines()
    assert head.split() == ["part", "case", "without", "with", "speed-up"]
    assert corpus.startswith("corpus   2 entries at defaults") and "operations in all" in corpus
    assert top.split()[1] in ("rebase-double-release", "fork-without-refcount")
    assert explore.startswith("explore  reference 4 x 2, 2 seqs") and explore.endswith("x")
    without, with_ = (float(x) for x in explore.split()[-3:-1])
    assert without > 0 and with_ > 0


@pytest.mark.parametrize("args", [("--parts", "all"), ("--repeat", "0"),
                                  ("--explore-scope", "4", "2"), ("--entries", "no-such-bug")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("benchmarks/shrinking.py: error: ")
