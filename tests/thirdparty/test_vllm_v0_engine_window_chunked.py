"""vLLM v0's engine core with a sliding window and chunked prefill
(``vllm-v0-engine-window-chunked``, ``aphrodite-v0-engine-window-chunked``): the release's own
``Scheduler`` with ``CacheConfig.sliding_window`` set and ``enable_chunked_prefill`` on, so its
``_schedule_chunked_prefill`` admits, chunks and drops behind the window
(``impl/thirdparty/vllm_v0_engine_window.py``).

vLLM 0.4.3 .. 0.6.2 and aphrodite 0.6.x accept the pair on block manager v2 (their engine
arguments refuse it only without it: ``window_refusal``, the release's own condition and
words); 0.6.3 on have no such check. What fails there is known: vLLM #11168 (the window cap in
``can_allocate``), reached through the chunked scheduler too; F11 (vLLM #7371) on 0.5.1 ..
0.5.4, with or without a window. With the cap removed (the release's own ``can_allocate``
with its ``max_block_sliding_window`` unset for the call, a counterfactual made here only)
the chunked windowed runs pass while blocks leave the table mid-prefill.
"""

from __future__ import annotations

import copy
import traceback

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.engines import MisuseError
from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty import aphrodite_v0_engine as ae
from kvcheck.impl.thirdparty import vllm_v0_engine_window as w
from kvcheck.models.engine.model import EngineOp, EngineScope
from kvcheck.models.engine.oracle import WINDOW
from kvcheck.spec.state import NULL
from kvcheck.verify import replay_ops, verify

REFUSAL = "Chunked prefill is not supported with sliding window"


def _ensure(*versions, engine="vllm-v0"):
    for v in versions:
        install.ensure(install.ENGINES[engine], v)


