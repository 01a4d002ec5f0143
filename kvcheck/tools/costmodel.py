"""Swap or recompute a preempted sequence: a first-order cost model.

For a victim of ``n`` tokens:

    swap(n)       = 2 * (latency + n * kv_bytes_per_token / link_bytes_per_s)
                    (copy out to host memory, later copy back; each direction
                    pays a fixed latency: synchronisation and launching the
                    per-layer block copies)
    recompute(n)  = n / prefill_tokens_per_s
                    (prefill the prompt and everything generated again)

Swap wins above ``crossover = 2 * latency / (1 / prefill - 2 * kv / link)``
tokens when the link moves a token's KV faster than prefill recomputes it
(``2 * kv / link < 1 / prefill``); otherwise recompute wins at every length.

Everything here is a *model* with stated inputs, not a measurement: it ignores
contention for the link and for prefill compute, host-memory limits and the
quadratic part of attention in prefill (small next to the weights' FLOPs at
these lengths: under 10% for a 70B model at 8K tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.tools.planner import MODELS, Model

LLAMA_3_3_70B = MODELS["llama-3.3-70b"]  # params drive the prefill FLOPs estimate


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # effective, one direction


# PCIe 5.0 x16: 63 GB/s nominal per direction; ~80% of it is typically achieved.
PCIE5 = Link("PCIe 5.0 x16 (50 GB/s effective per direction)", 50e9)
PCIE4 = Link("PCIe 4.0 x16 (25 GB/s effective per direction)", 25e9)


LLAMA_2_7B = Model("Llama 2 7B", layers=32, kv_heads=32, head_dim=128, dtype_bytes=2, params=6.7e9,
                   source="meta-llama/Llama-2-7b-hf: 32 layers, 32 KV heads (MHA), head dim 128")


def prefill_rate(params: float, gpus: int = 8, peak_flops: float = 989e12,
                 mfu: float = 0.4) -> float:
    """Tokens/s of prefill: ``gpus * peak * mfu / (2 * params)`` (dense bf16 H100 by default)."""
    return gpus * peak_flops * mfu / (2 * params)


@dataclass(frozen=True)
class CostModel:
    kv_bytes_per_token: float
    link_bytes_per_s: float  # aggregate over the GPUs holding the KV
    prefill_tokens_per_s: float  # aggregate
    latency_s: float = 1e-3  # fixed cost per swap direction

    def swap_s(self, n: int) -> float:
        return 2 * (self.latency_s + n * self.kv_bytes_per_token / self.link_bytes_per_s)

    def recompute_s(self, n: int) -> float:
        return n / self.prefill_tokens_per_s

    def decide(self, n: int) -> str:
        return "swap" if self.swap_s(n) < self.recompute_s(n) else "recompute"

    def crossover(self) -> float | None:
        """Tokens above which swapping wins; None if recompute always wins."""
        per_token = (1 / self.prefill_tokens_per_s
                     - 2 * self.kv_bytes_per_token / self.link_bytes_per_s)
        if per_token <= 0:
            return None
        return 2 * self.latency_s / per_token


def default(gpus: int = 8, link: Link = PCIE5, model: Model = LLAMA_3_3_70B,
            latency_s: float = 1e-3, mfu: float = 0.4) -> CostModel:
    """``model`` on ``gpus`` H100s with tensor parallelism, each with its own ``link``.

    With tensor parallelism each GPU holds 1/gpus of every token's KV and
    moves it over its own link, so link bandwidth and prefill throughput both
    scale with ``gpus`` and the crossover does not depend on it.
    """
    return CostModel(model.kv_bytes_per_token, gpus * link.bytes_per_s,
                     prefill_rate(model.params, gpus, mfu=mfu), latency_s)


def scenarios() -> list[tuple[str, CostModel]]:
    base = dict(model=LLAMA_3_3_70B)
    return [
        ("8x H100, TP8, PCIe 5, 40% MFU", default(8, PCIE5, **base)),
        ("8x H100, TP8, PCIe 4, 40% MFU", default(8, PCIE4, **base)),
        ("8x H100, TP8, PCIe 5, 1 ms -> 5 ms latency", default(8, PCIE5, latency_s=5e-3, **base)),
        ("Llama 2 7B (MHA: 524,288 B/token), 1x H100, PCIe 4", default(1, PCIE4, model=LLAMA_2_7B)),
    ]


def report(cm: CostModel | None = None, lengths=(16, 64, 256, 1024, 4096)) -> str:
    """The decision with its numbers and assumptions, as printed by ``kvcheck simulate``."""
    m = LLAMA_3_3_70B
    cm = cm or default()
    lines = [
        f"swap or recompute ({m.name}: {m.layers} layers x {m.kv_heads} KV heads x head dim "
        f"{m.head_dim} x {m.dtype_bytes} B x 2 (K,V) = {m.kv_bytes_per_token:,} bytes per token)",
        f"  assumptions: host link {cm.link_bytes_per_s / 1e9:,.0f} GB/s aggregate per direction "
        "(default: 8x H100 SXM, tensor parallel 8, each GPU with its own PCIe 5.0 x16 link at "
        "50 GB/s effective);",
        f"  prefill {cm.prefill_tokens_per_s:,.0f} tokens/s (default: 8 x 989 TFLOPS bf16 dense "
        f"x 40% MFU / 2 x {m.params / 1e9:.1f}e9 FLOPs per token); {cm.latency_s * 1e3:g} ms "
        "fixed latency per swap direction; a model, not a measurement",
        f"  per token: swap out+in {2 * cm.kv_bytes_per_token / cm.link_bytes_per_s * 1e6:.2f} us, "
        f"recompute {1e6 / cm.prefill_tokens_per_s:.2f} us",
        "    tokens   swap (ms)   recompute (ms)   decision",
    ]
    for n in lengths:
        lines.append(f"    {n:6d}   {cm.swap_s(n) * 1e3:9.2f}   {cm.recompute_s(n) * 1e3:14.2f}   "
                     f"{cm.decide(n)}")
    x = cm.crossover()
    lines.append("  swapping wins above " + (f"{x:,.0f} tokens" if x is not None
                                             else "no length: recompute always wins"))
    for name, other in scenarios()[1:]:
        y = other.crossover()
        swap_us = 2 * other.kv_bytes_per_token / other.link_bytes_per_s * 1e6
        rec_us = 1e6 / other.prefill_tokens_per_s
        lines.append(f"  {name}: " + (f"swap wins above {y:,.0f} tokens" if y is not None
                                       else "recompute wins at every length (per token: swap "
                                       f"{swap_us:.2f} us vs recompute {rec_us:.2f} us)"))
    return "\n".join(lines)
