"""Smoke test of the historical-bug benchmark (``benchmarks/historical/run.py``): the
catalogue's schema, its dry run, one cheap entry end to end (nano-vllm #144 on the pinned
nano-vllm-fork: installed by the session fixture, no download), and a bad catalogue."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIST = ROOT / "benchmarks" / "historical"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


runner = _module("kvcheck_historical_run", HIST / "run.py")
replays = _module("kvcheck_historical_replays", HIST / "hist_replays.py")


def _run(*args):
    return subprocess.run([sys.executable, str(HIST / "run.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_the_catalogue_is_well_formed_and_every_entry_names_a_real_generation():
    from kvcheck.impl.thirdparty import install

    entries = runner.load()
    assert len({e["id"] for e in entries}) == len(entries)
    for e in entries:
        if e["reach"] == "yes":
            assert e["generation"] in install.ENGINES
            assert install.ENGINES[e["generation"]].supports(e["buggy"])
            assert callable(getattr(replays, e["raw"]))
        else:
            assert e["lacks"]


def test_dry_run_prints_every_command():
    p = _run("--dry-run")
    assert p.returncode == 0, p.stderr
    assert "kvcheck verify kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded@0.4.2" in p.stdout
    assert "kvcheck verify kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded@0.4.3" in p.stdout
    assert p.stdout.splitlines()[-1].startswith("catalogue ok:")


def test_one_entry_end_to_end():
    p = _run("--only", "nano-vllm-144")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "caught on 20260210: 'allocate: a prompt fully in the cache leaves at least one " \
           "token to compute'" in out
    assert "raw replay on 20260210 (buggy): reproduced" in out
    assert "  the release's own code: yes (kvcheck re-enacts: the scheduler's caller" in out
    assert out.splitlines()[-1] == ("caught 1/1 on buggy releases, 1 of them on the release's "
                                    "own code, 0 false alarms on fixed releases")


def test_a_bad_catalogue_is_one_line(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"entries": [{"id": "x", "engine": "vllm", "generation": "vllm-v0",
                                            "issue": "-", "title": "-", "buggy": "0.4.2",
                                            "fixed": "0.4.3", "reach": "yes",
                                            "runs_release_code": "yes"}]}))
    try:
        runner.load(bad)
    except runner.CatalogueError as exc:
        assert "in reach but no 'command'" in str(exc)
    else:
        raise AssertionError("a bad catalogue was accepted")
    p = _run("--only", "no-such-entry")
    assert p.returncode == 2 and "no entry 'no-such-entry'" in p.stderr


def test_the_42571_replay_separates_the_releases_around_the_free_blocks_rewrite():
    """#42571's raw replay (the eager SimpleCPUOffload connector's calls on ``BlockPool``:
    one block touched for two positions of one request, released in one ``free_blocks``)
    queues the block twice on the catalogue's buggy 0.20.2 and on 0.23.0, the last release
    before free_blocks' rewrite, and once on 0.24.0, the catalogue's fixed release."""
    from kvcheck.impl.thirdparty import install

    for version in ("0.20.2", "0.23.0", "0.24.0"):
        install.ensure(install.ENGINES["vllm-v1"], version)
    for version in ("0.20.2", "0.23.0"):
        buggy, detail = replays.replay_vllm_42571(version)
        assert buggy, (version, detail)
    fixed, detail = replays.replay_vllm_42571("0.24.0")
    assert not fixed, detail


def test_the_11168_replay_runs_the_engines_own_admission_and_allocation():
    """#11168's raw replay calls 0.8.5's own ``SelfAttnBlockSpaceManager.can_allocate``
    (OK: the need capped by the window) and ``allocate`` (NoFreeBlocksError, blocks kept)."""
    reproduced, detail = replays.replay_vllm_11168("0.8.5")
    assert reproduced, detail
    assert "can_allocate -> OK, allocate raised NoFreeBlocksError; 0 of 3 blocks free" in detail


def test_the_waiting_target_separates_0_8_5_from_0_9_2():
    """vLLM PR #18957: ``make_prefix_waiting`` counts cached tokens in the scheduler's order
    and keeps a refused group waiting; the stale count is caught on 0.8.5 (a shrunk trace
    ending in the retried allocation), not on 0.9.2, whose scheduler drops the record."""
    from kvcheck.impl.thirdparty import install, vllm_v0
    from kvcheck.verify import verify

    install.ensure(install.ENGINES["vllm-v0"], "0.9.2")
    allow = ("append_slot: the sole holder of a partial block writes in place",
             "append_slot: a new block was free")
    kw = dict(model="prefix", allow=frozenset(allow))
    assert not vllm_v0.make_prefix_waiting(4, 2, version="0.8.5").forgets_when_refused
    assert vllm_v0.make_prefix_waiting(4, 2, version="0.9.2").forgets_when_refused
    bad = verify("kvcheck.impl.thirdparty.vllm_v0:make_prefix_waiting@0.8.5", 8, 2, 3000, 0, **kw)
    assert not bad.ok and bad.violation.name == (
        "allocate: every block the cached tokens skip holds the requested prefix")
    last = bad.trace.ops[-1]
    assert last.kind == "allocate" and any(
        o.kind == "allocate" and o.seq == last.seq and o.outcome == "refused"
        for o in bad.trace.ops[:-1])
    good = verify("kvcheck.impl.thirdparty.vllm_v0:make_prefix_waiting@0.9.2", 8, 2, 3000, 0, **kw)
    assert good.ok, good.violation


def test_the_18957_replay_on_the_engines_block_manager():
    for version, expected in (("0.8.5", True), ("0.9.2", False)):
        reproduced, detail = replays.replay_vllm_18957(version)
        assert reproduced is expected, (version, detail)



def test_the_30106_replay_loses_the_refill_only_when_it_hangs_under_an_unbacked_node():
    """H2 / sglang PR #30106's raw replay (the release's HiRadixCache with the storage tier
    on): a prefetch completed after another request cached a device-only node on its path
    loses a host page at the eviction on 0.5.6 and stops at the 'non-leaf' assertion on
    0.5.13 and 0.5.16 (its host pages allocated by the scheduler's drain,
    _drain_and_alloc_storage_hit) and 0.5.18; the same requests with the prefetch completed
    first (the node then has a host copy) lose nothing on any."""
    from kvcheck.impl.thirdparty import install

    for version, symptom in (("0.5.6", "lost (free nowhere, in no node): [1]"),
                             ("0.5.13", "AssertionError: non-leaf"),
                             ("0.5.16", "AssertionError: non-leaf"),
                             ("0.5.18", "AssertionError: non-leaf")):
        install.ensure(install.ENGINES["sglang"], version)
        reproduced, detail = replays.replay_sglang_30106(version)
        assert reproduced and symptom in detail, (version, detail)
        assert "node [5] without a host copy" in detail, detail
        control, detail = replays.prefetch_refill(version, cached_first=False)
        assert not control and "lost (free nowhere, in no node): []" in detail, (version,
                                                                                 detail)


SGLANG_REPLAYS = """
import sys
sys.path.insert(0, sys.argv[1])
import hist_replays
from kvcheck.impl.thirdparty import install
for v in ("0.4.8", "0.5.13", "0.5.14", "0.5.21", "0.5.22"):
    install.ensure(install.ENGINES["sglang"], v)
