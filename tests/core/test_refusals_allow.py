"""Deliberate refusals (checked to change nothing, the run goes on) and ``verify --allow``
(a documented deviation is counted and reported, and a later bug is still caught)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.verify import replay_trace, verify

HERE = Path(__file__).parent
WM_OOB = "allocate: out-of-blocks only when fewer than ceil(n/B) blocks are free"


def target(name: str) -> str:
    return f"{HERE / 'deviating_targets.py'}:{name}"


def kvcheck(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kvcheck", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_a_refusal_that_changes_nothing_is_checked_past():
    r = verify(target("Watermark"), 8, 2, ops=3000)
    assert r.ok and r.ops == 3000, r.violation


def test_a_refusal_that_changes_something_is_caught():
    r = verify(target("LeakyRefusal"), 8, 2, ops=3000)
    assert not r.ok
    assert r.violation.name == "allocate: exception_safety: free list length unchanged"
    assert len(r.trace.ops) == 1 and r.trace.ops[0].outcome == "refused"


def test_the_fast_and_full_modes_agree_on_refusals():
    for name in ("Watermark", "LeakyRefusal"):
        fast = verify(target(name), 8, 2, ops=2000, do_shrink=False)
        full = verify(target(name), 8, 2, ops=2000, mode="full", do_shrink=False)
        assert fast.ok == full.ok
        if not fast.ok:
            assert fast.violation.name == full.violation.name


def test_a_deviation_fails_without_allow_and_is_counted_with_it():
    assert not verify(target("WatermarkOutOfBlocks"), 8, 2, ops=3000).ok
    r = verify(target("WatermarkOutOfBlocks"), 8, 2, ops=3000, allow=frozenset({WM_OOB}))
    assert r.ok and r.ops == 3000
    assert r.deviations and {d.clause for d in r.deviations} == {WM_OOB}
    summary = r.to_json()["deviations"][WM_OOB]
    assert summary["count"] == len(r.deviations) and summary["first"]["step"] >= 1


def test_an_allowed_deviation_does_not_hide_a_later_bug(tmp_path):
    out = tmp_path / "t.json"
    p = kvcheck("verify", target("WatermarkAndForkBug"), "--blocks", "8", "--block-size", "2",
                "--allow", WM_OOB, "--trace-out", str(out))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "fork: refcount +1 per entry of the child's table" in p.stdout
    trace = json.loads(out.read_text())
    assert trace["settings"]["allow"] == WM_OOB
    from kvcheck.check.trace import Trace

    again = replay_trace(Trace.loads(out.read_text()))
    assert again.violation is not None and again.violation.name.startswith("fork:")


def test_allowed_deviations_are_printed_and_in_json():
    p = kvcheck("verify", target("WatermarkOutOfBlocks"), "--blocks", "8", "--block-size", "2",
                "--ops", "2000", "--allow", WM_OOB)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("ALLOWED ") and WM_OOB in p.stdout
    assert "except the" in p.stdout and "allowed deviations" in p.stdout
    p = kvcheck("verify", target("WatermarkOutOfBlocks"), "--blocks", "8", "--block-size", "2",
                "--ops", "2000", "--allow", WM_OOB, "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout)["deviations"][WM_OOB]["count"] >= 1


@pytest.mark.parametrize("name", ["no such clause", "fork:", ""])
def test_an_unknown_clause_is_a_usage_error(name):
    p = kvcheck("verify", "reference", "--allow", name)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "--allow" in p.stderr


def test_a_refusal_trace_is_written_replayed_and_reported(tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    p = kvcheck("verify", target("LeakyRefusal"), "--blocks", "8", "--block-size", "2",
                "--trace-out", str(out))
    assert p.returncode == 1 and json.loads(out.read_text())["ops"][0]["result"]["outcome"] == \
        "refused"
    p = kvcheck("replay", str(out))
    assert p.returncode == 1 and "REPRODUCED" in p.stdout, p.stdout + p.stderr
    p = kvcheck("report", str(out), "-o", str(page))
    assert p.returncode == 0 and "refused" in page.read_text()


def test_a_pass_says_how_many_operations_were_refused():
    r = verify(target("Watermark"), 8, 2, ops=3000)
    assert r.ok and r.refused > 0 and r.to_json()["refused"] == r.refused
    p = kvcheck("verify", target("Watermark"), "--blocks", "8", "--block-size", "2",
                "--ops", "2000")
    assert p.returncode == 0 and "refused by the target's declared policy" in p.stdout
    assert verify("reference", 8, 2, ops=500).refused == 0


def test_a_prefix_rule_under_allow_is_named_as_such(capsys):
    """``verify-prefix --allow key_after_write``: the rule exists (a violation prints it),
    it just cannot be allowed; the error said 'no clause or invariant has that name'."""
    from kvcheck.cli import main

    assert main(["verify-prefix", "prefix", "--allow", "key_after_write", "--ops", "10"],
                isolate=False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a prefix-cache rule cannot be allowed" in err, err
    assert main(["verify-prefix", "prefix", "--allow", "bogus", "--ops", "10"],
                isolate=False) == 2
    assert "no clause or invariant of the spec has that name" in capsys.readouterr().err
