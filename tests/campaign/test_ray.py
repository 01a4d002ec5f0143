"""``kvcheck campaign --ray`` on a real local Ray cluster of two workers (``ray.init`` with
two CPUs, started by the campaign): two runs in flight at once on two Ray worker processes,
a corpus bug found with replayable traces; and without Ray installed, ``--ray`` is one line
of bad input (everything else works without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
BUGGY = TESTS / "corpus" / "buggy.py"
SLOW = Path(__file__).with_name("slow_targets.py")


def campaign(*args, out: Path, env: dict | None = None):
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign", *map(str, args),
                        "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p


def needs_ray():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvcheck[ray]'); "
                                      "the Ray pool is not tested")


def test_two_ray_workers_run_two_runs_at_once(tmp_path):
    needs_ray()
    meet = tmp_path / "meet"
    meet.mkdir()
    out = tmp_path / "c"
    p = campaign(f"{SLOW}:MeetsAnother", "--ray", "--workers", "2", "--runs", "2",
                 "--timeout", "30", out=out, env={"KVCHECK_TEST_MEET": str(meet)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "on 2 Ray tasks at a time on a local Ray cluster (2 CPUs)" in p.stdout, p.stdout
    assert len(list(meet.glob("*.met"))) == 2 and not list(meet.glob("*.alone"))
    lines = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [x["verdict"] for x in lines] == ["pass", "pass"]
    assert len({x["worker"] for x in lines}) == 2  # two Ray worker processes watched them
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"] == "pass" and s["sessions"][0]["pool"].endswith("local Ray cluster (2 CPUs)")


def test_a_ray_campaign_finds_a_corpus_bug(tmp_path):
    needs_ray()
    out = tmp_path / "c"
    p = campaign(f"{BUGGY}:NoCopyOnWrite", "--ray", "--workers", "2", "--runs", "4", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"] == "fail" and s["runs"]["completed"] == 4 and s["runs"]["errors"] == 0
    for e in s["signatures"]:
        r = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay",
                            str(out / e["shortest"]["trace"])], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 1 and "REPRODUCED" in r.stdout, r.stdout + r.stderr


def test_without_ray_the_flag_is_one_line_of_bad_input(tmp_path):
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    p = campaign("reference", "--ray", "--runs", "1", out=tmp_path / "c", env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr == "kvcheck: error: --ray needs Ray: pip install 'kvcheck[ray]'\n"
    assert not (tmp_path / "c").exists()  # nothing ran: no campaign left to resume
    ok = campaign("reference", "--runs", "1", out=tmp_path / "d", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
