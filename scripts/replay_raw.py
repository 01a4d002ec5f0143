"""Replay a kvcheck trace on the raw third-party API, with no adapter in between.

    python scripts/replay_raw.py TRACE.json [--json]

Loads a kvcheck trace (``kvcheck.trace.Trace.load``), turns its operations into
the tuples of ``kvcheck.impl.thirdparty.raw`` and replays them through the raw
replay function for the trace's target:

=====================================================  ===========================================
trace ``target``                                       raw replay
=====================================================  ===========================================
``vllm-v1`` (``...vllm_v1:make``)                      ``replay_vllm_v1(ops, num_blocks + 1, bs)``
``...vllm_v1:make_no_cache``                           the same, ``enable_caching=False``
``vllm-v0`` (``...vllm_v0:make``)                      ``replay_vllm_v0(ops, n, bs, "naive")``
``vllm-v0-prefix`` (``...vllm_v0:make_prefix``)        ``replay_vllm_v0(ops, n, bs, "prefix_caching")``
``...vllm_v0:make_guarded`` / ``make_prefix_guarded``  ``replay_vllm_v0_guarded`` below, then the
                                                       unguarded ``replay_vllm_v0`` for comparison
``nano-vllm`` (``...nano_vllm:make``)                  ``replay_nano_vllm(ops, n, bs, checked=True)``
``sglang-token`` / ``sglang-paged``                    ``raw_sglang.replay_sglang_allocator(ops, n,
                                                       bs, paged)``
``...sglang_radix:make_evict_first``                   ``raw_sglang.replay_sglang_radix(ops, n, bs)``
=====================================================  ===========================================

SGLang ids are the trace's + 1 (SGLang's page 0 is its padding page); SGLang keeps no
refcounts, so the raw check's refcount is the holders SGLang itself records: a tree
page's ``lock_ref``, else the rows naming the page.

vLLM v1 is built with one more block than the trace's pool: the adapter does
the same, because vLLM reserves block 0 as its null block (so raw vLLM ids are
the trace's ids + 1).

After each step it prints what the third-party call returned or raised and the
third-party state read from its own fields, then ``DEVIATION`` lines from a
small check written here against the raw state only (independent of kvcheck's
oracle): a refcount that differs from the number of table entries naming the
block, a block both free and in a table, a block neither free nor held (leaked),
a table whose length is not ceil(tokens / block size), a call that failed but
changed the state, a call that raised something other than the allocator's
out-of-blocks signal, and (guarded v0) a refusal although the unguarded
allocator takes no new block for that step. Exit 0 if it printed at least one
deviation, 1 if the raw replay shows none, 2 on bad input.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvcheck.check.trace import Trace, TraceError  # noqa: E402
from kvcheck.impl.thirdparty import install, raw, raw_sglang  # noqa: E402

V0 = "kvcheck.impl.thirdparty.vllm_v0:"
V1 = "kvcheck.impl.thirdparty.vllm_v1:"
NANO = "kvcheck.impl.thirdparty.nano_vllm:"
SGL = "kvcheck.impl.thirdparty.sglang:"
SGL_RADIX = "kvcheck.impl.thirdparty.sglang_radix:"

# trace target -> (family, options)
TARGETS: dict[str, tuple[str, dict]] = {
    "vllm-v1": ("vllm-v1", {"enable_caching": True}),
    V1 + "make": ("vllm-v1", {"enable_caching": True}),
    V1 + "make_no_cache": ("vllm-v1", {"enable_caching": False}),
    "vllm-v0": ("vllm-v0", {"allocator_type": "naive"}),
    V0 + "make": ("vllm-v0", {"allocator_type": "naive"}),
    "vllm-v0-prefix": ("vllm-v0", {"allocator_type": "prefix_caching"}),
    V0 + "make_prefix": ("vllm-v0", {"allocator_type": "prefix_caching"}),
    V0 + "make_guarded": ("vllm-v0-guarded", {"allocator_type": "naive"}),
    V0 + "make_prefix_guarded": ("vllm-v0-guarded", {"allocator_type": "prefix_caching"}),
    "nano-vllm": ("nano-vllm", {}),
    NANO + "make": ("nano-vllm", {}),
    "sglang-token": ("sglang", {"paged": False}),
    SGL + "make_token": ("sglang", {"paged": False}),
    "sglang-paged": ("sglang", {"paged": True}),
    SGL + "make_paged": ("sglang", {"paged": True}),
    SGL_RADIX + "make_evict_first": ("sglang-radix", {}),
}

# What each library raises when it runs out of blocks (anything else raised is a crash).
OOB_RAISED = {"vllm-v0": ("NoFreeBlocksError",), "vllm-v0-guarded": ("NoFreeBlocksError",),
              "nano-vllm": (), "vllm-v1": (), "sglang": (), "sglang-radix": ()}


def raw_ops(trace: Trace) -> list[tuple]:
    """The trace's requested operations as ``raw`` tuples."""
    out = []
    for op in trace.ops:
        if op.kind == "allocate" and getattr(op, "tokens", ()):  # a prefix trace: its prompt
            out.append(("allocate", op.seq, len(op.tokens), list(op.tokens)))
        elif op.kind == "append_slot" and getattr(op, "tokens", ()):
            out.append(("append_slot", op.seq, op.tokens[0]))
        elif op.kind == "allocate":
            out.append(("allocate", op.seq, op.n_tokens))
        elif op.kind == "fork":
            out.append(("fork", op.seq, op.child))
        elif op.kind == "append_slots":
            out.append(("append_slots", op.seq, op.n_tokens, op.lookahead))
        else:
            out.append((op.kind, op.seq))
    return out


