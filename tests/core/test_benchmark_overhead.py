"""Smoke test of issue 18's ``benchmarks/overhead.py`` (bare vs checked, per target and size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/overhead.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_overhead_prints_one_line_per_target_and_size():
    r = _run("--targets", "reference", "--blocks", "32", "64", "--ops", "1000", "--repeat", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "TARGET BLOCKS bare_ops/s checked_ops/s slowdown"
    rows = [line.split() for line in lines[1:]]
    assert [(name, blocks) for name, blocks, *_ in rows] == [("reference", "32"), ("reference", "64")]
    for _, _, bare, checked, slowdown in rows:
        assert float(bare) > 0 and float(checked) > 0
        ratio = float(slowdown.rstrip("x"))
        assert abs(ratio - float(bare) / float(checked)) < 0.01 * ratio + 0.01


def test_overhead_rejects_bad_sizes():
    r = _run("--blocks", "0")
    assert r.returncode != 0 and "must be positive" in r.stderr


def test_overhead_times_by_cpu_time_when_asked():
    r = _run("--targets", "reference", "--blocks", "32", "--ops", "1000", "--repeat", "1",
             "--clock", "cpu")
    assert r.returncode == 0, r.stderr
    (row,) = [line.split() for line in r.stdout.splitlines()[1:]]
    assert row[:2] == ["reference", "32"] and float(row[2]) > 0 and float(row[3]) > 0
    assert _run("--clock", "sundial").returncode != 0
