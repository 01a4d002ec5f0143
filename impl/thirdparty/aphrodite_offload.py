"""Adapter: aphrodite-engine's ``SimpleCPUOffloadConnector`` scheduler side (vLLM's,
inherited: ``aphrodite/v1/simple_kv_offload/manager.py``), 0.20.0 .. 0.24.1, as a tiers
target: ``vllm_v1_offload`` on aphrodite's own files (its module docstring says what runs,
what is stood in and how the scheduler drives it), ``aphrodite-simple-offload@VERSION``."""

from __future__ import annotations

from .vllm_v1_offload import APHRODITE, SimpleOffloadTarget

ENGINE_KEY = "aphrodite"  # its row in install.ENGINES: the releases this adapter loads


def make(num_blocks: int, block_size: int, host_blocks: int,
         version: str | None = None) -> SimpleOffloadTarget:
    """aphrodite's SimpleCPUOffload (eager) over a full-attention + sliding-window config."""
    return SimpleOffloadTarget(num_blocks, block_size, host_blocks, APHRODITE, version)