# -- guarded vLLM v0 ------------------------------------------------------------------
def replay_vllm_v0_guarded(ops: list[tuple], num_blocks: int, block_size: int,
                           allocator_type: str = "naive", version: str | None = None) -> list[dict]:
    """``raw.replay_vllm_v0`` with ``SelfAttnBlockSpaceManager``'s capacity checks first.

    The checks use vLLM's own functions: ``BlockTable.get_num_required_blocks``
    (allocate) and ``BlockTable.get_num_blocks_touched_by_append_slots`` (append_slot,
    append_slots with its lookahead),
    each against ``allocator.get_num_free_blocks(GPU)``, watermark 0. A refused
    step calls nothing and is recorded as ``refused by the engine guard``.
    """
    from kvcheck.impl.thirdparty import vllm_v0

    mods = vllm_v0.load(version)
    BlockTable = mods["vllm.core.block.block_table"].BlockTable  # noqa: N806
    GPU = mods["vllm.utils"].Device.GPU  # noqa: N806
    allocator = mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type=allocator_type, num_gpu_blocks=num_blocks, num_cpu_blocks=0,
        block_size=block_size)
    gpu = allocator._allocators[GPU]
    tokens = itertools.count(1)
    tables: dict[int, Any] = {}

    def state() -> dict:
        return {
            "tables": {s: list(t.physical_block_ids) for s, t in tables.items()},
            "num_full_slots": {s: t.num_full_slots for s, t in tables.items()},
            "refcount": [gpu._refcounter.get(b) for b in range(num_blocks)],
            "free": vllm_v0.free_block_ids(gpu),
            "num_free": allocator.get_num_free_blocks(GPU),
        }

    out = []
    for op in ops:
        try:
            free = allocator.get_num_free_blocks(GPU)
            if op[0] == "allocate":
                _, seq, n = op
                toks = [next(tokens) for _ in range(n)]
                need = BlockTable.get_num_required_blocks(toks, block_size)
                if need > free:
                    result = f"refused by the engine guard: {need} blocks required > {free} free"
                else:
                    table = BlockTable(block_size, allocator)
                    table.allocate(toks)
                    tables[seq] = table
                    result = None
            elif op[0] == "append_slot":
                table = tables[op[1]]
                tok = next(tokens)
                touched = table.get_num_blocks_touched_by_append_slots([tok], 0)
                if touched > free:
                    result = (f"refused by the engine guard: {touched} block(s) touched > "
                              f"{free} free")
                else:
                    table.append_token_ids([tok])
                    result = {"cows": vllm_v0.copy_pairs(allocator.clear_copy_on_writes())}
            elif op[0] == "append_slots":  # SelfAttnBlockSpaceManager.can_append_slots first
                _, seq, n, lookahead = op
                table = tables[seq]
                toks = [next(tokens) for _ in range(n)]
                touched = table.get_num_blocks_touched_by_append_slots(toks, lookahead)
                if touched > free:
                    result = (f"refused by the engine guard: {touched} block(s) touched > "
                              f"{free} free")
                else:
                    vllm_v0.append_tokens(table, toks, lookahead)
                    result = {"cows": vllm_v0.copy_pairs(allocator.clear_copy_on_writes())}
            elif op[0] == "fork":
                tables[op[2]] = tables[op[1]].fork()
                result = None
            else:
                tables.pop(op[1]).free()
                result = None
        except Exception as exc:  # noqa: BLE001 - a raw replay records everything
            result = f"raised {type(exc).__name__}: {exc}".rstrip(": ")
        out.append({"op": op, "result": result, **state()})
    return out


