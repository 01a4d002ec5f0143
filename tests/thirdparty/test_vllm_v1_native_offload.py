"""vLLM v1's native ``OffloadingConnector`` (scheduler side) with its CPU offloading manager
over the release's own ``KVCacheManager`` (``vllm-v1-native-offload@0.33.0``, the tiers
model): 0.33.0 passes with stores, loads (sync and async), flushes, final stores and CPU
evictions exercised; the same engine with its flushes ignored is caught
(``unheld_sources_kept``, #46951's family, on 0.33.0 and 0.21.0); 0.24.0, 0.23.0, 0.22.0
and 0.21.0 (their own layout) pass a short run each, 0.20.2's layout (jobs keyed by
request) is refused in words."""

from __future__ import annotations

import collections

import pytest

from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import vllm_v1_native_offload as native
from kvcheck.models.tiers.model import MODEL, TierOp, TierScope
from kvcheck.verify import verify

SCOPE = TierScope(8, 1, 4)  # 8 device + 4 host blocks of 1 slot


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


def test_0_33_0_passes_with_stores_loads_flushes_and_evictions():
    Counting.seen = collections.Counter()
    r = verify(lambda n, b, h: Counting(n, b, h, version="0.33.0"), SCOPE.num_blocks,
               SCOPE.block_size, 400, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] > 30 and st["load"] > 5 and st["complete"] > 30, st
    assert st["free"] > 20 and st["oob"] > 10, st
    seen = Counting.seen
    assert seen["flushes"] > 5 and seen["sync loads"] and seen["async loads"], seen
    assert seen["evictions"] > 20 and seen["refused stores"] > 5, seen


def test_arc_policy_passes():
    r = verify("vllm-v1-native-offload-arc@0.33.0", SCOPE.num_blocks, SCOPE.block_size,
               300, 1, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    assert r.state.stats["store"] > 20 and r.state.stats["load"] > 3, r.state.stats


@pytest.mark.parametrize(("version", "seed"), [("0.33.0", 0), ("0.21.0", 3)])
def test_ignoring_a_flush_is_caught(version, seed):
    """Without the worker's flush, a finished request's final store still reads a block
    another request was given: ``unheld_sources_kept``, shrunk to a handful of steps.
    (0.21.0 fences a block when a step names it: its scan reads every named request.)"""
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


@pytest.mark.parametrize("version", ["0.24.0", "0.23.0", "0.22.0", "0.21.0"])
def test_earlier_releases_pass_with_stores_and_async_loads(version):
    """0.21.0 .. 0.24.0's own scheduler and CPU manager (``OffloadingSpec(vllm_config,
    kv_cache_config)``, ``BlockStatus`` records, every hit an asynchronous load; 0.21.0 /
    0.22.x: no ``on_new_request``, no store threshold, a scan of every named request).
    (0.22.1's connector, CPU manager and KV-cache manager files are 0.22.0's.)"""
    t = native.make(8, 1, 4, version=version)
    assert t.legacy and t.version == version
    r = verify(f"vllm-v1-native-offload@{version}", SCOPE.num_blocks, SCOPE.block_size,
               300, 0, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] > 20 and st["load"] > 5 and st["complete"] > 15, st


def test_arc_policy_passes_on_0_24_0():
    r = verify("vllm-v1-native-offload-arc@0.24.0", SCOPE.num_blocks, SCOPE.block_size,
               300, 1, model="tiers", scope=SCOPE)
    assert r.ok, r.violation
    assert r.state.stats["store"] > 20 and r.state.stats["load"] > 3, r.state.stats


def test_a_release_without_the_adapted_layout_is_refused_in_words():
    """0.20.2 ships the connector in another layout (``kv_offload/abstract.py``,
    ``spec.py``; jobs keyed by request): the target says so instead of failing an import."""
    with pytest.raises(MisuseError, match="this release has neither .its jobs keyed by request"):
        native.make(8, 1, 4, version="0.20.2")


def test_an_abort_mid_load_keeps_the_blocks_until_the_load_reports():
    """The #49889 scenario: a request waiting for its asynchronous load is aborted. The
    scheduler frees its blocks only once the load reports (``delay_free_blocks``): a pin
    until then, free after; the connector neither crashes nor starts a store."""
    t = native.make(4, 1, 4, version="0.33.0")
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
