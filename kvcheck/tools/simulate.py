"""End-to-end scheduler simulation, checked by the scheduler model at every step.

``simulate`` runs one seeded workload through the reference policy (recompute,
swap, or the cost model deciding per victim), with the policy spec and the
block managers' invariants checked after every step, and returns the
figures: requests finished, steps, preemptions, ping-pongs, recomputed and
swapped tokens, free blocks (peak, lowest, final) and leaked blocks.
``plot`` draws free blocks, running/waiting counts and preemptions over time.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path

from kvcheck.impl.scheduler import Scheduler
from kvcheck.impl.swap import SwapScheduler
from kvcheck.models.scheduler.runs import Run, run_workload
from kvcheck.models.scheduler.workload import generate
from kvcheck.tools import costmodel

MODES = ("recompute", "swap", "auto")


@dataclass
class Simulation:
    mode: str
    num_blocks: int
    block_size: int
    watermark: int
    seed: int
    run: Run
    cost: costmodel.CostModel

    @property
    def stats(self):
        return self.run.stats

    def modelled_seconds(self) -> dict:
        """Preemption overhead under the cost model (tokens scaled to the 70B model)."""
        s, cm = self.stats, self.cost
        recompute = s.recomputed_tokens / cm.prefill_tokens_per_s
        swaps = s.swapped_in_tokens * cm.kv_bytes_per_token / cm.link_bytes_per_s
        swaps += s.swapped_out_tokens * cm.kv_bytes_per_token / cm.link_bytes_per_s
        return {"recompute_s": recompute, "swap_transfer_s": swaps}

    def to_json(self, series: bool = False) -> dict:
        v = self.run.violation
        return {"mode": self.mode, "blocks": self.num_blocks, "block_size": self.block_size,
                "watermark": self.watermark, "seed": self.seed,
                "verdict": "pass" if v is None else "fail",
                "violation": None if v is None else v.to_json(),
                **self.stats.to_json(series), **self.modelled_seconds()}


def factory_for(mode: str, cost: costmodel.CostModel, host_blocks: int | None = None):
    if mode == "recompute":
        return Scheduler
    decide = cost.decide if mode == "auto" else None
    return functools.partial(SwapScheduler, host_blocks=host_blocks, decide=decide)


def simulate(requests: int = 120, num_blocks: int = 200, block_size: int = 16, watermark: int = 1,
             seed: int = 0, mode: str = "recompute", max_prompt: int = 256, max_new: int = 256,
             arrival_steps: int = 0, host_blocks: int | None = None,
             cost: costmodel.CostModel | None = None) -> Simulation:
    """Raises ``kvcheck.workload.WorkloadError`` for a scope no request fits."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    cost = cost or costmodel.default()
    reqs = generate(seed, requests, num_blocks, block_size, watermark, max_prompt, max_new,
                    arrival_steps)
    run = run_workload(factory_for(mode, cost, host_blocks), reqs, num_blocks, block_size,
                       watermark, series=True, seed=seed)
    return Simulation(mode, num_blocks, block_size, watermark, seed, run, cost)


def summary(sim: Simulation) -> str:
    s = sim.stats
    v = sim.run.violation
    lines = [
        f"simulate: {s.requests} requests, {sim.num_blocks} blocks x {sim.block_size} slots, "
        f"watermark {sim.watermark}, mode {sim.mode}, seed {sim.seed}",
        f"  finished          {s.finished} of {s.requests}",
        f"  steps             {s.steps} ({s.decoded:,} tokens decoded, at most {s.peak_running} "
        "running at once)",
        f"  preemptions       {s.preemptions} (ping-pongs: {s.pingpongs} preempted again before "
        "decoding a token)",
        f"  recomputed tokens {s.recomputed_tokens:,}",
    ]
    if sim.mode != "recompute":
        lines.append(f"  swapped tokens    {s.swapped_out_tokens:,} out, "
                     f"{s.swapped_in_tokens:,} in")
    m = sim.modelled_seconds()
    lines += [
        f"  free blocks       peak {s.peak_free}, lowest {s.min_free}, final {s.final_free}",
        f"  leaked blocks     {s.leaked}",
        f"  modelled overhead recompute {m['recompute_s']:.2f} s, swap transfers "
        f"{m['swap_transfer_s']:.3f} s (tokens priced as Llama 3.3 70B under the cost model)",
        "  every step checked: policy spec, device" + (" and host" if sim.mode != "recompute"
                                                        else "") + " pool invariants: "
        + ("all held" if v is None else f"VIOLATION at step {v.step}: {v.name}"),
    ]
    return "\n".join(lines)


def plot(sim: Simulation, path: str, title: str | None = None) -> None:
    """Free blocks, running/waiting counts and preemptions per step, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = sim.stats
    steps = range(1, len(s.free) + 1)
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ax = axes[0]
    ax.plot(steps, s.free, color="tab:green", lw=1)
    ax.axhline(sim.watermark, color="tab:red", ls="--", lw=1, label=f"watermark {sim.watermark}")
    ax.set_ylabel("free blocks")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right")
    ax = axes[1]
    ax.plot(steps, s.running, label="running", color="tab:blue", lw=1)
    ax.plot(steps, s.waiting, label="waiting", color="tab:orange", lw=1)
    ax.set_ylabel("sequences")
    ax.legend(loc="upper right")
    ax = axes[2]
    ax.bar(steps, s.preempted, width=1.0, color="tab:red", label="preempted this step")
    ax.set_ylabel("preemptions")
    twin = ax.twinx()
    cumulative, total = [], 0
    for x in s.preempted:
        total += x
        cumulative.append(total)
    twin.plot(steps, cumulative, color="black", lw=1, label="cumulative")
    twin.set_ylabel("cumulative")
    ax.set_xlabel("step")
    ax.legend(loc="upper left")
    twin.legend(loc="lower right")
    fig.suptitle(title or (
        f"{s.requests} requests on {sim.num_blocks} blocks x {sim.block_size}, watermark "
        f"{sim.watermark}, {sim.mode}: {s.preemptions} preemptions, {s.pingpongs} ping-pongs, "
        f"{s.leaked} leaked"))
    fig.tight_layout()
    # drawn in memory, then written: a failing write raises (savefig on a file name can
    # swallow it, e.g. on a full disk) instead of leaving a truncated picture
    picture = io.BytesIO()
    fig.savefig(picture, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=100)
    plt.close(fig)
    Path(path).write_bytes(picture.getvalue())
