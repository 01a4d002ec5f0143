"""Every corpus bug is caught: by ``verify`` (API and CLI) with a short minimal
trace over several seeds, and by the Hypothesis state machine factory; the legal
choices beside the engine corpus pass."""

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
from kvcheck.models.blocks.runs import Scope, explore, replay
from kvcheck.spec.contracts import Op
from kvcheck.verify import verify

from corpus.buggy import CORPUS
from corpus.cyclic import LEGAL as CYCLIC_LEGAL
from corpus.engine import LEGAL as ENGINE_LEGAL
from corpus.window import LEGAL as WINDOW_LEGAL

LEGAL = {**ENGINE_LEGAL, **WINDOW_LEGAL, **CYCLIC_LEGAL}

BUGGY = Path(__file__).resolve().parents[1] / "corpus" / "buggy.py"
SEEDS = (0, 1, 2)
# The corpus lists aliasing-fork as an invariant bug (no_aliasing); the fork contract's
# own clause "child's table is its own object" states the same thing and is checked
# first, so the report names the contract.
# The cyclic frees-stale bug shows as the contract's clause, or, once the stale block's
# other holder freed it first, as its own "Double free!" (#1556's symptom); the stale
# reuse as the engine's "Double free!" or as the append's contract.
ALSO = {"aliasing-fork": {"contract"}, "cyclic-frees-stale": {"crash"},
        "cyclic-reuses-stale-entry": {"contract"}}


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


def machine_settings(machine):
    """The machine's own settings (as a user gets them: Hypothesis does not shrink its
    example, kvcheck's shrinker does, in the failure's message) with this file's counts.
    Shrinking twice cost minutes here: 450 s for the corpus, 166 s for one entry."""
    return settings(machine.TestCase.settings, max_examples=300, stateful_step_count=20,
                    database=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_state_machine_factory_fails(name):
    cls, kind, _ = CORPUS[name]
    machine = make_state_machine(cls, num_blocks=6, block_size=2)
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=machine_settings(machine))
    text = str(info.value)
    assert any(f"{k} violation" in text for k in _kinds(name, kind)), text
    assert "Counterexample" in text and "VIOLATION" in text  # the run, explained


def test_state_machine_factory_fast_mode_fails():
    machine = make_state_machine(CORPUS["free-without-refcounts"][0], num_blocks=6, block_size=2,
                                 mode="fast")
    with pytest.raises(AssertionError, match="violation"):
        run_state_machine_as_test(machine, settings=machine_settings(machine))


@pytest.mark.parametrize("name", sorted(LEGAL))
def test_legal_engine_choices_pass(name):
    """Allocators choosing otherwise than the references, within the spec, are not flagged:
    by verify at several pool shapes, and by bounded exploration."""
    cls = LEGAL[name]
    for nb, bs, seed in ((16, 4, 0), (8, 2, 1), (4, 1, 2), (12, 3, 0), (3, 2, 1)):
        r = verify(cls, nb, bs, 3000, seed, timeout=5.0)
        assert r.ok, r.violation
    r = explore(cls, Scope(4, 2, 3, 4, 6))
    assert r.violation is None and r.complete


def test_eager_rebase_may_copy_into_a_block_the_child_released():
    """The rebase contract's copy may land in a block only the child held (released first),
    not only in one free before; into a block another sequence still reads it may not."""
    ops = [Op("allocate", seq=0, n_tokens=1), Op("fork", seq=0, child=1),
           Op("rebase", seq=0, child=1)]
    r = replay(LEGAL["eager-rebase-release-first"], 2, 2, ops, timeout=2.0)
    assert r.violation is None and r.ops[-1].copies == [(0, 1)]  # the pool is full: block 1 reused
    shared = CORPUS["eager-rebase-reuses-shared-tail"][0]
    ops = [Op("allocate", seq=0, n_tokens=1), Op("allocate", seq=1, n_tokens=2),
           Op("fork", seq=1, child=2), Op("rebase", seq=0, child=1)]
    r = replay(shared, 4, 2, ops, timeout=2.0)
    assert r.violation is not None and r.violation.step == 4
    assert r.violation.name == "rebase: a block copied at fork time was free or the child's alone"