print(*(hist_replays.replay_sglang_34399(v)[0] for v in ("0.4.8", "0.5.21", "0.5.22")))
print(*(hist_replays.replay_sglang_27779(v)[0] for v in ("0.5.13", "0.5.14")))
"""


def test_the_sglang_replays_separate_their_releases():
    """#34399's replay (the release's paged allocator, its kernel launches recorded): a
    launch on the exhausted pool on 0.4.8 and 0.5.21, none on 0.5.22's GPU path. #27779's
    (the release's SWA allocator): a SWA page freed twice on 0.5.13, once on 0.5.14. In a
    process of its own: before 0.5.22 the kernels run under Triton's interpreter, which
    needs triton imported with TRITON_INTERPRET=1 (not by an earlier test)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        import pytest

        pytest.skip("torch or triton missing")
    p = subprocess.run([sys.executable, "-c", SGLANG_REPLAYS, str(HIST)], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["True", "True", "False", "True", "False"], p.stdout


def test_the_1556_entry_end_to_end_with_a_documented_finding_on_the_fixed_release():
    """vLLM #1556: caught on 0.3.3 (the fork's stale-entry count, 2 operations); 0.4.0
    passes 0.3.3's counterexample and fails only with F10's documented clauses, which is
    reported beside it, never counted as a false alarm."""
    from kvcheck.impl.thirdparty import _loader, install

    for v in ("0.3.3", "0.4.0"):
        if not _loader.is_installed(install.select("vllm-v0-legacy", v)):
            import pytest

            pytest.skip(f"vLLM {v} not installed")
    p = _run("--only", "vllm-1556", "--no-raw")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert ("caught on 0.3.3: \"fork: refcount +1 per entry of the child's table, -1 per "
            "entry it had\"") in out and "trace of 2 operations" in out
    assert "no alarm on 0.4.0: the buggy release's counterexample passes there" in out
    assert "documented finding F10 reported" in out
    assert out.splitlines()[-1] == ("caught 1/1 on buggy releases, 1 of them on the release's "
                                    "own code, 0 false alarms on fixed releases")


def test_documented_findings_never_excuse_another_clause():
    known = {"F10": ["append_slot: a new block was free", "append_slot: never raises"]}
    f10 = {"rc": 1, "violation": "append_slot: never raises"}
    other = {"rc": 1, "violation": "free_seq: refcount -1 per entry of the freed table"}
    assert runner._documented(known, [f10, {"rc": 0}]) == "F10"
    assert runner._documented(known, [f10, other]) is None
    assert runner._documented(known, [other]) is None
    assert runner._documented(known, [{"rc": 0}]) is None


def test_fixed_findings_may_not_list_the_expected_clause(tmp_path):
    entry = {"id": "x", "engine": "vllm", "generation": "vllm-v0-legacy", "issue": "-",
             "title": "-", "buggy": "0.3.3", "fixed": "0.4.0", "reach": "yes",
             "runs_release_code": "yes", "command": ["verify", "vllm-v0-legacy@{version}"], "expected": "fork: a",
             "raw": "replay_vllm_1556", "fixed_findings": {"F10": ["fork: a"]}}
    bad = tmp_path / "c.json"
    for want in ("fork: a", ["free_seq: b", "fork: a"]):
        entry["expected"] = want
        bad.write_text(json.dumps({"entries": [entry]}))
        try:
            runner.load(bad)
        except runner.CatalogueError as exc:
            assert "fixed_findings lists the expected clause" in str(exc)
        else:
            raise AssertionError("a fixed finding naming the expected clause was accepted")
    entry["expected"], entry["fixed_findings"] = [], {}
    bad.write_text(json.dumps({"entries": [entry]}))
    try:
        runner.load(bad)
    except runner.CatalogueError as exc:
        assert "expected must be a clause or a list of clauses" in str(exc)
    else:
        raise AssertionError("an empty expected list was accepted")


def _refused(tmp_path, entry: dict) -> str:
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"entries": [entry]}))
    try:
        runner.load(bad)
    except runner.CatalogueError as exc:
        return str(exc)
    raise AssertionError(f"accepted: {entry}")


