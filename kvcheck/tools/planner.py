"""Block-size planner: what a block size costs and buys, in bytes and requests.

The basis is the waste bound the spec already states and the oracle checks
after every operation, ``kvcheck.spec.invariants.waste_bound``: every block
of a sequence but the last is full, so a sequence wastes at most
``block_size - 1`` token slots. With final lengths spread evenly over a
block, the mean tail waste is ``(block_size - 1) / 2`` slots.

For each block size ``s`` the planner reports

* KV bytes per token: ``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``
* worst / mean tail waste per sequence: ``s - 1`` / ``(s - 1) / 2`` tokens, and bytes
* mean waste across a running batch of ``seqs`` sequences
* block-table entries for one sequence at a context length: ``ceil(ctx / s)``
* prefix-match granularity: of a shared prompt of ``P`` tokens only the full
  blocks are shared (``floor(P / s) * s``), the rest is recomputed on a hit
* capacity, given a pool of KV tokens: contiguous reservation of ``max_len``
  per request (``floor(pool / max_len)``) versus paged at mean length ``T``
  (``floor(pool / (T + (s - 1) / 2))``).

Units: MiB = 2**20 bytes, GiB = 2**30 bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MIB, GIB = 2**20, 2**30


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    params: float = 0.0  # parameter count (for the weights' share of GPU memory)
    source: str = ""

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


# Published shapes (config.json of each model's official release); bf16 KV.
MODELS = {
    m.name: m for m in (
        Model("llama-3.3-70b", 80, 8, 128, 2, 70.6e9,
              "meta-llama/Llama-3.3-70B-Instruct: 80 layers, 8 KV heads, head dim 128"),
        Model("llama-3.1-8b", 32, 8, 128, 2, 8.03e9,
              "meta-llama/Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128"),
        Model("llama-3.1-405b", 126, 8, 128, 2, 405.9e9,
              "meta-llama/Llama-3.1-405B: 126 layers, 8 KV heads, head dim 128"),
        Model("qwen2.5-72b", 80, 8, 128, 2, 72.7e9,
              "Qwen/Qwen2.5-72B: 80 layers, 8 KV heads, head dim 128"),
        Model("mistral-7b", 32, 8, 128, 2, 7.24e9,
              "mistralai/Mistral-7B-v0.1: 32 layers, 8 KV heads, head dim 128"),
    )
}


class PlanError(ValueError):
    """Bad planner input (one line)."""


def get_model(name: str) -> Model:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise PlanError(f"unknown model {name!r}; presets: {', '.join(MODELS)}") from None


def pool_from_gpus(model: Model, gpus: int, gpu_mem_gib: float, util: float,
                   weights_gib: float | None = None, overhead_gib: float = 0.0) -> int:
    """KV tokens that fit: (gpus x memory x util - weights - overhead) / KV bytes per token."""
    if weights_gib is None:
        if not model.params:
            raise PlanError("--weights-gib is needed for a custom shape with --gpus")
        weights = model.params * model.dtype_bytes
    else:
        weights = weights_gib * GIB
    budget = gpus * gpu_mem_gib * GIB * util - weights - overhead_gib * GIB
    if budget <= 0:
        raise PlanError(f"the weights ({weights / GIB:.1f} GiB) and overhead do not fit in "
                        f"{gpus} x {gpu_mem_gib} GiB at utilisation {util}")
    return int(budget // model.kv_bytes_per_token)


@dataclass
class Row:
    block_size: int
    worst_waste_tokens: int
    worst_waste_bytes: int
    mean_waste_tokens: float
    mean_waste_bytes: float
    batch_mean_waste_bytes: float
    table_entries: int
    prefix_shared_tokens: int
    prefix_recomputed_tokens: int
    paged_requests: int | None
    contiguous_requests: int | None


@dataclass
class Plan:
    model: Model
    seqs: int
    mean_len: int
    max_len: int
    context: int
    shared_prompt: int
    pool_tokens: int | None
    rows: list[Row]

    def to_json(self) -> dict:
        return {
            "model": asdict(self.model),
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "seqs": self.seqs, "mean_len": self.mean_len, "max_len": self.max_len,
            "context": self.context, "shared_prompt": self.shared_prompt,
            "pool_tokens": self.pool_tokens,
            "waste_bound": "kvcheck.spec.invariants.waste_bound",
            "rows": [asdict(r) for r in self.rows],
        }


def plan(model: Model, block_sizes, seqs: int = 256, mean_len: int = 1500, max_len: int = 8192,
         context: int = 131072, shared_prompt: int = 1000, pool_tokens: int | None = None) -> Plan:
    for what, v in (("block size", min(block_sizes, default=0)), ("seqs", seqs),
                    ("mean length", mean_len), ("max length", max_len), ("context", context),
                    ("shared prompt", shared_prompt), ("layers", model.layers),
                    ("KV heads", model.kv_heads), ("head dim", model.head_dim),
                    ("dtype bytes", model.dtype_bytes)):
        if v < 1:
            raise PlanError(f"{what} must be positive, got {v}")
    if pool_tokens is not None and pool_tokens < 1:
        raise PlanError(f"pool tokens must be positive, got {pool_tokens}")
    kv = model.kv_bytes_per_token
    rows = []
    for s in block_sizes:
        mean = (s - 1) / 2
        shared = shared_prompt // s * s
        rows.append(Row(
            s, s - 1, (s - 1) * kv, mean, mean * kv, seqs * mean * kv,
            math.ceil(context / s), shared, shared_prompt - shared,
            None if pool_tokens is None else int(pool_tokens // (mean_len + mean)),
            None if pool_tokens is None else pool_tokens // max_len,
        ))
    return Plan(model, seqs, mean_len, max_len, context, shared_prompt, pool_tokens, rows)


def _mib(x: float) -> str:
    return f"{x / MIB:,.2f} MiB"


def render(p: Plan) -> str:
    m = p.model
    lines = [
        f"{m.name}: {m.layers} layers x {m.kv_heads} KV heads x head dim {m.head_dim} x "
        f"{m.dtype_bytes} B -> {m.kv_bytes_per_token:,} B of KV per token (K and V, all layers)",
    ]
    head = ["block", "worst waste/seq", "mean waste/seq", f"mean waste, {p.seqs} seqs",
            f"table entries @ {p.context:,}", f"shared of {p.shared_prompt:,}-tok prompt"]
    if p.pool_tokens is not None:
        head.append(f"paged reqs @ mean {p.mean_len:,}")
    body = []
    for r in p.rows:
        cells = [str(r.block_size),
                 f"{r.worst_waste_tokens} tok = {_mib(r.worst_waste_bytes)}",
                 f"{r.mean_waste_tokens:g} tok = {_mib(r.mean_waste_bytes)}",
                 f"{r.batch_mean_waste_bytes / GIB:,.2f} GiB",
                 f"{r.table_entries:,}",
                 f"{r.prefix_shared_tokens:,} ({r.prefix_recomputed_tokens} recomputed)"]
        if p.pool_tokens is not None:
            cells.append(f"{r.paged_requests:,}")
        body.append(cells)
    widths = [max(len(c[i]) for c in [head, *body]) for i in range(len(head))]
    for cells in [head, ["-" * w for w in widths], *body]:
        lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    if p.pool_tokens is not None:
        contiguous = p.pool_tokens // p.max_len
        lines.append(f"pool {p.pool_tokens:,} KV tokens: contiguous reservation of "
                     f"{p.max_len:,} per request = {contiguous:,} requests; paged as above")
    lines.append("waste bound: at most block_size - 1 slots per sequence, the spec invariant "
                 "kvcheck.spec.invariants.waste_bound (checked by the oracle after every "
                 "operation); the mean assumes final lengths uniform within a block")
    return "\n".join(lines)