# -- an independent check of the raw state ---------------------------------------------
def _view(family: str, rec: dict, block_size: int) -> dict:
    """Normalise a raw record: tables, lengths, refcounts, free ids (raw ids)."""
    if family == "vllm-v1":
        refs = dict(enumerate(rec["ref_cnt"]))
        refs.pop(0)  # the null block: never handed out, ref_cnt not maintained
        return {"tables": rec["tables"], "lens": rec["num_computed_tokens"], "refs": refs,
                "free": rec["free_queue"]}
    if family.startswith("vllm-v0"):
        return {"tables": rec["tables"], "lens": rec["num_full_slots"],
                "refs": dict(enumerate(rec["refcount"])), "free": rec["free"]}
    if family.startswith("sglang"):  # SGLang page ids; holders as SGLang records them
        tables, locked = rec["pages"], rec.get("tree_pages_lock_ref", {})
        refs = {b: locked.get(b, sum(t.count(b) for t in tables.values()))
                for b in range(1, rec["num_pages"] + 1)}
        # An unlocked tree page is the tree's to evict: structurally free, as for every
        # prefix cache; the tree itself is compared on a failed step ("cache").
        free = rec["free_pages"] + [b for b, ref in locked.items() if ref == 0]
        return {"tables": tables, "lens": rec["lens"], "refs": refs, "free": free,
                **({"cache": locked} if family == "sglang-radix" else {})}
    return {"tables": rec["tables"], "lens": rec["len"], "refs": dict(enumerate(rec["ref_count"])),
            "free": rec["free"]}


def _failed(family: str, result: Any) -> str | None:
    """'oob', 'crash' or None for a step's recorded result."""
    if family.startswith("sglang") and isinstance(result, str) and result.startswith("alloc "):
        return "oob"  # "alloc returned None": SGLang's out-of-memory answer
    if isinstance(result, str):
        if result.startswith("refused"):
            return "oob"
        if result.startswith("raised "):
            name = result[len("raised "):].split(":")[0]
            return "oob" if name in OOB_RAISED[family] else "crash"
        return None
    if family == "vllm-v1" and result is None:
        return None
    if isinstance(result, dict) and result.get("can_allocate") is False:
        return "oob"
    if isinstance(result, dict) and result.get("can_append") is False:
        return "oob"
    return None


