"""SGLang's scheduler as an engine core (``sglang-engine``, issue 34 §1): the release's own
scheduler loop (``Scheduler`` methods, its batch result processor, ``ScheduleBatch``) with its
``Req``, ``SchedulePolicy``, ``PrefillAdder``, ``RadixCache``, paged allocator and
allocation / release functions, driven step by step by the engine model. The loop's code is
the release's file's (its code objects; a change planted in a scratch copy of scheduler.py
changes the run). The pinned 0.5.23 and 0.5.19 .. 0.5.22 pass (each through its own loop);
a planted bug that frees a running request's page is caught; what the adapter does not
drive is refused in one line. With SGLang's own optimistic admission
(``schedule_conservativeness`` 0.05, ``make_optimistic``) decode outgrows the pool: the
release's ``check_decode_mem`` fails and its ``retract_decode`` runs, the run passes, and a
planted retraction that keeps the retracted request's pages is caught on two requests.
SchedulePolicy's other policies (lpm, dfs-weight, lof, random) order the queue by the
release's own calc_priority, and pass."""

from __future__ import annotations

import copy
import functools

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


@pytest.mark.parametrize("version", ["0.5.22", "0.5.21", "0.5.20", "0.5.19"])
def test_the_earlier_releases_pass(version):
    """0.5.19 .. 0.5.21 through their own calls where the scheduler's changed (their
    maybe_cache_unfinished_req, alloc_for_decode, release_kv_cache(is_insert), to 0.5.20
    PrefillAdder's own budget): the same run as 0.5.22's, step for step."""
    made = []
    r = verify(_counted(made, version, se.make), 5, 4, 2000, 2, model="engine",
               scope=EngineScope(5, 4, budget=16), do_shrink=False, extra={"requests": 10})
    assert r.verdict == "pass", r.violation
    t = made[-1]
    assert t.version == version
    if version != "0.5.22":
        assert "checkpoint_kv_cache" not in t.ns, version  # maybe_cache_unfinished_req
    # the loop is this release's own: its scheduler.py, schedule_batch.py
    assert _release_file(t.scheduler.get_next_batch_to_run).endswith(
        f"sglang-{version}/sglang/srt/managers/scheduler.py")
    assert _release_file(t.ns["ScheduleBatch"].prepare_for_decode).endswith(
        f"sglang-{version}/sglang/srt/managers/schedule_batch.py")
    assert r.state.stats == _reference_stats(), (r.state.stats, _reference_stats())


