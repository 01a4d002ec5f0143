"""vLLM v0's swapping under the tiers model (``impl/thirdparty/vllm_v0_swap.py``): the
release's own block manager v2 with its CPU pool. Fixed releases pass; vLLM PR #6849
(0.5.4) and PR #8824 (0.6.2) are caught with their clause in a few operations; findings
V1 and V2 (aborting a swapped-out request) shown with the release's own calls. Every
release used is installed by scripts/test.sh."""

from __future__ import annotations

import pytest

from kvcheck.impl.errors import MisuseError
from kvcheck.impl.thirdparty import vllm_v0_swap
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

SWAP = "kvcheck.impl.thirdparty.vllm_v0_swap"
ADMITTED_FAILS = "swap_in: a swap its admission check admits succeeds"


def _run(target, scope, ops, seed=0, mix=None):
    return verify(target, scope.num_blocks, scope.block_size, ops, seed, model="tiers",
                  scope=scope, extra={"weights": mix} if mix else None)


@pytest.mark.parametrize("target, version, scope, mix", [
    ("make_prefix_no_swapped_abort", "0.5.5", TierScope(6, 1, 8), {"swap": 3.0}),
    ("make_lookahead_no_swapped_abort", "0.6.3.post1", TierScope(4, 2, 4), None),
    ("make_no_swapped_abort", "0.8.5", TierScope(8, 2, 8), None),
])
def test_fixed_releases_pass_and_swap(target, version, scope, mix):
    r = _run(f"{SWAP}:{target}@{version}", scope, 1200, mix=mix)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["swap_out"] >= 20 and st["swap_in"] >= 20 and st["oob"], st


def test_pr_6849_caught_on_0_5_4():
    """A block cached in the evictor is not counted by the admission, yet the evictor
    counts it free: the swap the check admits runs out of blocks (on either pool)."""
    r = _run(f"{SWAP}:make_prefix_no_swapped_abort@0.5.4", TierScope(6, 1, 8), 3000,
             mix={"swap": 3.0})
    assert r.verdict == "fail"
    assert r.violation.name in (ADMITTED_FAILS,
                                "swap_out: a swap its admission check admits succeeds")
    assert len(r.trace.ops) <= 8, [MODEL.describe(op) for op in r.trace.ops]


def test_pr_8824_caught_on_0_6_2():
    """A full last block and lookahead slots: the admission counts the table's blocks
    only, the lookahead slots then find no block."""
    r = _run(f"{SWAP}:make_lookahead_no_swapped_abort@0.6.2", TierScope(4, 2, 4), 3000)
    assert r.verdict == "fail" and r.violation.name == ADMITTED_FAILS, r.violation
    ops = r.trace.ops
    assert len(ops) <= 4 and ops[-1].kind == "swap_in" and ops[-1].lookahead == 2, \
        [MODEL.describe(op) for op in ops]


def test_the_registered_name_takes_a_version_and_reports_v2():
    """``vllm-v0-swap-prefix@0.5.5`` frees any live sequence, as the engine's abort does:
    the abort of a swapped-out request is V2's crash, in a few operations."""
    r = _run("vllm-v0-swap-prefix@0.5.5", TierScope(4, 1, 4), 500)
    assert r.verdict == "fail" and r.violation.kind == "crash" and r.violation.name == "free"
    kinds = [op.kind for op in r.trace.ops]
    assert kinds[-1] == "free" and "swap_out" in kinds and len(kinds) <= 4, kinds
    with pytest.raises(TargetError, match="does not swap yet"):
        _run("vllm-v0-swap@0.4.3", TierScope(4, 1, 4), 10)


def _manager(version, caching, gpu=2, cpu=1):
    mods, cls = vllm_v0_swap.load(version)
    manager = cls(block_size=1, num_gpu_blocks=gpu, num_cpu_blocks=cpu, watermark=0.0,
                  enable_caching=caching)
    return manager, vllm_v0_swap._Seq, vllm_v0_swap._Group, vllm_v0_swap.SequenceStatus


@pytest.mark.parametrize("version", ["0.5.5", "0.8.5"])
def test_v2_aborting_a_swapped_out_prefix_cached_request_raises_key_error(version):
    """The release's own calls: a request scheduled once (its last access recorded),
    swapped out, then aborted: ``free`` hands the CPU block ids to the GPU allocator."""
    manager, seq_cls, group_cls, status = _manager(version, True)
    seq = seq_cls(0, [7])
    group = group_cls(seq)
    if hasattr(manager, "get_num_cached_tokens"):
        manager.get_num_cached_tokens(seq)
    manager.allocate(group)
    seq.status = status.RUNNING
    manager.access_all_blocks_in_seq(seq, 1.0)  # Scheduler.schedule, every step
    manager.swap_out(group)
    seq.status = status.SWAPPED
    with pytest.raises(KeyError):
        manager.free(seq)  # Scheduler.abort_seq_group -> free_seq


@pytest.mark.parametrize("version", ["0.5.5", "0.8.5"])
def test_v1_aborted_swapped_out_blocks_land_in_the_cpu_block_pool(version):
    """The release's own calls, naive allocators: the ``Block`` objects of a request
    swapped out and aborted go back to the CPU allocator's ``BlockPool``, under the GPU
    pool's ids: the CPU pool's free ids then name an object it does not have, and its next
    allocation (a swap-out) raises ``IndexError``."""
    manager, seq_cls, group_cls, status = _manager(version, False, gpu=4, cpu=1)
    cpu = manager.block_allocator._allocators[vllm_v0_swap.load(version)[0]["vllm.utils"].Device.CPU]
    pool = cpu._block_pool
    for n in range(64):  # a request admitted, swapped out, aborted; again
        seq = seq_cls(n, [7])
        group = group_cls(seq)
        manager.allocate(group)
        seq.status = status.RUNNING
        foreign = [i for i in pool._free_ids if i >= len(pool._pool)]
        assert manager.can_swap_out(group)
        try:
            manager.swap_out(group)
        except IndexError:
            assert foreign, "the CPU pool's free ids named only its own objects"
            break
        seq.status = status.SWAPPED
        manager.free(seq)
    else:
        pytest.fail("64 aborted swapped-out requests, no IndexError")
    assert n >= 4  # (the CPU pool holds 4 objects; the first aborts return ids it has)


def test_bad_sizes_are_refused():
    with pytest.raises(MisuseError):
        vllm_v0_swap.make(0, 2, 4)
