"""SGLang's scheduling policy as an engine core (``sglang-engine``, issue 34 §1): the release's
own ``Req``, ``SchedulePolicy``, ``PrefillAdder``, ``RadixCache``, paged allocator and
allocation / release functions, driven step by step by the engine model. The pinned 0.5.23
and 0.5.22 pass; a planted bug that frees a running request's page is caught; what the
adapter does not drive is refused in one line. With SGLang's own optimistic admission
(``schedule_conservativeness`` 0.05, ``make_optimistic``) decode outgrows the pool: the
release's ``check_decode_mem`` fails and its ``retract_decode`` runs, the run passes, and a
planted retraction that keeps the retracted request's pages is caught on two requests."""

from __future__ import annotations

import copy

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import sglang_engine as se
from kvcheck.impl.thirdparty.sglang_engine import SglangEngineTarget
from kvcheck.models.engine.model import EngineOp, EngineScope
from kvcheck.verify import replay_ops, verify


def _run(factory, seed=0, blocks=8, block_size=4, budget=16, requests=15):
    scope = EngineScope(blocks, block_size, budget=budget)
    return verify(factory, blocks, block_size, 2000, seed, model="engine", scope=scope,
                  do_shrink=True, extra={"requests": requests})


def test_the_pinned_release_passes_with_cache_hits_and_chunks():
    for seed, budget in ((0, 16), (1, 4)):
        r = _run("sglang-engine", seed=seed, budget=budget)
        assert r.verdict == "pass", (seed, r.violation)
        st = r.state.stats
        assert st["finished"] + st["aborted"] == st["requests"] == 15, st
        assert st["hits"] > 0 and st["kv_calls"] > 0, st


def test_0_5_22_passes():
    r = _run("sglang-engine@0.5.22", seed=2, blocks=5)
    assert r.verdict == "pass", r.violation


class EarlyFree(SglangEngineTarget):
    """A planted bug: after each step the allocator is handed back the last page of the
    first running request that holds one, while its req_to_token row still names it."""

    def step(self, gen):
        r = super().step(gen)
        for req in self._live():
            pages = self._pages(req)
            if pages:
                page = pages[-1] + 1
                bs = self.block_size
                self.alloc.free(self.torch.arange(page * bs, page * bs + bs))
                break
        return r


def _early_free(nb, bs, budget=16, max_seqs=8, policy="fcfs", caching=True, spec=0,
                max_model_len=0):
    return EarlyFree(nb, bs, budget, max_seqs, policy, caching, spec, max_model_len)


def test_a_page_freed_while_running_is_caught_with_a_short_trace():
    r = _run(_early_free, seed=0)
    assert r.verdict == "fail" and r.violation.kind == "invariant", r.violation
    assert r.ops <= 4, r.ops  # an add and a step or two


