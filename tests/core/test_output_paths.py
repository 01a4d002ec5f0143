"""Every file a command writes is checked before the run (missing folder, a directory, a file
where a folder should be: one line, exit 2, nothing run), and a write that still fails after
the run loses nothing: the result is printed, the verdict's exit code stands (1 for a
violation; a pass whose requested file could not be written is 2), one line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.cli import main

TESTS = Path(__file__).resolve().parents[1]
BUGGY = TESTS / "corpus" / "buggy.py"
PREFIX_BUGGY = TESTS / "prefix" / "buggy_prefix.py"
SCHED_BUGGY = TESTS / "scheduler" / "buggy.py"
PROVE_SMALL = ["--blocks", "3", "--block-size", "2", "--seqs", "2", "--depth", "3", "--no-pairs",
               "--no-crosshair"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "t.json"
    assert main(["verify", f"{BUGGY}:NoCopyOnWrite", "--ops", "2000", "--trace-out",
                 str(path)]) == 1
    return str(path)


# (argv before the output flag, the flag, what the finished run prints, the exit code when the
# file cannot be written after it: 1 with a violation, 2 for a pass)
WRITERS = [
    (["verify", f"{BUGGY}:NoCopyOnWrite", "--ops", "2000"], "--trace-out", "VIOLATION", 1),
    (["verify-prefix", f"{PREFIX_BUGGY}:StaleKeyAfterReuse", "--ops", "2000"], "--trace-out",
     "VIOLATION", 1),
    (["verify-scheduler", f"{SCHED_BUGGY}:IgnoreWatermark"], "--trace-out", "VIOLATION", 1),
    (["prove", f"{BUGGY}:NoCopyOnWrite", *PROVE_SMALL], "--trace-out", "counterexample", 1),
    (["prove", f"{BUGGY}:NoCopyOnWrite", *PROVE_SMALL], "--junit", "counterexample", 1),
    (["prove", "reference", *PROVE_SMALL], "--junit", "PASS", 2),
    (["replay", "TRACE"], "--trace-out", "REPRODUCED", 1),
    (["replay", "TRACE"], "--pytest-out", "REPRODUCED", 1),
    (["report", "TRACE"], "-o", None, 2),
    (["simulate", "--requests", "5", "--blocks", "20", "--block-size", "4"], "--plot", "steps", 2),
]
IDS = [f"{argv[0]} {flag}" + (" (pass)" if prints == "PASS" else "") for argv, flag, prints, _ in WRITERS]


def _argv(argv, trace):
    return [trace if a == "TRACE" else a for a in argv]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv,flag,prints,code", WRITERS, ids=IDS)
@pytest.mark.parametrize("bad,says", [("missing/out.x", "does not exist"),
                                      ("folder", "is a directory"),
                                      ("file.txt/out.x", "is not a directory")])
def test_checked_before_the_run(tmp_path, capsys, trace, argv, flag, prints, code, bad, says):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("a file, not a folder\n")
    assert main([*_argv(argv, trace), flag, str(tmp_path / bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran: a finished run prints its verdict
    line = _one_line(err)
    assert flag in line and says in line, line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv,flag,prints,code", WRITERS, ids=IDS)
def test_a_failing_write_after_the_run_loses_nothing(capsys, trace, argv, flag, prints, code):
    if flag == "--plot":
        pytest.importorskip("matplotlib")
    assert main([*_argv(argv, trace), flag, "/dev/full"]) == code
    out, err = capsys.readouterr()
    if prints:
        assert prints in out, out
    line = _one_line(err)
    assert "cannot write" in line and flag in line and "/dev/full" in line, line


def test_two_outputs_naming_one_file_are_refused(tmp_path, capsys):
    same = str(tmp_path / "out")
    assert main(["prove", *PROVE_SMALL, "--junit", same, "--trace-out", same]) == 2
    assert "same file" in _one_line(capsys.readouterr().err)


def test_a_plot_format_matplotlib_cannot_draw_is_refused_before_the_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["simulate", "--requests", "5", "--plot", str(tmp_path / "run.txt")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "cannot draw a .txt file" in _one_line(err)
