"""Malformed and hostile trace files: a one-line error and exit 2, never a traceback, never code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.check.trace import MAX_BYTES, Trace, TraceError
from kvcheck.cli import main

BAD = Path(__file__).parent / "bad"
GOOD = {"format": "kvcheck.trace", "version": 1, "target": "reference",
        "scope": {"num_blocks": 4, "block_size": 2}, "ops": []}


def _with(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


GENERATED = {
    "deep_nesting.json": b"[" * 200_000 + b"]" * 200_000,
    "deep_nesting_in_field.json": _with(seed=None)[:-1] + b', "x": ' + b"{\"a\":" * 50_000
    + b"1" + b"}" * 50_000 + b"}",
    "deep_details.json": json.dumps({**GOOD, "violation": {
        "step": 0, "kind": "crash", "name": "x", "details": {"a": [[[[[1]]]]]}}}).encode(),
    "many_digits.json": _with()[:-1] + b', "seed": ' + b"9" * 20_000 + b"}",
    "big_seed.json": _with(seed=2**70),
    "long_string.json": _with(target="x" * 100_000),
    "too_many_ops.json": _with(ops=[{"op": "free_seq", "seq": 0}] * 100_001),
    "control_chars.json": b'{"format": "kvcheck.trace\x00"}',
    "infinity.json": _with()[:-1] + b', "seed": Infinity}',
}


def _bad_files(tmp: Path) -> list[Path]:
    files = sorted(BAD.glob("*.json"))
    for name, data in GENERATED.items():
        (tmp / name).write_bytes(data)
        files.append(tmp / name)
    huge = tmp / "gigantic.json"
    with open(huge, "wb") as f:  # sparse: MAX_BYTES + 1 bytes that cost no disk
        f.truncate(MAX_BYTES + 1)
    return [*files, huge]


def test_bad_corpus_is_there():
    assert len(list(BAD.glob("*.json"))) >= 30


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> list[Path]:
    return _bad_files(tmp_path_factory.mktemp("bad"))


def test_every_bad_file_is_one_line_trace_error(bad_files):
    for path in bad_files:
        with pytest.raises(TraceError) as info:
            Trace.load(path)
        msg = str(info.value)
        assert msg and "\n" not in msg and len(msg) < 400, (path.name, msg)
        assert str(path) in msg


@pytest.mark.parametrize("command", [["replay"], ["report", "-o", "out.html"]])
def test_cli_exit_2_with_one_line(bad_files, command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in bad_files:
        assert main([command[0], str(path), *command[1:]]) == 2, path.name
        err = capsys.readouterr().err
        assert err.startswith("kvcheck: error: ") and err.count("\n") == 1, (path.name, err)
    assert not (tmp_path / "out.html").exists()


def test_subprocess_no_traceback(bad_files, tmp_path):
    for path in bad_files[:3] + bad_files[-3:]:
        p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay", str(path)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (path.name, p.stderr)
        assert p.stderr.count("\n") == 1


def test_an_operation_invalid_in_the_trace_s_own_history_is_a_bad_trace(tmp_path, capsys):
    """A hand-edited trace: its append on a sequence no operation created is refused as a
    bad trace (exit 2, one line naming the operation), not replayed as a PASS."""
    from traces_helpers import found_trace

    data = json.loads(found_trace("no-copy-on-write").dumps())
    data["ops"][-1]["seq"] = 99
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=r"trace\.ops\[2\]: append_slot\(seq=99\) cannot run "
                                         r"there: sequence 99 is not live"):
        Trace.load(path)
    for command in (["replay", str(path)], ["replay", str(path), "--target", "reference"],
                    ["report", str(path), "-o", str(tmp_path / "r.html")]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"kvcheck: error: {path}: trace.ops[2]: ") and err.count("\n") == 1
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stdout) == (2, "") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and "sequence 99 is not live" in p.stderr
    for name, why in [("seq_used_after_free", "sequence 0 is not live (ended by ops[1])"),
                      ("fork_into_live_seq", "sequence 1 is live already (created by ops[1])"),
                      ("seq_of_a_failed_allocation", "sequence 0 is not live")]:
        with pytest.raises(TraceError, match=re.escape(why)):
            Trace.load(BAD / f"{name}.json")


def test_missing_and_directory_and_bad_target(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.json")]) == 2
    assert main(["replay", str(tmp_path)]) == 2
    good = tmp_path / "t.json"
    good.write_bytes(_with(target="no_such_target"))
    assert main(["replay", str(good)]) == 2
    assert "--target" in capsys.readouterr().err
    assert main(["replay", str(good), "--target", "also:not_there"]) == 2
    assert main(["replay", str(good), "--target", "reference", "--pytest-out", str(tmp_path)]) == 2
    assert main(["report", str(good), "-o", str(tmp_path)]) == 2
    for argv in (["replay", str(good), "--timeout", "-1"], ["report", str(good)]):
        with pytest.raises(SystemExit) as info:  # argparse: one line, exit 2
            main(argv)
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_loading_never_imports_the_target(tmp_path, capsys):
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\nclass A: pass\n")
    path = tmp_path / "t.json"
    path.write_bytes(_with(target=f"{evil}:A"))
    Trace.load(path)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 0
    assert not marker.exists()


def test_pytest_out_cannot_be_injected(tmp_path):
    import ast

    from kvcheck.check.violation import Violation
    from kvcheck.report.pytest_out import pytest_source

    nasty = 'x"""\nimport os\nos.system("echo pwned")\n"""\r# \u2028\x0c'
    t = Trace(nasty, 4, 2, [], Violation(0, "crash", nasty, witness=nasty), None)
    src = pytest_source(t)
    tree = ast.parse(src)
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds == ["Import", "ImportFrom", "Assign", "Assign", "Assign", "Assign", "Assign",
                     "Assign", "FunctionDef"]
    assert "pwned" not in "".join(ast.unparse(n) for n in tree.body[:2])
    target = next(n for n in tree.body if isinstance(n, ast.Assign)
                  and n.targets[0].id == "TARGET")
    assert target.value.values[1].value == nasty  # only ever as a string literal
