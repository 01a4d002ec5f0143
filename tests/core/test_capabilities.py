"""A target that leaves kvcheck no operation to issue is bad input (exit 2, one line), never a
PASS over zero operations and never a traceback; names kvcheck does not know are ignored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck import make_state_machine
from kvcheck.check.trace import Trace
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

HERE = Path(__file__).resolve().parent
TARGETS = HERE / "capability_targets.py"
BUGGY = HERE.parent / "corpus" / "buggy.py"
KVCHECK = [sys.executable, "-c", "import sys; from kvcheck.cli import main; sys.exit(main())"]
NOTHING = ["Empty", "NoneCaps", "Unknown", "OnlyFree", "Bare"]
SAYS = {"Empty": "offers no operation", "NoneCaps": "must be a set of operation names",
        "Unknown": "offers no operation", "OnlyFree": "does not offer allocate",
        "Bare": "has none of the methods"}


def kvcheck(*args, cwd=HERE):
    return subprocess.run([*KVCHECK, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def one_line_exit_2(p, says):
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "PASS" not in p.stdout and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr


@pytest.mark.parametrize("name", NOTHING)
def test_verify_and_prove_refuse(name):
    one_line_exit_2(kvcheck("verify", f"{TARGETS}:{name}", "--ops", "100"), SAYS[name])
    one_line_exit_2(kvcheck("prove", f"{TARGETS}:{name}", "--blocks", "3", "--seqs", "2",
                            "--depth", "2", "--no-crosshair", "--no-pairs"), SAYS[name])


@pytest.mark.parametrize("name", NOTHING)
def test_replay_refuses(tmp_path, name):
    trace = tmp_path / "t.json"
    assert kvcheck("verify", f"{BUGGY}:NoCopyOnWrite", "--ops", "500", "--trace-out",
                   str(trace)).returncode == 1
    one_line_exit_2(kvcheck("replay", str(trace), "--target", f"{TARGETS}:{name}"), SAYS[name])


def test_replay_of_a_trace_without_operations_is_bad_input(tmp_path):
    empty = tmp_path / "empty.json"
    Trace("reference", 4, 2, []).write(empty)
    one_line_exit_2(kvcheck("replay", str(empty)), "nothing was checked")


@pytest.mark.parametrize("name", NOTHING)
def test_api_raises_target_error(name):
    with pytest.raises(TargetError, match=SAYS[name]):
        make_state_machine(f"{TARGETS}:{name}", num_blocks=4, block_size=2)
    with pytest.raises(TargetError, match=SAYS[name]):
        verify(f"{TARGETS}:{name}", 4, 2, ops=50)


def test_unknown_names_next_to_known_ones_are_ignored():
    p = kvcheck("verify", f"{TARGETS}:Newer", "--ops", "300")
    assert p.returncode == 0 and p.stdout.startswith("PASS"), p.stderr
    assert "300 operations" in p.stdout
