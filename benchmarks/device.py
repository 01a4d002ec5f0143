"""Bandwidth of the device KV cache's kernels against a plain device-to-device copy.

One prepared script. On a CUDA machine it builds a realistic cache (default:
4,096 sequences of 250 tokens, block size 16, 8 KV heads, head dim 128,
bfloat16, one layer: about 4.3 GB of K+V; or ``--model llama-3.3-70b --tp N``:
Llama 3.3 70B's per-GPU shape, below), forks half the sequences so the
batched decode step has copy-on-write work, runs one batched step through the
``DeviceBlockManager`` (checked against the torch fallback), times the batched
step in a steady state, then times each kernel on its own:

    copy_blocks   every copy-on-write block copy of the step, one launch
    write_slots   every new token's K/V into its slot, one launch
    gather        every sequence's K/V read back through its block table

Bandwidth is bytes moved (read + written) over time, as for a copy, and each
kernel is compared with ``dst.copy_(src)`` moving the same number of bytes,
measured in the same run (and with a 1 GiB copy, the device's practical
peak). The goal is >= 0.80 of the same-size copy for every kernel. Every timed
run (kernel or copy) starts with a cold L2 on a GPU: a 256 MB buffer is
written before it, outside the timed region.

The batched decode step (``decode_step``: the reference bookkeeping in Python,
then one copy launch and one write launch) is timed twice: the first step
(Triton compiles the kernels for its shapes: a cold start) and the median of
``--reps`` steady steps, each over the same kind of batch: every parent forked
anew (so each fork copies its shared tail block on write), the step over those
forks and the first step's forks (writing in place), the new forks freed after.

``--model llama-3.3-70b --tp N`` is Llama 3.3 70B's KV cache on one of N GPUs
of a tensor-parallel group: 80 layers, 8 KV heads / N per GPU (grouped-query
attention: 64 query heads, 8 KV heads), head dim 128, block size 16, 256
sequences of 1,000 tokens (an odd tail, so forks copy on write), bfloat16.
N = 8 (1 KV head per GPU: bf16 weights of 141 GB need several 80 GB GPUs, and
8 is the usual node) and N = 4 (2 heads) are the shapes that fit one H100 with
room for the same-size copies. Any flag given explicitly overrides the preset.

On a machine without CUDA it runs a small size on the CPU and says so: that
run checks the script, it is not a GPU figure.

    python benchmarks/device.py [--model llama-3.3-70b --tp N]
                                [--seqs N] [--context T] [--block-size B] [--heads H]
                                [--head-dim D] [--layers L] [--dtype bfloat16]
                                [--backend auto|triton|torch] [--reps R] [--json]

Exit 0 on success (whatever the ratios), 1 when the step read back wrong
data, 2 on bad input (one line on stderr).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from kvcheck.cli.commands.common import OneLineParser, positive_int  # noqa: E402


class BadInput(Exception):
    pass


# Llama 3.3 70B (its config.json): 80 layers, 64 query heads, 8 KV heads, head dim 128.
MODELS = {"llama-3.3-70b": {"layers": 80, "kv_heads": 8, "head_dim": 128}}
PRESET = {"seqs": 256, "context": 1000, "block_size": 16, "dtype": "bfloat16"}
GPU_DEFAULTS = {"seqs": 4096, "context": 250, "heads": 8, "head_dim": 128, "layers": 1,
                "block_size": 16}
CPU_DEFAULTS = {"seqs": 64, "context": 40, "heads": 2, "head_dim": 64, "layers": 1,
                "block_size": 16}
FLUSH_BYTES = 256 << 20  # written before every timed run on a GPU: a cold L2 (50-60 MB)


def parse(argv):
    p = OneLineParser(prog="benchmarks/device.py", description="Time the device KV cache kernels against a plain copy.")
    p.add_argument("--model", choices=sorted(MODELS),
                   help="a model's per-GPU KV cache shape (with --tp): layers, KV heads, head dim; "
                        "256 sequences of 1,000 tokens, block size 16, bfloat16")
    p.add_argument("--tp", type=positive_int, default=None,
                   help="tensor-parallel GPUs the model's KV heads are split over (with --model; "
                        "default 8)")
    p.add_argument("--seqs", type=positive_int, help="sequences in the step (GPU 4096, CPU 64)")
    p.add_argument("--context", type=positive_int, help="tokens per sequence (GPU 250, CPU 40)")
    p.add_argument("--block-size", type=positive_int, help="tokens per block (16)")
    p.add_argument("--heads", type=positive_int, help="KV heads (GPU 8, CPU 2)")
    p.add_argument("--head-dim", type=positive_int, help="head dim (GPU 128, CPU 64)")
    p.add_argument("--layers", type=positive_int, help="layers (1)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="bfloat16")
    p.add_argument("--backend", choices=("auto", "triton", "torch"), default="auto")
    p.add_argument("--reps", type=positive_int, default=20,
                   help="timed repetitions (median), of each kernel and of the steady decode step")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        return run(args)
    except BadInput as exc:
        print(f"benchmarks/device.py: error: {exc}", file=sys.stderr)
        return 2


def shape(args, cuda: bool) -> dict | None:
    """Fill the flags not given: the model's preset (returned), else the device's defaults."""
    preset = None
    if args.model is None:
        if args.tp is not None:
            raise BadInput("--tp needs --model")
        defaults = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    else:
        m = MODELS[args.model]
        tp = 8 if args.tp is None else args.tp
        if m["kv_heads"] % tp:
            raise BadInput(f"--tp {tp} does not divide {args.model}'s {m['kv_heads']} KV heads")
        preset = {"model": args.model, "tp": tp, **m, "kv_heads_per_gpu": m["kv_heads"] // tp,
                  **PRESET}
        defaults = {"seqs": PRESET["seqs"], "context": PRESET["context"],
                    "block_size": PRESET["block_size"], "heads": m["kv_heads"] // tp,
                    "head_dim": m["head_dim"], "layers": m["layers"]}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return preset


def run(args) -> int:
    import torch

    from kvcheck.impl.device import DeviceBlockManager, kernels
    from kvcheck.impl.device.store import DTYPES

    cuda = torch.cuda.is_available()
    preset = shape(args, cuda)
    if args.seqs < 2:
        raise BadInput("--seqs must be at least 2 (half of them are forks)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = DTYPES[args.dtype]
    bs, L, H, D = args.block_size, args.layers, args.heads, args.head_dim
    parents = args.seqs // 2
    per_seq = -(-(args.context + 1) // bs)
    # the sequences' blocks, the first step's copies, and for the steady steps: each rep's
    # forks' copies (freed after it) and the first forks' growth by a token a step
    grow = -(-args.reps // bs) + 1
    num_blocks = args.seqs * per_seq + 2 * parents + (args.seqs - parents) * grow + 8
    esize = torch.tensor([], dtype=dtype).element_size()
    row_bytes = H * D * esize
    cache_bytes = 2 * L * num_blocks * bs * row_bytes
    gather_out = 2 * L * args.seqs * (args.context + 1) * row_bytes
    # the cache, then at most: the gather's same-size copy (source and destination, each
    # the size of its output), the 1 GiB copy's two buffers, the L2 flush
    need = cache_bytes + 2 * gather_out + 2 * (1 << 30) + FLUSH_BYTES
    if cuda:
        free, _ = torch.cuda.mem_get_info()
        if need > free:
            raise BadInput(f"needs {need / 1e9:.1f} GB of device memory, {free / 1e9:.1f} GB free")
    try:
        m = DeviceBlockManager(num_blocks, bs, num_layers=L, num_kv_heads=H, head_dim=D,
                               dtype=args.dtype, device=device, backend=args.backend)
    except ValueError as exc:  # MisuseError: e.g. --backend triton on a CPU
        raise BadInput(str(exc)) from None
    backend = m.backend

    # -- state: parents with a partial tail, each forked once ---------------------------
    g = torch.Generator(device="cpu").manual_seed(0)
    for q in range(parents):
        m.allocate(q, args.context)  # deterministic K/V, written by the write kernel
        m.fork(q, parents + q)
    seqs = list(range(args.seqs))
    if args.seqs % 2:
        m.allocate(args.seqs - 1, args.context)
    k = torch.randn(m.kv_shape(len(seqs)), generator=g).to(dtype).to(device)
    v = torch.randn(m.kv_shape(len(seqs)), generator=g).to(dtype).to(device)
    before = {q: m.gather(q) for q in (0, parents)}
    _sync(device)
    t0 = time.perf_counter()
    reserved = m.decode_step(seqs, k, v)
    _sync(device)
    first_step_s = time.perf_counter() - t0

    # -- correctness of the step (against the torch fallback's gather) -------------------
    ok = True
    for q in (0, parents):  # a parent (copied on write) and its fork (wrote in place)
        gk, gv = m.gather(q)
        ok &= torch.equal(gk[:, :-1], before[q][0]) and torch.equal(gk[:, -1], k[:, q])
        ok &= torch.equal(gv[:, :-1], before[q][1]) and torch.equal(gv[:, -1], v[:, q])
    tables = [m.tables[q] for q in seqs]
    lengths = [m.lens[q] for q in seqs]
    width = max(len(t) for t in tables)
    tab = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64,
                       device=device)
    lens = torch.tensor(lengths, device=device)
    total = sum(lengths)
    tok_seq = torch.repeat_interleave(torch.arange(len(seqs), device=device), lens,
                                      output_size=total)
    tok_pos = torch.arange(total, device=device) - (torch.cumsum(lens, 0) - lens)[tok_seq]
    few = tok_seq < 8
    ref_k, _ = kernels.gather(m.store.key, m.store.value, tab, tok_seq[few], tok_pos[few],
                              "torch")
    got_k, _ = kernels.gather(m.store.key, m.store.value, tab, tok_seq[few], tok_pos[few],
                              backend)
    ok &= torch.equal(ref_k, got_k)

    # -- the kernels, each alone, as in the step ----------------------------------------------
    pairs = [(src, blk) for blk, _, src in reserved if src is not None]
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=device)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=device)
    slots = torch.tensor([b * bs + o for b, o, _ in reserved], dtype=torch.int64, device=device)
    kc, vc = m.store.key, m.store.value
    block_bytes = bs * row_bytes
    rows = []

    def bench(name, fn, moved):
        t = _time(fn, device, args.reps)
        rows.append({"kernel": name, "bytes": moved, "seconds": t, "gbps": moved / t / 1e9})

    bench("copy_blocks", lambda: kernels.copy_blocks(kc, vc, src, dst, backend),
          2 * 2 * L * len(pairs) * block_bytes)
    bench("write_slots", lambda: kernels.write_slots(kc, vc, k, v, slots, backend),
          2 * 2 * L * len(seqs) * row_bytes)
    bench("gather", lambda: kernels.gather(kc, vc, tab, tok_seq, tok_pos, backend),
          2 * 2 * L * total * row_bytes)
    for r in rows:  # a plain copy moving the same bytes (read half, write half)
        r["copy_gbps"] = _plain_copy_gbps(r["bytes"] // 2, device, args.reps)
        r["ratio"] = r["gbps"] / r["copy_gbps"]
    peak = _plain_copy_gbps((1 << 30) if cuda else (64 << 20), device, args.reps)
    for r in rows:
        r["peak_ratio"] = r["gbps"] / peak

    # -- the batched decode step, steady: every parent forked anew, the step, forks freed --
    steady = _steady_steps(m, args, parents, seqs, device, dtype, g)
    ok &= steady["reads_back_correctly"]

    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    out = {
        "device": name, "gpu_figure": cuda, "backend": backend, "dtype": args.dtype,
        "torch": torch.__version__, "triton": getattr(kernels.triton, "__version__", None),
        "interpreted": kernels.interpreting() and backend == "triton" and not cuda,
        "preset": preset,
        "sequences": args.seqs, "context": args.context, "block_size": bs, "layers": L,
        "kv_heads": H, "head_dim": D, "num_blocks": num_blocks, "cache_bytes": cache_bytes,
        "copies": len(pairs), "writes": len(seqs), "gathered_tokens": total,
        "decode_step_first_seconds": first_step_s,
        "decode_step_seconds": steady["seconds"], "decode_step_reps": args.reps,
        "decode_step_copies": steady["copies"], "decode_step_writes": steady["writes"],
        "peak_copy_gbps": peak, "kernels": rows,
        "goal_met": min(r["ratio"] for r in rows) >= 0.8 if cuda else None,
        "step_reads_back_correctly": bool(ok),
    }
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        _report(out)
    return 0 if ok else 1


def _steady_steps(m, args, parents, seqs, device, dtype, g) -> dict:
    """The median of ``args.reps`` batched decode steps (after 2 untimed), each over the same
    kind of batch: a fresh fork of every parent (each copies its shared tail on write) and the
    first step's forks (each writes in place); the fresh forks are freed after each step. The
    last step is read back: a fresh fork is its parent plus its token, a first fork ends with
    its token."""
    import torch

    base = args.seqs  # fresh forks' ids: after every existing sequence
    firsts = [q for q in seqs if q >= parents]  # the first step's forks (and an odd one)
    batch = [base + q for q in range(parents)] + firsts
    k = torch.randn(m.kv_shape(len(batch)), generator=g).to(dtype).to(device)
    v = torch.randn(m.kv_shape(len(batch)), generator=g).to(dtype).to(device)
    times, ok, reserved = [], True, []
    for rep in range(args.reps + 2):
        for q in range(parents):
            m.fork(q, base + q)
        _sync(device)
        t0 = time.perf_counter()
        reserved = m.decode_step(batch, k, v)
        _sync(device)
        if rep >= 2:
            times.append(time.perf_counter() - t0)
        if rep == args.reps + 1:
            pk, pv = m.gather(0)
            ck, cv = m.gather(base)
            ok &= torch.equal(ck[:, :-1], pk) and torch.equal(ck[:, -1], k[:, 0])
            ok &= torch.equal(cv[:, :-1], pv) and torch.equal(cv[:, -1], v[:, 0])
            i = batch.index(firsts[0])
            fk, fv = m.gather(firsts[0])
            ok &= torch.equal(fk[:, -1], k[:, i]) and torch.equal(fv[:, -1], v[:, i])
        for q in range(parents):
            m.free_seq(base + q)
    return {"seconds": statistics.median(times), "reads_back_correctly": bool(ok),
            "copies": sum(1 for _, _, s in reserved if s is not None), "writes": len(batch)}


def _report(o) -> None:
    if not o["gpu_figure"]:
        print("CPU RUN: a small size on the CPU, to check the script. NOT a GPU figure.")
    p = o["preset"]
    if p:
        print(f"shape: {p['model']} on 1 of {p['tp']} tensor-parallel GPUs ({p['layers']} layers, "
              f"{p['kv_heads']} KV heads / {p['tp']} = {p['kv_heads_per_gpu']} per GPU, head dim "
              f"{p['head_dim']}){'; flags given override it' if _overridden(o) else ''}")
    print(f"device {o['device']}, backend {o['backend']}, {o['dtype']}, torch {o['torch']}, "
          f"triton {o['triton']}")
    print(f"cache: {o['num_blocks']:,} blocks x {o['block_size']} slots x {o['kv_heads']} heads "
          f"x {o['head_dim']} dims x {o['layers']} layer(s) = {o['cache_bytes'] / 1e9:.2f} GB "
          f"(K+V)")
    print(f"first step: {o['sequences']:,} sequences: {o['copies']:,} copy-on-write block "
          f"copies, {o['writes']:,} slot writes, {o['decode_step_first_seconds'] * 1e3:.1f} ms "
          f"(compiling included); reads back correctly: {o['step_reads_back_correctly']}")
    print(f"decode_step end to end (bookkeeping included), median of {o['decode_step_reps']}: "
          f"{o['decode_step_seconds'] * 1e3:.2f} ms for {o['decode_step_writes']:,} sequences, "
          f"{o['decode_step_copies']:,} copies")
    print(f"plain copy, 1 GiB: {o['peak_copy_gbps']:,.0f} GB/s" if o["gpu_figure"] else
          f"plain copy, 64 MiB: {o['peak_copy_gbps']:,.1f} GB/s")
    print(f"{'kernel':<12} {'MB moved':>10} {'time us':>10} {'GB/s':>9} "
          f"{'same-size copy GB/s':>20} {'ratio':>6} {'vs peak':>8}")
    for r in o["kernels"]:
        print(f"{r['kernel']:<12} {r['bytes'] / 1e6:>10.1f} {r['seconds'] * 1e6:>10.1f} "
              f"{r['gbps']:>9.1f} {r['copy_gbps']:>20.1f} {r['ratio']:>6.2f} "
              f"{r['peak_ratio']:>8.2f}")
    if o["gpu_figure"]:
        worst = min(r["ratio"] for r in o["kernels"])
        print(f"goal: every kernel >= 0.80 of the same-size copy: "
              f"{'met' if o['goal_met'] else 'NOT met'} (worst {worst:.2f})")


def _overridden(o) -> bool:
    p = o["preset"]
    return (o["layers"], o["kv_heads"], o["head_dim"], o["sequences"], o["context"],
            o["block_size"], o["dtype"]) != (p["layers"], p["kv_heads_per_gpu"], p["head_dim"],
                                             p["seqs"], p["context"], p["block_size"], p["dtype"])


def _plain_copy_gbps(nbytes: int, device, reps: int) -> float:
    """Bandwidth (bytes read + written per second) of ``dst.copy_(src)`` of ``nbytes``."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _time(lambda: dst.copy_(src), device, reps) / 1e9


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, after warm-up (compiles kernels); on a GPU
    each run starts with a cold L2 (a buffer larger than it written first, untimed)."""
    import torch

    for _ in range(3):
        fn()
    _sync(device)
    times = []
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if device.type == "cuda" else None
    for _ in range(reps):
        if device.type == "cuda":
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