def deviations(family: str, records: list[dict], ops: list[tuple], block_size: int,
               unguarded: list[dict] | None = None) -> list[list[str]]:
    """Per step, the deviations from the seed semantics visible in the raw state."""
    out: list[list[str]] = []
    prev = None
    ahead: dict[int, int] = {}  # seq -> the most lookahead slots a successful append_slots asked
    for i, rec in enumerate(records):
        v = _view(family, rec, block_size)
        found: list[str] = []
        entries: dict[int, list[int]] = {}
        if ops[i][0] == "append_slots" and _failed(family, rec["result"]) is None:
            ahead[ops[i][1]] = max(ahead.get(ops[i][1], 0), ops[i][3])
        for seq, table in v["tables"].items():
            for b in table:
                entries.setdefault(b, []).append(seq)
            length = v["lens"].get(seq)
            most = -(-(length + ahead.get(seq, 0)) // block_size) if length is not None else 0
            if length is not None and not (-(-length // block_size) <= len(table) <= most):
                found.append(f"seq {seq}: {length} tokens in {len(table)} block(s) "
                             f"(ceil({length}/{block_size}) = {-(-length // block_size)})")
        free = list(v["free"])
        for b, ref in v["refs"].items():
            held = entries.get(b, [])
            if ref != len(held):
                found.append(f"block {b}: refcount {ref} but {len(held)} table "
                             f"{'entry names' if len(held) == 1 else 'entries name'} it"
                             + (f" (seqs {held})" if held else ""))
            if held and b in free:
                found.append(f"block {b} is on the free list while seqs {held} hold it")
            if not held and b not in free:
                found.append(f"block {b} is neither free nor in any table (leaked)")
        for b in {b for b in free if free.count(b) > 1}:
            found.append(f"block {b} is on the free list {free.count(b)} times")
        fail = _failed(family, rec["result"])
        if fail == "crash":
            found.append(f"{ops[i][0]} {rec['result']}")
        if (family == "vllm-v1" and ops[i][0] in ("allocate", "append_slot")
                and rec["result"] is None):
            fail = "oob"
        if fail == "oob":
            before = prev if prev is not None else {
                "tables": {}, "refs": {b: 0 for b in v["refs"]}, "free": sorted(v["refs"])}
            for key in ("tables", "refs", "cache"):
                if key in v and before.get(key, {}) != v[key]:
                    found.append(f"{ops[i][0]} failed ({rec['result']}) but changed {key}: "
                                 f"{before[key]} -> {v[key]}")
            if sorted(before["free"]) != sorted(v["free"]):
                found.append(f"{ops[i][0]} failed ({rec['result']}) but changed the free list: "
                             f"{sorted(before['free'])} -> {sorted(v['free'])}")
            if unguarded is not None and str(rec["result"]).startswith("refused"):
                u = unguarded[i]
                ok = _failed("vllm-v0", u["result"]) is None
                same_table = u["tables"].get(ops[i][1]) == rec["tables"].get(ops[i][1])
                appends = ops[i][0] in ("append_slot", "append_slots")
                if ok and same_table and appends and not u["result"]["cows"]:
                    found.append(f"refused, but unguarded vLLM writes the token in place "
                                 f"(table {u['tables'][ops[i][1]]}, no copy-on-write, "
                                 f"no new block)")
        out.append(found)
        prev = v
    return out


def _parse_op(text: str) -> tuple:
    kind, *nums = text.split(":")
    arity = {"allocate": 2, "append_slot": 1, "fork": 2, "free_seq": 1}
    if kind not in arity or len(nums) != arity[kind] or not all(n.isdigit() for n in nums):
        raise TraceError(f"bad --then operation {text!r} (e.g. free_seq:0, allocate:2:5)")
    return (kind, *map(int, nums))


def replay(trace: Trace, then: list[tuple] = ()) -> dict:
    """Replay ``trace`` raw (and ``then``); the records, unguarded comparison and deviations."""
    target, version = trace.target, None
    head, colon, attr = target.rpartition(":")
    if "@" in (attr if colon else target):  # TARGET@VERSION: that release of the engine
        target, _, version = target.rpartition("@")
    try:
        family, opts = TARGETS[target]
    except KeyError:
        raise TraceError(f"no raw replay for target {trace.target!r} "
                         f"(known: {', '.join(sorted(TARGETS))}, each also as TARGET@VERSION "
                         f"for the vLLM ones)") from None
    if version is not None:
        if family == "nano-vllm":
            raise TraceError(f"no raw replay for {trace.target!r}: nano-vllm has one release")
        opts = {**opts, "version": version}
    ops = raw_ops(trace) + list(then)
    n, bs = trace.num_blocks, trace.block_size
    unguarded = None
    if family == "vllm-v1":
        how = f"raw.replay_vllm_v1(ops, num_gpu_blocks={n + 1}, block_size={bs}, {_kw(opts)})"
        try:
            records = raw.replay_vllm_v1(ops, n + 1, bs, **opts)
        except (install.InstallError, install.ThirdPartyMissing) as exc:
            # e.g. a release before 0.10.2 (vllm_v1_early): its catalogued bugs have raw
            # replays in benchmarks/historical/hist_replays.py, traces have none yet
            raise TraceError(f"no raw replay for {trace.target!r}: {exc}") from None
    elif family == "vllm-v0":
        how = f"raw.replay_vllm_v0(ops, num_blocks={n}, block_size={bs}, {_kw(opts)})"
        records = raw.replay_vllm_v0(ops, n, bs, **opts)
    elif family == "vllm-v0-guarded":
        how = (f"replay_vllm_v0_guarded(ops, num_blocks={n}, block_size={bs}, {_kw(opts)}); "
               f"compare raw.replay_vllm_v0(ops, {n}, {bs}, {_kw(opts)})")
        records = replay_vllm_v0_guarded(ops, n, bs, **opts)
        unguarded = raw.replay_vllm_v0(copy.deepcopy(ops), n, bs, **opts)
    elif family == "sglang":
        how = f"raw_sglang.replay_sglang_allocator(ops, num_pages={n}, page_size={bs}, {_kw(opts)})"
        records = raw_sglang.replay_sglang_allocator(ops, n, bs, **opts)
    elif family == "sglang-radix":
        how = f"raw_sglang.replay_sglang_radix(ops, num_pages={n}, page_size={bs})"
        records = raw_sglang.replay_sglang_radix(ops, n, bs)
    else:
        how = f"raw.replay_nano_vllm(ops, num_blocks={n}, block_size={bs}, checked=True)"
        records = raw.replay_nano_vllm(ops, n, bs, checked=True)
    return {"family": family, "how": how, "ops": ops, "records": records,
            "unguarded": unguarded,
            "deviations": deviations(family, records, ops, bs, unguarded)}


def _kw(opts: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in opts.items())


def _fmt_op(op: tuple) -> str:
    if op[0] == "allocate":
        return f"allocate(seq={op[1]}, n_tokens={op[2]})"
    if op[0] == "fork":
        return f"fork(parent={op[1]}, child={op[2]})"
    if op[0] == "append_slots":
        return f"append_slots(seq={op[1]}, n_tokens={op[2]}, lookahead={op[3]})"
    return f"{op[0]}(seq={op[1]})"


def render(trace: Trace, r: dict) -> str:
    lines = [f"raw replay of {trace.target} on {trace.num_blocks} blocks x {trace.block_size} "
             f"slots: {r['how']}"]
    if r["family"] == "vllm-v1":
        lines.append("(vLLM ids: block 0 is vLLM's null block; vLLM id = trace id + 1)")
    for i, (op, rec, devs) in enumerate(zip(r["ops"], r["records"], r["deviations"], strict=True), 1):
        lines.append(f"{i}. {_fmt_op(op)} -> {rec['result']!r}")
        state = {k: v for k, v in rec.items() if k not in ("op", "result")}
        for k, v in state.items():
            lines.append(f"     {k}: {v}")
        if r["unguarded"] is not None:
            u = r["unguarded"][i - 1]
            lines.append(f"     unguarded vLLM: {u['result']!r}, tables {u['tables']}, "
                         f"num_full_slots {u['num_full_slots']}, "
                         f"refcount {u['refcount']}, free {u['free']}")
        for d in devs:
            lines.append(f"  DEVIATION: {d}")
    total = sum(len(d) for d in r["deviations"])
    first = next((i for i, d in enumerate(r["deviations"], 1) if d), None)
    summary = f"{total} deviation(s)" + (f", first at step {first}" if first else "")
    if trace.violation is not None:
        summary += f"; kvcheck recorded: step {trace.violation.step} {trace.violation.name}"
    lines.append(summary)
    return "\n".join(lines)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return obj
    return repr(obj)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", metavar="TRACE.json")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--then", action="append", default=[], metavar="OP",
                    help="replay one more operation after the trace's (repeatable): "
                         "allocate:SEQ:N, append_slot:SEQ, fork:PARENT:CHILD, free_seq:SEQ")
    args = ap.parse_args(argv)
    try:
        trace = Trace.load(args.trace)
        r = replay(trace, [_parse_op(text) for text in args.then])
    except TraceError as exc:
        print(f"replay_raw: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(_jsonable({k: v for k, v in r.items()}), sys.stdout, indent=1)
        print()
    else:
        print(render(trace, r))
    return 0 if any(r["deviations"]) else 1


if __name__ == "__main__":
    sys.exit(main())
