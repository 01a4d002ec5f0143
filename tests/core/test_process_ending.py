"""No verdict without a completed run (issue 12 §1).

A target that ends, wedges or floods the process is reported, never mistaken
for PASS: in process through the watchdog's traps (``sys.exit``, ``os._exit``
in a call, KeyboardInterrupt, BaseException, unprintable exceptions, hangs in
any call or observation), and, for what no handler can see (a segfault, a
kill, ``os._exit`` from another thread, a loop that swallows the timeout), by
the command line's supervisor (``kvcheck.supervise``), tested as a real
``kvcheck`` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.cli import main
from kvcheck.verify import HANG_SHRINK_TIMEOUT, verify

HERE = Path(__file__).parent
TARGETS = HERE / "ending_targets.py"


def target(name: str) -> str:
    return f"{TARGETS}:{name}"


def kvcheck(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real program (supervised), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "kvcheck", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=HERE)


# -- in process: the oracle's traps ---------------------------------------------------------
@pytest.mark.parametrize("name, words", [
    ("ExitsInFork", "fork called sys.exit(0)"),
    ("HardExitsInFork", "fork called os._exit(0)"),
    ("InterruptsInFork", "fork raised KeyboardInterrupt"),
    ("RaisesUnprintable", "could not be printed"),
])
def test_ending_the_process_in_an_operation_is_a_violation(name, words):
    r = verify(target(name), num_blocks=8, block_size=2, ops=500)
    assert r.verdict == "fail"
    assert r.violation.kind == "crash" and r.violation.name == "fork"
    assert words in r.violation.witness
    assert [op.kind for op in r.trace.ops] == ["allocate", "fork"]  # shrunk as usual


def test_cli_in_process_reports_sys_exit(capsys):
    assert main(["verify", target("ExitsInFork"), "--ops", "300"]) == 1
    assert "called sys.exit(0)" in capsys.readouterr().out


def test_exit_in_constructor_is_bad_input(capsys):
    assert main(["verify", target("ExitsInConstructor")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "called sys.exit(0)" in err


def test_exit_at_import_is_bad_input(tmp_path, capsys):
    f = tmp_path / "leaves.py"
    f.write_text("import sys\nsys.exit(0)\n")
    assert main(["verify", f"{f}:Anything"]) == 2
    assert "called sys.exit(0)" in capsys.readouterr().err


def test_base_exception_out_of_blocks_passes():
    r = verify(target("BaseExceptionOutOfBlocks"), num_blocks=6, block_size=2, ops=3000)
    assert r.ok, r.violation


def test_base_exception_out_of_blocks_named_explicitly(capsys):
    code = main(["verify", target("BaseExceptionOutOfBlocks"), "--blocks", "6", "--block-size",
                 "2", "--ops", "2000", "--out-of-blocks", target("OutOfBlocks")])
    assert code == 0, capsys.readouterr().out


def test_hang_while_observing_is_a_hang():
    r = verify(target("FreeListHangs"), num_blocks=8, block_size=2, ops=400, timeout=0.5,
               do_shrink=False)
    assert r.verdict == "fail" and r.violation.kind == "hang"


def test_hang_in_constructor_is_bad_input(capsys):
    assert main(["verify", target("HangsInConstructor"), "--timeout", "0.5"]) == 2
    assert "did not return within 0.5 s" in capsys.readouterr().err


def test_a_hang_costs_one_full_timeout():
    from kvcheck.targets.loading import resolve

    _, cls = resolve(target("HangsInFork"))  # the module as kvcheck's loader imported it
    HANG_ENTRIES = sys.modules[cls.__module__].HANG_ENTRIES
    HANG_ENTRIES.clear()
    r = verify(target("HangsInFork"), num_blocks=8, block_size=2, ops=400, timeout=3.0,
               shrink_budget=10.0)
    assert r.verdict == "fail" and r.violation.kind == "hang" and r.violation.name == "fork"
    assert HANG_ENTRIES[0] == 3.0
    assert len(HANG_ENTRIES) > 1 and all(t <= HANG_SHRINK_TIMEOUT for t in HANG_ENTRIES[1:])
    assert "limit per operation" in r.trace.minimality


# -- the real program: the supervisor ---------------------------------------------------------
@pytest.mark.parametrize("name, how", [
    ("SegfaultsInFork", "killed by signal SIGSEGV"),
    ("KilledInFork", "killed by signal SIGKILL"),
    ("ExitsFromThread", "exit status 0"),
])
def test_a_process_ended_by_the_target_is_a_violation(name, how):
    p = kvcheck("verify", target(name), "--ops", "500", "--json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    v = data["violation"]["violation"]
    assert data["verdict"] == "fail" and v["kind"] == "crash" and v["name"] == "fork"
    assert how in v["witness"] and "during operation" in v["witness"]
    ops = data["violation"]["ops"]
    assert ops[-1]["op"] == "fork" and len(ops) == v["step"]
    assert "Traceback" not in p.stderr


def test_a_violation_found_before_shrinking_ended_the_process_is_reported():
    """The run finds the leak; a replay while shrinking segfaults (every target built after
    a process's first does). The report is the run's violation, never a crash on a mixture
    of the replays', shrunk with each replay in a process of its own (where the target is
    built once, so the leak shows and nothing crashes)."""
    p = kvcheck("verify", target("LeaksThenSegfaultsWhenShrunk"), "--ops", "500", "--json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    v = data["violation"]["violation"]
    assert v["kind"] != "crash" and "free_seq" in v["name"], v
    ops = data["violation"]["ops"]
    assert [op["op"] for op in ops] == ["allocate", "free_seq"] and v["step"] == 2
    minimality = data["violation"]["minimality"]
    assert minimality.startswith("1-minimal") and "each replay ran in a process of its own" \
        in minimality
    assert "Traceback" not in p.stderr


def test_text_report_names_the_last_operation():
    p = kvcheck("verify", target("SegfaultsInFork"), "--ops", "500")
    assert p.returncode == 1
    assert "killed by signal SIGSEGV" in p.stdout and ">>" in p.stdout
    assert "; shrunk to 2:" in p.stdout.splitlines()[0]  # allocate, fork


def test_a_crash_that_ends_the_process_is_shrunk_like_any_violation():
    """Each replay in a process of its own: the segfault behind allocate, fork and an append
    into the shared block shrinks to exactly those three, 1-minimal, and says how."""
    p = kvcheck("verify", target("SegfaultsOnSharedAppend"), "--json")
    assert p.returncode == 1, p.stderr
    trace = json.loads(p.stdout)["violation"]
    assert [op["op"] for op in trace["ops"]] == ["allocate", "fork", "append_slot"]
    v = trace["violation"]
    assert v["kind"] == "crash" and v["name"] == "append_slot" and v["step"] == 3
    assert "killed by signal SIGSEGV" in v["witness"]
    assert trace["minimality"].startswith("1-minimal")
    assert "each replay ran in a process of its own" in trace["minimality"]


def test_hang_beyond_interruption_is_killed_and_reported():
    p = kvcheck("verify", target("HangsBeyondInterruption"), "--ops", "300", "--timeout", "0.5")
    assert p.returncode == 1, p.stderr
    assert "(hang): fork" in p.stdout and "could not be interrupted" in p.stdout


def test_exit_at_import_in_the_real_program(tmp_path):
    f = tmp_path / "vanishes.py"
    f.write_text("import os\nos._exit(0)\n")
    p = kvcheck("verify", f"{f}:Anything")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "os._exit(0)" in p.stderr


def test_a_chatty_target_cannot_corrupt_json():
    p = kvcheck("verify", target("Chatty"), "--ops", "300", "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout)["verdict"] == "pass"
    assert "{" * 100 in p.stderr and "}" * 100 in p.stderr


def test_other_commands_report_a_dead_target(tmp_path):
    trace = tmp_path / "t.json"
    assert main(["verify", target("ExitsInFork"), "--ops", "300", "--trace-out", str(trace)]) == 1
    p = kvcheck("replay", str(trace), "--target", target("SegfaultsInFork"), "--json")
    assert p.returncode == 1
    assert "SIGSEGV" in json.loads(p.stdout)["error"]


def test_supervisor_can_be_turned_off():
    env = {**os.environ, "KVCHECK_NO_SUPERVISOR": "1"}
    p = subprocess.run([sys.executable, "-m", "kvcheck", "verify", target("ExitsInFork"),
                        "--ops", "300"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1 and "called sys.exit(0)" in p.stdout
