"""vLLM v1 (0.33.0) through the prefix-cache lifecycle: ``vllm-v1-lifecycle``.

``allocate`` is ``schedule()``'s ``allocate_slots`` and ``commit(seq)`` the forward
pass that writes the scheduled prompt. ``allocate_slots`` caches the scheduled
tokens' block hashes before that write, so kvcheck reports ``key_after_write`` at
the first allocation, at every shape. The consequence is a hit on a never-written
block after a priority preemption inside ``schedule()``; the raw replay shows it on
vLLM's own API (``scripts/replay_raw_v1_commit.py``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import vllm_v1_lifecycle
from kvcheck.models.prefix.oracle import PrefixOp

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "docs" / "traces" / "prefix" / "vllm-v1-lifecycle-key-before-write.json"
NO_CACHE = "kvcheck.impl.thirdparty.vllm_v1_lifecycle:make_no_cache"


def _raw():
    spec = importlib.util.spec_from_file_location(
        "replay_raw_v1_commit", ROOT / "scripts" / "replay_raw_v1_commit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _verify(capsys, target, blocks, bs, ops):
    code = kvcheck(["verify-prefix", target, "--blocks", str(blocks), "--block-size", str(bs),
                    "--ops", str(ops), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("blocks,bs", [(6, 1), (8, 4), (4, 2)])
def test_keys_are_published_before_the_write(capsys, blocks, bs):
    code, out = _verify(capsys, "vllm-v1-lifecycle", blocks, bs, 300)
    assert code == 1 and out["verdict"] == "fail"
    v = out["violation"]
    assert v["violation"]["name"] == "key_after_write"
    assert [o["op"] for o in v["ops"]] == ["allocate"]  # shrunk: one scheduled prompt


def test_the_trace_reproduces_and_the_legal_targets_pass_it(capsys):
    assert kvcheck(["replay", str(TRACE)]) == 1
    assert capsys.readouterr().out.startswith("REPRODUCED on vllm-v1-lifecycle")
    for legal in ("prefix-commit", NO_CACHE, "vllm-v1"):  # vllm-v1: no commit, written in allocate
        assert kvcheck(["replay", str(TRACE), "--target", legal]) == 0, legal
        capsys.readouterr()


@pytest.mark.parametrize("blocks,bs", [(6, 1), (8, 4)])
def test_without_prefix_caching_the_lifecycle_holds(capsys, blocks, bs):
    """The legal control: nothing is published, and the run does preempt and free
    prompts before their write and commits the others."""
    code, out = _verify(capsys, NO_CACHE, blocks, bs, 600)
    assert code == 0 and out["verdict"] == "pass", out.get("violation")
    st = out["stats"]
    assert st["commits"] > 0 and st["freed_uncommitted"] > 0 and st["preempts"] > 0


def test_commit_and_admits():
    t = vllm_v1_lifecycle.make(4, 2)
    t.allocate(0, 4, token_ids=[1, 2, 3, 4])
    assert t.cached_blocks() == set(t.block_table(0))  # hashed at allocate_slots already
    assert not t.admits(PrefixOp("free_seq", seq=0))  # no abort between schedule and write
    assert t.admits(PrefixOp("preempt", seq=0))
    t.commit(0)
    assert t.admits(PrefixOp("free_seq", seq=0))
    with pytest.raises(MisuseError):
        t.commit(0)
    with pytest.raises(MisuseError):
        t.commit(7)
    t.allocate(1, 2, token_ids=[9, 9])
    t.preempt(1)
    assert 1 not in t.unwritten


@pytest.mark.parametrize("bs", [1, 2, 4])
def test_raw_replay_hits_a_block_never_written(bs):
    out = _raw().replay(bs)
    assert out["published_unwritten"] == [3]  # A's second block: hashed, never written
    assert out["hit_blocks"] == [1, 3] and out["num_computed_tokens"] == 2 * bs
    assert out["unwritten_hits"] == [3]


def test_raw_replay_with_the_rollback_rule_hits_only_written_blocks(capsys):
    out = _raw().replay(2, fix=True)
    assert out["published_unwritten"] == [] and out["unwritten_hits"] == []
    assert out["hit_blocks"] == [1] and out["num_computed_tokens"] == 2
    mod = _raw()
    assert mod.main(["--block-size", "2"]) == 0
    assert "DEVIATION: cache hit on block 3" in capsys.readouterr().out
    assert mod.main(["--fix"]) == 1
    assert mod.main(["--block-size", "0"]) == 2
