"""vLLM v0's engine core with a sliding window (``vllm-v0-engine-window``,
``aphrodite-v0-engine-window``): the release's own ``Scheduler`` with
``CacheConfig.sliding_window`` set as vLLM's engine sets it, so its own ``can_allocate``,
``allocate`` and ``append_slots`` run windowed (``impl/thirdparty/vllm_v0_engine_window.py``).

vLLM #11168 (never fixed in v0; aphrodite 0.6.x inherits it): ``can_allocate`` caps the
blocks a prompt needs at ``max_block_sliding_window`` while ``allocate`` takes a block for
every prompt token, so the scheduler's ``_schedule_prefills`` raises ``NoFreeBlocksError``
after the check said yes. Not crying wolf: with the window off the same seeds pass, and with
the cap removed (the release's own ``can_allocate``, called with its
``max_block_sliding_window`` unset, a counterfactual made here only) the windowed runs pass
while their blocks leave the window (the oracle's ``WINDOW`` rule checks each drop; a target
that claims a wider window than its release keeps is caught).
"""

from __future__ import annotations

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.engines import MisuseError
from kvcheck.impl.thirdparty import aphrodite_v0_engine as ae
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v0_engine as ve
from kvcheck.impl.thirdparty import vllm_v0_engine_window as w
from kvcheck.models.engine.model import EngineScope
from kvcheck.models.engine.oracle import WINDOW
from kvcheck.spec.state import NULL
from kvcheck.verify import verify

SEEDS = (0, 1, 2, 3)


def _run(factory, seed, bs=2):
    scope = EngineScope(8, bs, budget=16, max_seqs=8, caching=False)
    return verify(factory, 8, bs, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": 30})


def _uncapped(make):
    """``make``'s target with can_allocate's window cap removed: the release's own method,
    run with the manager's ``max_block_sliding_window`` unset for the call."""
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


def test_the_window_is_the_releases_setting():
    t = w.make(8, 2)
    assert t.scheduler.cache_config.sliding_window == 2
    m = t.manager
    assert (m.sliding_window, m.max_block_sliding_window) == (2, 3)  # 2 // 2 + 2
    assert type(m).__module__.endswith("vllm.core.block_manager")
    assert t.num_free() == 8 and t.free_blocks() == list(range(8))  # the null block taken
    assert m.block_allocator.allocate_or_get_null_block().block_id == w.NULL_ID
    assert w.make_window(8, 4, 9).manager.max_block_sliding_window == 4  # 9 // 4 + 2
    t.add(0, [2, 3, 4, 5, 6, 2, 3, 4, 5], 6)
    while not t.is_finished(0):
        t.step(0)
        if t.blocks(0)[:1] == [NULL]:
            break
    assert t.blocks(0)[0] == NULL and NULL not in t.free_blocks()


def test_11168_on_0_8_5_raises_through_its_own_scheduler():
    for seed in SEEDS:
        r = _run(w.make, seed)
        assert r.verdict == "fail" and r.violation.kind == "crash", r.violation
        assert "NoFreeBlocksError" in r.violation.witness, r.violation.witness


def test_not_crying_wolf_window_off_and_cap_removed_pass():
    dropped = 0
    for seed in SEEDS:
        r = _run(lambda *a, **k: ve.make(*a, **k), seed)
        assert r.verdict == "pass", r.violation
        r = _run(_uncapped(w.make), seed)
        assert r.verdict == "pass", r.violation
        dropped += r.state.stats.get("dropped", 0)
    assert dropped > 20


def test_a_drop_inside_the_window_is_caught():
    """A target claiming a wider window than its release keeps: the release's drops read as
    blocks leaving the table while the next token still attends to them."""
    def wide(*a, **k):
        t = _uncapped(w.make)(*a, **k)
        t.sliding_window = (t.window_blocks + 1) * t.block_size  # it keeps S + B or more
        return t
    r = _run(wide, 0)
    assert r.verdict == "fail" and r.violation.name == WINDOW, r.violation


def test_prefix_caching_with_a_window_is_refused_in_one_line(capsys):
    assert kvcheck(["verify-engine", "vllm-v0-engine-window", "--ops", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Prefix caching is not supported with sliding window" in err[0]
    with pytest.raises(MisuseError):
        w.make_window(8, 2, 0)


def test_aphrodite_0_6_5_carries_it_and_passes_uncapped():
    install.ensure(install.ENGINES["aphrodite-v0"], "0.6.5")
    t = ae.make_window(8, 2)
    assert type(t.manager).__module__.endswith("aphrodite.processing.block_manager_v2")
    assert t.manager.max_block_sliding_window == 3
    r = _run(ae.make_window, 0)
    assert r.verdict == "fail" and "NoFreeBlocksError" in r.violation.witness, r.violation
    r = _run(_uncapped(ae.make_window), 0)
    assert r.verdict == "pass" and r.state.stats.get("dropped", 0) > 0, r.violation


def test_both_targets_are_registered():
    from kvcheck.targets.registry import ENGINE_TARGETS

    assert ENGINE_TARGETS["vllm-v0-engine-window"][0] == (
        "kvcheck.impl.thirdparty.vllm_v0_engine_window:make")
    assert ENGINE_TARGETS["aphrodite-v0-engine-window"][0] == (
        "kvcheck.impl.thirdparty.aphrodite_v0_engine:make_window")


def test_the_cli_shrinks_it_and_the_trace_replays(tmp_path, capsys):
    """The catalogue's command (a small shrinking budget): FAIL, the crash named in the
    release's file, and the trace replays to the same crash."""
    trace = tmp_path / "t.json"
    rc = kvcheck(["verify-engine", "vllm-v0-engine-window@0.8.5", "--no-prefix-caching",
                  "--block-size", "2", "--seed", "1", "--shrink-budget", "20",
                  "--trace-out", str(trace)])
    out = capsys.readouterr().out
    assert rc == 1 and "NoFreeBlocksError in vllm/core/block/naive_block.py" in out, out
    assert kvcheck(["replay", str(trace)]) == 1
    assert "NoFreeBlocksError" in capsys.readouterr().out
