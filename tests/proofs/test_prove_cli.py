"""``kvcheck prove``: the table, JSON, JUnit, exit codes."""

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

CORPUS = str(Path(__file__).parents[1] / "corpus" / "buggy.py")
SMALL = ["--blocks", "4", "--block-size", "2", "--seqs", "3", "--depth", "4", "--no-pairs",
         "--no-crosshair", "--budget", "60"]


def kvcheck(*args):
    return subprocess.run([sys.executable, "-m", "kvcheck", *args], capture_output=True,
                          text=True, timeout=600)


def test_reference_passes_with_junit(tmp_path):
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", *SMALL, "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS reference" in r.stdout
    cases = ET.parse(junit).getroot().iter("testcase")
    names = [c.get("name") for c in cases]
    assert any("refcount_conservation" in n for n in names)
    assert any("copy-on-write" in n for n in names)


def test_buggy_allocator_fails_with_shortest_trace(tmp_path):
    out = tmp_path / "t.json"
    r = kvcheck("prove", f"{CORPUS}:NoCopyOnWrite", *SMALL, "--json", "--trace-out", str(out))
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail"
    failed = [row for row in report["rows"] if row["result"] == "violated"]
    assert failed and all(row["engine"] == "exploration" for row in failed)
    trace = json.loads(out.read_text())
    assert [op["op"] for op in trace["ops"]] == ["allocate", "fork", "append_slot"]


def test_bad_input_exits_2():
    for args in (["prove", "nosuch"], ["prove", "--blocks", "0"], ["prove", "--blocks", "500"]):
        r = kvcheck(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
