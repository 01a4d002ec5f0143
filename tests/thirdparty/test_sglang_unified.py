"""SGLang's UnifiedRadixCache with its HiCache host tier under the write_back policy
(``kvcheck.impl.thirdparty.sglang_unified:make_write_back@VERSION``, 0.5.12 .. 0.5.16):
0.5.12.post1's write-back eviction leaves its write in flight and the scheduler's next
``check_hicache_events`` unlocks a node it never locked (sglang #24869, fixed by PR #24585 in
0.5.13: the release's own assertion), caught in a few operations and gone on 0.5.13; 0.5.13's
load-back whose nested host eviction frees the host copy it loads (PR #27444, fixed in 0.5.14:
a TypeError in the release's commit) caught, gone on 0.5.14; the raw replays agree; the
target's view of the release's tree on a small case; what it refuses is one line, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty.sglang_unified import make_write_back
from kvcheck.models.tiers.model import TierScope
from kvcheck.verify import replay_trace, verify

HIST = Path(__file__).resolve().parents[2] / "benchmarks" / "historical"
BUGGY, FIXED = "0.5.12.post1", "0.5.13"
LOCKED = "0.5.14"  # (load_back host-locks the nodes it loads: PR #27444)
TARGET = "kvcheck.impl.thirdparty.sglang_unified:make_write_back"
missing = [v for v in (BUGGY, FIXED, LOCKED)
           if not _loader.is_installed(install.select("sglang-unified", v))]
needs = pytest.mark.skipif(bool(missing), reason=f"SGLang {', '.join(missing)} not installed "
                           f"(kvcheck install sglang==VERSION)")
SCOPE = TierScope(4, 1, 5)


def run(version, ops, seed=0):
    return verify(f"{TARGET}@{version}", SCOPE.num_blocks, 1, ops, seed, model="tiers",
                  scope=SCOPE)


@needs
def test_an_unwaited_write_back_is_caught_on_the_buggy_release_and_gone_on_the_fixed_one():
    bug = run(BUGGY, 40, seed=1)
    assert not bug.ok and bug.violation.kind == "crash", bug.violation
    assert bug.violation.name in ("allocate", "load")
    assert "writing_check -> dec_lock_ref -> release_component_lock" in bug.violation.witness
    assert len(bug.trace.ops) <= 6
    assert replay_trace(bug.trace, f"{TARGET}@{FIXED}").violation is None
    fixed = run(FIXED, 200)
    assert fixed.ok, fixed.violation
    stats = fixed.state.stats
    assert stats["load"] and stats["evict"] and not stats.get("store"), stats


@needs
def test_a_load_whose_eviction_frees_its_host_copy_is_caught_until_the_host_lock():
    """0.5.13: the load's device eviction writes a leaf back, the host is short, and
    ``evict_host`` takes the host-only node being loaded: the release's commit reads
    ``len(None)``. The shrunk trace passes on 0.5.14, which host-locks the loaded nodes."""
    bug = run(FIXED, 300)
    assert not bug.ok and bug.violation.kind == "crash" and bug.violation.name == "load"
    assert "load_back -> commit_hicache_transfer" in bug.violation.witness
    assert "TypeError" in bug.violation.witness and len(bug.trace.ops) <= 6
    assert replay_trace(bug.trace, f"{TARGET}@{LOCKED}").violation is None


@needs
def test_the_raw_replays_reproduce_on_the_buggy_releases_only():
    sys.path.insert(0, str(HIST))
    try:
        import hist_replays as r
    finally:
        sys.path.remove(str(HIST))
    got, evidence = r.replay_sglang_24585(BUGGY)
    assert got is True and "1 write(s) in flight" in evidence, evidence
    got, evidence = r.replay_sglang_24585(FIXED)
    assert got is False and "0 write(s) in flight" in evidence, evidence
    got, evidence = r.replay_sglang_27444(FIXED)
    assert got is True and "host_value is now None" in evidence, evidence
    got, evidence = r.replay_sglang_27444(LOCKED)
    assert got is False and "loaded 0 token(s)" in evidence, evidence


@needs
def test_a_write_back_eviction_demotes_to_the_host_with_its_keys():
    """0.5.13: a prefix cached on a full device is written back to the host when a new
    request needs its slots; a request for it loads it back from the host."""
    t = make_write_back(4, 1, 8, version=FIXED)
    t.allocate(0, [1, 2, 3])
    t.free(0)
    assert sorted(k for k, _b in t.cache_entries("device")) == [(1,), (1, 2), (1, 2, 3)]
    t.allocate(1, [7, 8, 9])
    host = dict(t.cache_entries("host"))
    assert sorted(host) == [(1,), (1, 2), (1, 2, 3)]
    assert sorted(t.evictable_blocks("host")) == sorted(host.values())
    assert not t.pending_jobs()
    t.free(1)
    job = t.load(2, [1, 2, 3, 4])
    pending = t.pending_jobs()
    assert pending[job]["kind"] == "load"
    assert pending[job]["src"] == ("host", [host[(1,)], host[(1, 2)], host[(1, 2, 3)]])
    t.complete(job)
    assert not t.pending_jobs() and len(t.table(2)[1]) == 4


@needs
def test_what_the_target_refuses(capsys):
    with pytest.raises(MisuseError, match="larger than the device pool"):
        make_write_back(4, 1, 4, version=FIXED)
    for version in ("0.5.11", "0.5.17"):
        assert kvcheck(["verify-tiers", f"{TARGET}@{version}", "--blocks", "4",
                        "--block-size", "1", "--host-blocks", "5", "--ops", "5"]) == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert f"sglang-unified loads sglang 0.5.12 .. 0.5.16, not {version}" in err
