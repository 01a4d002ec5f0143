"""vLLM 0.33.0's v1 KVCacheManager with a hybrid config (full attention + sliding window
sharing one pool), driven through its real calls by the hybrid model: what kvcheck says
at several shapes, that a sliding-window hit reads back with null entries behind the
window, and that a mutated coordinator (per-group hits not reconciled) is caught."""

from __future__ import annotations

import pytest

from kvcheck.impl.thirdparty.vllm_v1_hybrid import VllmV1HybridTarget
from kvcheck.models.hybrid.model import MODEL
from kvcheck.verify import replay_ops, verify


@pytest.mark.parametrize("target,bs,nb", [("vllm-v1-hybrid", 1, 8), ("vllm-v1-hybrid", 2, 12),
                                          ("vllm-v1-hybrid", 4, 6),
                                          ("vllm-v1-hybrid-odd", 3, 10)])
def test_vllm_hybrid_passes(target, bs, nb):
    r = verify(target, nb, bs, 1500, 0, model="hybrid")
    assert r.ok, r.violation and (r.violation.name, r.violation.witness)
    st = r.state.stats
    assert st["hits"] > 0 and st["dropped"] > 0 and st["oob"] > 0 and st["append_tokens"] > 0
    if bs == 1:  # vLLM drops behind the window before it finds too few blocks (allowed)
        assert st["oob_dropping"] > 0


def test_sliding_hit_served_with_null_entries():
    """A prompt whose prefix another request decoded past its window: vLLM serves the same
    hit to both groups, the sliding group's entries behind the window null."""
    B = 1
    a, b = MODEL.make_op, "allocate"
    ops = [a(b, seq=0, tokens=[0, 1, 2, 3, 4, 5]),
           a(b, seq=1, tokens=[0, 1, 2, 3, 4, 5, 6])]
    rep = replay_ops("hybrid", "vllm-v1-hybrid", {"num_blocks": 16, "block_size": B}, ops)
    assert rep.violation is None
    assert rep.ops[1].cached == [6, 6]
    full, sliding = rep.states[1]["tables"]["1"]
    assert -1 not in full and sliding[:5] == [-1] * 5 and -1 not in sliding[5:]
    assert full[:6] == rep.states[1]["tables"]["0"][0]


class Unreconciled(VllmV1HybridTarget):
    """vLLM with a coordinator that takes each group's own longest hit (its
    ``find_longest_cache_hit_per_group``) instead of the hit common to all groups,
    reporting the shortest as the hit length: a regression of the fixed point."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        coord = self.manager.coordinator

        def longest(block_hashes, max_cache_hit_length):
            blocks, lengths = coord.find_longest_cache_hit_per_group(block_hashes,
                                                                     max_cache_hit_length)
            return blocks, min(lengths), 0

        coord.find_longest_cache_hit = longest


def test_unreconciled_coordinator_caught():
    r = verify(Unreconciled, 8, 2, 3000, 0, model="hybrid", shrink_budget=30)
    assert not r.ok
    assert r.violation.name.startswith("allocate: ")
    assert len(r.trace.ops) <= 5  # an eviction in one group: two admissions and frees first


def test_the_verdict_names_the_engine_release(capsys):
    """As every third-party target's: ``engine: vllm ... from ...`` (text and --json); the
    hybrid adapter's verdict had none."""
    import json

    from kvcheck.cli import main

    assert main(["verify-hybrid", "vllm-v1-hybrid", "--ops", "30"], isolate=False) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("engine: vllm "), out
    assert main(["verify-hybrid", "vllm-v1-hybrid", "--ops", "30", "--json"],
                isolate=False) == 0
    assert json.loads(capsys.readouterr().out)["engine"].startswith("vllm ")
    assert main(["verify-hybrid", "reference-hybrid", "--ops", "30"], isolate=False) == 0
    assert "engine:" not in capsys.readouterr().out


@pytest.mark.parametrize("version", ["0.10.2", "0.20.2"])
def test_the_range_ends_and_a_middle_release_pass(version):
    """The adapter loads any release of ``vllm-v1``'s range (``vllm-v1-hybrid@VERSION``),
    the oldest (no ``scheduler_block_size`` keyword, two-item ``get_computed_blocks``) too;
    0.33.0 is the default of the tests above."""
    r = verify(f"vllm-v1-hybrid@{version}", 8, 2, 1500, 0, model="hybrid")
    assert r.ok, r.violation and (r.violation.name, r.violation.witness)
    st = r.state.stats
    assert st["hits"] > 0 and st["dropped"] > 0
    assert VllmV1HybridTarget(4, 2, version=version).version == version


def test_a_release_outside_the_range_is_a_clear_error():
    from kvcheck.targets.loading import TargetError

    with pytest.raises(TargetError, match="not 0.9.0"):
        verify("vllm-v1-hybrid@0.9.0", 8, 2, 10, 0, model="hybrid")
