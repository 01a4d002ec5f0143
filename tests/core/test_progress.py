"""Progress on a terminal: every long-running command draws it on stderr when (and only when)
stderr is a terminal, engine by engine for ``prove`` and for every shrinker; nothing extra when
stderr is not a terminal or with ``--json``. Run under a pseudo-terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pty = pytest.importorskip("pty")

TESTS = Path(__file__).resolve().parents[1]
KVCHECK = [sys.executable, "-c", "import sys; from kvcheck.cli import main; sys.exit(main())"]
PROVE = ["--blocks", "3", "--seqs", "2", "--depth", "4", "--no-crosshair", "--no-pairs"]  # pairs: 50 s a run

# argv, what the terminal must show
COMMANDS = [
    (["verify", f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", "--ops", "3000"],
     ["verify [", "operations", "verify: shrinking: ", " attempts, counterexample of "]),
    (["verify", "--ops", "3000"], ["verify [", "0/3000 operations"]),
    (["prove", *PROVE],
     ["z3 k-induction: ", "z3 k-induction (prefix cache)",
      "z3 bmc: depth ", " invariants closed by their induction", "z3 coverage: depth 1, ",
      "exploration: z3 witnesses", "exploration bfs: depth "]),
    (["prove", f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", *PROVE, "--target-only"],
     ["exploration bfs: depth ", "shrinking: ", " attempts, counterexample of "]),
    (["verify-prefix", f"{TESTS}/prefix/buggy_prefix.py:UnchainedKeys", "--ops", "3000"],
     ["verify-prefix [", "verify-prefix: shrinking: "]),
    (["verify-scheduler", f"{TESTS}/scheduler/buggy.py:PreemptCurrent"],
     ["verify-scheduler [", "workloads", "verify-scheduler: shrinking: ", " requests"]),
    (["verify-scheduler", "--workloads", "3"], ["verify-scheduler [", "/3 workloads"]),
    (["simulate", "--requests", "10"], ["simulate: watermark 1, 1 of 1 run(s)"]),
]
IDS = [" ".join(a[:1] + (["(fails)"] if any("buggy" in x for x in a) else [])) for a, _ in COMMANDS]


def on_terminal(argv) -> tuple[int, str, str]:
    """Run kvcheck with stderr on a pseudo-terminal; (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([*KVCHECK, *argv], stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL)
    os.close(slave)
    got: list[bytes] = []

    def pump():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed
                return
            if not data:
                return
            got.append(data)

    reader = threading.Thread(target=pump)
    reader.start()
    out, _ = p.communicate(timeout=600)
    reader.join(timeout=60)
    os.close(master)
    return p.returncode, out.decode(), b"".join(got).decode(errors="replace")


@pytest.mark.parametrize("argv,shows", COMMANDS, ids=IDS)
def test_progress_on_a_terminal(argv, shows):
    code, out, term = on_terminal(argv)
    assert code in (0, 1), term
    for text in shows:
        assert text in term, (text, term[-2000:])
    assert term.endswith("\r"), term[-200:]  # the line is cleared at the end
    assert "\r" not in out  # never on stdout


@pytest.mark.parametrize("argv,shows", COMMANDS, ids=IDS)
def test_nothing_extra_off_a_terminal(argv, shows):
    p = subprocess.run([*KVCHECK, *argv], capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1) and p.stderr == "", p.stderr


@pytest.mark.parametrize("argv,shows", COMMANDS, ids=IDS)
def test_nothing_extra_with_json(argv, shows):
    code, out, term = on_terminal([*argv, "--json"])
    assert code in (0, 1) and term == "", term
    __import__("json").loads(out)
