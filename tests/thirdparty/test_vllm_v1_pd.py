"""vLLM v1's disaggregated prefill, prefill side (``vllm-v1-pd@0.33.0``, the tiers model):
the NIXL connector's scheduler half with the release's own ``Scheduler`` delayed free over
its ``KVCacheManager``. 0.33.0 passes with sends, completions (read, or the lease expired)
and aborts in flight; the same engine freeing the blocks at ``request_finished`` (before
the send finishes) is caught at that free, and one that never frees them at its
completion."""

from __future__ import annotations

import collections

import pytest

from kvcheck.impl.thirdparty import vllm_v1_pd as pd
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.verify import verify

SCOPE = TierScope(8, 2, 1)  # 8 device blocks of 2 slots (no host pool: the peer is remote)


class Counting(pd.PDTarget):
    """The adapter, counting what the release decided."""

    seen: collections.Counter = collections.Counter()

    def free(self, seq):
        self.seen["ends with another send in flight"] += bool(self._jobs)
        job = super().free(seq)
        self.seen["sends" if job else "immediate frees"] += 1
        return job

    def complete(self, job, ok):
        self.seen["reads" if ok else "lease expiries"] += 1
        super().complete(job, ok)

    def allocate(self, seq, tokens):
        self.seen["admissions with a send in flight"] += bool(self._jobs)
        return super().allocate(seq, tokens)


def test_0_33_0_passes_with_sends_completions_and_aborts_in_flight():
    Counting.seen = collections.Counter()
    for seed in (0, 1):
        r = verify(lambda n, b, h: Counting(n, b, version="0.33.0"), SCOPE.num_blocks,
                   SCOPE.block_size, 300, seed, model="tiers", scope=SCOPE)
        assert r.ok, r.violation
        assert r.state.stats["complete"] > 10 and r.state.stats["oob"] > 10, r.state.stats
    seen = Counting.seen
    assert seen["sends"] > 30 and seen["immediate frees"] > 5, seen
    assert seen["reads"] > 10 and seen["lease expiries"] >= 1, seen
    assert seen["admissions with a send in flight"] > 20, seen
    assert seen["ends with another send in flight"] > 10, seen


def test_freeing_before_the_send_finishes_is_caught():
    r = verify("vllm-v1-pd-early-free@0.33.0", SCOPE.num_blocks, SCOPE.block_size, 300, 0,
               model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    assert r.violation.name == "free: a refcount drops by the entries the request held"
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) <= 4 and ops[-1].startswith("free("), ops


class NeverFreed(pd.PDTarget):
    """The worker's report dropped: a finished send's blocks are never freed."""

    def complete(self, job, ok):
        self._jobs.pop(job)


def test_never_freeing_after_the_send_is_caught():
    r = verify(lambda n, b, h: NeverFreed(n, b, version="0.33.0"), SCOPE.num_blocks,
               SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
    assert r.verdict == "fail", r.verdict
    ops = [MODEL.describe(op) for op in r.trace.ops]
    assert len(ops) <= 4 and ops[-1].startswith("complete("), (ops, r.violation)


def test_the_release_s_own_calls_delay_the_free_until_finished_sending():
    """A raw replay: the scheduler's ``_free_request`` keeps a finished prefill's blocks
    (the connector's ``delay_free_blocks``, the request named in ``reqs_to_send``) until
    ``_update_from_kv_xfer_finished`` sees ``finished_sending``; an abort frees at once; a
    second report for the same request is refused by the scheduler's own assertion."""
    t = pd.make(4, 2, version="0.33.0")
    t.allocate(0, [1, 2, 3])
    t.append(0, 4)
    table = t.table(0)[1]
    job = t.free(0)
    rid = t._jobs[job][1].request_id
    assert rid in t.shell.requests and t.pending_jobs()[job]["src"] == ("device", table)
    assert all(t.refcount("device", b) == 1 for b in table)
    assert set(table).isdisjoint(t.free_blocks("device"))
    t.allocate(1, [7])  # (an abort during prefill: no token generated, freed at once)
    assert t.free(1) is None and len(t.free_blocks("device")) == 2
    t.complete(job, True)
    assert rid not in t.shell.requests and sorted(t.free_blocks("device")) == [0, 1, 2, 3]
    again = t._outputs.KVConnectorOutput(finished_sending={rid})
    with pytest.raises(AssertionError):  # (scheduler.py: ``assert req_id in self.requests``)
        t.shell._update_from_kv_xfer_finished(again)
    assert sorted(t.free_blocks("device")) == [0, 1, 2, 3]
