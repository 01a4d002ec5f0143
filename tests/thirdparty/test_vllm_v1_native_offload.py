"""vLLM v1's native ``OffloadingConnector`` (scheduler side) with its CPU offloading manager
over the release's own ``KVCacheManager`` (``vllm-v1-native-offload@0.33.0``, the tiers
model): 0.33.0 passes with stores, loads (sync and async), flushes, final stores and CPU
evictions exercised; the same engine with its flushes ignored is caught
(``unheld_sources_kept``, #46951's family, on 0.33.0 and 0.21.0); each earlier layout
(0.32.0, 0.27.0, 0.25.1, 0.24.0, 0.23.0, 0.22.0, 0.21.0) passes a short run, 0.26.0 dies
aborting a queued request (#49118), 0.20.2's layout (jobs keyed by request) is refused
in words."""

from __future__ import annotations

import collections

import pytest

from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v1_native_offload as native
from kvcheck.models.tiers.model import MODEL, TierOp, TierScope
from kvcheck.verify import verify

SCOPE = TierScope(8, 1, 4)  # 8 device + 4 host blocks of 1 slot


def _ensure(version: str) -> str:
    """A release outside scripts/test.sh's first line (0.34.0, the newest: the script
    installs it; installed here if not)."""
    install.ensure(install.ENGINES["vllm-v1"], version)
    return version


class Counting(native.NativeOffloadTarget):
    """The adapter, counting what the release's connector did in each step's metadata."""

    seen: collections.Counter = collections.Counter()

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        prepare = self.cpu.prepare_store

        def counted(keys, ctx):  # (the CPU manager's own prepare_store, its outcome counted)
            got = prepare(keys, ctx)
            self.seen["evictions"] += len(got.evicted_keys) if got is not None else 0
            self.seen["refused stores"] += got is None
            return got

        self.cpu.prepare_store = counted

    def _end_step(self, out):
        meta = super()._end_step(out)
        self.seen["flushes"] += len(meta.jobs_to_flush or ())
        sync = [getattr(j, "sync", False) for j in meta.load_jobs.values()]  # (0.33.0's)
        self.seen["sync loads"] += sum(sync)
        self.seen["async loads"] += len(sync) - sum(sync)
        return meta


