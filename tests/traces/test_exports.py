"""Exports of a trace: Apalache's Informal Trace Format, and JUnit XML from verify and replay."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from traces_helpers import found_trace, target_of

from kvcheck.cli import main
from kvcheck.report import itf


def _ints_are_bigints(v) -> bool:
    if isinstance(v, bool) or isinstance(v, str):
        return True
    if isinstance(v, int) or isinstance(v, float):
        return False  # ITF integers are {"#bigint": "..."}
    if isinstance(v, list):
        return all(_ints_are_bigints(x) for x in v)
    if isinstance(v, dict):
        if set(v) == {"#bigint"}:
            return isinstance(v["#bigint"], str) and v["#bigint"].lstrip("-").isdigit()
        if set(v) == {"#map"}:
            return all(len(kv) == 2 and _ints_are_bigints(kv) for kv in v["#map"])
        return all(_ints_are_bigints(x) for k, x in v.items() if k != "#meta")
    return False


def test_itf_has_every_state_encoded_the_itf_way(corpus_name):
    trace = found_trace(corpus_name)
    doc = json.loads(itf.dumps(trace))
    assert doc["#meta"]["format"] == "ITF" and doc["params"] == []
    states = doc["states"]
    assert len(states) == len(trace.states) + 1  # the initial state, then one per operation
    assert [s["#meta"]["index"] for s in states] == list(range(len(states)))
    assert states[0]["action"] == "init"
    for s in states:
        assert set(doc["vars"]) <= set(s) and _ints_are_bigints(s)
    v = trace.violation
    assert doc["#meta"]["violation"]["name"] == v.name
    assert v.name in doc["#meta"]["description"]
    last = trace.states[-1] if trace.states else None
    if last is not None:  # the tables of the last state, back from the #map encoding
        tables = {int(k["#bigint"]): [int(b["#bigint"]) for b in t]
                  for k, t in states[-1]["tables"]["#map"]} if last["tables"] else {}
        assert tables == {int(q): t for q, t in last["tables"].items()}


def test_report_writes_itf_and_html(tmp_path, capsys):
    t = tmp_path / "t.json"
    found_trace("no-copy-on-write").write(t)
    out, page = tmp_path / "t.itf.json", tmp_path / "t.html"
    assert main(["report", str(t), "--itf", str(out), "-o", str(page)]) == 0
    said = capsys.readouterr().out
    assert "ITF trace written" in said and "report written" in said
    assert json.loads(out.read_text())["#meta"]["kvcheck"]["model"] == "blocks"
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_verify_writes_junit_pass_and_fail(tmp_path):
    ok, bad = tmp_path / "ok.xml", tmp_path / "bad.xml"
    assert main(["verify", "reference", "--ops", "300", "--junit", str(ok)]) == 0
    assert main(["verify", target_of("no-copy-on-write"), "--ops", "2000", "--junit",
                 str(bad)]) == 1
    good = ET.parse(ok).getroot()
    assert good.get("tests") == "1" and good.get("failures") == "0"
    failed = ET.parse(bad).getroot()
    assert failed.get("failures") == "1"
    failure = failed.find(".//failure")
    assert "a shared partial block is copied first" in failure.get("message")
    assert "Counterexample" in failure.text


def test_replay_writes_junit(tmp_path):
    t, out = tmp_path / "t.json", tmp_path / "r.xml"
    found_trace("no-copy-on-write").write(t)
    assert main(["replay", str(t), "--junit", str(out)]) == 1
    assert ET.parse(out).getroot().get("failures") == "1"
    assert main(["replay", str(t), "--target", "reference", "--junit", str(out)]) == 0
    assert ET.parse(out).getroot().get("failures") == "0"


TESTS = __import__("pathlib").Path(__file__).resolve().parents[1]
JUNIT_RUNS = {  # command: (arguments of a failing run, of a passing run)
    "verify-prefix": ([f"{TESTS}/prefix/buggy_prefix.py:StaleKeyAfterReuse", "--blocks", "8",
                       "--block-size", "2"], ["prefix", "--ops", "300"]),
    "verify-scheduler": ([f"{TESTS}/scheduler/buggy.py:SkipAhead"],
                         ["reference", "--workloads", "2"]),
    "verify-device": (None, ["device", "--blocks", "8", "--block-size", "2", "--ops", "40"]),
}


def test_every_verify_command_writes_junit(tmp_path):
    for command, (failing, passing) in JUNIT_RUNS.items():
        ok = tmp_path / f"{command}-ok.xml"
        assert main([command, *passing, "--junit", str(ok)]) == 0, command
        root = ET.parse(ok).getroot()
        assert root.get("tests") == "1" and root.get("failures") == "0", command
        if failing is None:
            continue
        bad = tmp_path / f"{command}-bad.xml"
        assert main([command, *failing, "--junit", str(bad)]) == 1, command
        failure = ET.parse(bad).find(".//failure")
        assert failure is not None and failure.get("message") and "Counterexample" in failure.text
