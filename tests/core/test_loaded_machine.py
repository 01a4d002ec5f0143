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
    """``n`` CPU-bound processes (default: one per core and one more: with kvcheck and the
    suite's other lane, well over two runnable processes per core) for the duration of the
    block. (Every second under them slows the rest of the suite as much: keep it short.)"""
    n = n or (os.cpu_count() or 1) + 1
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
    """A fork that sleeps forever uses no CPU, but its own time runs: a hang, loaded or not.
    (Shrinking is cut short: each hanging replay waits out a timeout, 18 s beside the hogs.)"""
    target = f"{HERE / 'slow_targets.py'}:SleepsInFork"
    with hogs():
        r = kvcheck("verify", target, "--ops", "50", "--timeout", "1", "--json",
                    "--shrink-budget", "3")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["violation"]["violation"]["kind"] == "hang", r.stdout + r.stderr


# one of every kind of violation, the longest shrunk traces, and the crashes (shrunk with
# each replay in a process of its own); the whole corpus took a minute beside the hogs
LOADED_CORPUS = ("slots-oob-ignores-cow", "cyclic-reuses-stale-entry", "slots-cow-first-block-only",
                 "append-slot-into-shared-reservation", "rollback-slots-stay-writable",
                 "eager-rebase-reuses-shared-tail", "cyclic-frees-stale", "slots-copy-unreported",
                 "slots-length-first", "bad-return", "window-counts-reserved-as-tokens")


def _corpus_traces() -> dict[str, str]:
    from kvcheck.verify import verify

    from corpus.buggy import CORPUS

    return {name: verify(CORPUS[name][0]).trace.dumps() for name in LOADED_CORPUS}


def test_the_corpus_shrinks_to_the_same_traces_beside_a_cpu_hog():
    """Corpus entries of every kind through ``verify`` at its defaults, idle and then beside
    the hogs: byte for byte the same traces (shrinking's budget is counted in replayed
    operations, not seconds)."""
    from corpus.buggy import CORPUS

    kinds = {CORPUS[name][1] for name in LOADED_CORPUS}
    assert kinds == {kind for _, kind, _ in CORPUS.values()}, kinds
    idle = _corpus_traces()
    with hogs():
        loaded = _corpus_traces()
    assert idle.keys() == loaded.keys()
    different = [name for name in idle if idle[name] != loaded[name]]
    assert not different, different


def test_a_shrink_cut_by_its_budget_is_the_same_beside_a_cpu_hog():
    """A bug behind hidden state (it needs 300 appends first) shrinks until its budget runs
    out: the budget is replayed operations, so the cut falls at the same place, loaded or
    not (a budget in seconds cut it at a different length each time)."""
    from kvcheck.check.shrink import Budget
    from kvcheck.verify import verify

    def trace() -> str:
        r = verify(f"{HERE / 'slow_targets.py'}:CrashesLate", shrink_budget=Budget(steps=10_000))
        assert "shrinking stopped at its budget of 10,000 replayed operations" in \
            r.trace.minimality
        return r.trace.dumps()

    idle = trace()
    with hogs():
        assert trace() == idle


def _tiers_traces(tmp: Path, tag: str) -> dict[str, bytes]:
    """A few buggy tiered stores through ``verify-tiers`` (stores, completions chosen by the
    driver, evictions; one whose swapped K/V is wrong, caught by reading every block back),
    each trace as written."""
    corpus = HERE.parent / "corpus"
    out = {}
    for name in ("FreesPinnedBlock", "PublishesAtStoreStart",
                 "SwapInReversed"):  # (the last: K/V read back, the data level)
        path = tmp / f"{tag}-{name}.json"
        module = corpus / ("tiers_data.py" if name == "SwapInReversed" else "tiers.py")
        r = kvcheck("verify-tiers", f"{module}:{name}", "--trace-out", str(path))
        assert r.returncode == 1, r.stdout + r.stderr
        out[name] = path.read_bytes()
    return out


def test_the_tiers_model_gives_the_same_traces_beside_a_cpu_hog(tmp_path):
    """The tiers model's driver chooses which pending job completes next: that choice, and
    shrinking, depend on the seed alone, loaded or not."""
    idle = _tiers_traces(tmp_path, "idle")
    with hogs():
        loaded = _tiers_traces(tmp_path, "loaded")
    assert [n for n in idle if idle[n] != loaded[n]] == []