def test_what_the_adapter_does_not_drive_is_refused_in_one_line(capsys):
    for argv, word in ((["--spec-tokens", "2"], "speculative"),
                       (["--no-prefix-caching"], "ChunkCache")):
        assert kvcheck(["verify-engine", "sglang-engine", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0] and "Traceback" not in err[0], err
    assert kvcheck(["verify-engine", "sglang-engine@0.5.21"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0.5.21" in err[0], err


def test_the_pinned_install_and_the_release_objects():
    t = se.make(4, 2)
    assert t.version == "0.5.23"
    assert type(t.policy).__name__ == "SchedulePolicy"
    assert type(t.tree).__name__ == "RadixCache"
    assert t.ns["PrefillAdder"].add_one_req.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_policy.py")
    assert t.ns["Req"].__init__.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_batch.py")


def _counted(made, version=None):
    def factory(*a, **k):
        if version:
            k["version"] = version
        made.append(se.make_optimistic(*a, **k))
        return made[-1]
    return factory


@pytest.mark.parametrize("version", [None, "0.5.22"])
def test_optimistic_admission_retracts_and_passes(version):
    made = []
    r = verify(_counted(made, version), 8, 4, 2000, 1, model="engine",
               scope=EngineScope(8, 4, budget=16), do_shrink=False, extra={"requests": 30})
    assert r.verdict == "pass", r.violation
    st, target = r.state.stats, made[-1]
    assert target.version == (version or "0.5.23")
    assert target.stats["retract_steps"] >= 1 and target.stats["retractions"] >= 1, target.stats
    # each retracted request left the running set unfinished: the oracle saw it preempted
    assert st["preemptions"] == target.stats["retractions"], (st, target.stats)
    assert st["finished"] + st["aborted"] == st["requests"] == 30, st


class KeepsRetractedPages(SglangEngineTarget):
    """A planted bug in the retraction path: the batch's ``release_req`` (what
    ``retract_decode`` calls per retracted request) unlocks the prefix, frees the request's
    ``ReqToTokenPool`` row and resets the request, but never hands its KV pages back
    (``release_kv_cache``'s ``free_kv_row`` skipped): they stay out of the allocator and the
    tree, held by no one."""

    def __init__(self, *a, **k):
        super().__init__(*a, schedule_conservativeness=se.OPTIMISTIC, **k)

        def release_req(batch, idx, remaing_req_count, offload_kv=True):
            req = batch.reqs[idx]
            batch.tree_cache.unlock(req.lock)
            req.lock = None
            batch.req_to_token_pool.free(req)
            req.kv.mark_kv_released()
            req.reset_for_retract()
            return True

        self.Batch = type("ScheduleBatch", (self.Batch,), {"release_req": release_req})
        self.running_batch = self.Batch([], self)


# two requests on 4 pages of 4: 0 is admitted with its whole max_new reserved, 1 the next
# step against 0's remaining tokens x the optimistic ratio; both decode until the pool is
# full, and check_decode_mem fails at engine step 7 (the oracle's sweep drains the run)
TWO = [EngineOp("add", seq=0, tokens=[2, 3, 4, 5], max_new=6, priority=0),
       EngineOp("add", seq=1, tokens=[3], max_new=6, priority=0)]
SMALL = {"num_blocks": 4, "block_size": 4, "budget": 16}


def test_a_retraction_that_keeps_the_pages_is_caught_on_two_requests():
    made = []
    good = replay_ops("engine", _counted(made), SMALL, copy.deepcopy(TWO))
    assert good.violation is None, good.violation
    t = made[-1]
    assert t.stats["retractions"] == 1, t.stats
    # the retracted request re-entered the waiting queue after both arrivals: its entry
    # time (what priority scheduling sorts equal priorities by) is stamped anew
    (back,) = [r for r in t.requests.values() if r.retraction_count]
    assert back.time_stats.wait_queue_entry_time > max(
        r.time_stats.wait_queue_entry_time for r in t.requests.values() if r is not back)
    bad = replay_ops("engine", KeepsRetractedPages, SMALL, copy.deepcopy(TWO))
    v = bad.violation
    assert v is not None and v.kind == "invariant" and v.name == "free_list", v
    assert "engine step 7" in v.witness, v.witness
    for one in TWO:  # 1-minimal: one request alone is never retracted
        assert replay_ops("engine", KeepsRetractedPages, SMALL, [copy.deepcopy(one)]) \
            .violation is None


def test_a_negative_conservativeness_is_refused():
    with pytest.raises(MisuseError, match="non-negative"):
        SglangEngineTarget(4, 4, schedule_conservativeness=-1.0)


def test_the_optimistic_target_is_registered_with_its_versions():
    """``sglang-engine-optimistic[@VERSION]`` by name: the retracting setting, release by
    release (as a campaign or a CI line would name it)."""
    for version in ("", "@0.5.22"):
        r = _run(f"sglang-engine-optimistic{version}", seed=1, requests=30)
        assert r.verdict == "pass", r.violation
        assert r.state.stats["preemptions"] >= 1, r.state.stats
