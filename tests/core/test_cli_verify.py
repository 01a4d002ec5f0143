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
    # a pool no trace can record is refused up front, not found unrecordable (or "hung")
    (["verify", "--blocks", "100000000"], "at most 1048576 blocks"),
    (["verify-prefix", "--blocks", "1048577"], "at most 1048576 blocks"),
    (["verify-tiers", "--host-blocks", "0"], "positive integer"),
    (["verify-tiers", "nosuch"], "unknown tiers target 'nosuch'"),
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


@pytest.mark.parametrize("effort", ["0", "-2", "lots"])
def test_prove_bad_effort_exit_2_one_line(effort):
    p = subprocess.run([*KVCHECK, "prove", "reference", "--effort", effort],
                       capture_output=True, text=True, timeout=120, cwd=HERE)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--effort" in lines[0] and "positive number" in lines[0], p.stderr
    assert p.stdout == ""


def test_the_pool_limit_is_the_trace_schema_s():

    from kvcheck.check.trace import MAX_BLOCKS, schema

    assert schema()["properties"]["scope"]["properties"]["num_blocks"]["maximum"] == MAX_BLOCKS


# -- Ctrl-C (issue 32, item 3) -------------------------------------------------------------------
def _interrupt(argv, stderr, ready: bytes, read_from: int):
    """Run kvcheck in its own process group (as a terminal's foreground job), send the group
    SIGINT (what Ctrl-C does) once ``ready`` has appeared twice on stderr (the file descriptor
    ``stderr``, closed here once the child has it; read back from ``read_from``); (exit code,
    stdout, what stderr got)."""
    import os
    import signal
    import threading
    import time

    p = subprocess.Popen([*KVCHECK, *argv], stdout=subprocess.PIPE, stderr=stderr,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(stderr)
    got: list[bytes] = []

    def pump():
        while True:
            try:
                data = os.read(read_from, 65536)
            except OSError:  # the other side closed
                return
            if not data:
                return
            got.append(data)

    reader = threading.Thread(target=pump)
    reader.start()
    deadline = time.monotonic() + 120
    while b"".join(got).count(ready) < 2 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    reader.join(timeout=30)
    return p.returncode, out.decode(), b"".join(got).decode(errors="replace")


def test_ctrl_c_keeps_the_progress_line_and_says_how_far_the_run_got():
    import os
    import re

    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    try:
        code, out, term = _interrupt(["verify", "--ops", "100000000", "--seed", "7"], slave,
                                     b" operations", master)
    finally:
        os.close(master)
    assert code == 130 and out == "" and "Traceback" not in term, term[-2000:]
    *before, last = term.rstrip("\r\n").split("\n")
    said = re.fullmatch(r"kvcheck: interrupted after ([\d,]+) of 100,000,000 operations "
                        r"\(seed 7\): no violation so far, no verdict\r?", last)
    assert said, term[-600:]
    assert int(said.group(1).replace(",", "")) > 0
    # the progress line is ended by a newline, not wiped: its last drawing stays on the screen
    shown = before[-1].rstrip("\r").split("\r")[-1] if before else ""
    assert re.fullmatch(r"verify \[[#.]+\] \d+/100000000 operations", shown), term[-600:]


def test_ctrl_c_off_a_terminal_and_with_json_says_how_far_too(tmp_path):
    import os

    noisy = tmp_path / "noisy.py"  # says on stderr when the run has started (target output)
    noisy.write_text("import sys\nfrom kvcheck.impl.block_manager import BlockManager\n\n"
                     "class Noisy(BlockManager):\n"
                     "    def __init__(self, *a):\n"
                     "        super().__init__(*a)\n"
                     "        print('started', file=sys.stderr, flush=True)\n"
                     "        print('started', file=sys.stderr, flush=True)\n")
    for extra in ([], ["--json"]):
        r, w = os.pipe()
        try:
            code, out, err = _interrupt(["verify", f"{noisy}:Noisy", "--ops", "100000000",
                                         *extra], w, b"started", r)
        finally:
            os.close(r)
        assert code == 130 and out == "" and "Traceback" not in err, err
        assert err.splitlines()[-1].startswith("kvcheck: interrupted after "), err
        assert err.splitlines()[-1].endswith(" of 100,000,000 operations (seed 0): no violation "
                                             "so far, no verdict"), err


def test_interrupted_while_shrinking_says_a_violation_was_found():
    from kvcheck.cli.commands.common import Progress

    bar = Progress(1000, "verify", "operations", show=False)
    bar(512)
    assert bar.interrupted(3) == ("after 512 of 1,000 operations (seed 3): no violation so far, "
                                  "no verdict")
    bar.shrinking(57, 12)
    said = bar.interrupted(3)
    assert said.startswith("while shrinking (seed 3): a violation was found")
    assert "down to 12 operations after 57 attempts" in said


def test_the_readme_s_first_example_is_what_verify_prints():
    """README.md opens with ``kvcheck verify tests/corpus/buggy.py:NoCopyOnWrite`` and its
    output: exactly what it prints (the checkout's path written /path/to/kvcheck)."""
    root = HERE.parents[1]
    readme = (root / "README.md").read_text()
    command = "$ kvcheck verify tests/corpus/buggy.py:NoCopyOnWrite\n"
    shown = readme.split("```\n" + command, 1)[1].split("```", 1)[0]
    p = subprocess.run([*KVCHECK, "verify", "tests/corpus/buggy.py:NoCopyOnWrite"],
                       capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode == 1, p.stderr
    assert p.stdout.replace(f"{root}/", "/path/to/kvcheck/") == shown


def _operations(*argv) -> dict:
    p = subprocess.run([*KVCHECK, *argv, "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)["operations"]


def test_json_and_the_pass_line_count_every_operation(capsys):
    assert main(["verify", "reference-engine", "--ops", "2000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS reference-engine") and out[1].startswith("  operations: ")
    ops = _operations("verify", "reference-engine", "--ops", "2000")
    assert set(ops) == {"allocate", "append_slot", "append_slots", "fork", "free_seq",
                        "rollback", "rebase", "preempt"}
    assert sum(n for by in ops.values() for n in by.values()) == 2000
    assert ops["allocate"]["oob"] > 0 and f"allocate {sum(ops['allocate'].values()):,} (" \
        f"{ops['allocate']['oob']:,} out of blocks)" in out[1]


def test_mix_weights_every_operation_the_target_offers():
    plain = _operations("verify", "reference-engine", "--ops", "2000")
    # weights of 1 are the driver's own mix: the very same stream
    assert _operations("verify", "reference-engine", "--ops", "2000", "--mix",
                       "rollback=1,preempt=1,rebase=1,append_slots=1") == plain
    mixed = _operations("verify", "reference-engine", "--ops", "2000", "--mix",
                        "rollback=0,preempt=0,rebase=4")
    assert "rollback" not in mixed and "preempt" not in mixed
    assert sum(mixed["rebase"].values()) > 2 * sum(plain["rebase"].values())
    prefix = _operations("verify-prefix", "prefix-engine", "--ops", "1500", "--mix", "rebase=0")
    assert "rebase" not in prefix and "rollback" in prefix
