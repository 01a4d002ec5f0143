"""``max_model_len`` as the engines accept it at start-up (issue 34).

vLLM refuses to start when one request of ``max_model_len`` tokens needs more KV memory than
the pool has (v1: ``check_enough_kv_cache_memory``; the v1 worker of 0.6.x and v0's
``raise_if_cache_size_invalid``: ``max_model_len > block_size * num_gpu_blocks``). A kvcheck
run on settings the engine would not start with is no evidence against it, so an explicit
``--max-model-len`` the release refuses is refused in one line, exit 2, in the release's
words (``impl/thirdparty/vllm_config.py`` compiles its check from its own source); and
with none given the engine targets run with the largest length the release accepts on the
pool, at most 65,536 (vLLM's ``max_model_len=-1`` auto-fit), not with 65,536 whatever the
pool. A trace that records a max_model_len replays with it (refused as above if the release
refuses it); one that records none replays with the pool's default, which runs it the same
as the old default of 65,536 did (checked below on a published trace).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import (
    aphrodite_v0_engine,
    install,
    nano_vllm_engine,
    vllm_config,
    vllm_v0_engine,
    vllm_v0_engine_v1,
    vllm_v1_engine,
)

ROOT = Path(__file__).resolve().parents[2]
TRACE_43569 = ROOT / "docs" / "traces" / "engine" / "vllm-v1-engine-0.33.0-43569.json"


def _ensure(key: str, *versions: str) -> None:
    """The releases a test reads (scripts/test.sh installs them; installed here if not)."""
    for v in versions:
        install.ensure(install.ENGINES[install.select(key, v, with_family=key == "vllm-v1").key],
                       v)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _refusal(make, **kw) -> str:
    with pytest.raises(MisuseError) as e:
        make(**kw)
    return str(e.value)


def test_an_explicit_length_above_the_pool_is_refused_in_vllm_s_words(capsys):
    """0.33.0, 8 usable blocks of 4 (num_gpu_blocks 9 with the null block, which 0.29.0 on
    hold back): 33 tokens need 9 blocks, refused in the release's words with the length it
    estimates; 32 starts."""
    assert kvcheck(["verify-engine", "vllm-v1-engine@0.33.0", "--max-model-len", "33",
                    "--ops", "10"]) == 2
    err = _one_line(capsys)
    assert err.startswith("kvcheck: error: cannot build the engine"), err
    assert ("vllm 0.33.0 refuses max_model_len 33 at start-up on a pool of 8 blocks of 4 "
            "tokens (num_gpu_blocks 9 with its null block): --max-model-len 32 or less "
            "starts; its vllm/v1/core/kv_cache_planning.py: To serve at least one request "
            "with the model's max seq len (33)") in err, err
    assert "the estimated maximum model length is 32." in err, err
    assert vllm_v1_engine.make(8, 4, max_model_len=32, version="0.33.0").max_model_len == 32


@pytest.mark.parametrize(("version", "most", "where", "says"), [
    # the null block counted in (0.8.3 .. 0.28.0): one block more than the usable pool
    ("0.10.2", 36, "vllm/v1/core/kv_cache_utils.py",
     "To serve at least one request with the models's max seq len (37)"),
    ("0.34.0", 32, "vllm/v1/core/kv_cache_planning.py",
     "To serve at least one request with the model's max seq len (33)"),
    # no null block; the v1 worker's own check
    ("0.6.4.post1", 32, "vllm/v1/worker/gpu_worker.py",
     "The model's max seq len (33) is larger than the maximum number of tokens that can be "
     "stored in KV cache (32)"),
])
def test_each_v1_generation_refuses_in_its_own_check(version, most, where, says):
    _ensure("vllm-v1", version)
    err = _refusal(vllm_v1_engine.make, num_blocks=8, block_size=4, spec=0, version=version,
                   max_model_len=most + 1)
    assert f"--max-model-len {most} or less starts; its {where}: " in err and says in err, err
    assert vllm_v1_engine.make(8, 4, spec=0, version=version).max_model_len == most
    assert vllm_v1_engine.make(8, 4, spec=0, version=version,
                               max_model_len=most).max_model_len == most


def test_aphrodite_s_v1_refuses_in_its_own_copy_of_the_check():
    """aphrodite-engine's v1 carries vLLM's check under its own names: 0.22.0 counts the null
    block in, 0.24.1 holds it back (as vLLM 0.29.0 on)."""
    from kvcheck.impl.thirdparty import aphrodite_v1_engine

    for version, most in (("0.22.0", 36), ("0.24.1", 32)):
        install.ensure(install.ENGINES[aphrodite_v1_engine.ENGINE_KEY], version)
        assert aphrodite_v1_engine.make(8, 4, version=version).max_model_len == most
        err = _refusal(aphrodite_v1_engine.make, num_blocks=8, block_size=4, version=version,
                       max_model_len=most + 1)
        assert (f"aphrodite-engine {version} refuses max_model_len {most + 1} at start-up"
                in err and "its aphrodite/v1/core/kv_cache_utils.py: To serve at least one "
                           "request with the model" in err), err


def test_v0_refuses_in_its_worker_s_words_and_aphrodite_v0_only_logs():
    """vLLM v0's worker (``raise_if_cache_size_invalid``; 0.4.0's ``check_block_size_valid``)
    refuses a length past ``block_size * num_gpu_blocks``; aphrodite 0.6.x's copy logs an
    error and the engine starts with the length asked, so kvcheck runs it."""
    _ensure("vllm-v0", "0.8.5")
    install.ensure(install.ENGINES[vllm_v0_engine_v1.ENGINE_KEY], "0.4.0")
    err = _refusal(vllm_v0_engine.make_chunked, num_blocks=8, block_size=4, version="0.8.5",
                   max_model_len=33)
    assert ("vllm 0.8.5 refuses max_model_len 33 at start-up on a pool of 8 blocks of 4 "
            "tokens: --max-model-len 32 or less starts; its vllm/worker/worker.py: The "
            "model's max seq len (33) is larger than the maximum number of tokens that can "
            "be stored in KV cache (32).") in err, err
    err = _refusal(vllm_v0_engine_v1.make, num_blocks=8, block_size=4, budget=64,
                   caching=False, version="0.4.0", max_model_len=40)
    assert "its vllm/executor/utils.py: The model's max seq len (40)" in err, err
    install.ensure(install.ENGINES[aphrodite_v0_engine.ENGINE_KEY], "0.6.5")
    t = aphrodite_v0_engine.make_chunked(8, 4, caching=False, version="0.6.5",
                                         max_model_len=1 << 16)
    assert t.max_model_len == 1 << 16


def test_the_default_is_the_largest_length_the_pool_holds_at_most_65536():
    """Unset, a target runs with the largest length its release accepts on the pool: the
    length the release's own refusal estimates (vLLM's -1 auto-fit), capped at 65,536; v0
    without chunked prefill at most the budget too (its SchedulerConfig refuses more)."""
    said = _refusal(vllm_v1_engine.make, num_blocks=5, block_size=3, version="0.33.0",
                    max_model_len=1 << 16)
    estimated = int(re.search(r"estimated maximum model length is (\d+)\.", said).group(1))
    assert estimated == 15 == vllm_v1_engine.make(5, 3, version="0.33.0").max_model_len
    assert vllm_v1_engine.make(20_000, 4, version="0.33.0").max_model_len == 1 << 16
    assert vllm_v0_engine.make(8, 4, budget=64, version="0.8.5").max_model_len == 32
    assert vllm_v0_engine.make(8, 4, budget=16, version="0.8.5").max_model_len == 16
    assert vllm_v0_engine.make_chunked(8, 4, budget=16, version="0.8.5").max_model_len == 32
    assert aphrodite_v0_engine.make_chunked(8, 4, caching=False,
                                            version="0.6.5").max_model_len == 1 << 16
    # nano-vllm has no start-up check of the pool: its Config asserts only the budget
    assert nano_vllm_engine.make(2, 4, budget=64, max_model_len=64).max_model_len == 64
    # the check answers in the release's words whatever the length: monotone, so the
    # largest accepted is one below the smallest refused
    mods = vllm_v1_engine.load("0.33.0")
    pool = (vllm_v1_engine.engine_config(vllm_v1_engine.EngineSettings(5, 3, max_model_len=1)),
            vllm_v1_engine._layer_spec(mods, 3))
    assert vllm_config.pool_refusal(mods, 6, 3, 15, pool) is None
    assert vllm_config.pool_refusal(mods, 6, 3, 16, pool) is not None


def test_a_trace_s_max_model_len_is_replayed_and_refused_as_the_release_refuses_it(
        tmp_path, capsys):
    """A trace recording a max_model_len runs with it; one the release refuses on the
    trace's pool is refused in one line (exit 2), as a budget below max_seqs is."""
    trace = json.loads(TRACE_43569.read_text())
    pool = trace["scope"]["num_blocks"] * trace["scope"]["block_size"]
    bad = copy.deepcopy(trace)
    bad["scope"]["max_model_len"] = 1 << 16
    path = tmp_path / "too-long.json"
    path.write_text(json.dumps(bad))
    assert kvcheck(["replay", str(path)]) == 2
    err = _one_line(capsys)
    assert f"refuses max_model_len 65536 at start-up on a pool of " \
           f"{trace['scope']['num_blocks']} blocks" in err, err
    assert f"--max-model-len {pool} or less starts" in err, err
    ok = copy.deepcopy(trace)
    ok["scope"]["max_model_len"] = pool
    path = tmp_path / "fits.json"
    path.write_text(json.dumps(ok))
    assert kvcheck(["replay", str(path)]) == 1  # the finding, reproduced
    assert "VIOLATION" in capsys.readouterr().out