class NoFlush(native.NativeOffloadTarget):
    """A worker that ignores the connector's flushes: a store still reading a block the
    engine re-allocated stays unflushed."""

    def _end_step(self, out):
        meta = super()._end_step(out)
        self._flushed.clear()  # (the worker never waited: nothing is ever flushed)
        return meta


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_0_33_0_and_0_34_0_pass_with_stores_loads_flushes_and_evictions(version):
    """0.34.0 (the newest release) reads ``num_hash_lookahead_tokens`` (0: no drafting),
    ``Request.resumable`` (False) and ``skip_reading_external_kv``, and makes its events'
    payload a ``msgspec.Struct`` (events off); the same counts happen as on 0.33.0."""
    Counting.seen = collections.Counter()
    _ensure(version)
    r = verify(lambda n, b, h: Counting(n, b, h, version=version), SCOPE.num_blocks,
               SCOPE.block_size, 400, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] > 30 and st["load"] > 5 and st["complete"] > 30, st
    assert st["free"] > 20 and st["oob"] > 10, st
    seen = Counting.seen
    assert seen["flushes"] > 5 and seen["sync loads"] and seen["async loads"], seen
    assert seen["evictions"] > 20 and seen["refused stores"] > 5, seen


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_arc_policy_passes(version):
    r = verify(f"vllm-v1-native-offload-arc@{_ensure(version)}", SCOPE.num_blocks,
               SCOPE.block_size, 300, 1, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    assert r.state.stats["store"] > 20 and r.state.stats["load"] > 3, r.state.stats


@pytest.mark.parametrize(("version", "seed"), [("0.33.0", 0), ("0.34.0", 0), ("0.21.0", 3)])
def test_ignoring_a_flush_is_caught(version, seed):
    """Without the worker's flush, a finished request's final store still reads a block
    another request was given: ``unheld_sources_kept``, shrunk to a handful of steps.
    (0.21.0 fences a block when a step names it: its scan reads every named request.)"""
    _ensure(version)
    r = verify(lambda n, b, h: NoFlush(n, b, h, version=version), SCOPE.num_blocks,
               SCOPE.block_size, 300, seed, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert (r.violation.kind, r.violation.name) == ("invariant", "unheld_sources_kept")
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) <= 6 and any(o.startswith("free(") for o in ops), ops


def test_final_store_whole_hit_async_load_and_no_gpu_reference():
    """The release's calls, one step each: a request ends unstored (its final store scan
    starts a job that holds no GPU reference); once stored, the same prompt is a whole hit,
    loaded asynchronously into blocks for every token, and runs once the load lands."""
    t = native.make(4, 1, 4, version="0.33.0")
    t.allocate(0, [5, 6])
    table = t.table(0)[1]
    job = t.free(0)
    pending = t.pending_jobs()[job]
    assert pending["kind"] == "store" and pending["src"] == ("device", table), pending
    assert pending["holds_src"] is False and pending["flushed"] is False, pending
    assert all(t.refcount("device", b) == 0 for b in table)
    assert sorted(t.free_blocks("device")) == [0, 1, 2, 3]
    t.complete(job, True)
    assert len(t.cache_entries("host")) == 2 and not t.pending_jobs()
    load = t.load(1, [5, 6])
    pending = t.pending_jobs()[load]
    assert pending["kind"] == "load" and len(pending["src"][1]) == 2, pending
    assert t.connector._req_status["1.1"].req.status.name == "WAITING_FOR_REMOTE_KVS"
    assert len(t.table(1)[1]) == 2 and all(t.refcount("host", c) == 2
                                           for c in pending["src"][1])
    assert not t.admits(TierOp("store", seq=1))  # (a waiting request is not scheduled)
    t.complete(load, True)
    assert t.requests[1].status.name == "RUNNING"
    assert all(t.refcount("host", c) == 1 for c in pending["src"][1])
    t.append(1, 7)
    store = t.store(1)  # (the chunks it loaded are already cached: only the new one)
    assert store is not None and len(t.pending_jobs()[store]["src"][1]) == 1
    assert t.refcount("device", t.pending_jobs()[store]["src"][1][0]) == 1  # the request's


@pytest.mark.parametrize("version", ["0.32.0", "0.27.0", "0.25.1", "0.24.0", "0.23.0",
                                     "0.22.0", "0.21.0"])
def test_earlier_releases_pass_with_stores_and_async_loads(version):
    """Each layout before 0.33.0, its own scheduler and CPU manager, every hit an
    asynchronous load: 0.30.0 .. 0.32.0 (``ChunkStatus`` records), 0.27.0 .. 0.29.0
    (``BlockStatus`` records, the policy factory), 0.25.x (no ``kv_offload/config.py``:
    ``OffloadingSpec(vllm_config, kv_cache_config)``), 0.23.0 / 0.24.0 (``transfer_spec``
    pairs), 0.21.0 / 0.22.x (no ``on_new_request``, no store threshold, a scan of every
    named request). (0.22.1's connector, CPU manager and KV-cache manager files are
    0.22.0's.)"""
    t = native.make(8, 1, 4, version=version)
    assert t.version == version and not t._sync_loads
    assert t.legacy == (version < "0.26.0")
    r = verify(f"vllm-v1-native-offload@{version}", SCOPE.num_blocks, SCOPE.block_size,
               300, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] > 20 and st["load"] > 5 and st["complete"] > 15, st


def test_0_26_0_dies_aborting_a_queued_request():
    """vLLM #49118 on 0.26.0: a request whose admission found no room waits, unscheduled;
    aborted there, the next step's store scan (finished requests are scanned to their
    last token from 0.26.0) meets keys without blocks and trips the release's own
    ``assert len(offload_keys) == len(offload_block_ids)``: a crash, shrunk to that one
    operation. 0.27.0 (PRs #49146 / #49285: an aborted request's scan stops at its
    computed tokens) refuses the same admission cleanly."""
    r = verify("vllm-v1-native-offload@0.26.0", SCOPE.num_blocks, SCOPE.block_size, 300, 0,
               model="tiers", scope=SCOPE)
    assert r.verdict == "fail" and r.violation.kind == "crash", r.violation
    assert "AssertionError" in r.violation.witness, r.violation.witness
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) == 1 and ops[0].startswith("allocate("), ops
    fixed = native.make(1, 1, 1, version="0.27.0")
    with pytest.raises(native.OutOfBlocks):
        fixed.allocate(0, [0, 1])
    assert fixed.free_blocks("device") == [0] and not fixed.connector._req_status