@functools.cache
def _reference_stats():
    """0.5.22's counts of the run above."""
    return verify("sglang-engine@0.5.22", 5, 4, 2000, 2, model="engine",
                  scope=EngineScope(5, 4, budget=16), do_shrink=False,
                  extra={"requests": 10}).state.stats


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
    for target in ("sglang-engine@0.5.18", "sglang-engine-optimistic@0.5.18"):
        assert kvcheck(["verify-engine", target]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "0.5.18" in err[0] and "0.5.19 .. 0.5.23" in err[0], err


def _release_file(fn) -> str:
    return getattr(fn, "__func__", fn).__code__.co_filename


SCHEDULER_LOOP = ("get_next_batch_to_run", "get_new_batch_prefill", "_get_new_batch_prefill_raw",
                  "stash_chunked_request", "process_pending_chunked_abort",
                  "update_running_batch", "process_batch_result", "_add_request_to_queue",
                  "abort_request", "on_idle", "is_fully_idle", "get_num_allocatable_reqs",
                  "init_req_max_new_tokens")
BATCH_LOOP = ("init_new", "prepare_for_extend", "prepare_for_decode", "filter_batch",
              "merge_batch", "check_decode_mem", "retract_decode", "release_req")


def test_the_pinned_install_and_the_release_objects():
    t = se.make(4, 2)
    assert t.version == "0.5.23"
    assert type(t.policy).__name__ == "SchedulePolicy"
    assert type(t.tree).__name__ == "RadixCache"
    assert t.ns["PrefillAdder"].add_one_req.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_policy.py")
    assert t.ns["Req"].__init__.__code__.co_filename.endswith(
        "sglang/srt/managers/schedule_batch.py")


def test_the_scheduler_loop_is_the_releases_own_code():
    """The loop's methods are compiled from the release's scheduler.py, its batch result
    processor and its ScheduleBatch (sglang_loop); a run goes through them: the batch the
    scheduler runs is the release's ScheduleBatch, its forward mode the release's."""
    t = se.make(4, 4)
    sch = t.scheduler
    for name in SCHEDULER_LOOP:
        assert _release_file(getattr(sch, name)).endswith(
            "sglang-0.5.23/sglang/srt/managers/scheduler.py"), name
        assert name in type(sch).__release_methods__
    for name in ("process_batch_result_prefill", "process_batch_result_decode"):
        assert _release_file(getattr(sch.batch_result_processor, name)).endswith(
            "sglang/srt/managers/scheduler_components/batch_result_processor.py"), name
    batch_cls = t.ns["ScheduleBatch"]
    for name in BATCH_LOOP:
        assert _release_file(getattr(batch_cls, name)).endswith(
            "sglang/srt/managers/schedule_batch.py"), name
    t.add(0, [2, 3, 4, 5, 6], 2)
    t.step(0)
    last = sch.last_batch
    assert type(last) is batch_cls and last.forward_mode.name == "EXTEND"
    t.step(1)
    assert sch.last_batch.forward_mode.name == "DECODE" and t.is_finished(0)
    # and what is not the release's says so: a member the shell lacks is kvcheck's gap
    from kvcheck.impl.errors import StandInMissing
    with pytest.raises(StandInMissing, match="Scheduler.no_such_member"):
        _ = sch.no_such_member


def test_a_change_planted_in_a_scratch_copy_of_scheduler_py_runs(tmp_path, monkeypatch):
    """A scratch copy of the pinned install whose scheduler.py no longer takes admitted
    requests out of the waiting queue (one line of _get_new_batch_prefill_raw): the run
    fails on the engine's queues -- the loop that ran is the file's."""
    from kvcheck.impl.thirdparty import _loader

    src = _loader.base_dir() / "sglang-0.5.23"
    dst = tmp_path / "sglang-0.5.23"
    import shutil
    import subprocess
    subprocess.run(["cp", "-rs", str(src), str(dst)], check=True)
    rel = "sglang/srt/managers/scheduler.py"
    text = (src / rel).read_text()
    line = "self.waiting_queue = [x for x in self.waiting_queue if x not in can_run_set]"
    assert text.count(line) == 1
    (dst / rel).unlink()  # a link into the install: replaced, never written through
    (dst / rel).write_text(text.replace(line, "pass"))
    for other in _loader.base_dir().iterdir():  # the other installs, as they are
        if other.name != "sglang-0.5.23" and not (tmp_path / other.name).exists():
            (tmp_path / other.name).symlink_to(other)
    monkeypatch.setenv(_loader.ENV_DIR, str(tmp_path))
    try:
        r = _run("sglang-engine", seed=0, requests=6)
    finally:
        shutil.rmtree(dst)
    assert r.verdict == "fail" and r.violation.kind == "invariant", r.violation
    from kvcheck.spec.engine import QUEUES
    assert r.violation.name == QUEUES, r.violation


def _counted(made, version=None, make=None):
    def factory(*a, **k):
        if version:
            k["version"] = version
        made.append((make or se.make_optimistic)(*a, **k))
        return made[-1]
    return factory


@pytest.mark.parametrize("version", [None, "0.5.22", "0.5.21", "0.5.20", "0.5.19"])
def test_optimistic_admission_retracts_and_passes(version):
    made = []
    r = verify(_counted(made, version), 8, 4, 2000, 2, model="engine",
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

        real = self.ns["__loop__"]["ScheduleBatch"]
        self.batch_class = type("ScheduleBatch", (real,), {"release_req": release_req})
        self._publish()
        self.scheduler.running_batch = self.batch_class(reqs=[], batch_is_full=False)


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
        r = _run(f"sglang-engine-optimistic{version}", seed=2, requests=30)
        assert r.verdict == "pass", r.violation
        assert r.state.stats["preemptions"] >= 1, r.state.stats


# -- SchedulePolicy's other policies: the release's own calc_priority orders the queue ------


def _first_admitted(policy, gen=5, version=None):
    """Three requests queued before the first step, one admitted (max_seqs 1): which."""
    t = se.make(8, 4, budget=16, max_seqs=1, policy=policy, version=version)
    for q, max_new in ((0, 2), (1, 5), (2, 3)):
        t.add(q, [2 + q, 3, 4], max_new)
    return list(t.step(gen).scheduled), t


def test_lof_admits_the_longest_output_first():
    assert _first_admitted("fcfs")[0] == [0]
    first, t = _first_admitted("lof")
    assert first == [1], first  # max_new 5 of 2, 5, 3
    assert t.waiting() == [2, 0] and type(t.policy.policy).__name__ == "CacheAgnosticPolicy"


def _after_a_cached_prompt(policy, version=None):
    """A prompt of two pages and a token runs to the end (the tree keeps its pages); then a
    stranger and a request sharing those pages arrive, in that order."""
    t = se.make(8, 4, budget=16, max_seqs=1, policy=policy, version=version)
    t.add(0, [2, 3, 4, 5, 6, 7, 8, 2, 3], 1)
    g = 0
    while not t.is_finished(0):
        t.step(g)
        g += 1
    t.add(1, [5, 5, 5, 5, 5], 1)
    t.add(2, [2, 3, 4, 5, 6, 7, 8, 2, 4], 1)
    return list(t.step(100).scheduled)


@pytest.mark.parametrize("version", [None, "0.5.19"])  # 0.5.19: match_prefix_for_req
def test_cache_aware_policies_admit_the_cached_prefix_first(version):
    assert _after_a_cached_prompt("fcfs", version) == [1]
    assert _after_a_cached_prompt("lpm", version) == [2]  # 8 tokens matched, against none
    assert _after_a_cached_prompt("dfs-weight", version) == [2]


def test_random_shuffles_by_the_step_and_replays():
    firsts = {g: _first_admitted("random", gen=g)[0][0] for g in range(12)}
    assert set(firsts.values()) == {0, 1, 2}, firsts  # the release's shuffle ran
    assert all(_first_admitted("random", gen=g)[0][0] == f for g, f in firsts.items())
    # a run is a function of its seed: the same run twice
    a, b = (_run("sglang-engine", seed=3, requests=12) for _ in range(2))
    assert a.verdict == "pass"
    assert a.ops == b.ops and a.state.stats == b.state.stats


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "lof", "random"])
def test_each_policy_passes_and_catches_a_planted_bug(policy):
    scope = EngineScope(8, 4, budget=16, policy=policy)
    r = verify("sglang-engine", 8, 4, 2000, 1, model="engine", scope=scope, do_shrink=False,
               extra={"requests": 15})
    assert r.verdict == "pass", r.violation
    assert r.state.stats["hits"] > 0, r.state.stats
    bad = verify(_early_free, 8, 4, 2000, 1, model="engine", scope=scope, do_shrink=False,
                 extra={"requests": 15})
    assert bad.verdict == "fail" and bad.violation.kind == "invariant", bad.violation


