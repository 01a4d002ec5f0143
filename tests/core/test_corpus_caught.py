"""Every corpus bug is caught: by ``verify`` (API and CLI) with a short minimal
trace over several seeds, and by the Hypothesis state machine factory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck import make_state_machine
from kvcheck.cli import main
from kvcheck.verify import verify

from corpus.buggy import CORPUS

BUGGY = Path(__file__).resolve().parents[1] / "corpus" / "buggy.py"
SEEDS = (0, 1, 2)
# The corpus lists aliasing-fork as an invariant bug (no_aliasing); the fork contract's
# own clause "child's table is its own object" states the same thing and is checked
# first, so the report names the contract.
ALSO = {"aliasing-fork": {"contract"}}


def _kinds(name, kind):
    return {kind} | ALSO.get(name, set())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_verify_api_catches(name, seed):
    cls, kind, bound = CORPUS[name]
    r = verify(cls, 16, 4, 3000, seed, timeout=5.0, shrink_budget=30)
    assert r.verdict == "fail"
    assert r.violation.kind in _kinds(name, kind), r.violation
    assert r.trace is not None and 1 <= len(r.trace.ops) <= bound, r.trace.ops
    assert r.trace.violation.step == len(r.trace.ops)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_verify_cli_catches(name, capsys):
    cls, kind, bound = CORPUS[name]
    code = main(["verify", f"{BUGGY}:{cls.__name__}", "--blocks", "16", "--ops", "3000",
                 "--seed", "1", "--json"])
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "fail"
    assert out["violation"]["violation"]["kind"] in _kinds(name, kind)
    assert len(out["violation"]["ops"]) <= bound


def test_cli_exit_code_1_in_a_subprocess():
    cls = CORPUS["no-copy-on-write"][0]
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "verify", f"{BUGGY}:{cls.__name__}",
                        "--ops", "2000"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "FAIL" in p.stdout and "copied first" in p.stdout


MACHINE_SETTINGS = settings(max_examples=300, stateful_step_count=20, deadline=None,
                            database=None, derandomize=True,
                            suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_state_machine_factory_fails(name):
    cls, kind, _ = CORPUS[name]
    machine = make_state_machine(cls, num_blocks=6, block_size=2)
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
    text = str(info.value)
    assert any(f"{k} violation" in text for k in _kinds(name, kind)), text
    assert "Counterexample" in text and "VIOLATION" in text  # the run, explained


def test_state_machine_factory_fast_mode_fails():
    machine = make_state_machine(CORPUS["free-without-refcounts"][0], num_blocks=6, block_size=2,
                                 mode="fast")
    with pytest.raises(AssertionError, match="violation"):
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
