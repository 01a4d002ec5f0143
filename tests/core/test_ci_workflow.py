"""The documented CI workflow (docs/ci/kvcheck.yml) run locally (issue 35 §4): its kvcheck
step is docs/ci/kvcheck-gate.sh, which fails only on FAIL, warns on INCONCLUSIVE and
leaves JUnit, traces and the HTML report for the upload step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "ci" / "kvcheck.yml"
GATE = ROOT / "docs" / "ci" / "kvcheck-gate.sh"
BUGGY = ROOT / "tests" / "corpus" / "buggy.py"


def gate(target: str, out: Path, **env) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    return subprocess.run(["bash", str(GATE), target, str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                                            "KVCHECK": f"{bindir / 'kvcheck'}", **env})


def test_the_workflow_runs_the_gate_and_uploads_its_folder_always():
    text = WORKFLOW.read_text()
    runs = [line.split("run:", 1)[1].strip() for line in text.splitlines() if "run:" in line]
    assert any("pip install" in r and "kvcheck" in r for r in runs)
    assert any(r.startswith("bash docs/ci/kvcheck-gate.sh") and "kvcheck-out" in r for r in runs)
    upload = text[text.index("actions/upload-artifact"):]
    assert "path: kvcheck-out/" in upload and "if: always()" in text[text.index("name: reports"):]
    assert "on: [push, pull_request]" in text


def test_pass_is_exit_0_with_junit(tmp_path):
    r = gate("reference", tmp_path / "out", KVCHECK_PROVE_BUDGET="0", KVCHECK_OPS="1500")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvcheck gate: verify: PASS" in r.stdout
    assert (tmp_path / "out" / "verify-junit.xml").is_file()
    assert not (tmp_path / "out" / "verify.json").exists()


def test_a_fail_fails_the_job_and_leaves_the_trace_and_its_page(tmp_path):
    r = gate(f"{BUGGY}:NoCopyOnWrite", tmp_path / "out", KVCHECK_PROVE_BUDGET="0",
             KVCHECK_OPS="1500")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "::error title=kvcheck verify failed::" in r.stdout
    out = tmp_path / "out"
    assert (out / "verify.json").is_file() and (out / "verify.html").is_file()
    assert "VIOLATION at step" in (out / "verify.txt").read_text()


def test_inconclusive_is_a_warning_not_a_failure(tmp_path):
    """A prove budget too small to decide anything: exit 4 from kvcheck, a warning here."""
    r = gate("reference", tmp_path / "out", KVCHECK_PROVE_BUDGET="0.5", KVCHECK_PROVE_BLOCKS="2",
             KVCHECK_OPS="500")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "::warning title=kvcheck prove inconclusive::" in r.stdout
    assert "INCONCLUSIVE" in (tmp_path / "out" / "prove.txt").read_text()
    assert (tmp_path / "out" / "prove-junit.xml").is_file()


def test_bad_input_fails_with_its_line(tmp_path):
    r = gate("no_such_module_xyz:Thing", tmp_path / "out", KVCHECK_PROVE_BUDGET="0")
    assert r.returncode == 2
    assert "::error title=kvcheck verify: bad input::" in r.stdout and "cannot import" in r.stdout