def test_arc_policy_passes_on_0_24_0():
    r = verify("vllm-v1-native-offload-arc@0.24.0", SCOPE.num_blocks, SCOPE.block_size,
               300, 1, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    assert r.state.stats["store"] > 20 and r.state.stats["load"] > 3, r.state.stats


def test_a_release_without_the_connector_is_refused_in_words():
    """0.10.2 ships no OffloadingConnector: the target says so instead of failing an
    import."""
    with pytest.raises(MisuseError, match="this release has neither"):
        native.make(8, 1, 4, version="0.10.2")


class EarlyFree(native.RequestKeyedTarget):
    """A scheduler that frees a finished request's blocks at once, as if
    ``request_finished`` had answered False: its store then holds nothing."""

    def free(self, seq):
        finished = self.connector.request_finished  # (the release's, its answer ignored)
        self.connector.request_finished = lambda req, ids=None: (
            finished(req, ids)[0] and False, None)
        try:
            return super().free(seq)
        finally:
            self.connector.request_finished = finished


@pytest.mark.parametrize(("version", "policy"), [
    ("0.20.2", "lru"), ("0.20.2", "arc"), ("0.17.0", "arc"), ("0.11.0", "lru")])
def test_keyed_by_request_passes_with_final_stores_and_async_loads(version, policy):
    """0.11.0 .. 0.20.2's connector keyed by request (0.19.x / 0.20.x the ``offloading/``
    package, 0.11.0 .. 0.18.1 one file over the LRU / ARC manager and CPU backend): every
    store is the one a request's end starts (a delayed free keeps its blocks), completed
    by ``finished_sending``; loads by ``finished_recving``. (0.18.1 and 0.19.1 pass the same
    at the defaults; left out here to keep the suite's downloads few.)"""
    seen = collections.Counter()

    class Counted(native.RequestKeyedTarget):
        def free(self, seq):
            job = super().free(seq)
            seen["final stores"] += job is not None
            return job

    r = verify(lambda n, b, h: Counted(n, b, h, version=version, policy=policy),
               SCOPE.num_blocks, SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    st = r.state.stats
    assert "store" not in st and st["load"] > 5 and st["complete"] > 15, st
    assert seen["final stores"] > 5, seen


def test_0_20_2_freeing_at_request_finished_is_caught():
    """Without the scheduler's delayed free, a finished request's pending store reads a
    block another request is given: ``unheld_sources_kept``."""
    r = verify(lambda n, b, h: EarlyFree(n, b, h, version="0.20.2"), SCOPE.num_blocks,
               SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert (r.violation.kind, r.violation.name) == ("invariant", "unheld_sources_kept")
    assert len(r.trace.ops) <= 6, r.trace.ops


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0", "0.20.2"])
def test_an_abort_mid_load_keeps_the_blocks_until_the_load_reports(version):
    """The #49889 scenario: a request waiting for its asynchronous load is aborted. The
    scheduler frees its blocks only once the load reports (``delay_free_blocks``): a pin
    until then, free after; the connector neither crashes nor starts a store."""
    t = native.make(4, 1, 4, version=_ensure(version))
    t.allocate(0, [5, 6])
    t.complete(t.free(0), True)
    load = t.load(1, [5, 6])
    table = t.table(1)[1]
    assert t.admits(TierOp("free", seq=1))
    assert t.free(1) is None
    assert list(t.pins("device").values()) == [table], t.pins("device")
    assert all(t.refcount("device", b) == 1 for b in table)
    assert set(table).isdisjoint(t.free_blocks("device"))
    t.complete(load, True)
    assert not t.pins("device") and not t.pending_jobs()
    assert sorted(t.free_blocks("device")) == [0, 1, 2, 3]
    assert not t.connector._req_status and len(t.cache_entries("host")) == 2


def test_arc_0_16_0_dies_touching_a_block_it_is_storing():
    """vLLM PR #34576 on 0.11.1 .. 0.16.0: ``ARCOffloadingManager.touch`` pops a block
    from T1 and, the block being one the store scan just prepared (not ready), moves the
    popped key to T1's end: KeyError, the first store of every request. Shrunk to a
    request and its end; 0.17.0 keeps the block in T1 (the test above passes it)."""
    r = verify("vllm-v1-native-offload-arc@0.16.0", SCOPE.num_blocks, SCOPE.block_size, 300,
               0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail" and r.violation.kind == "crash", r.violation
    assert "KeyError" in r.violation.witness, r.violation.witness
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) == 2 and ops[1].startswith("free("), ops


def test_0_34_0_a_failed_store_publishes_nothing_and_frees_its_chunks():
    """0.34.0's worker reports a failed job (``failed_jobs``): the scheduler calls the CPU
    manager's ``complete_store(success=False)``, which drops the chunks. The adapter offers
    store failures there only (``failures``); the same prompt then misses, its chunks free.
    Driven with failures drawn (the default mix), the release passes with failed stores,
    successful ones and load hits."""
    assert native.make(8, 1, 4, version="0.33.0").failures == frozenset()
    t = native.make(4, 1, 4, version=_ensure("0.34.0"))
    assert t.failures == frozenset({"store"})
    t.allocate(0, [5, 6])
    job = t.free(0)
    assert t.pending_jobs()[job]["kind"] == "store"
    t.complete(job, False)
    assert not t.cache_entries("host") and sorted(t.free_blocks("host")) == [0, 1, 2, 3]
    assert t.load(1, [5, 6]) is None  # (a miss: nothing was published)
    t.complete(t.free(1), True)
    assert len(t.cache_entries("host")) == 2
    seen = collections.Counter()

    class Counted(native.NativeOffloadTarget):
        def complete(self, job, ok):
            seen[(self._jobs[job][2], ok)] += 1
            super().complete(job, ok)

    r = verify(lambda n, b, h: Counted(n, b, h, version="0.34.0"), SCOPE.num_blocks,
               SCOPE.block_size, 400, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    assert seen[("store", False)] > 5 and seen[("store", True)] > 20, seen
    assert seen[("load", True)] > 5 and not seen[("load", False)], seen

    class FailureDropped(native.NativeOffloadTarget):
        def _report(self, event, ok=True):
            super()._report(event, True)  # (the worker's failure never reaches the connector)

    r = verify(lambda n, b, h: FailureDropped(n, b, h, version="0.34.0"), SCOPE.num_blocks,
               SCOPE.block_size, 400, 0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert r.violation.name == "complete: a failed store leaves its destinations free"
    assert [MODEL.describe(op) for op in r.trace.ops][-1].endswith("ok=False)"), r.trace.ops
