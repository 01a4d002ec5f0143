"""The pytest plugin (issue 35 §2): ``kvcheck_verify`` in a user's own suite, registered by
the ``pytest11`` entry point, runs kvcheck's checker, shrinker and explanation, fails with
the counterexample and writes its trace; seeds are printed and reproducible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BUGGY = Path(__file__).resolve().parents[1] / "corpus" / "buggy.py"

SUITE = f'''
def test_reference(kvcheck_verify):
    r = kvcheck_verify("reference", blocks=8, block_size=2, ops=500)
    assert r.verdict == "pass" and r.ops == 500


def test_buggy(kvcheck_verify):
    kvcheck_verify("{BUGGY}:NoCopyOnWrite", blocks=8, block_size=2, ops=2000)


def test_tiers(kvcheck_verify):
    kvcheck_verify("reference-tiers", model="tiers", ops=300)


def test_bad_target(kvcheck_verify):
    kvcheck_verify("no_such_module_xyz:Thing")
'''


def pytest_in(folder: Path, *args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           *(["-q"] if quiet else []), "-rf", *args], cwd=folder, capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_fixture_fails_with_the_shrunk_counterexample_and_writes_the_trace(tmp_path):
    (tmp_path / "test_user.py").write_text(SUITE)
    r = pytest_in(tmp_path, "--kvcheck-trace-dir", "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 failed, 2 passed" in r.stdout, r.stdout
    assert "VIOLATION at step 3 (contract): append_slot: a shared partial block is copied " \
        "first" in r.stdout
    assert "kvcheck: FAIL on" in r.stdout and "at seed 0" in r.stdout
    assert "rerun:  pytest test_user.py::test_buggy --kvcheck-seed 0" in r.stdout
    traces = sorted((tmp_path / "out").glob("*.json"))
    assert [t.name for t in traces] == ["test_user.py_test_buggy-seed0.json"]
    assert f"replay: kvcheck replay out/{traces[0].name}" in r.stdout
    data = json.loads(traces[0].read_text())
    assert data["seed"] == 0 and data["violation"]["kind"] == "contract"
    assert len(data["ops"]) <= 4  # shrunk, as kvcheck verify shrinks it
    assert "kvcheck: bad target: cannot import 'no_such_module_xyz'" in r.stdout
    assert "Traceback" not in r.stdout


def test_the_seed_option_is_printed_and_used(tmp_path):
    (tmp_path / "test_user.py").write_text(SUITE)
    r = pytest_in(tmp_path, "--kvcheck-seed", "3", "--kvcheck-ops", "400",
                  "--kvcheck-trace-dir", "out", "-k", "buggy or reference", quiet=False)
    assert "kvcheck: seed 3, 400 operations per run" in r.stdout, r.stdout
    # (a --kvcheck-ops of 400 overrides the test's 500: the reference test's assertion fails)
    assert "assert 400 == 500" in r.stdout or "r.ops == 500" in r.stdout
    traces = list((tmp_path / "out").glob("*.json"))
    assert traces and all(json.loads(t.read_text())["seed"] == 3 for t in traces)
    assert all(t.name.endswith("-seed3.json") for t in traces)
