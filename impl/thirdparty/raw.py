"""Raw reproductions: replay operations on the third-party APIs with no adapter in between.

Each ``replay_*`` function takes a list of operations

    ("allocate", seq, n_tokens) | ("append_slot", seq) | ("fork", parent, child)
    | ("free_seq", seq) | ("append_slots", seq, n_tokens, lookahead)  (vLLM v0 only)

builds the third-party object itself (through ``_loader`` and the adapter
module's *stand-ins* only -- none of the ``*Target`` classes), performs each
operation with the third-party calls spelled out inline, and returns one
record per step: what the call returned or raised, and the third-party state
read straight from its own fields (vLLM v1 block ids are vLLM's, *including*
the null block 0). A finding reported through an adapter is shown not to be an
artifact of the adapter by replaying its operations here.

Token ids are ``1, 2, 3, ...`` in order of use, so every sequence's tokens are
distinct (no prefix-cache hits), as the oracle's are.
"""

from __future__ import annotations

import itertools
from typing import Any

Op = tuple


def record(op: Op, result: Any, state: dict) -> dict:
    return {"op": op, "result": result, **state}


def raised(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {exc}".rstrip(": ")


# -- vLLM v1 ----------------------------------------------------------------------
def replay_vllm_v1(ops: list[Op], num_gpu_blocks: int, block_size: int,
                   enable_caching: bool = True, version: str | None = None) -> list[dict]:
    """vLLM v1 ``KVCacheManager`` (0.33.0, or ``version``) with ``num_gpu_blocks`` blocks
    *including* the null block."""
    import inspect

    from . import vllm_v1

    mods = vllm_v1.load(version)
    iface = mods["vllm.v1.kv_cache_interface"]
    utils = mods["vllm.v1.core.kv_cache_utils"]
    hashing = mods["vllm.utils.hashing"]
    Request = mods["vllm.v1.request"].Request  # noqa: N806 - the stand-in class
    RequestStatus = mods["vllm.v1.request"].RequestStatus  # noqa: N806
    spec = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=mods["torch"].float16)
    config = iface.KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[],
                                 kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)])
    utils.init_none_hash(hashing.sha256)
    manager_cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    kwargs = {"max_model_len": 1 << 40, "scheduler_block_size": block_size,
              "hash_block_size": block_size, "enable_caching": enable_caching}
    params = inspect.signature(manager_cls.__init__).parameters  # the release's keywords
    manager = manager_cls(config, **{k: v for k, v in kwargs.items() if k in params})
    hasher = utils.get_request_block_hasher(block_size, hashing.sha256) if enable_caching else None
    pool = manager.block_pool
    tokens = itertools.count(1)
    reqs: dict[int, Any] = {}

    def state() -> dict:
        per_req = manager.coordinator.single_type_managers[0].req_to_blocks
        return {
            "tables": {s: [b.block_id for b in per_req.get(r.request_id, [])]
                       for s, r in reqs.items()},
            "num_computed_tokens": {s: r.num_computed_tokens for s, r in reqs.items()},
            "num_tokens": {s: r.num_tokens for s, r in reqs.items()},
            "ref_cnt": [b.ref_cnt for b in pool.blocks],
            "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "num_free": pool.get_num_free_blocks(),
        }

    out = []
    for op in ops:
        try:
            if op[0] == "allocate":
                _, seq, n = op
                req = Request(str(seq), [next(tokens) for _ in range(n)], hasher)
                got = manager.get_computed_blocks(req)  # 2 items to 0.20.x, 3 after
                computed, num_computed = got[0], got[1]
                got = manager.allocate_slots(req, n - num_computed, num_computed, computed)
                if got is not None:
                    req.num_computed_tokens = n
                    req.status = RequestStatus.RUNNING
                    reqs[seq] = req
                result = None if got is None else got.get_block_ids()
            elif op[0] == "append_slot":
                req = reqs[op[1]]
                req.append_output_token_ids(next(tokens))
                got = manager.allocate_slots(req, 1)
                if got is not None:
                    req.num_computed_tokens += 1
                result = None if got is None else got.get_block_ids()
            elif op[0] == "free_seq":
                req = reqs.pop(op[1])
                req.status = RequestStatus.FINISHED_STOPPED
                result = manager.free(req)
            else:
                result = "unsupported: vLLM v1 has no fork"
        except Exception as exc:  # noqa: BLE001 - a raw replay records everything
            result = raised(exc)
        out.append(record(op, result, state()))
    return out


