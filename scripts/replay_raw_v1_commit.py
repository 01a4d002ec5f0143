"""vLLM v1 publishes prefix-cache hashes before the KV is written: a raw replay.

    python scripts/replay_raw_v1_commit.py [--block-size B] [--fix] [--json]

No kvcheck adapter and no oracle: vLLM 0.33.0's own ``KVCacheManager`` (loaded from
the installed wheel through ``impl/thirdparty/_loader`` with the ``vllm_v1`` stand-ins
for the modules it imports), called in the order ``Scheduler.schedule()`` calls it
(``vllm/v1/core/sched/scheduler.py``, 0.33.0). The forward pass is simulated by a
dict ``kv[block_id] -> token ids written``: a step writes exactly the tokens the
scheduler left scheduled for it, after ``schedule()`` returned.

Three steps, ``SchedulingPolicy.PRIORITY``, chunked prefill, 4 usable blocks
(``num_gpu_blocks = 5``, block 0 is vLLM's null block):

1. schedule: A (priority 1, prompt 3B tokens) gets its first chunk of B tokens,
   C (priority 0, prompt B tokens) its whole prompt. Forward: both written.
   update_from_output: C samples one token.
2. schedule, running loop (lines 911-977): A's second chunk,
   ``allocate_slots(A, 2B)``: takes two blocks and *caches their hashes*
   (``cache_blocks(A, 3B)``). C's decode: ``allocate_slots(C, 1)`` is None, so
   the scheduler preempts ``max(running, key=(priority, arrival_time))`` = A,
   which is in ``scheduled_running_reqs``: its tokens are taken back and
   ``_preempt_request(A)`` -> ``kv_cache_manager.free(A)``; C's retry succeeds
   (it evicts A's last block, the head of the free queue). Forward: only C's
   token is written. A's second block was never written and keeps its hash.
   update_from_output: C has its two tokens (``max_tokens=2``) and finishes.
3. schedule, waiting loop (nothing is running): A resumes: ``get_computed_blocks(A)`` returns A's
   first *and second* block, ``num_computed_tokens = 2B``: the scheduler will
   compute only A's last block and attention reads the second block's KV, which
   no forward pass ever wrote.

``--fix`` replays the same steps with the rule vLLM PR #43569 proposes, spelled
out here on vLLM's own objects: on a free before the step's write, the blocks
``allocate_slots`` cached in that step lose their hash
(``BlockPool._maybe_evict_cached_block``); then step 3 hits only block one.

Exit 0 if the replay shows a hit on an unwritten block (the finding), 1 if not,
2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvcheck.impl.thirdparty import vllm_v1  # noqa: E402  (load() and the stand-ins only)


def replay(block_size: int, fix: bool = False) -> dict:
    mods = vllm_v1.load()
    iface = mods["vllm.v1.kv_cache_interface"]
    utils = mods["vllm.v1.core.kv_cache_utils"]
    hashing = mods["vllm.utils.hashing"]
    Request = mods["vllm.v1.request"].Request  # noqa: N806 - the stand-in class
    RequestStatus = mods["vllm.v1.request"].RequestStatus  # noqa: N806
    B = block_size  # noqa: N806
    spec = iface.FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=1,
                                   dtype=mods["torch"].float16)
    config = iface.KVCacheConfig(num_blocks=5, kv_cache_tensors=[],
                                 kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)])
    utils.init_none_hash(hashing.sha256)
    manager = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager(
        config, max_model_len=1 << 20, scheduler_block_size=B, hash_block_size=B,
        enable_caching=True)
    hasher = utils.get_request_block_hasher(B, hashing.sha256)
    pool = manager.block_pool
    kv: dict[int, list] = {}  # block id -> the token ids the forward pass wrote, slot by slot
    log: list[str] = []

    def blocks(req) -> list:
        return manager.coordinator.single_type_managers[0].req_to_blocks.get(req.request_id, [])

    def forward(scheduled: dict) -> None:
        """The step's forward pass: each scheduled request's KV for its scheduled tokens."""
        for req, n in scheduled.items():
            start = req.num_computed_tokens - n  # _update_after_schedule already advanced it
            for pos in range(start, start + n):
                b = blocks(req)[pos // B].block_id
                slots = kv.setdefault(b, [None] * B)
                slots[pos % B] = req.all_token_ids[pos]
            log.append(f"  forward: {req.request_id} writes tokens {start}..{start + n - 1}")

    def cached() -> dict:
        return {b.block_id: b.block_hash is not None for b in pool.blocks[1:]}

    a = Request("A", [100 + i for i in range(3 * B)], hasher)
    a.priority, a.arrival_time = 1, 0.0
    c = Request("C", [200 + i for i in range(B)], hasher)
    c.priority, c.arrival_time = 0, 1.0
    running: list = []

    # -- step 1 -------------------------------------------------------------------
    log.append("step 1: schedule (waiting loop)")
    scheduled: dict = {}
    for req, chunk in ((a, B), (c, B)):
        computed, hits, _ = manager.get_computed_blocks(req)
        got = manager.allocate_slots(req, chunk - hits, hits, computed)
        assert got is not None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = chunk  # _update_after_schedule
        scheduled[req] = chunk - hits
        running.append(req)
        log.append(f"  allocate_slots({req.request_id}, {chunk}): blocks "
                   f"{[b.block_id for b in blocks(req)]}")
    forward(scheduled)
    c.append_output_token_ids(300)  # update_from_output: C's sampled token
    log.append(f"  cache (block -> hashed): {cached()}")

    # -- step 2 -------------------------------------------------------------------
    log.append("step 2: schedule (running loop, PRIORITY)")
    scheduled = {}
    published_unwritten: list[int] = []
    got = manager.allocate_slots(a, 2 * B)  # A's second chunk: 2B prompt tokens
    assert got is not None
    scheduled[a] = 2 * B
    step_blocks = [b.block_id for b in got.blocks[0]]
    log.append(f"  allocate_slots(A, {2 * B}): new blocks {step_blocks}, cache (block -> "
               f"hashed) {cached()}")
    got = manager.allocate_slots(c, 1)
    log.append(f"  allocate_slots(C, 1) -> {None if got is None else 'blocks'}")
    if got is None:
        victim = max(running, key=lambda r: (r.priority, r.arrival_time))
        assert victim is a and a in scheduled
        running.remove(victim)
        del scheduled[victim]  # scheduled_running_reqs.remove + num_scheduled_tokens.pop
        if fix:  # PR #43569's rule: blocks cached this step, freed before the write, unhashed
            for b in blocks(victim):
                if b.block_id in step_blocks and b.block_hash is not None:
                    pool._maybe_evict_cached_block(b)
        manager.free(victim)  # _preempt_request
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        log.append("  preempt A (scheduled in this call): free(A)")
        got = manager.allocate_slots(c, 1)
        assert got is not None
        log.append(f"  allocate_slots(C, 1) retried: blocks {[b.block_id for b in blocks(c)]}")
    a.num_computed_tokens = 0
    c.num_computed_tokens += 1
    scheduled[c] = 1
    forward(scheduled)
    # update_from_output: C reaches its max_tokens (2) and finishes: _free_request
    c.append_output_token_ids(301)
    c.status = RequestStatus.FINISHED_LENGTH_CAPPED
    manager.free(c)
    running.remove(c)
    log.append("  update_from_output: C finishes (max_tokens 2): free(C)")
    published_unwritten = [bid for bid, h in cached().items()
                           if h and (kv.get(bid) is None or None in kv[bid])]
    log.append(f"  after the step: cache (block -> hashed) {cached()}; hashed but never "
               f"written: {published_unwritten}")

    # -- step 3 -------------------------------------------------------------------
    log.append("step 3: schedule (waiting loop, nothing running): A resumes")
    computed, hits, _ = manager.get_computed_blocks(a)
    hit_ids = [b.block_id for b in computed.blocks[0]]
    bad = [bid for i, bid in enumerate(hit_ids)
           if kv.get(bid) != a.all_token_ids[i * B : (i + 1) * B]]
    log.append(f"  get_computed_blocks(A): blocks {hit_ids}, num_computed_tokens {hits}")
    for bid in bad:
        log.append(f"  DEVIATION: cache hit on block {bid} whose KV was never written "
                   f"(written slots: {kv.get(bid)}); A will skip computing it")
    return {"block_size": B, "fix": fix, "hit_blocks": hit_ids, "num_computed_tokens": hits,
            "published_unwritten": published_unwritten, "unwritten_hits": bad, "log": log}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=2)
    ap.add_argument("--fix", action="store_true", help="replay with PR #43569's rule")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.block_size < 1:
        print("error: --block-size must be positive", file=sys.stderr)
        return 2
    out = replay(args.block_size, args.fix)
    if args.json:
        print(json.dumps(out))
    else:
        print("\n".join(out["log"]))
        print("FINDING: a cache hit returned a block whose KV was never written"
              if out["unwritten_hits"] else "no hit on an unwritten block")
    return 0 if out["unwritten_hits"] else 1


if __name__ == "__main__":
    sys.exit(main())
