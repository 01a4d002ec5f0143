"""``benchmarks/state_machine.py`` runs (a smoke test: two entries), and refuses bad
arguments with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/state_machine.py", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_two_entries_fail_both_ways_with_the_same_trace():
    r = _run("--entries", "no-copy-on-write", "rebase-leaks", "--examples", "50")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["entry", "verify", "s"]
    for line in lines[1:3]:
        assert line.split()[-3:] == ["True", "True", "True"], line
    assert lines[3].startswith("total: 2 entries; verify found 2") and \
        "the machine failed on 2" in lines[3] and "2 the same trace as verify" in lines[3]


def test_bad_arguments():
    for args in (("--entries", "no-such-bug"), ("--examples", "0")):
        r = _run(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("benchmarks/state_machine.py: error: ")
