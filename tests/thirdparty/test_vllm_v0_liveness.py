"""The liveness failures of ``vllm-v0-engine-chunked`` campaigns, on the release's own objects
(docs/findings.md E5, E6): each is the engine's behaviour, shown here without the oracle,
and the engine model reports it (``every request the pool can hold finishes within the
bound``).

E5 (0.5.1 .. 0.9.2, chunked prefill): a request whose re-admitted prompt needs every block
of a pool under 100 blocks is preempted at each later chunk, forever: ``can_allocate``
admits it (``watermark_blocks = int(0.01 * num_gpu_blocks)`` is 0), ``can_append_slots``
counts the last block as touched and wants a free block, there is none. From 100 blocks on
(watermark 1) the same request is ignored (``FINISHED_IGNORED``): v0's own way out.

E6 (0.7.3 .. 0.9.2, chunked prefill with prefix caching): a token budget below the block
size is rounded down to no block at all (``_chunk_new_tokens_to_schedule``): no prefill is
ever scheduled.
"""

from __future__ import annotations

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v0_engine as ve


def _ensure(*versions):
    for v in versions:
        install.ensure(install.ENGINES["vllm-v0"], v)


def _request(t, prompt: int, max_new: int) -> None:
    t.add(0, [2 + i % 5 for i in range(prompt)], max_new)
    t.requests[0].sampling_params.ignore_eos = True  # the length alone ends it


@pytest.mark.parametrize("version", ["0.5.4", "0.9.2"])
def test_e5_a_request_needing_every_block_is_preempted_forever_below_100_blocks(version):
    _ensure(version)
    # 2 blocks of 8: 8 prompt tokens and 3 to generate fit (max_model_len 16, the pool)
    t = ve.make_chunked(2, 8, budget=8, max_seqs=1, caching=False, version=version)
    assert t.manager.watermark_blocks == 0
    _request(t, 8, 3)
    seen = []
    for gen in range(40):
        r = t.step(gen)
        seen.append((t.status(0), sum(r.scheduled.values())))
    assert not t.is_finished(0)
    # the loop: re-admitted with its 10 tokens (two chunks of the budget 8), the first chunk
    # computed on both blocks, then preempted (can_append_slots: no free block), again
    tail = seen[-4:]
    assert tail in ([("RUNNING", 8), ("WAITING", 0)] * 2,
                    [("WAITING", 0), ("RUNNING", 8)] * 2), seen
    assert t.num_free() in (0, 2)


def test_e5_from_100_blocks_the_request_is_ignored_instead():
    """The watermark (1 block from 100 blocks) makes can_allocate answer NEVER for the
    re-admitted request: v0 finishes it as ignored, so the same shape ends."""
    _ensure("0.9.2")
    t = ve.make_chunked(100, 4, budget=128, max_seqs=1, caching=False, version="0.9.2")
    assert t.manager.watermark_blocks == 1
    _request(t, 300, 100)  # 400 tokens: every one of the 100 blocks
    for gen in range(200):
        t.step(gen)
        if t.is_finished(0):
            break
    assert t.status(0) == "FINISHED_IGNORED"
    # one block fewer (watermark 0) and the same request loops, as above
    t = ve.make_chunked(99, 4, budget=128, max_seqs=1, caching=False, version="0.9.2")
    _request(t, 300, 96)
    for gen in range(200):
        t.step(gen)
    assert not t.is_finished(0)


@pytest.mark.parametrize("version", ["0.7.3", "0.9.2"])
def test_e6_a_budget_below_the_block_size_schedules_no_prefill_with_prefix_caching(version):
    _ensure(version)
    for caching, budget, runs in ((True, 2, False), (False, 2, True), (True, 8, True)):
        t = ve.make_chunked(3, 8, budget=budget, max_seqs=2, caching=caching, version=version)
        _request(t, 1, 4)
        scheduled = sum(sum(t.step(gen).scheduled.values()) for gen in range(6))
        assert (scheduled > 0) == runs, (caching, budget, scheduled)


@pytest.mark.parametrize(("flags", "steps"), [
    (["--blocks", "2", "--block-size", "8", "--budget", "8", "--max-seqs", "1",
      "--no-prefix-caching"], "preempt"),
    (["--blocks", "3", "--block-size", "8", "--budget", "2", "--max-seqs", "2"], "nothing"),
])
def test_the_engine_model_reports_both_as_liveness(flags, steps, capsys):
    _ensure("0.9.2")
    code = kvcheck(["verify-engine", "vllm-v0-engine-chunked@0.9.2", *flags, "--requests", "1",
                    "--seed", "0", "--ops", "60", "--shrink-budget", "50"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "(liveness): every request the pool can hold finishes within the bound" in out, out
    assert ("scheduled {}" in out) and ("scheduled {'0'" in out) == (steps == "preempt"), out
