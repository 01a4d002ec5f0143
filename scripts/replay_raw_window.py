"""Replay a sliding-window kvcheck trace on vLLM v0's raw API, with no adapter in between.

    python scripts/replay_raw_window.py TRACE.json [--json]

For traces of ``kvcheck.impl.thirdparty.vllm_v0_sliding`` (``vllm-v0-sliding`` =
``:make``, ``:make_guarded``, ``:make_lazy``, ``:make_lazy_guarded``; sliding window
``S`` = the block size).
Each operation becomes the call ``SelfAttnBlockSpaceManager`` makes, written here
directly on vLLM 0.8.5's ``BlockTable`` / ``CpuGpuBlockAllocator`` (loaded from the
wheel, ``vllm_v0.load``; nothing of the adapter runs):

* every table is ``BlockTable(B, allocator, max_block_sliding_window=S // B + 2)``;
* ``allocate`` -> ``BlockTable.allocate(tokens)``; ``append_slot`` / ``append_slots``
  -> ``append_token_ids(tokens, num_lookahead_slots, num_computed_slots=len)``;
  ``drop_behind_window`` -> ``append_token_ids([], 0, num_computed_slots=len)``;
  ``fork`` -> ``BlockTable.fork()``; ``free_seq`` / ``preempt`` -> ``BlockTable.free()``;
* ``:make`` / ``:make_guarded``: ``num_blocks + 1`` GPU blocks and
  ``allocate_or_get_null_block()`` first (raw ids = the trace's + 1); the lazy ones:
  ``num_blocks`` blocks, the null block left to vLLM;
* the guarded ones: ``can_allocate`` first, as 0.8.5 computes it under a window
  (``min(get_num_required_blocks(tokens), max_block_sliding_window) <= free``), and
  ``can_append_slots`` (``get_num_blocks_touched_by_append_slots <= free``); a no is
  printed as ``refused`` and the call is not made.

After each step it prints what the call returned or raised and the allocator's
state read from its own fields (tables with ``null`` for a ``NullBlock`` entry, the
null block's id, refcounts, the free deque), then ``DEVIATION`` lines from checks
written here against that raw state only: a refcount that differs from the table
entries naming the block; a forked child whose table or token count is not its
parent's; a block both free and in a table; a block off the free
list that no table names (other than a null block taken before the first step); a
call that failed but changed the state; a call that raised something other than
``NoFreeBlocksError``; a guard that admitted a call which then ran out of blocks.
Exit 0 if it printed at least one deviation, 1 if none, 2 on bad input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvcheck.check.trace import Trace, TraceError  # noqa: E402

V0S = "kvcheck.impl.thirdparty.vllm_v0_sliding:"
TARGETS = {  # trace target -> (null block reserved first, guarded)
    "vllm-v0-sliding": (True, False),
    V0S + "make": (True, False),
    V0S + "make_guarded": (True, True),
    V0S + "make_lazy": (False, False),
    V0S + "make_lazy_guarded": (False, True),
}


def replay(trace: Trace) -> dict:
    from kvcheck.impl.thirdparty import vllm_v0

    if trace.target not in TARGETS:
        raise TraceError(f"no raw sliding-window replay for target {trace.target!r} "
                         f"(one of: {', '.join(TARGETS)})")
    reserved, guarded = TARGETS[trace.target]
    n, bs = trace.scope.num_blocks, trace.scope.block_size
    sliding_window = bs  # the factories' S
    window_blocks = sliding_window // bs + 2  # SelfAttnBlockSpaceManager's max_block_sliding_window
    mods = vllm_v0.load()
    BlockTable = mods["vllm.core.block.block_table"].BlockTable  # noqa: N806
    NullBlock = mods["vllm.core.block.cpu_gpu_block_allocator"].NullBlock  # noqa: N806
    gpu_dev = mods["vllm.utils"].Device.GPU
    total = n + 1 if reserved else n
    allocator = mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type="naive", num_gpu_blocks=total, num_cpu_blocks=0, block_size=bs)
    gpu = vllm_v0.gpu_allocator(allocator)
    pre_null = allocator.allocate_or_get_null_block().block_id if reserved else None
    tokens = itertools.count(1)
    tables: dict[int, Any] = {}

    def state() -> dict:
        null = allocator._null_block
        return {
            "tables": {s: ["null" if isinstance(b, NullBlock) else b.block_id for b in t.blocks]
                       for s, t in tables.items()},
            "num_full_slots": {s: t.num_full_slots for s, t in tables.items()},
            "null_block": None if null is None else null.block_id,
            "refcount": [gpu._refcounter.get(b) for b in range(total)],
            "free": vllm_v0.free_block_ids(gpu),
        }

    def check(op, before: dict, after: dict, name: str, result: Any) -> list[str]:
        out = []
        held = [0] * total
        for t in after["tables"].values():
            for b in t:
                if b != "null":
                    held[b] += 1
        for b in range(total):
            ref, free = after["refcount"][b], after["free"].count(b)
            if b == pre_null:
                continue
            if held[b] and ref != held[b]:
                out.append(f"block {b}: refcount {ref} but {held[b]} table entries name it")
            if held[b] and free:
                out.append(f"block {b} is both free and in a table")
            if not held[b] and not free:
                what = " (vLLM's NullBlock, taken in this step)" if (
                    b == after["null_block"] and before["null_block"] is None) else ""
                out.append(f"block {b} is off the free list but no table names it{what}")
        if name == "fork" and not (isinstance(result, str) and result.startswith("raised")):
            parent, child = op.seq, op.child
            if after["tables"][child] != after["tables"][parent]:
                out.append(f"fork: the child's table {after['tables'][child]} is not the "
                           f"parent's {after['tables'][parent]}")
            if after["num_full_slots"][child] != after["num_full_slots"][parent]:
                out.append(f"fork: the child holds {after['num_full_slots'][child]} tokens, "
                           f"the parent {after['num_full_slots'][parent]}")
        if isinstance(result, str) and result.startswith("raised"):
            if "NoFreeBlocksError" not in result:
                out.append(f"{name} {result}")
            for key in ("tables", "refcount", "free"):
                if before[key] != after[key]:
                    out.append(f"{name} failed ({result}) but changed {key}: "
                               f"{before[key]} -> {after[key]}")
            if guarded and "NoFreeBlocksError" in result:
                out.append(f"{name}: the engine's check admitted it, then it ran out of blocks")
        return out

    records, deviations = [], []
    for op in trace.ops:
        kind, seq = op.kind, op.seq
        before = state()
        result: Any = None
        try:
            free = allocator.get_num_free_blocks(gpu_dev)
            if kind == "allocate":
                toks = [next(tokens) for _ in range(op.n_tokens)]
                need = min(BlockTable.get_num_required_blocks(toks, bs), window_blocks)
                if guarded and need > free:
                    result = f"refused (can_allocate: {need} > {free} free)"
                else:
                    table = BlockTable(bs, allocator, max_block_sliding_window=window_blocks)
                    tables[seq] = table  # registered first: a failed allocate stays visible
                    table.allocate(toks)
            elif kind in ("append_slot", "append_slots", "drop_behind_window"):
                table = tables[seq]
                count = {"append_slot": 1, "append_slots": op.n_tokens}.get(kind, 0)
                look = op.lookahead if kind == "append_slots" else 0
                toks = [next(tokens) for _ in range(count)]
                touched = table.get_num_blocks_touched_by_append_slots(toks, look)
                if guarded and count and touched > free:
                    result = f"refused (can_append_slots: {touched} > {free} free)"
                else:
                    table.append_token_ids(toks, num_lookahead_slots=look,
                                           num_computed_slots=table.num_full_slots)
                    result = {"cows": allocator.clear_copy_on_writes()} if count else None
            elif kind == "fork":
                tables[op.child] = tables[seq].fork()
            elif kind in ("free_seq", "preempt"):
                tables.pop(seq).free()
            else:
                raise TraceError(f"operation {kind!r} has no raw v0 call")
        except TraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's own exception is the result
            result = f"raised {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
            if kind == "allocate" and not tables[seq].physical_block_ids:
                del tables[seq]
        after = state()
        records.append({"op": _fmt(op), "result": result, "state": after})
        deviations.append(check(op, before, after, kind, result))
    return {"target": trace.target, "records": records, "deviations": deviations}


def _fmt(op) -> str:
    args = {"allocate": f"seq={op.seq}, n_tokens={op.n_tokens}",
            "append_slots": f"seq={op.seq}, n_tokens={op.n_tokens}, lookahead={op.lookahead}",
            "drop_behind_window": f"seq={op.seq}, window={op.n_tokens}",
            "fork": f"parent={op.seq}, child={op.child}"}.get(op.kind, f"seq={op.seq}")
    return f"{op.kind}({args})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        trace = Trace.load(Path(args.trace))
        r = replay(trace)
    except (OSError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r, default=str, indent=1))
    else:
        print(f"raw vLLM 0.8.5 replay of {args.trace} ({trace.target}, "
              f"{trace.scope.num_blocks} blocks x {trace.scope.block_size})")
        for i, (op, rec, devs) in enumerate(zip(trace.ops, r["records"], r["deviations"], strict=True), 1):
            print(f"{i}. {_fmt(op)} -> {rec['result']!r}")
            for key, value in rec["state"].items():
                print(f"     {key}: {value}")
            for d in devs:
                print(f"  DEVIATION: {d}")
    return 0 if any(r["deviations"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
