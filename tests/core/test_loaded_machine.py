"""The same command gives the same verdict on an idle and on a loaded machine (issue 32).

Each test runs kvcheck beside CPU-bound processes (``hogs``: more runnable processes than
cores, so kvcheck waits for a core much of the time) and checks that the load changes
nothing: no hang blamed on a slow target, the same trace, the same proof verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent


@contextmanager
def hogs(n: int | None = None):
    """``n`` CPU-bound processes (default: two per core) for the duration of the block."""
    n = n or 2 * (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def kvcheck(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "kvcheck", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_a_slow_call_on_a_loaded_machine_is_not_a_hang():
    """Each allocation computes for 1.2 s of CPU under a 2 s timeout. Beside the hogs one
    takes well over 2 s of wall clock (the process waits for a core), but only 1.2 s of its
    own time: PASS, no hang (the wall clock used to call it one)."""
    target = f"{HERE / 'slow_targets.py'}:SlowAllocate"
    with hogs():
        r = kvcheck("verify", target, "--ops", "4", "--blocks", "8", "--timeout", "2",
                    "--json", env={"KVCHECK_TEST_BURN": "1.2"})
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["verdict"] == "pass", r.stdout + r.stderr
    assert out["ops"] == 4


def test_a_real_hang_is_still_a_hang_on_a_loaded_machine():
    """A fork that sleeps forever uses no CPU, but its own time runs: a hang, loaded or not."""
    target = f"{HERE / 'slow_targets.py'}:SleepsInFork"
    with hogs():
        r = kvcheck("verify", target, "--ops", "50", "--timeout", "1", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["violation"]["violation"]["kind"] == "hang", r.stdout + r.stderr