def test_every_entry_says_whether_the_buggy_path_is_the_releases_own(tmp_path):
    """``runs_release_code`` on every entry (yes, partly, no); anything but yes names what
    kvcheck re-enacts; an expected clause is a rule, never an operation's bare name."""
    entries = runner.load()
    assert {e["runs_release_code"] for e in entries} <= {"yes", "partly", "no"}
    assert all(e.get("re_enacted") for e in entries if e["runs_release_code"] != "yes")
    assert not [c for e in entries if e["reach"] == "yes" for c in runner.expected(e)
                if c in runner.OPERATIONS]
    entry = {"id": "x", "engine": "vllm", "generation": "vllm-v0", "issue": "-", "title": "-",
             "buggy": "0.4.2", "fixed": "0.4.3", "reach": "yes", "raw": "replay_vllm_4761",
             "command": ["verify", "vllm-v0@{version}"], "expected": "allocate"}
    assert "no 'runs_release_code'" in _refused(tmp_path, entry)
    entry["runs_release_code"] = "mostly"
    assert "runs_release_code must be yes, partly or no" in _refused(tmp_path, entry)
    entry["runs_release_code"] = "partly"
    assert "no 're_enacted'" in _refused(tmp_path, entry)
    entry["re_enacted"] = "the guard"
    assert "'allocate' is an operation, not the rule broken (a crash: 'allocate: never " \
           "raises')" in _refused(tmp_path, entry)
    assert runner.clause({"kind": "crash", "name": "allocate"}) == "allocate: never raises"
    assert runner.clause({"kind": "contract", "name": "allocate: x"}) == "allocate: x"


