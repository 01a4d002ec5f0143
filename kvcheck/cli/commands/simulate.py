"""``kvcheck simulate``: run a workload end to end through the reference scheduler."""

from __future__ import annotations

import sys
from pathlib import Path

from kvcheck.cli.commands.common import (
    Progress,
    add_json,
    add_pool,
    add_seed,
    check_outputs,
    emit_json,
    exit_code,
    nonneg_int,
    positive_float,
    positive_int,
)


def _watermarks(text: str) -> list[int]:
    import argparse

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative integers, got {text!r}")
    return values


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a scheduler workload end to end",
                       description="Run a seeded workload through the reference scheduler with "
                                   "the policy spec and pool invariants checked at every step; "
                                   "print the figures, the swap-or-recompute decision, and "
                                   "optionally plot them. Exit 0 when everything held, 1 on a "
                                   "violation, 2 on bad input.")
    p.add_argument("--requests", type=positive_int, default=120, metavar="N",
                   help="requests in the workload (default: %(default)s)")
    add_pool(p, 200, 16, "device pool size")
    p.add_argument("--watermark", type=nonneg_int, default=1, metavar="BLOCKS",
                   help="free blocks admission keeps in reserve, in blocks (default: %(default)s)")
    add_seed(p)
    p.add_argument("--max-prompt", type=positive_int, default=256, metavar="TOKENS",
                   help="longest prompt, in tokens (default: %(default)s)")
    p.add_argument("--max-new", type=positive_int, default=256, metavar="TOKENS",
                   help="longest output, in tokens (default: %(default)s)")
    p.add_argument("--arrival-steps", type=nonneg_int, default=0, metavar="STEPS",
                   help="spread arrivals over this many scheduler steps (default: %(default)s: "
                        "all at once)")
    p.add_argument("--mode", choices=("recompute", "swap", "auto"), default="recompute",
                   help="preemption: recompute, swap to a host pool, or auto (the cost model "
                        "decides per victim) (default: %(default)s)")
    p.add_argument("--host-blocks", type=positive_int, metavar="N",
                   help="host pool for swap, in blocks (default: 4 x --blocks)")
    p.add_argument("--link-gbps", type=positive_float, default=400.0, metavar="GB/S",
                   help="host link bandwidth, in GB/s aggregate per direction (default: "
                        "%(default)g, 8x PCIe 5 x16)")
    p.add_argument("--prefill-tps", type=positive_float, metavar="TOKENS/S",
                   help="prefill throughput, in tokens per second (default: 8x H100 bf16 at "
                        "40%% MFU, about 22,400)")
    p.add_argument("--swap-latency-ms", type=positive_float, default=1.0, metavar="MS",
                   help="fixed latency per swap direction, in milliseconds (default: %(default)g)")
    p.add_argument("--compare-watermarks", type=_watermarks, metavar="W,W,...",
                   help="also run these watermarks, in blocks, and print a comparison table "
                        "(default: none)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the run to FILE.png (needs matplotlib) (default: not drawn)")
    add_json(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.models.scheduler.workload import WorkloadError, check_scope
    from kvcheck.tools import costmodel
    from kvcheck.tools.simulate import plot, simulate, summary

    if args.plot:
        check_outputs((args.plot, "--plot"))
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'kvcheck[plot]'") from None
        kinds = FigureCanvasAgg.get_supported_filetypes()
        suffix = Path(args.plot).suffix.lstrip(".").lower()
        if suffix and suffix not in kinds:
            raise UsageError(f"--plot {args.plot}: cannot draw a .{suffix} file (name it "
                             f"FILE.png, or one of .{', .'.join(sorted(kinds))})")
    m = costmodel.LLAMA_3_3_70B
    cost = costmodel.CostModel(
        m.kv_bytes_per_token, args.link_gbps * 1e9,
        args.prefill_tps or costmodel.prefill_rate(m.params), args.swap_latency_ms / 1e3)
    marks = [args.watermark] + [w for w in (args.compare_watermarks or []) if w != args.watermark]
    for w in marks:
        try:
            check_scope(args.blocks, args.block_size, w)
        except WorkloadError as exc:
            raise UsageError(str(exc)) from None
    sims = []
    bar = None if args.json else Progress(len(marks), "simulate", "runs")
    try:
        for w in marks:
            if bar:
                bar.say(f"simulate: watermark {w}, {len(sims) + 1} of {len(marks)} run(s), "
                        f"{args.requests} requests")
            sims.append(simulate(args.requests, args.blocks, args.block_size, w, args.seed,
                                 args.mode, args.max_prompt, args.max_new, args.arrival_steps,
                                 args.host_blocks, cost))
    finally:
        if bar:
            bar.close()
    sim = sims[0]
    written = True
    if args.plot:
        try:
            plot(sim, args.plot)
        except (OSError, ValueError) as exc:
            written = False
            print(f"kvcheck: error: cannot write --plot {args.plot}: "
                  f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
    ok = all(s.run.violation is None for s in sims)
    if args.json:
        out = sim.to_json(series=False)
        out["cost_model"] = {"kv_bytes_per_token": cost.kv_bytes_per_token,
                             "link_bytes_per_s": cost.link_bytes_per_s,
                             "prefill_tokens_per_s": cost.prefill_tokens_per_s,
                             "latency_s": cost.latency_s, "crossover_tokens": cost.crossover()}
        if len(sims) > 1:
            out["compare"] = [s.to_json() for s in sims]
        emit_json(out)
        return exit_code(0 if ok else 1, written)
    print(summary(sim))
    if len(sims) > 1:
        print("watermark comparison (same workload shape, same seed):")
        print("  watermark  steps  preemptions  ping-pongs  recomputed  lowest free  leaked")
        for s in sims:
            st = s.stats
            print(f"  {s.watermark:9d}  {st.steps:5d}  {st.preemptions:11d}  {st.pingpongs:10d}  "
                  f"{st.recomputed_tokens:10,d}  {st.min_free:11d}  {st.leaked:6d}")
    print(costmodel.report(cost))
    if args.plot and written:
        print(f"plot written to {args.plot}")
    return exit_code(0 if ok else 1, written)
