"""``kvcheck verify``: exit codes, --json, --trace-out, --out-of-blocks, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.check.trace import Trace
from kvcheck.cli import main

HERE = Path(__file__).resolve().parent
OOB = HERE / "oob_named_otherwise.py"
BUGGY = HERE.parent / "corpus" / "buggy.py"
# the console script (``python -m kvcheck.cli`` would run cli.py as __main__, a second copy)
KVCHECK = [sys.executable, "-c", "import sys; from kvcheck.cli import main; sys.exit(main())"]


def test_pass_exit_0(capsys):
    assert main(["verify", "--ops", "500"]) == 0
    assert capsys.readouterr().out.startswith("PASS reference")


def test_json_fields(capsys):
    assert main(["verify", "--ops", "300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"verdict", "ops", "seconds", "violation"} <= set(out)
    assert out["verdict"] == "pass" and out["ops"] > 0 and out["violation"] is None
    assert isinstance(out["seconds"], float)


def test_fail_json_and_trace_out(tmp_path, capsys):
    path = tmp_path / "t.json"
    code = main(["verify", f"{BUGGY}:NoCopyOnWrite", "--ops", "2000", "--json",
                 "--trace-out", str(path)])
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "fail" and out["violation"]["violation"]["kind"] == "contract"
    trace = Trace.load(path)
    assert trace.violation.kind == "contract" and 1 <= len(trace.ops) <= 3


def test_out_of_blocks_named_otherwise(capsys):
    target = f"{OOB}:Renamed"
    # without --out-of-blocks, PoolExhausted is an unexpected exception
    assert main(["verify", target, "--blocks", "4", "--ops", "500", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["violation"]["violation"]["kind"] == "crash"
    assert "PoolExhausted" in out["violation"]["violation"]["witness"]
    # target and exception from the same module (a file.py:attr target is loaded afresh
    # each time, so its classes would not be the same objects as --out-of-blocks FILE:Name's)
    sys.path.insert(0, str(HERE))
    try:
        assert main(["verify", "oob_named_otherwise:Renamed", "--blocks", "4", "--ops", "500",
                     "--out-of-blocks", "oob_named_otherwise:PoolExhausted"]) == 0
    finally:
        sys.path.remove(str(HERE))
    assert capsys.readouterr().out.startswith("PASS")


BAD = [
    (["verify", "no_such_module_xyz:Thing"], "cannot import"),
    (["verify", "nonsense"], "unknown target"),
    (["verify", "missing/file.py:Thing"], "does not exist"),
    (["verify", f"{OOB}:NOT_CALLABLE"], "is not callable"),
    (["verify", f"{OOB}:NoSuchAttr"], "has no attribute"),
    (["verify", "--blocks", "0"], "positive integer"),
    (["verify", "--block-size", "-1"], "positive integer"),
    (["verify", "--blocks", "many"], "positive integer"),
    (["verify", "--timeout", "0"], "positive number"),
    (["verify", f"{OOB}:refuses"], "cannot build target"),
    (["verify", "--out-of-blocks", "oob_named_otherwise:NotAnException"], "not an exception"),
    (["verify", "--out-of-blocks", "oob_named_otherwise:NOT_CALLABLE"], "not callable"),
    (["verify", "--trace-out", "."], "is a directory"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_input_exit_2_one_line(argv, message):
    p = subprocess.run([*KVCHECK, *argv, "--ops", "50"],
                       capture_output=True, text=True, timeout=120, cwd=HERE,
                       env={**__import__("os").environ, "PYTHONPATH": str(HERE)})
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and message in lines[0], lines[0]