def test_a_trace_without_max_model_len_runs_as_it_ran_at_65536(monkeypatch):
    """A published trace records no max_model_len: it ran with 65,536 then and runs with the
    pool's default now. Its every step's schedule, output and verdict are the same either
    way (the requests a run may hold fit the pool, so neither length is reached)."""
    from kvcheck.check.trace import Trace
    from kvcheck.verify import replay_ops

    trace = Trace.load(TRACE_43569)
    ops = trace.ops

    def at(length):
        def factory(nb, bs, **kw):
            return vllm_v1_engine.make(nb, bs, version="0.33.0", max_model_len=length, **kw)
        return factory

    monkeypatch.setattr(vllm_config, "check_pool", lambda *a, **k: None)  # (65,536: refused)
    old = replay_ops("engine", at(1 << 16), trace.scope_json(), copy.deepcopy(ops))
    monkeypatch.undo()
    new = replay_ops("engine", at(None), trace.scope_json(), copy.deepcopy(ops))
    assert old.violation is not None and new.violation is not None
    assert (old.violation.name, old.violation.step) == (new.violation.name, new.violation.step)
    assert [repr(o) for o in old.ops] == [repr(o) for o in new.ops]
    assert old.states == new.states


def test_a_campaign_draws_no_max_model_len_above_its_pool():
    """Every max_model_len a campaign draws is within the run's pool (every engine starts
    with that), so no drawn run is refused at start-up."""
    from kvcheck.campaign.plan import Settings, draw

    drawn = 0
    for seed in (0, 3):
        s = Settings("vllm-v1-engine", "engine", seed=seed)
        for n in range(1, 300):
            sc = draw(s, n).scope
            if sc.get("max_model_len"):
                drawn += 1
                assert sc["max_model_len"] <= sc["num_blocks"] * sc["block_size"], sc
    assert drawn > 50
