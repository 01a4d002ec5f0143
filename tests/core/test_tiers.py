"""The tiers model (issue 33): device and host pools, holders that are not sequences,
transfers that complete later, checked by the one checker against ``kvcheck.spec.tiers``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.check.model import Options
from kvcheck.check.run import drive
from kvcheck.models.tiers.model import MODEL, TierExploreScope, TierScope
from kvcheck.verify import verify

from corpus.tiers import CORPUS, LEGAL

TIERS = Path(__file__).resolve().parents[1] / "corpus" / "tiers.py"
SCOPE = TierScope(8, 2, 4)
SEED = {"load-past-first-miss": 1, "swap-in-floor-admission": 1}  # (the seed that reaches it)


def kvcheck(*args):
    return subprocess.run([sys.executable, "-m", "kvcheck", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_reference_passes(seed):
    r = verify("reference-tiers", 12, 2, 3000, seed, model="tiers", scope=TierScope(12, 2, 6))
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] and st["load"] and st["complete"] and st["evict"] and st["swap_out"]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_tier_bug_is_caught_with_a_minimal_trace(name):
    cls, kind, bound = CORPUS[name]
    r = verify(cls, SCOPE.num_blocks, SCOPE.block_size, 3000, SEED.get(name, 0), model="tiers",
               scope=SCOPE)
    assert r.verdict == "fail", name
    assert r.violation.kind == kind, r.violation
    assert r.trace.minimality.startswith("1-minimal"), r.trace.minimality
    assert len(r.trace.ops) <= 3 * bound, [MODEL.describe(op) for op in r.trace.ops]
    assert r.trace.violation.step == len(r.trace.ops)


@pytest.mark.parametrize("name", sorted(LEGAL))
def test_legal_variants_pass(name):
    for seed, scope in ((0, SCOPE), (1, TierScope(12, 2, 6)), (2, TierScope(6, 1, 3))):
        r = verify(LEGAL[name], scope.num_blocks, scope.block_size, 2000, seed, model="tiers",
                   scope=scope)
        assert r.ok, (name, seed, r.violation)


def test_the_driver_chooses_the_completion_order_and_failures():
    """Completions interleave with everything else: a job completes while one started
    before it is still pending, some completions fail, and requests end with jobs in flight."""
    from kvcheck.targets.loading import _import_attr
    from kvcheck.targets.registry import TIERS_TARGETS

    factory = _import_attr(TIERS_TARGETS["reference-tiers"][0])
    run = drive(MODEL, factory, SCOPE, Options(), 0, 2000)
    assert run.violation is None
    started, out_of_order, failed, aborted = [], 0, 0, 0
    pending: set = set()
    for op in run.history:
        if op.kind in ("store", "load") and op.job is not None:
            started.append((op.seq, op.job))
            pending.add((op.seq, op.job))
        elif op.kind == "complete":
            name = (op.seq, op.job)
            out_of_order += any(started.index(p) < started.index(name) for p in pending)
            failed += not op.ok
            pending.discard(name)
        elif op.kind == "free":
            aborted += any(q == op.seq for q, _ in pending)
    assert out_of_order and failed and aborted, (out_of_order, failed, aborted)


def test_breadth_first_exploration_completes_jobs_in_every_order():
    """BFS over the model's moves (every pending job completed or failed) finds a bug that
    needs a completion (a failed store published) and nothing on the reference."""
    from kvcheck.check.explore import explore
    from kvcheck.targets.loading import _import_attr
    from kvcheck.targets.registry import TIERS_TARGETS

    scope = TierExploreScope(2, 2, 2, depth=4)
    found = explore(MODEL, CORPUS["failed-store-publishes"][0], scope, Options())
    assert found.violation is not None and found.ops[-1].kind == "complete", found.ops
    assert not found.ops[-1].ok
    clean = explore(MODEL, _import_attr(TIERS_TARGETS["reference-tiers"][0]),
                    TierExploreScope(4, 2, 2, depth=4), Options())
    assert clean.violation is None and clean.complete and clean.explored > 200, clean


def test_the_cli_trace_replay_and_report(tmp_path):
    trace = tmp_path / "t.json"
    r = kvcheck("verify-tiers", f"{TIERS}:FreesPinnedBlock", "--blocks", "8", "--trace-out",
                str(trace))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "free: a refcount drops by the entries the request held" in r.stdout
    assert "job 0.0" in r.stdout  # the pending store, named in the run
    data = json.loads(trace.read_text())
    assert data["model"] == "tiers" and 1 <= data["scope"]["host_blocks"] <= 4
    again = kvcheck("replay", str(trace))
    assert again.returncode == 1 and again.stdout.startswith("REPRODUCED"), again.stdout
    fixed = kvcheck("replay", str(trace), "--target", "reference-tiers")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    page = tmp_path / "t.html"
    assert kvcheck("report", str(trace), "-o", str(page)).returncode == 0
    assert "free" in page.read_text()
    ok = kvcheck("verify-tiers", "--ops", "500")
    assert ok.returncode == 0 and ok.stdout.startswith("PASS reference-tiers"), ok.stdout


def test_a_campaign_runs_the_tiers_model(tmp_path):
    out = tmp_path / "c"
    r = subprocess.run([sys.executable, "-m", "kvcheck", "campaign", f"{TIERS}:EvictsPastN",
                        "--model", "tiers", "--runs", "3", "--workers", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["signatures"] and s["signatures"][0]["clause"] == "evict: at most n blocks"


def test_a_prefetch_partial_fill_trace_replays_and_older_traces_still_load(tmp_path):
    """SGLang #13501's shape through the CLI: the trace's complete carries filled (the
    unfilled tail released twice), replays on the buggy store and passes on the reference
    with a storage tier; a complete without filled (every older trace) still loads."""
    from kvcheck.check.trace import Trace

    trace = tmp_path / "p.json"
    r = kvcheck("verify-tiers", f"{TIERS}:PrefetchReleasesTailTwice", "--blocks", "8",
                "--trace-out", str(trace))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "released once, by one owner" in r.stdout and "filled=" in r.stdout, r.stdout
    data = json.loads(trace.read_text())
    ops = data["ops"]
    assert [o["op"] for o in ops] == ["prefetch", "complete"], ops
    assert ops[1]["filled"] < len(data["states"][0]["jobs"]["0.0"]["dst"]), data
    again = kvcheck("replay", str(trace))
    assert again.returncode == 1 and again.stdout.startswith("REPRODUCED"), again.stdout
    fixed = kvcheck("replay", str(trace), "--target",
                   "kvcheck.impl.tiered_cache:PrefetchingTieredCache")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    store = tmp_path / "s.json"
    assert kvcheck("verify-tiers", f"{TIERS}:FailedStorePublishes", "--blocks", "8",
                   "--trace-out", str(store)).returncode == 1
    old = json.loads(store.read_text())
    assert all("filled" not in o for o in old["ops"]), old["ops"]
    assert Trace.load(store).ops[-1].filled is None
