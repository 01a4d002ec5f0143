"""SGLang's own HiCache (``sglang-hicache@VERSION``: HiRadixCache, its host pool and
HiCacheController under the tiers model): sglang PR #4989 (``evict_host`` evicting every
host-only node) caught on 0.4.4.post3, gone on 0.4.5; under the write_back policy
(``make_write_back``) #5499 (an eviction freeing less than it counts) caught on
0.4.5.post2, gone on 0.4.5.post3, and PR #27631's bug (a load's nested ``evict_host``
freeing the host pages it copies from) caught on 0.4.6 and 0.5.14, gone on 0.5.20 (0.5.15
protects the nodes being loaded) (the releases scripts/test.sh installs); the target's view
of the release's tree on small cases; the later releases' code paths, one release each
(``NEWER``), pass short runs under both policies; 0.5.10's write_back eviction leaves a
stale host leaf (0.5.9 .. 0.5.10's ``evictable_host_leaves``), a leaked host block that
0.5.20 does not leak on the same trace. With the storage tier on
(``sglang-hicache-storage``): sglang PR #13501 (a prefetch's unfilled host pages released
twice) caught on 0.5.5.post3, gone on 0.5.6; 0.5.6, 0.5.14, 0.5.16 and 0.5.18 pass short
runs (0.5.16 on: a prefetch's host pages allocated by the scheduler's drain); H2 (sglang PR
#30106) caught on 0.5.16 and 0.5.18 with the catalogue's command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty.sglang_hicache import make
from kvcheck.models.tiers.model import TierScope
from kvcheck.spec import tiers as T
from kvcheck.verify import replay_trace, verify

HIST = Path(__file__).resolve().parents[2] / "benchmarks" / "historical"
BUGGY, FIXED = "0.4.4.post3", "0.4.5"
WRITE_BACK = "kvcheck.impl.thirdparty.sglang_hicache:make_write_back"
# the storage tier present but off, its controller's threads (0.4.9.post3 .. 0.4.10.post2);
# copies issued on the controller's streams and acked by their events, RadixKey, the host
# pool aligned up a page, Req.pop_committed_kv_cache (0.5.2 .. 0.5.5.post3); CacheInitParams
# with the server's arguments, the params objects, rows given to requests, the allocator
# package, the events mixin, write backups published on their ack, the host pool's package,
# the runtime context, staged host frees, the L2 transfer engine, req.kv, the server's
# arguments in arg_groups/fields/ (0.5.6 .. 0.5.20);
# 0.5.10 in its own test
NEWER = ("0.4.10.post2", "0.5.5.post3", "0.5.20")
LEAF = "0.5.10"  # (evictable_host_leaves: a write_back eviction leaves a stale host leaf)
missing = [v for v in (BUGGY, FIXED, "0.4.5.post2", "0.4.5.post3", "0.4.6", *NEWER, LEAF)
           if not _loader.is_installed(install.select("sglang-hicache", v))]
needs = pytest.mark.skipif(bool(missing), reason=f"SGLang {', '.join(missing)} not installed "
                           f"(kvcheck install sglang==VERSION)")
SCOPE = TierScope(4, 1, 8)


def run(version, ops, seed=0):
    return verify(f"sglang-hicache@{version}", SCOPE.num_blocks, 1, ops, seed, model="tiers",
                  scope=SCOPE)


@needs
def test_4989_caught_on_the_buggy_release_and_gone_on_the_fixed_one():
    bug = run(BUGGY, 400)
    assert not bug.ok and bug.violation.name == T.EVICT_BOUND == "evict: at most n blocks"
    assert len(bug.trace.ops) <= 10 and bug.trace.ops[-1].kind == "evict"
    assert replay_trace(bug.trace, f"sglang-hicache@{FIXED}").violation is None
    fixed = run(FIXED, 300)
    assert fixed.ok, fixed.violation
    stats = fixed.state.stats
    assert stats["store"] and stats["load"] and stats["complete"] and stats["evict"], stats


@needs
@pytest.mark.parametrize("version", NEWER)
def test_later_releases_pass_under_both_policies(version):
    """No false alarm on the later releases, and every operation kind ran: stores, loads,
    their completions and host evictions (write_back: no store, its writes inside the
    evictions, the loads completed by the driver)."""
    through = run(version, 300)
    assert through.ok, through.violation
    stats = through.state.stats
    assert stats["store"] and stats["load"] and stats["complete"] and stats["evict"], stats
    back = verify(f"{WRITE_BACK}@{version}", SCOPE.num_blocks, 1, 300, 0, model="tiers",
                  scope=SCOPE)
    assert back.ok, back.violation
    stats = back.state.stats
    assert not stats.get("store") and stats["load"] and stats["complete"] and stats["evict"], stats


@needs
@pytest.mark.parametrize("version", (FIXED, NEWER[-1]))
def test_the_target_reads_the_release_tree(version):
    """One prompt stored and completed: its host copy is findable under the device's keys
    but not evictable while the device holds the node (an inclusive cache); a request that
    evicts the node from the device makes the host copy evictable; a load of the prompt
    copies it back, its device slots findable at once, the host slots pinned by the job."""
    t = make(4, 1, 8, version=version)
    t.allocate(0, [1, 2, 3])
    job = t.store(0)
    jobs = t.pending_jobs()
    assert jobs[job]["src"] == (T.DEVICE, [0, 1, 2]) and jobs[job]["dst"][0] == T.HOST
    assert t.cache_entries(T.HOST) == []  # a pending store's copies are not findable
    t.complete(job, True)
    assert sorted(k for k, _ in t.cache_entries(T.HOST)) == [(1,), (1, 2), (1, 2, 3)]
    assert t.evictable_blocks(T.HOST) == [] and t.eviction_units(T.HOST) == [[0, 1, 2]]
    t.free(0)
    t.allocate(1, [5, 6, 7, 8])  # needs the device: the tree's node goes to the host
    assert t.cache_entries(T.DEVICE) == [((5,), 3), ((5, 6), 0), ((5, 6, 7), 1),
                                          ((5, 6, 7, 8), 2)]
    assert sorted(t.evictable_blocks(T.HOST)) == [0, 1, 2]
    t.free(1)
    job = t.load(2, [1, 2, 3, 9])
    assert t.pending_jobs()[job]["src"] == (T.HOST, [0, 1, 2])
    assert [t.refcount(T.HOST, b) for b in (0, 1, 2)] == [2, 2, 2]  # the cache + the job
    t.complete(job, True)
    assert t.pending_jobs() == {} and t.evictable_blocks(T.HOST) == []
    assert t.evict(1) == 0  # nothing host-only left to evict


def test_the_host_pool_is_at_least_the_device_pool():
    with pytest.raises(MisuseError, match="host"):
        make(4, 1, 2, version=FIXED)
    with pytest.raises(MisuseError, match="block_size"):
        make(4, 2, 8, version=FIXED)


def _replays():
    sys.path.insert(0, str(HIST))
    try:
        import hist_replays
    finally:
        sys.path.remove(str(HIST))
    return hist_replays


@needs
def test_the_replays_on_the_release_tree():
    r = _replays()
    assert r.replay_sglang_4989(BUGGY)[0] is True
    assert r.replay_sglang_4989(FIXED)[0] is False
    assert r.replay_sglang_5499("0.4.5.post2")[0] is True
    assert r.replay_sglang_5499("0.4.5.post3")[0] is False
    assert r.replay_sglang_27631("0.4.6")[0] is True
    assert r.replay_sglang_27631(NEWER[-1])[0] is False  # (0.5.15 on: the loaded protected)


@needs
def test_5499_write_back_eviction_short_of_what_it_counts():
    """0.4.5.post2: evicting a node and its child under write_back frees the child only
    (the parent locked by the child's write_backup): the prefill's allocation fails where
    the admission counted room; 0.4.5.post3 passes the same run."""
    scope = TierScope(4, 1, 6)
    bug = verify(f"{WRITE_BACK}@0.4.5.post2", 4, 1, 300, 0, model="tiers", scope=scope)
    assert not bug.ok and bug.violation.kind == "crash" and bug.violation.name == "allocate"
    assert len(bug.trace.ops) <= 5  # (shrunk to host = device slots, which 0.4.5.post3's
    # host pool refuses: its own assert wants more host than device, so no replay there)
    fixed = verify(f"{WRITE_BACK}@0.4.5.post3", 4, 1, 150, 0, model="tiers", scope=scope)
    assert fixed.ok, fixed.violation


@needs
@pytest.mark.parametrize("version", ("0.4.6", "0.5.14"))
def test_27631_a_load_copies_from_host_pages_its_own_eviction_freed(version):
    """Caught through 0.5.14; 0.5.15's load_back protects the nodes it loads from host
    eviction (``protect_host``), so the latest release passes the same trace."""
    scope = TierScope(5, 1, 6)
    bug = verify(f"{WRITE_BACK}@{version}", 5, 1, 150, 4, model="tiers", scope=scope)
    assert not bug.ok
    assert bug.violation.name == "load: a hit gains the job's reference and nothing else"
    assert len(bug.trace.ops) <= 10 and bug.trace.ops[-1].kind == "load"
    assert replay_trace(bug.trace, f"{WRITE_BACK}@{NEWER[-1]}").violation is None


@needs
def test_host_leaf_left_stale_by_a_write_back_eviction():
    """0.5.9 .. 0.5.10 keep ``evictable_host_leaves`` incrementally. Under write_back,
    ``evict`` writes an unbacked leaf back and evicts it only after the loop; the loop
    meanwhile evicts the leaf's backed-up parent, whose host-leaf status is taken while
    the child is not yet evicted (a host leaf: evicted, no evicted child), and nothing
    updates it once the child is. ``evict_host`` then takes the parent first and drops the
    child with it: the child's host slot is neither free nor cached (a leak), which the
    next operation's contract sees. 0.5.20 (0.5.11 on: a host leaf has no backed-up child)
    passes the same trace; the write-through policy passes the same run."""
    bug = verify(f"{WRITE_BACK}@{LEAF}", SCOPE.num_blocks, 1, 300, 0, model="tiers",
                 scope=SCOPE)
    assert not bug.ok and bug.violation.name == "allocate: other blocks untouched"
    assert len(bug.trace.ops) <= 14
    assert replay_trace(bug.trace, f"{WRITE_BACK}@{NEWER[-1]}").violation is None
    through = run(LEAF, 300)
    assert through.ok, through.violation
    stats = through.state.stats
    assert stats["store"] and stats["load"] and stats["complete"] and stats["evict"], stats


# -- the storage tier on (make_storage: sglang-hicache-storage@VERSION) -----------------
STORAGE = ("0.5.5.post3", "0.5.6", "0.5.14")  # #13501's pair, a late release
LAZY = ("0.5.16", "0.5.18")  # host pages allocated by the drain, first and last driven
needs_lazy = pytest.mark.skipif(
    any(not _loader.is_installed(install.select("sglang-hicache", v)) for v in LAZY),
    reason=f"SGLang {', '.join(LAZY)} not installed (kvcheck install sglang==VERSION)")
needs_storage = pytest.mark.skipif(
    any(not _loader.is_installed(install.select("sglang-hicache", v)) for v in STORAGE),
    reason=f"SGLang {', '.join(STORAGE)} not installed (kvcheck install sglang==VERSION)")
STORAGE_SCOPE = TierScope(8, 1, 24)  # (prefetches in flight: at most 0.8 x (24 - 8) tokens)


def run_storage(version, ops, seed=0):
    return verify(f"sglang-hicache-storage@{version}", STORAGE_SCOPE.num_blocks, 1, ops, seed,
                  model="tiers", scope=STORAGE_SCOPE)


@needs_storage
def test_13501_unfilled_prefetch_pages_released_twice():
    """0.5.5.post3 queues a prefetch's unfilled host pages for release twice
    (``_page_transfer`` and ``prefetch_io_aux_func``): the drain frees them twice. Caught
    as RELEASED_ONCE on a 2-operation trace (a prefetch, completed with fewer pages than
    it allocated); 0.5.6 passes that trace, and the raw replay agrees on both."""
    bug = run_storage("0.5.5.post3", 300)
    assert not bug.ok and bug.violation.name == T.RELEASED_ONCE
    ops = bug.trace.ops
    assert [o.kind for o in ops] == ["prefetch", "complete"]
    assert ops[-1].filled is not None and ops[-1].filled < len(ops[0].tokens)
    assert replay_trace(bug.trace, "sglang-hicache-storage@0.5.6").violation is None
    r = _replays()
    assert r.replay_sglang_13501("0.5.5.post3")[0] is True
    assert r.replay_sglang_13501("0.5.6")[0] is False


@needs_storage
@pytest.mark.parametrize("version,seed", [("0.5.6", 0), ("0.5.6", 1), ("0.5.14", 2)])
def test_storage_fixed_releases_pass(version, seed):
    """No false alarm with the storage tier on: prefetches (some filled partly), stores
    whose acks queue backups to the storage tier (acked in the same step, so no host copy
    stays protected), loads and host evictions all ran."""
    res = run_storage(version, 250, seed)
    assert res.ok, res.violation
    stats = res.state.stats
    assert stats["prefetch"] and stats["store"] and stats["load"] and stats["evict"], stats


@needs_lazy
@pytest.mark.parametrize("version,seed", [("0.5.16", 0), ("0.5.16", 3), ("0.5.18", 1)])
def test_storage_drain_allocated_releases_pass(version, seed):
    """0.5.16 .. 0.5.18: ``prefetch`` runs the prefetch thread's storage hit query and the
    scheduler's drain (``_drain_and_alloc_storage_hit``: the host pages allocated for the
    hit); no false alarm where nothing is wrong, prefetches and their completions ran."""
    res = run_storage(version, 250, seed)
    assert res.ok, res.violation
    stats = res.state.stats
    assert stats["prefetch"] and stats["store"] and stats["load"] and stats["evict"], stats


@needs_lazy
@pytest.mark.parametrize("version", LAZY)
def test_storage_drain_allocates_the_prefetch_pages(version):
    """0.5.16 on: ``prefetch_from_storage`` queues an operation with no host pages; after
    ``prefetch`` (the hit query, the drain) the job holds the 3 pages the drain allocated,
    nothing is left on ``prefetch_hit_queue`` or ``prefetch_buffer``, and a completion with
    1 page filled keeps that page under its prefix and frees the other 2 once."""
    from kvcheck.impl.thirdparty.sglang_hicache import make_storage

    t = make_storage(8, 1, 24, version=version)
    free = len(t.free_blocks(T.HOST))
    job = t.prefetch(0, [4, 5, 6])
    pages = t.pending_jobs()[job]["dst"][1]
    op = t.jobs[job]["op"]
    assert [int(x) for x in op.host_indices.tolist()] == pages and len(pages) == 3
    assert t.ctl.prefetch_hit_queue.empty() and t.ctl.prefetch_buffer.empty()
    assert [t.refcount(T.HOST, b) for b in pages] == [1, 1, 1]
    assert len(t.free_blocks(T.HOST)) == free - 3
    t.complete(job, True, 1)
    assert t.pending_jobs() == {} and t.pins(T.HOST) == {}
    assert t.cache_entries(T.HOST) == [((4,), pages[0])]
    after = t.free_blocks(T.HOST)
    assert len(after) == len(set(after)) == free - 1


@needs_lazy
@pytest.mark.parametrize("version", LAZY)
def test_h2_caught_where_the_drain_allocates(version):
    """H2 (sglang PR #30106) with the catalogue's command (seed 1): the refill hung under a
    device-only node, the eviction's 'non-leaf' AssertionError, in the catalogue's 7
    operations."""
    from kvcheck.models.tiers.model import TierScope

    res = verify(f"sglang-hicache-storage@{version}", 12, 1, 3000, 1, model="tiers",
                 scope=TierScope(12, 1, 36))
    assert not res.ok and "non-leaf" in str(res.violation), res.violation
    assert [o.kind for o in res.trace.ops] == ["load", "store", "prefetch", "load", "complete",
                                               "free", "allocate"]


@needs_storage
def test_storage_target_reads_a_partial_prefetch_and_a_backup():
    """A prefetch of 3 pages is a job from the storage tier into 3 host pages the job alone
    holds, its last host node protected (a pin); completed with 1 page filled: that page is
    findable under its prefix, the other 2 free once (0.5.6), nothing pinned. A store's
    completion backs the node up to the storage tier and acks it in the same step: the
    host copy is evictable once the device drops it (no protection left)."""
    from kvcheck.impl.thirdparty.sglang_hicache import make_storage

    t = make_storage(8, 1, 24, version="0.5.6")
    free = len(t.free_blocks(T.HOST))
    job = t.prefetch(0, [4, 5, 6])
    jobs = t.pending_jobs()
    assert jobs[job]["kind"] == "prefetch" and jobs[job]["src"] == ("storage", [])
    pages = jobs[job]["dst"][1]
    assert len(pages) == 3 and [t.refcount(T.HOST, b) for b in pages] == [1, 1, 1]
    t.complete(job, True, 1)
    assert t.pending_jobs() == {} and t.pins(T.HOST) == {}
    assert t.cache_entries(T.HOST) == [((4,), pages[0])]
    after = t.free_blocks(T.HOST)
    assert len(after) == len(set(after)) == free - 1
    t.allocate(1, [1, 2])
    job = t.store(1)
    t.complete(job, True)
    assert t.ctl.backup_queue.empty() and t.tree.ongoing_backup == {} and t.pins(T.HOST) == {}
    assert len(t.ctl.storage_backend.pages) == 2  # (both pages backed up to the storage)
    t.free(1)
    t.allocate(2, [9] * 8)  # the device needs every slot: the stored node goes to the host
    stored = sorted(b for k, b in t.cache_entries(T.HOST) if k[0] == 1)
    assert len(stored) == 2 and sorted(t.evictable_blocks(T.HOST)) == sorted(
        stored + [pages[0]])  # (the prefetched page too: host-only, unprotected)


@pytest.mark.parametrize("version,why", [("0.5.2", "StorageBackendFactory"),
                                         ("0.5.20", "ack_prefetch_queue")])
def test_storage_refused_outside_its_range(version, why):
    if not _loader.is_installed(install.select("sglang-hicache", version)):
        pytest.skip(f"SGLang {version} not installed")
    from kvcheck.impl.thirdparty.sglang_hicache import make_storage

    with pytest.raises(MisuseError, match=why):
        make_storage(8, 1, 24, version=version)
