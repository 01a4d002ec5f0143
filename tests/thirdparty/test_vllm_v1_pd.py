"""vLLM v1's disaggregated prefill, prefill side (``vllm-v1-pd@0.33.0``, the tiers model):
the NIXL connector's scheduler half with the release's own ``Scheduler`` delayed free over
its ``KVCacheManager``. 0.33.0 passes with sends, completions (read, or the lease expired)
and aborts in flight; the same engine freeing the blocks at ``request_finished`` (before
the send finishes) is caught at that free, and one that never frees them at its
completion."""

from __future__ import annotations

import collections

import pytest

from kvcheck.impl.errors import StandInGap
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v1_pd as pd
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.verify import verify

SCOPE = TierScope(8, 2, 1)  # 8 device blocks of 2 slots (no host pool: the peer is remote)


def _ensure(version: str) -> str:
    """0.34.0, the newest release (scripts/test.sh installs it; installed here if not)."""
    install.ensure(install.ENGINES["vllm-v1"], version)
    return version


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


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_0_33_0_and_0_34_0_pass_with_sends_completions_and_aborts_in_flight(version):
    Counting.seen = collections.Counter()
    _ensure(version)
    for seed in (0, 1):
        r = verify(lambda n, b, h: Counting(n, b, version=version), SCOPE.num_blocks,
                   SCOPE.block_size, 300, seed, model="tiers", scope=SCOPE)
        assert r.ok, r.violation
        assert r.state.stats["complete"] > 10 and r.state.stats["oob"] > 10, r.state.stats
    seen = Counting.seen
    assert seen["sends"] > 30 and seen["immediate frees"] > 5, seen
    assert seen["reads"] > 10 and seen["lease expiries"] >= 1, seen
    assert seen["admissions with a send in flight"] > 20, seen
    assert seen["ends with another send in flight"] > 10, seen


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_freeing_before_the_send_finishes_is_caught(version):
    r = verify(f"vllm-v1-pd-early-free@{_ensure(version)}", SCOPE.num_blocks,
               SCOPE.block_size, 300, 0, model="tiers", scope=SCOPE)
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


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_release_s_own_calls_delay_the_free_until_finished_sending(version):
    """A raw replay: the scheduler's ``_free_request`` keeps a finished prefill's blocks
    (the connector's ``delay_free_blocks``, the request named in ``reqs_to_send``) until
    ``_update_from_kv_xfer_finished`` sees ``finished_sending``; an abort frees at once; a
    second report for the same request is refused by the scheduler's own assertion.
    0.34.0's ``_free_request`` also drops a parked load's reservation
    (``_unreserve_parked``, the release's own method: none here)."""
    t = pd.make(4, 2, version=_ensure(version))
    assert hasattr(t.shell, "_unreserve_parked") == (version >= "0.34.0")
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


def test_0_34_0_without_the_release_s_unreserve_parked_is_a_stand_in_gap(monkeypatch):
    """Had the adapter not loaded 0.34.0's ``Scheduler._unreserve_parked``, the release's
    ``_free_request`` would read it from the scheduler shell (a ``_loader.StandIn``): the
    run stops on kvcheck's gap, naming the method and the adapter, never a crash verdict
    on vLLM; the settings stand-in says the same of a setting it does not hold."""
    _ensure("0.34.0")
    monkeypatch.setattr(pd, "LATER_SCHEDULER_METHODS", ())
    with pytest.raises(StandInGap, match=r"_SchedulerShell\._unreserve_parked.*vllm_v1_pd"):
        verify("vllm-v1-pd@0.34.0", SCOPE.num_blocks, SCOPE.block_size, 300, 0,
               model="tiers", scope=SCOPE)
    with pytest.raises(StandInGap, match=r"vllm_config\.cache_config\.sliding_window"):
        pd._settings(2).cache_config.sliding_window  # noqa: B018 - the read is the test
