"""Seeded scheduler workloads: requests with a prompt, an output length and an arrival step.

Every request generated here *fits*: it can be admitted at any length it may
be preempted at (prompt + max_new - 1 tokens need at most the pool minus the
watermark) and finish (prompt + max_new tokens need at most the pool).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


class WorkloadError(ValueError):
    """Parameters for which no request can fit (bad input)."""


@dataclass(frozen=True)
class Request:
    seq: int
    prompt: int  # tokens to prefill
    max_new: int  # tokens to generate, >= 1
    arrival: int = 0  # step before which it is queued

    def to_json(self) -> dict:
        return asdict(self)


def blocks_for(n: int, block_size: int) -> int:
    return -(-n // block_size)


def longest_final(num_blocks: int, block_size: int, watermark: int) -> int:
    """The longest prompt + max_new that fits (see module docstring)."""
    return min((num_blocks - watermark) * block_size + 1, num_blocks * block_size)


def fits(r: Request, num_blocks: int, block_size: int, watermark: int) -> bool:
    return (r.prompt >= 1 and r.max_new >= 1
            and r.prompt + r.max_new <= longest_final(num_blocks, block_size, watermark))


def check_scope(num_blocks: int, block_size: int, watermark: int) -> None:
    if num_blocks < 1 or block_size < 1:
        raise WorkloadError("the pool needs at least one block of at least one slot")
    if watermark < 0:
        raise WorkloadError(f"watermark must be non-negative, got {watermark}")
    if watermark >= num_blocks:
        raise WorkloadError(f"watermark {watermark} must be below the pool size {num_blocks}: "
                            f"nothing could ever be admitted")
    if longest_final(num_blocks, block_size, watermark) < 2:
        raise WorkloadError(f"no request fits: {num_blocks} block(s) of {block_size} slot(s) "
                            f"with watermark {watermark} cannot hold a 1-token prompt plus "
                            f"one generated token")


def generate(seed: int, requests: int, num_blocks: int, block_size: int, watermark: int,
             max_prompt: int | None = None, max_new: int | None = None,
             arrival_steps: int = 0) -> list[Request]:
    """``requests`` random fitting requests; lengths default to a third of the pool."""
    check_scope(num_blocks, block_size, watermark)
    rng = random.Random(seed)
    cap = longest_final(num_blocks, block_size, watermark)
    share = max(2, num_blocks * block_size // 3)
    max_prompt = max(1, min(max_prompt or share, cap - 1))
    max_new = max(1, min(max_new or share, cap - 1))
    out = []
    for q in range(requests):
        prompt = rng.randint(1, max_prompt)
        new = rng.randint(1, max_new)
        if prompt + new > cap:  # clamp to fit, keeping both at least 1
            prompt = max(1, min(prompt, cap - 1 - rng.randint(0, cap - 2)))
            new = cap - prompt if prompt + new > cap else new
        arrival = rng.randint(0, arrival_steps) if arrival_steps else 0
        out.append(Request(q, prompt, new, arrival))
    out.sort(key=lambda r: (r.arrival, r.seq))
    return out
