"""``kvcheck plan``: the block-size trade-off table for a model and workload."""

from __future__ import annotations

from kvcheck.cli.commands.common import add_json, emit_json, positive_float, positive_int


def block_sizes(text: str) -> list[int]:
    import argparse

    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"block sizes must be positive integers, got {text!r}")
    return sizes


def add_parser(sub) -> None:
    import argparse

    from kvcheck.tools.planner import MODELS

    p = sub.add_parser("plan", help="block-size trade-offs for a model and workload",
                       description="Print KV bytes per token, tail waste (the spec's waste_bound), "
                                   "block-table size, prefix-match granularity and paged versus "
                                   "contiguous capacity for each block size. Exit 0, or 2 on "
                                   "bad input.")
    p.add_argument("--model", metavar="NAME",
                   help=f"preset model: {', '.join(MODELS)} (default: none; then give --layers, "
                        f"--kv-heads and --head-dim)")
    p.add_argument("--layers", type=positive_int, metavar="N",
                   help="transformer layers (default: the preset's)")
    p.add_argument("--kv-heads", type=positive_int, metavar="N",
                   help="KV heads per layer (default: the preset's)")
    p.add_argument("--head-dim", type=positive_int, metavar="N",
                   help="elements per head (default: the preset's)")
    p.add_argument("--dtype-bytes", type=positive_int, metavar="BYTES",
                   help="bytes per KV element (default: the preset's, else 2)")
    p.add_argument("--block-sizes", type=block_sizes, default=[16, 64, 128], metavar="TOKENS,...",
                   help="block sizes to compare, in tokens per block, comma-separated "
                        "(default: 16,64,128)")
    p.add_argument("--running-seqs", type=positive_int, default=256, metavar="N",
                   help="running sequences: the batch decoded together, in sequences "
                        "(default: %(default)s)")
    p.add_argument("--seqs", type=positive_int, dest="running_seqs", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old spelling, kept for scripts
    p.add_argument("--mean-len", type=positive_int, default=1500, metavar="TOKENS",
                   help="mean sequence length, in tokens (default: %(default)s)")
    p.add_argument("--max-len", type=positive_int, default=8192, metavar="TOKENS",
                   help="contiguous reservation per request, in tokens (default: %(default)s)")
    p.add_argument("--context", type=positive_int, default=131072, metavar="TOKENS",
                   help="context length for the block-table size, in tokens (default: "
                        "%(default)s)")
    p.add_argument("--shared-prompt", type=positive_int, default=1000, metavar="TOKENS",
                   help="shared prompt length for prefix-match granularity, in tokens (default: "
                        "%(default)s)")
    p.add_argument("--pool-tokens", type=positive_int, metavar="TOKENS",
                   help="KV pool size, in tokens (default: none; or derive it with --gpus)")
    p.add_argument("--gpus", type=positive_int, metavar="N",
                   help="derive the pool from this many GPUs instead (default: none)")
    p.add_argument("--gpu-mem-gib", type=positive_float, default=80.0, metavar="GIB",
                   help="memory per GPU, in GiB (default: %(default)g)")
    p.add_argument("--util", type=positive_float, default=0.92, metavar="FRACTION",
                   help="fraction of GPU memory for the engine, in (0, 1] (default: %(default)g)")
    p.add_argument("--weights-gib", type=positive_float, metavar="GIB",
                   help="model weights, in GiB (default: preset parameters x dtype bytes)")
    p.add_argument("--overhead-gib", type=positive_float, default=None, metavar="GIB",
                   help="activations etc., in GiB, total over the GPUs (default: 0)")
    add_json(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.tools.planner import Model, PlanError, get_model, plan, pool_from_gpus, render

    try:
        shape = (args.layers, args.kv_heads, args.head_dim)
        if args.model:
            model = get_model(args.model)
            if any(x is not None for x in shape) or args.dtype_bytes:
                base = model
                model = Model(base.name + " (modified)", args.layers or base.layers,
                              args.kv_heads or base.kv_heads, args.head_dim or base.head_dim,
                              args.dtype_bytes or base.dtype_bytes, base.params, base.source)
        elif all(x is not None for x in shape):
            model = Model("custom", *shape, args.dtype_bytes or 2)
        else:
            raise UsageError("give --model NAME or all of --layers, --kv-heads, --head-dim")
        if args.gpus and args.pool_tokens:
            raise UsageError("give --pool-tokens or --gpus, not both")
        if not 0 < args.util <= 1:
            raise UsageError(f"--util must be in (0, 1], got {args.util}")
        pool = args.pool_tokens
        if args.gpus:
            pool = pool_from_gpus(model, args.gpus, args.gpu_mem_gib, args.util,
                                  args.weights_gib, args.overhead_gib or 0.0)
        p = plan(model, args.block_sizes, args.running_seqs, args.mean_len, args.max_len, args.context,
                 args.shared_prompt, pool)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        emit_json(p.to_json())
    else:
        print(render(p))
    return 0
