"""``kvcheck verify device`` and ``benchmarks/device.py`` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_verify_device_passes():
    r = _run("-m", "kvcheck.cli", "verify", "device", "--ops", "400", "--blocks", "12")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("PASS device: 400 operations")


@pytest.mark.parametrize("args", [("--blocks", "0"), ("--block-size", "x")])
def test_verify_device_bad_input(args):
    r = _run("-m", "kvcheck.cli", "verify", "device", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_benchmark_small_cpu_run():
    r = _run("benchmarks/device.py", "--seqs", "4", "--context", "5", "--block-size", "4",
             "--heads", "1", "--head-dim", "4", "--reps", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["step_reads_back_correctly"] is True
    assert [k["kernel"] for k in out["kernels"]] == ["copy_blocks", "write_slots", "gather"]
    assert out["copies"] == 2 and out["writes"] == 4
    if not out["gpu_figure"]:
        text = _run("benchmarks/device.py", "--seqs", "2", "--context", "3", "--heads", "1",
                    "--head-dim", "2", "--reps", "1")
        assert "NOT a GPU figure" in text.stdout


@pytest.mark.parametrize("args", [("--seqs", "0"), ("--seqs", "1"), ("--dtype", "int8"),
                                  ("--reps", "many")])
def test_benchmark_bad_input(args):
    r = _run("benchmarks/device.py", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr
