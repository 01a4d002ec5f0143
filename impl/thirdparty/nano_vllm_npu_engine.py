"""Adapter: upstream nano-vllm's engine core as nano-vllm-npu carries it (0.0.1.post1 ..
0.0.2): the release's own ``Scheduler``, ``BlockManager``, ``Sequence`` and
``SamplingParams`` (``nanovllmnpu/engine/scheduler.py``: upstream nano-vllm's scheduler,
its decode preemption taking ``running.pop()``), driven exactly as ``nano_vllm_engine``
drives nano-vllm-fork's (the operations, the KV calls, the one stand-in and what is refused
are described there). ``nano-vllm-npu-engine[@VERSION]`` (``kvcheck install
nano-vllm-npu``)."""

from __future__ import annotations

from .nano_vllm_engine import NanoEngineTarget

ENGINE_KEY = "nano-vllm-npu"  # its row in install.ENGINES


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> NanoEngineTarget:
    """nano-vllm-npu's scheduler (see ``nano_vllm_engine.make``)."""
    return NanoEngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                            max_model_len or 0, ENGINE_KEY, version)
