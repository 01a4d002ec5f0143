"""Every corpus bug: write, load, replay; and a trace replays on any other allocator."""

from __future__ import annotations

import json

import pytest
from traces_helpers import CORPUS, found_trace, target_of

from kvcheck.check.trace import Trace, schema
from kvcheck.cli import main
from kvcheck.spec.contracts import SEED_OPERATIONS

from corpus.cyclic import CYCLIC


def want_attr(target: str) -> str:
    return target.rpartition(":")[2]


def test_trace_roundtrip_and_replay(corpus_name, tmp_path, capsys):
    trace = found_trace(corpus_name)
    assert trace.violation is not None
    assert trace.violation.kind == CORPUS[corpus_name][1] or trace.violation.kind == "contract"
    path = tmp_path / "t.json"
    trace.write(path)
    loaded = Trace.load(path)
    got, want = loaded.to_json(), trace.to_json()
    # the target file is recorded relative to the trace (portable), and found again from it
    assert loaded.loadable_target() == want.pop("target")
    assert got.pop("target").endswith(":" + want_attr(trace.target))
    assert got.pop("target_file")["path"] == loaded.target.rpartition(":")[0]
    assert got == want
    assert len(loaded.states) == len(loaded.ops)
    # replay on the recorded target reproduces it: exit 1
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"REPRODUCED on {target_of(corpus_name)}: step {trace.violation.step}")
    assert trace.violation.name in out
    # the reference offering the trace's operations passes the whole trace: exit 0
    kinds = {o.kind for o in trace.ops}
    reference = "reference-cyclic" if corpus_name in CYCLIC else \
        "reference" if kinds <= set(SEED_OPERATIONS) else \
        "reference-window" if "drop_behind_window" in kinds else "reference-engine"
    assert main(["replay", str(path), "--target", reference]) == 0
    assert capsys.readouterr().out.startswith(f"PASS {reference}: all ")


def test_schema_accepts_what_kvcheck_writes(corpus_name):
    jsonschema = pytest.importorskip("jsonschema")
    s = schema()
    jsonschema.Draft202012Validator.check_schema(s)
    jsonschema.Draft202012Validator(s).validate(json.loads(found_trace(corpus_name).dumps()))


def test_replays_on_every_other_allocator(corpus_name, tmp_path, capsys):
    path = tmp_path / "t.json"
    found_trace(corpus_name).write(path)
    for other in sorted(CORPUS):
        code = main(["replay", str(path), "--target", target_of(other)])
        out = capsys.readouterr().out
        assert code in (0, 1, 4), (other, out)
        if other == corpus_name:
            assert code == 1 and out.startswith("REPRODUCED")
        elif code == 1:
            assert out.startswith(("REPRODUCED", "FAIL"))
        elif code == 4:
            assert out.startswith("NOT REPRODUCED")
        else:
            assert out.startswith("PASS")


def test_replay_json_and_trace_out(tmp_path, capsys):
    path, again = tmp_path / "t.json", tmp_path / "again.json"
    found_trace("no-copy-on-write").write(path)
    assert main(["replay", str(path), "--json", "--trace-out", str(again)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "reproduced" and doc["violation"]["step"] == doc["recorded"]["step"]
    assert Trace.load(again).violation.name == doc["violation"]["name"]


def test_replay_skips_operations_a_target_lacks(tmp_path, capsys):
    nofork = tmp_path / "nofork.py"
    nofork.write_text(
        "from kvcheck.impl.block_manager import BlockManager\n\n"
        "class NoFork(BlockManager):\n"
        "    fork = None\n")
    path = tmp_path / "t.json"
    found_trace("cow-full-blocks").write(path)
    assert main(["replay", str(path), "--target", f"{nofork}:NoFork"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "1 operation(s) skipped" in out


def test_a_replay_that_skips_the_recorded_violating_step_is_not_a_pass(tmp_path, capsys):
    """On a target without fork, the aliasing fork's trace cannot run its violating step: the
    replay says so (exit 4: inconclusive), in its text, its JSON and its JUnit case (skipped,
    not passed)."""
    import xml.etree.ElementTree as ET

    nofork = tmp_path / "nofork.py"
    nofork.write_text(
        "from kvcheck.impl.block_manager import BlockManager\n\n"
        "class NoFork(BlockManager):\n"
        "    fork = None\n")
    path, junit = tmp_path / "t.json", tmp_path / "j.xml"
    trace = found_trace("aliasing-fork")
    trace.write(path)
    step = trace.violation.step
    assert trace.ops[step - 1].kind == "fork"
    target = f"{nofork}:NoFork"
    assert main(["replay", str(path), "--target", target, "--junit", str(junit)]) == 4
    out = capsys.readouterr().out
    assert out.startswith(f"NOT REPRODUCED on {target}: step {step} (fork(parent=")
    assert f"step {step} (fork(" in out and ") did not run" in out and "PASS" not in out
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case.find("failure") is None and case.find("skipped") is not None
    assert "not reproduced: step" in case.find("skipped").get("message")
    assert main(["replay", str(path), "--target", target, "--json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "not-reproduced" and doc["did_not_run"] == step
    assert doc["violation"] is None and doc["skipped"] >= 1