def test_a_policy_is_refused_where_it_is_not_driven(capsys):
    with pytest.raises(MisuseError, match="hrrn"):
        se.make(4, 4, policy="hrrn")
    # another engine's own scheduler refuses it (vLLM v1: "Unknown scheduling policy: lpm")
    for target in ("vllm-v1-engine", "nano-vllm-engine"):
        assert kvcheck(["verify-engine", target, "--policy", "lpm"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lpm" in err[0] and "Traceback" not in err[0], err


def test_a_trace_names_the_policy():
    from kvcheck.models.engine.model import EngineModel

    m = EngineModel()
    for policy in ("fcfs", "priority", "lpm", "random"):
        scope = EngineScope(8, 4, policy=policy)
        data = m.scope_json(scope)
        assert m.scope_from_json(data) == scope
        assert ("policy" in data) == (policy not in ("fcfs", "priority"))
    assert m.scope_json(EngineScope(8, 4, policy="random"))["policy"] == 4
    for bad in ({"policy": "lpm"}, {"policy": 5}, {"policy": 1, "priority": 1}):
        with pytest.raises(ValueError, match="policy"):
            m.scope_from_json({"num_blocks": 8, "block_size": 4, **bad})


def test_a_failing_run_under_a_policy_replays_from_its_trace(tmp_path, capsys):
    """The trace file holds the policy (an integer, as every scope field) and replay runs it."""
    trace = tmp_path / "t.json"
    target = f"{__file__}:_early_free"
    assert kvcheck(["verify-engine", target, "--policy", "random", "--seed", "2",
                    "--trace-out", str(trace)]) == 1
    capsys.readouterr()
    assert kvcheck(["replay", str(trace), "--target", target]) == 1
    out = capsys.readouterr().out
    assert "REPRODUCED" in out and "random" in out, out


def _near_full(prompt, version=None, steps=40, blocks=3, block_size=8):
    """E7 (docs/findings.md) on the release's objects, no oracle: a prompt of ``prompt``
    tokens (max_new 8) and a one-token request behind it arrive at an idle server of
    ``blocks`` pages of ``block_size`` (chunked_prefill_size 8, max_running_requests 2);
    ``steps`` engine steps. Returns the target and the first request's max_new_tokens as
    the release's arrival left it."""
    t = se.make(blocks, block_size, budget=8, max_seqs=2, version=version)
    t.add(0, [2 + i % 5 for i in range(prompt)], 8)
    clipped = t.requests[0].sampling_params.max_new_tokens
    t.add(1, [3], 4)
    for g in range(steps):
        t.step(g)
    return t, clipped


@pytest.mark.parametrize("version", [None, "0.5.19"])
def test_e7_a_prompt_within_a_page_of_the_pool_waits_forever_and_blocks_the_queue(version):
    """SGLang's own arrival: the server's limits for a 24-token pool at page size 8 are
    max_req_len 23, max_req_input_len 18 (TpModelWorker); init_req_max_new_tokens clips a
    16-token prompt's max_new_tokens to max(0, 24 - 16 - 8 - 1) = 0, validate_input_length
    passes it (16 < 18), and PrefillAdder then refuses it at every step (16 + 0 + one page
    is not below the 24 free tokens): it waits forever on an idle, empty pool, and under
    FCFS the one-token request behind it too. One token shorter it runs; two tokens longer
    the release refuses it at arrival."""
    t, clipped = _near_full(16, version)
    sch = t.scheduler
    assert (sch.max_total_num_tokens, sch.max_req_len, sch.max_req_input_len) == (24, 23, 18)
    assert clipped == 0
    assert t.waiting() == [0, 1] and t.running() == []
    assert not t.is_finished(0) and t.requests[0].to_finish is None  # not aborted
    assert t.alloc.available_size() == 24 and not t.chunked_req  # idle, the pool empty
    ok, clipped = _near_full(15, version)  # 15 + 0 + 8 < 24: admitted, one token, done
    assert clipped == 0 and ok.is_finished(0) and ok.is_finished(1)
    too_long, _ = _near_full(18, version)  # 18 >= max_req_input_len: aborted
    assert too_long.is_finished(0) and too_long.is_finished(1)


def test_e7_the_oracle_reports_liveness_for_the_near_full_prompt():
    """The engine model counts the 16-token prompt (max_new 8) as one the 3 x 8 pool holds
    whole, so the hang above is a liveness violation, from the arrival alone."""
    scope = {"num_blocks": 3, "block_size": 8, "budget": 8, "max_seqs": 2}
    add = EngineOp("add", seq=0, tokens=[2 + i % 5 for i in range(16)], max_new=8, priority=0)
    v = replay_ops("engine", "sglang-engine", scope, [add]).violation
    assert v is not None and v.kind == "liveness", v
    short = EngineOp("add", seq=0, tokens=[2 + i % 5 for i in range(15)], max_new=8, priority=0)
    assert replay_ops("engine", "sglang-engine", scope, [short]).violation is None