@pytest.mark.parametrize("entry, buggy, fixed", [
    ("vllm-11186", ("0.6.4.post1",), ("0.6.5", "0.7.0")),
    ("vllm-11565", ("0.6.5", "0.6.6.post1"), ("0.7.0",)),
    ("vllm-10730", ("0.6.4.post1",), ("0.6.5",)),
    ("vllm-19459", ("0.9.0",), ("0.9.1", "0.9.2")),
])
def test_the_early_v1_replays_separate_buggy_from_fixed(entry, buggy, fixed):
    """The raw replays of v1's first releases (the release's own ``KVCacheManager``, with
    its defaults: preallocation on where it has it) reproduce on every buggy release they
    name and on none of the fixed ones."""
    from kvcheck.impl.thirdparty import install

    fn = replays.REPLAYS[entry]
    for version in buggy + fixed:
        install.ensure(install.ENGINES["vllm-v1-early"], version)
        reproduced, detail = fn(version)
        assert reproduced == (version in buggy), (entry, version, detail)



@pytest.mark.parametrize("entry, buggy, fixed", [
    ("vllm-49118", ("0.26.0",), ("0.25.1", "0.27.0")),
    ("vllm-34576", ("0.11.1", "0.16.0"), ("0.17.0",)),
])
def test_the_native_offload_replays_separate_buggy_from_fixed(entry, buggy, fixed):
    """The raw replays of the native OffloadingConnector's bugs (the release's own
    ``OffloadingConnectorScheduler`` over its KVCacheManager; its ARC manager over its
    CPUBackend) reproduce on every buggy release they name and on none of the others:
    0.25.1's store scan never reaches an aborted request (#49118 is 0.26.0's), and the
    ARC manager's first release, 0.11.1, already has #34576's touch."""
    from kvcheck.impl.thirdparty import install

    fn = replays.REPLAYS[entry]
    for version in buggy + fixed:
        install.ensure(install.ENGINES["vllm-v1"], version)
        reproduced, detail = fn(version)
        assert reproduced == (version in buggy), (entry, version, detail)

def test_the_early_v1_entries_end_to_end():
    """kvcheck on v1's first releases: PR #11565 under the prefix model (vllm-v1@VERSION ->
    vllm_v1_early), PR #11186 (0.6.4.post1's full-hit branch) and #19459 (0.9.0's crash on
    resuming a preempted request with speculative decoding) through the release's own
    scheduler (verify-engine: the crash is the engine step's); each fixed release passes,
    0.6.5 the 11186 counterexample beside its own #11565."""
    p = _run("--only", "vllm-11186", "vllm-11565", "vllm-19459", "--no-raw")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for line in ("caught on 0.6.4.post1: 'key_after_write'",
                 "caught on 0.6.5: 'allocate: exception_safety: refcount unchanged'",
                 "caught on 0.9.0: 'step: never raises'",
                 "no alarm on 0.6.5: the buggy release's counterexample passes there",
                 "documented finding vllm-11565 reported", "no alarm on 0.7.0",
                 "no alarm on 0.9.1"):
        assert line in out, out
    assert out.splitlines()[-1] == ("caught 3/3 on buggy releases, 3 of them on the release's "
                                    "own code, 0 false alarms on fixed releases")


def test_a_run_cut_by_the_wall_clock_is_inconclusive_never_a_miss_or_an_alarm():
    # time never decides a verdict: --timeout only guards against a hang
    p = _run("--only", "nano-vllm-144", "--no-raw", "--timeout", "0.01")
    assert p.returncode == 4, p.stdout + p.stderr
    out = p.stdout
    assert "INCONCLUSIVE on 20260210: did not finish in 0 s (--timeout)" in out, out
    assert "MISSED" not in out and "FALSE ALARM" not in out, out
    assert out.splitlines()[-1].startswith("caught 0/1 on buggy releases, 0 of them on the "
                                           "release's own code, 0 false alarms on fixed "
                                           "releases, "), out
    assert out.splitlines()[-1].endswith(" inconclusive (a release whose run did not finish: "
                                         "not counted either way)"), out
