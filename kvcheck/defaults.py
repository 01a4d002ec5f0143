"""The run each checking command makes when given no flags, per model: its pool, length and
seed (``kvcheck verify``: 32 blocks x 4, 10,000 operations, seed 0).

The commands take their defaults from here (``kvcheck.cli.commands``), and a campaign's
first run is this run (``kvcheck.campaign.plan``), so a campaign always checks what the
model's command at its defaults checks, before its swarm of drawn shapes. A plain module:
importing it loads nothing else.
"""

from __future__ import annotations

SEED = 0

# Shrinking a counterexample, the same for every command (verify, prove, campaign, ...):
SHRINK_STEPS = 500_000  # the budget: operations replayed in all (the same trace on any machine)
SHRINK_SECONDS = 600.0  # an outer wall-clock cap only; the trace says so when it cuts

RUN = {
    "blocks": {"num_blocks": 32, "block_size": 4, "ops": 10_000},  # kvcheck verify
    "prefix": {"num_blocks": 16, "block_size": 4, "ops": 5_000},  # kvcheck verify-prefix
    "device": {"num_blocks": 16, "block_size": 4, "ops": 2_000,  # kvcheck verify-device
               "batch_prob": 0.3},
    "scheduler": {"num_blocks": 16, "block_size": 4, "watermark": 1,  # kvcheck verify-scheduler
                  "requests": 12, "workloads": 20},
    "hybrid": {"num_blocks": 16, "block_size": 2, "ops": 3_000},  # kvcheck verify-hybrid
    "tiers": {"num_blocks": 12, "block_size": 2, "ops": 3_000},  # kvcheck verify-tiers
    # kvcheck verify-engine (the engine model, issue 34): an engine's own scheduler; "requests"
    # in its seeded workload, "ops" the most operations (adds, aborts, engine steps); its
    # shrinking budget is smaller (each replay drives the engine's own scheduler)
    "engine": {"num_blocks": 8, "block_size": 4, "ops": 2_000, "requests": 30, "budget": 16,
               "max_seqs": 8, "shrink_steps": 50_000},
}

ENGINE_RUN = RUN["engine"]  # (verify-engine's name for its row)
