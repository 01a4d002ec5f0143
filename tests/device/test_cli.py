"""``kvcheck verify device`` (the structure), ``kvcheck verify-device`` (the data), replaying,
reporting and reproducing a device trace, and ``benchmarks/device.py`` from the command line."""

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
    # the steady decode steps: each a fresh fork of both parents (copies) and both first forks
    assert out["decode_step_copies"] == 2 and out["decode_step_writes"] == 4
    assert out["decode_step_seconds"] > 0 and out["preset"] is None
    if not out["gpu_figure"]:
        text = _run("benchmarks/device.py", "--seqs", "2", "--context", "3", "--heads", "1",
                    "--head-dim", "2", "--reps", "1")
        assert "NOT a GPU figure" in text.stdout


def test_benchmark_model_preset_with_overrides():
    """``--model llama-3.3-70b --tp 4``: 2 KV heads per GPU, head dim 128 unless overridden."""
    r = _run("benchmarks/device.py", "--model", "llama-3.3-70b", "--tp", "4", "--seqs", "4",
             "--context", "6", "--block-size", "4", "--layers", "2", "--reps", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["preset"] == {"model": "llama-3.3-70b", "tp": 4, "layers": 80, "kv_heads": 8,
                             "head_dim": 128, "kv_heads_per_gpu": 2, "seqs": 256,
                             "context": 1000, "block_size": 16, "dtype": "bfloat16"}
    assert (out["layers"], out["kv_heads"], out["head_dim"], out["sequences"]) == (2, 2, 128, 4)
    assert out["step_reads_back_correctly"] is True


@pytest.mark.parametrize("args", [("--seqs", "0"), ("--seqs", "1"), ("--dtype", "int8"),
                                  ("--reps", "many"), ("--tp", "2"),
                                  ("--model", "llama-3.3-70b", "--tp", "3"),
                                  ("--model", "gpt-2")])
def test_benchmark_bad_input(args):
    r = _run("benchmarks/device.py", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr


# -- kvcheck verify-device: the data on the command line --------------------------------------
TARGETS = ROOT / "tests" / "device" / "data_targets.py"


def _kv(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env={**os.environ, **(env or {})})


def test_verify_device_checks_the_data():
    r = _kv("verify-device", "--ops", "200", "--blocks", "12")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("PASS device: 200 operations (")
    assert "read back its own K/V bit for bit" in r.stdout
    j = _kv("verify-device", f"{TARGETS}:correct", "--ops", "150", "--full", "--json",
            "--batch-prob", "1", "--layers", "2", "--head-dim", "3")
    assert j.returncode == 0, j.stderr
    out = json.loads(j.stdout)
    assert out["verdict"] == "pass" and out["model"] == "device" and out["ops"] == 150
    assert out["stats"]["decode_steps"] > 50


def test_verify_device_finds_a_bug_and_its_trace_replays(tmp_path):
    trace = tmp_path / "t.json"
    r = _kv("verify-device", f"{TARGETS}:write_before_copy", "--trace-out", str(trace))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and "VIOLATION at step 3 (data): read-back" in r.stdout
    data = json.loads(trace.read_text())
    assert data["model"] == "device" and data["version"] == 2 and len(data["ops"]) == 3
    j = _kv("verify-device", f"{TARGETS}:write_before_copy", "--json", "--shrink-seconds", "0")
    assert j.returncode == 1
    out = json.loads(j.stdout)
    assert out["verdict"] == "fail" and out["violation"]["model"] == "device"
    assert out["violation"]["violation"]["name"] == "read-back"
    # kvcheck replay: reproduced on the bug, a pass on the correct store
    again = _kv("replay", str(trace))
    assert again.returncode == 1 and again.stdout.startswith("REPRODUCED"), again.stdout
    fixed = _kv("replay", str(trace), "--target", f"{TARGETS}:correct", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["verdict"] == "pass"


@pytest.mark.parametrize("args", [("--batch-prob", "2"), ("--blocks", "0"), ("--layers", "0"),
                                  ("--head-dim", "x"), ("reference",),
                                  ("device", "--layers", "2", "--block-size", "0"),
                                  ("kvcheck.impl.block_manager:BlockManager", "--layers", "2")])
def test_verify_dash_device_bad_input(args):
    r = _kv("verify-device", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_process_ended_in_a_data_call_is_reported_with_where():
    r = _kv("verify-device", f"{TARGETS}:AbortInRunStep", "--batch-prob", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ended the process during run_step (the data of operation" in r.stdout, r.stdout


def _decode_trace(path, bug="SwappedCopy"):
    """A device trace ending in a decode step (as found, not shrunk)."""
    from kvcheck.check.model import Options
    from kvcheck.check.run import replay
    from kvcheck.check.shrink import counterexample
    from kvcheck.models.device import MODEL, DecodeStep, DeviceScope
    from kvcheck.spec.contracts import Op
    from kvcheck.targets.loading import resolve

    label, factory = resolve(f"{ROOT / 'tests' / 'device' / 'device_bugs.py'}:{bug}")
    ops = [Op("allocate", seq=0, n_tokens=3), Op("fork", seq=0, child=1),
           Op("allocate", seq=2, n_tokens=2), DecodeStep(seqs=[1, 2, 0])]
    scope = DeviceScope(8, 2)
    v = replay(MODEL, factory, scope, ops, Options()).violation
    trace = counterexample(MODEL, label, factory, scope, ops, v, 0, Options(), do_shrink=False)
    trace.write(path)
    return trace


def test_report_and_pytest_out_of_a_device_trace(tmp_path):
    trace = _decode_trace(tmp_path / "d.json")
    assert trace.ops[-1].kind == "decode_step" and trace.violation.step == 4
    page = tmp_path / "d.html"
    r = _kv("report", str(tmp_path / "d.json"), "-o", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "decode_step(seqs=[1, 2, 0])" in html and 'id="violation"' in html
    assert "one decode step over sequences [1, 2, 0]" in html
    assert 'class="hl" data-block="1"' in html  # the shared block written
    repro = tmp_path / "test_repro.py"
    r = _kv("replay", str(tmp_path / "d.json"), "--pytest-out", str(repro))
    assert r.returncode == 1 and repro.exists(), r.stdout + r.stderr
    text = repro.read_text()
    assert "MODEL = 'device'" in text and "Op('decode_step', seqs=[1, 2, 0])" in text
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(repro)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 1 and "shared block written" in run.stdout, run.stdout
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(repro)], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**__import__("os").environ, "KVCHECK_TARGET": "device"})
    assert run.returncode == 0, run.stdout + run.stderr
