"""Bandwidth of the device KV cache's kernels against a plain device-to-device copy.

One prepared script. On a CUDA machine it builds a realistic cache (default:
4,096 sequences of 250 tokens, block size 16, 8 KV heads, head dim 128,
bfloat16, one layer: about 4.3 GB of K+V), forks half the sequences so the
batched decode step has copy-on-write work, runs one batched step through the
``DeviceBlockManager`` (checked against the torch fallback), then times each
kernel on its own:

    copy_blocks   every copy-on-write block copy of the step, one launch
    write_slots   every new token's K/V into its slot, one launch
    gather        every sequence's K/V read back through its block table

Bandwidth is bytes moved (read + written) over time, as for a copy, and each
kernel is compared with ``dst.copy_(src)`` moving the same number of bytes,
measured in the same run (and with a 1 GiB copy, the device's practical
peak). The goal is >= 0.80 of the same-size copy for every kernel.

On a machine without CUDA it runs a small size on the CPU and says so: that
run checks the script, it is not a GPU figure.

    python benchmarks/device.py [--seqs N] [--context T] [--block-size B] [--heads H]
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


def parse(argv):
    p = OneLineParser(prog="benchmarks/device.py", description="Time the device KV cache kernels against a plain copy.")
    p.add_argument("--seqs", type=positive_int, help="sequences in the step (GPU 4096, CPU 64)")
    p.add_argument("--context", type=positive_int, help="tokens per sequence (GPU 250, CPU 40)")
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--heads", type=positive_int, help="KV heads (GPU 8, CPU 2)")
    p.add_argument("--head-dim", type=positive_int, help="head dim (GPU 128, CPU 64)")
    p.add_argument("--layers", type=positive_int, default=1)
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="bfloat16")
    p.add_argument("--backend", choices=("auto", "triton", "torch"), default="auto")
    p.add_argument("--reps", type=positive_int, default=20, help="timed repetitions (median)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        return run(args)
    except BadInput as exc:
        print(f"benchmarks/device.py: error: {exc}", file=sys.stderr)
        return 2


def run(args) -> int:
    import torch

    from kvcheck.impl.device import DeviceBlockManager, kernels
    from kvcheck.impl.device.store import DTYPES

    cuda = torch.cuda.is_available()
    big = {"seqs": 4096, "context": 250, "heads": 8, "head_dim": 128}
    small = {"seqs": 64, "context": 40, "heads": 2, "head_dim": 64}
    for name, value in (big if cuda else small).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.seqs < 2:
        raise BadInput("--seqs must be at least 2 (half of them are forks)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = DTYPES[args.dtype]
    bs, L, H, D = args.block_size, args.layers, args.heads, args.head_dim
    parents = args.seqs // 2
    per_seq = -(-(args.context + 1) // bs)
    num_blocks = args.seqs * per_seq + parents + 8
    esize = torch.tensor([], dtype=dtype).element_size()
    row_bytes = H * D * esize
    cache_bytes = 2 * L * num_blocks * bs * row_bytes
    gather_out = 2 * L * args.seqs * (args.context + 1) * row_bytes
    need = cache_bytes + gather_out + 2 * (1 << 30)
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
    step_s = time.perf_counter() - t0

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

    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    out = {
        "device": name, "gpu_figure": cuda, "backend": backend, "dtype": args.dtype,
        "sequences": args.seqs, "context": args.context, "block_size": bs, "layers": L,
        "kv_heads": H, "head_dim": D, "num_blocks": num_blocks, "cache_bytes": cache_bytes,
        "copies": len(pairs), "writes": len(seqs), "gathered_tokens": total,
        "decode_step_seconds": step_s, "peak_copy_gbps": peak, "kernels": rows,
        "step_reads_back_correctly": bool(ok),
    }
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        _report(out)
    return 0 if ok else 1


def _report(o) -> None:
    if not o["gpu_figure"]:
        print("CPU RUN: a small size on the CPU, to check the script. NOT a GPU figure.")
    print(f"device {o['device']}, backend {o['backend']}, {o['dtype']}")
    print(f"cache: {o['num_blocks']:,} blocks x {o['block_size']} slots x {o['kv_heads']} heads "
          f"x {o['head_dim']} dims x {o['layers']} layer(s) = {o['cache_bytes'] / 1e9:.2f} GB "
          f"(K+V)")
    print(f"step: {o['sequences']:,} sequences: {o['copies']:,} copy-on-write block copies, "
          f"{o['writes']:,} slot writes; decode_step end to end (bookkeeping included) "
          f"{o['decode_step_seconds'] * 1e3:.1f} ms; reads back correctly: "
          f"{o['step_reads_back_correctly']}")
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
              f"{'met' if worst >= 0.8 else 'NOT met'} (worst {worst:.2f})")


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
    """Median seconds of ``fn`` over ``reps`` runs, after warm-up (compiles kernels)."""
    import torch

    for _ in range(3):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
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
