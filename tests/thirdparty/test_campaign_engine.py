"""``kvcheck campaign --model engine``: campaigns draw runs of the engine model (an engine's own
scheduler, ``kvcheck verify-engine``) on the releases kvcheck installs.

A campaign on vLLM 0.9.0 finds #19459 (resuming a preempted request whose drafts were
accepted crashes the engine step) in a drawn run with speculative tokens, and the command the
run records reproduces its verdict and trace; 0.33.0 passes a few runs, every engine class
counted, and a resumed campaign draws from the settings it learnt; what each engine target
accepts is learnt once, and no drawn run is refused; bad input is one line, exit 2.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.campaign.engine import probe
from kvcheck.campaign.plan import ENGINE, Settings, draw
from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install
from kvcheck.models.engine.loading import build, resolve
from kvcheck.models.engine.model import MODEL


def _ensure(key: str, *versions: str) -> None:
    """The releases a test reads (scripts/test.sh installs them; installed here if not)."""
    for v in versions:
        install.ensure(install.ENGINES[key], v)


def campaign(*args, out: Path, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign", "--model", "engine",
                           *map(str, args), "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def found_19459(tmp_path_factory):
    """A campaign of 8 runs on 0.9.0 (seed 215: its run 7 draws 4 speculative tokens with
    prefix caching on; a small shrinking budget keeps the test short)."""
    _ensure("vllm-v1-early", "0.9.0")
    out = tmp_path_factory.mktemp("campaign") / "c"
    p = campaign("vllm-v1-engine@0.9.0", "--seed", "215", "--runs", "8", "--workers", "2",
                 "--shrink-budget", "3000", out=out)
    return p, out


def test_a_campaign_on_0_9_0_finds_19459(found_19459):
    p, out = found_19459
    assert p.returncode == 1, p.stdout + p.stderr
    assert "\nFAIL vllm-v1-engine@0.9.0: 1 signature(s) in 8 completed runs" in p.stdout, p.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["model"] == "engine" and s["runs"]["refused"] == 0 and s["runs"]["errors"] == 0
    (sig,) = s["signatures"]
    assert (sig["kind"], sig["clause"]) == ("crash", "step")
    assert "find_longest_cache_hit" in sig["shortest"]["witness"]
    assert "--spec-tokens 0" not in sig["rerun"]  # drafts: #19459 needs them
    cov = s["coverage"]
    assert cov["classes"] and all(cov["total"].values()), cov  # every engine class occurred


def test_a_drawn_run_s_command_reproduces_its_verdict_and_trace(found_19459, tmp_path):
    """The command the failing run recorded, run as a user runs it, fails the same way and
    writes the very trace the campaign kept."""
    _, out = found_19459
    s = json.loads((out / "summary.json").read_text())
    (sig,) = s["signatures"]
    argv = shlex.split(sig["rerun"])
    assert argv[:3] == ["kvcheck", "verify-engine", "vllm-v1-engine@0.9.0"]
    assert "--shrink-budget" in argv  # the campaign's, not verify-engine's default
    trace = tmp_path / "again.json"
    assert kvcheck([*argv[1:], "--trace-out", str(trace)]) == 1
    kept = json.loads((out / sig["shortest"]["trace"]).read_text())
    assert json.loads(trace.read_text()) == kept
    assert kept["model"] == "engine" and kept["violation"]["name"] == "step"


def test_0_33_0_passes_a_few_runs_and_resumes_its_draws(tmp_path):
    out = tmp_path / "c"
    p = campaign("vllm-v1-engine@0.33.0", "--runs", "3", "--workers", "2", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("PASS vllm-v1-engine@0.33.0: 3 campaign runs (engine model"), \
        p.stdout
    assert "engine/finished" in p.stdout and "warning" not in p.stdout
    state = json.loads((out / "campaign.json").read_text())
    accepts = state["settings"]["accepts"]
    assert accepts["spec"] == list(ENGINE["spec"]) and accepts["policy"] == ["fcfs", "priority"]
    again = campaign("vllm-v1-engine@0.33.0", "--runs", "1", "--workers", "2", out=out)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted(x["run"] for x in lines) == list(range(4))
    s = Settings("vllm-v1-engine@0.33.0", "engine", accepts=accepts)
    for x in lines:  # each run as drawn from the saved settings, its command verify-engine's
        assert x["verdict"] == "pass" and x["command"] == draw(s, x["run"]).command()
    assert lines[0]["command"].startswith("kvcheck verify-engine vllm-v1-engine@0.33.0 "
                                          "--blocks 8 --block-size 4 --ops 2000 --requests 30 ")


@pytest.mark.parametrize("target,install_key,version,expect", [
    ("vllm-v1-engine@0.33.0", None, None, {"spec": [0, 1, 2, 3, 4], "max_model_len": "any"}),
    ("vllm-v1-engine@0.7.2", "vllm-v1-early", "0.7.2", {"spec": [0], "policy": ["fcfs"]}),
    ("nano-vllm-engine", None, None, {"spec": [0], "policy": ["fcfs"], "caching": [True],
                                      "block_size": [2, 4, 8, 16], "max_model_len": "within",
                                      "whole": True}),
    ("vllm-v0-engine-chunked@0.5.5", "vllm-v0", "0.5.5", {"caching": [False], "spec": [0]}),
    ("vllm-v0-engine@0.9.2", "vllm-v0", "0.9.2", {"spec": [0], "max_model_len": "within",
                                                  "whole": True}),
])
def test_what_a_target_accepts_is_learnt_and_no_drawn_run_is_refused(target, install_key,
                                                                        version, expect):
    """The settings each target refuses (verify-engine says so in one line) are learnt, and
    every drawn run, run 0 included, builds: a campaign never draws one it refuses."""
    if install_key:
        _ensure(install_key, version)
    accepts = probe(target, 10.0)
    for k, v in expect.items():
        assert accepts[k] == v, (k, accepts)
    _, factory = resolve(target)
    for seed in (0, 1):
        s = Settings(target, "engine", seed=seed, accepts=accepts)
        for n in range(40):
            build(factory, MODEL.scope_from_json(draw(s, n).scope))  # TargetError if refused


@pytest.mark.parametrize("args,says", [
    (["reference"], "unknown engine target 'reference'"),
    (["vllm-v1-engine", "--out-of-blocks", "x:Y"], "--out-of-blocks is not for --model engine"),
])
def test_bad_input_is_one_line(args, says, tmp_path):
    out = tmp_path / "c"
    p = campaign(*args, "--runs", "1", out=out)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and says in err, err
    assert not (out / "campaign.json").exists()  # the same --out serves the corrected command