# -- vLLM v0 ----------------------------------------------------------------------
def replay_vllm_v0(ops: list[Op], num_blocks: int, block_size: int,
                   allocator_type: str = "naive", version: str | None = None) -> list[dict]:
    """vLLM v0 ``BlockTable`` (0.8.5, or ``version``) on
    ``CpuGpuBlockAllocator.create(allocator_type, ...)``. Copy-on-writes are recorded as
    ``(src, dst)`` pairs whatever form the release returns them in."""
    from . import vllm_v0

    mods = vllm_v0.load(version)
    BlockTable = mods["vllm.core.block.block_table"].BlockTable  # noqa: N806
    Device = mods["vllm.utils"].Device  # noqa: N806
    allocator = mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type=allocator_type, num_gpu_blocks=num_blocks, num_cpu_blocks=0,
        block_size=block_size)
    gpu = allocator._allocators[Device.GPU]
    refcounter = getattr(gpu, "_refcounter", None)
    tokens = itertools.count(1)
    tables: dict[int, Any] = {}

    def state() -> dict:
        return {
            "tables": {s: list(t.physical_block_ids) for s, t in tables.items()},
            "block_objects": {s: [b.block_id for b in (t.blocks if hasattr(type(t), "blocks")
                                                          else t._blocks)]  # 0.4.x: no property
                              for s, t in tables.items()},
            "num_full_slots": {s: t.num_full_slots for s, t in tables.items()},
            "refcount": [refcounter.get(b) for b in range(num_blocks)],
            "free": vllm_v0.free_block_ids(gpu),
            "num_free": allocator.get_num_free_blocks(Device.GPU),
        }

    out = []
    for op in ops:
        try:
            if op[0] == "allocate":
                _, seq, n = op
                table = BlockTable(block_size, allocator)
                tables[seq] = table  # registered first: a failed allocate stays visible
                table.allocate([next(tokens) for _ in range(n)])
                result = None
            elif op[0] == "append_slot":
                tables[op[1]].append_token_ids([next(tokens)])
                result = {"cows": vllm_v0.copy_pairs(allocator.clear_copy_on_writes())}
            elif op[0] == "append_slots":  # SelfAttnBlockSpaceManager.append_slots
                _, seq, n, lookahead = op
                vllm_v0.append_tokens(tables[seq], [next(tokens) for _ in range(n)], lookahead)
                result = {"cows": vllm_v0.copy_pairs(allocator.clear_copy_on_writes())}
            elif op[0] == "fork":
                _, parent, child = op
                tables[child] = tables[parent].fork()
                result = None
            elif op[0] == "free_seq":
                tables.pop(op[1]).free()
                result = None
        except Exception as exc:  # noqa: BLE001
            result = raised(exc)
            if op[0] == "allocate" and not tables[op[1]].physical_block_ids:
                del tables[op[1]]
        out.append(record(op, result, state()))
    return out


# -- nano-vllm --------------------------------------------------------------------
def replay_nano_vllm(ops: list[Op], num_blocks: int, block_size: int,
                     checked: bool = True) -> list[dict]:
    """nano-vllm ``BlockManager``; with ``checked`` each action runs only if its
    ``can_allocate`` / ``can_append`` is true (as the scheduler does), else the
    action is called unconditionally."""
    from . import nano_vllm

    manager = nano_vllm.load()["nanovllm.engine.block_manager"].BlockManager(
        num_blocks, block_size)
    tokens = itertools.count(1)
    seqs: dict[int, Any] = {}

    def state() -> dict:
        return {
            "tables": {s: list(q.block_table) for s, q in seqs.items()},
            "len": {s: len(q) for s, q in seqs.items()},
            "ref_count": [b.ref_count for b in manager.blocks],
            "free": list(manager.free_block_ids),
            "hash_to_block_id": dict(manager.hash_to_block_id),
        }

    out = []
    for op in ops:
        try:
            if op[0] == "allocate":
                _, seq, n = op
                s = nano_vllm.new_sequence([next(tokens) for _ in range(n)], block_size)
                ok = manager.can_allocate(s)
                result = {"can_allocate": ok}
                if ok or not checked:
                    seqs[seq] = s
                    manager.allocate(s)
            elif op[0] == "append_slot":
                s = seqs[op[1]]
                s.append_token(next(tokens))
                ok = manager.can_append(s)
                result = {"can_append": ok}
                if ok or not checked:
                    manager.may_append(s)
            elif op[0] == "free_seq":
                manager.deallocate(seqs.pop(op[1]))
                result = None
            else:
                result = "unsupported: nano-vllm has no fork"
        except Exception as exc:  # noqa: BLE001
            result = raised(exc)
        out.append(record(op, result, state()))
    return out


REPLAYS = {
    "vllm-v1": replay_vllm_v1,
    "vllm-v0": replay_vllm_v0,
    "nano-vllm": replay_nano_vllm,
}