def _run(factory, seed, bs=4):
    scope = EngineScope(8, bs, budget=16, max_seqs=8, caching=False)
    return verify(factory, 8, bs, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": 30})


def _uncapped(make):
    """``make``'s target with can_allocate's window cap removed (the release's own method,
    its manager's ``max_block_sliding_window`` unset for the call): vLLM #11168 out of the
    way."""
    def factory(*a, **k):
        t = make(*a, **k)
        rec = t.manager.can_allocate  # (the target's recorder around the release's method)
        method = rec.method

        def exact(manager, *args, **kwargs):
            saved = manager.max_block_sliding_window
            manager.max_block_sliding_window = None
            try:
                return method(manager, *args, **kwargs)
            finally:
                manager.max_block_sliding_window = saved
        rec.method = exact
        return t
    return factory


def _bare(t):
    """The target's scheduler with the release's own manager methods (the KV call recorders
    taken off): what follows runs on the release's objects only."""
    for name in ("can_allocate", "allocate", "can_append_slots", "append_slots", "free"):
        t.manager.__dict__.pop(name, None)
    return t.scheduler


def test_a_prompt_is_chunked_and_its_first_block_dropped_mid_prefill():
    t = w.make_chunked(8, 4, budget=8)
    sched = t.scheduler
    assert sched.scheduler_config.chunked_prefill_enabled
    assert sched.cache_config.sliding_window == 4 and t.manager.max_block_sliding_window == 3
    t.add(0, [2 + i % 5 for i in range(24)], 4)  # 6 blocks; the budget: chunks of 8
    seen = []
    for gen in range(3):
        r = t.step(gen)
        seen.append((r.scheduled.get(0), t.computed(0), t.blocks(0)[0]))
    # the third chunk's append_slots (16 computed: 16 // 4 - 3 = 1) drops block 0 while the
    # prompt is still prefilling; the chunk itself goes to blocks 4 and 5
    assert [s[:2] for s in seen] == [(8, 8), (8, 16), (8, 24)], seen
    assert seen[1][2] != NULL and seen[2][2] == NULL, seen
    assert len(t.blocks(0)) == 6 and NULL not in t.free_blocks()


def test_a_drop_mid_prefill_inside_the_window_is_caught():
    """A target claiming a window of 16 tokens on a release that keeps 3 blocks of 4: the
    third chunk's ``append_slots`` (16 of a 24-token prompt computed) drops block 0, tokens
    0 .. 3, which the next token (16) still attends to under the claim. The KV call carries
    the tokens up to the next one computed (17), so the window rule sees it; judged by the
    whole prompt (24) it would pass, and the request, finished by its first sampled token,
    never decodes to show it later. The honest target passes the same operations."""
    ops = [EngineOp("add", seq=0, tokens=[2 + i % 5 for i in range(24)], max_new=1,
                    priority=0), *(EngineOp("step", gen=g) for g in range(3))]
    scope = {"num_blocks": 8, "block_size": 4, "budget": 8, "max_seqs": 8, "caching": False}

    def wide(*a, **k):
        t = w.make_chunked(*a, **k)
        t.sliding_window = 16  # (the release keeps 3 blocks: 12 .. 15 tokens back)
        return t
    good = replay_ops("engine", lambda *a, **k: w.make_chunked(*a, **k), scope,
                      copy.deepcopy(ops))
    assert good.violation is None, good.violation
    bad = replay_ops("engine", wide, scope, copy.deepcopy(ops)).violation
    assert bad is not None and bad.name == WINDOW and bad.step == 4, bad
    assert "(17 tokens, a window of 16) replaced its block 0" in bad.witness, bad.witness


def test_11168_is_reached_through_the_chunked_scheduler_raw():
    """On the release's objects, no oracle: a 10-token prompt needs 5 blocks of 2, the pool
    has 4; the chunked scheduler's ``can_allocate`` caps the need at the window's 3 and says
    OK, and ``allocate`` raises out of ``_schedule_chunked_prefill``. Without the cap the
    same prompt waits (LATER)."""
    t = w.make_chunked(4, 2, budget=4, max_seqs=4)
    sched = _bare(t)
    t.add(0, [2 + i % 5 for i in range(10)], 2)
    with pytest.raises(Exception) as info:
        sched.schedule()
    assert type(info.value).__name__ == "NoFreeBlocksError"
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_schedule_chunked_prefill" in frames and "allocate" in frames, frames
    t = w.make_chunked(4, 2, budget=4, max_seqs=4)
    sched = _bare(t)
    t.manager.max_block_sliding_window = None  # (the counterfactual: the need uncapped)
    t.add(0, [2 + i % 5 for i in range(10)], 2)
    sched.schedule()
    assert t.status(0) == "WAITING" and t.num_free() == 4


def test_the_engine_model_reports_11168_and_passes_uncapped():
    dropped = 0
    for seed in (0, 1):
        r = _run(w.make_chunked, seed)
        assert r.verdict == "fail" and "NoFreeBlocksError" in r.violation.witness, r.violation
        r = _run(_uncapped(w.make_chunked), seed)
        assert r.verdict == "pass", r.violation
        dropped += r.state.stats.get("dropped", 0)
    assert dropped > 0


def test_f11_on_0_5_4_is_not_the_windows():
    """0.5.1 .. 0.5.4's later-chunk crash (F11, vLLM #7371) with the window's cap removed:
    the chunked path's own bug, which the window does not change."""
    _ensure("0.5.4")

    def make(*a, **k):
        return w.make_chunked(*a, **{**k, "version": "0.5.4"})
    r = _run(_uncapped(make), 2)
    assert r.verdict == "fail" and "IndexError" in r.violation.witness, r.violation
    assert "append_token_ids" in r.violation.witness, r.violation.witness


def test_the_releases_engine_arguments_refuse_it_without_block_manager_v2():
    """``window_refusal`` is the release's own check (its condition and words compiled from
    ``engine/arg_utils.py``): 0.6.2 refuses chunked prefill with a window on block manager v1
    and accepts it on v2; 0.6.3 has no such check; aphrodite 0.6.5's ``args_tools.py`` as
    0.6.2."""
    _ensure("0.6.2", "0.6.3.post1")
    _ensure("0.6.5", engine="aphrodite-v0")
    for engine, version, refuses in (("vllm-v0", "0.6.2", True),
                                     ("vllm-v0", "0.6.3.post1", False),
                                     ("aphrodite-v0", "0.6.5", True)):
        dist = install.select(engine, version)
        root = _loader.require(dist)
        said = w.window_refusal(root, dist.top, sliding_window=4, chunked=True, v2=False)
        assert (said is not None and said.startswith(REFUSAL)) == refuses, (version, said)
        assert w.window_refusal(root, dist.top, sliding_window=4, chunked=True, v2=True) is None
        assert w.window_refusal(root, dist.top, sliding_window=4, chunked=False,
                                v2=False) is None


def test_a_target_on_block_manager_v1_is_refused_in_one_line(tmp_path, capsys):
    _ensure("0.6.2")
    src = tmp_path / "v1window.py"
    src.write_text(
        "from kvcheck.impl.thirdparty import vllm_v0_engine_window as w\n\n\n"
        "class V1(w.VllmV0EngineWindowTarget):\n"
        "    block_manager_v2 = False  # use_v2_block_manager=False\n\n\n"
        "def make(n, bs, budget=16, max_seqs=8, policy='fcfs', caching=False, spec=0,\n"
        "         version=None, max_model_len=None):\n"
        "    return V1(n, bs, bs, budget, max_seqs, policy, caching, spec,\n"
        "              max_model_len or 0, '0.6.2', chunked=True)\n")
    rc = kvcheck(["verify-engine", f"{src}:make", "--no-prefix-caching", "--ops", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert REFUSAL in err[0] and "vllm 0.6.2" in err[0], err


def test_prefix_caching_is_refused_in_one_line_and_both_are_registered(capsys):
    from kvcheck.targets.registry import ENGINE_TARGETS

    assert kvcheck(["verify-engine", "vllm-v0-engine-window-chunked", "--ops", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Prefix caching is not supported with sliding window" in err[0]
    assert ENGINE_TARGETS["vllm-v0-engine-window-chunked"][0] == (
        "kvcheck.impl.thirdparty.vllm_v0_engine_window:make_chunked")
    assert ENGINE_TARGETS["aphrodite-v0-engine-window-chunked"][0] == (
        "kvcheck.impl.thirdparty.aphrodite_v0_engine:make_window_chunked")
    with pytest.raises(MisuseError):
        w.make_window(8, 2, 0, chunked=True)


def test_aphrodite_0_6_5_runs_it_chunked():
    _ensure("0.6.5", engine="aphrodite-v0")
    t = ae.make_window_chunked(8, 4, budget=8)
    assert t.scheduler.scheduler_config.chunked_prefill_enabled
    assert type(t.manager).__module__.endswith("aphrodite.processing.block_manager_v2")
    t.add(0, [2 + i % 5 for i in range(24)], 4)
    for gen in range(3):
        t.step(gen)
    assert t.blocks(0)[0] == NULL and t.computed(0) == 24
    r = _run(ae.make_window_chunked, 0)
    assert r.verdict == "fail" and "NoFreeBlocksError" in r.violation.witness, r.violation
    r = _run(_uncapped(ae.make_window_chunked), 0)
    assert r.verdict == "pass", r.violation
