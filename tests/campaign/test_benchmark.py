"""``benchmarks/campaign.py`` runs at a tiny budget (both parts, local processes), and refuses
bad arguments with one line and exit 2. Its figures are measured, never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/campaign.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_a_tiny_run_prints_both_parts():
    r = _run("--runs", "2", "--repeat", "2", "--no-ray", "--entries", "no-copy-on-write", "--campaign-time", "30s")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "## throughput" in out and "local: 2 workers / 1 worker = " in out
    # the 2 alternated pairs' ratios, and how busy the workers' cores were (a percentage)
    (summary,) = [line for line in out.splitlines() if line.startswith("local: ")]
    assert "pairs: median " in summary and len(summary.split("pairs: median ")[1].split()) == 3
    local = [line.split() for line in out.splitlines() if line.startswith("local ")]
    assert [row[1] for row in local] == ["1", "2"] and all(row[6].endswith("%") for row in local)
    assert "## time to the first violation" in out
    (row,) = [line for line in out.splitlines() if line.startswith("no-copy-on-write ")]
    # entry, verify, its median (fastest), exited, campaign, its median (fastest), exited,
    # speed-up, won: the pairs the campaign printed first, of the 2 alternated
    fields = row.split()
    assert fields[1] == "found" and fields[5] == "found", row
    assert fields[3].startswith("(") and fields[7].startswith("("), row
    assert fields[9].endswith("x") and fields[10] in ("0/2", "1/2", "2/2"), row
    assert "entries both found" in out


@pytest.mark.parametrize("args", [("--runs", "0"), ("--entries", "nosuch"),
                                  ("--campaign-time", "soon"), ("--seed", "-1")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("benchmarks/campaign.py: error: ")
