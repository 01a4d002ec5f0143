"""Adapter: aphrodite-engine's v1 engine core (a vLLM v1 fork) -- the release's own
``Scheduler``, ``KVCacheManager`` and ``Request`` -- driven step by step with no model.

Issue 34 §1. ``aphrodite-v1-engine[@VERSION]``; the ``aphrodite`` install key (``kvcheck
install aphrodite-engine==VERSION``). aphrodite-engine 0.20.0 on carries vLLM v1's engine
core under ``aphrodite/v1/`` (``core/sched/scheduler.py``, ``core/kv_cache_manager.py``,
``request.py``, ``outputs.py``...) with fork-local edits: 0.24.1's scheduler is 2,841 lines
and differs from vLLM 0.29.0's, its closest, in about 700 lines (diff with the names mapped).
So the adapter *is* ``vllm_v1_engine.EngineTarget``: the same engine loop (add_request,
schedule, a generated ``ModelRunnerOutput``, update_from_output, finish_requests), on
aphrodite's own files, loaded under aphrodite's names (``vllm_v1_engine.FORKS``: the
adapter asks for vLLM's module names and gets aphrodite's; what differs is read from the
files, as for vLLM's releases).

Stand-ins: ``vllm_v1_engine``'s (``STUBS``, ``OFF``: each named there with its reason) under
aphrodite's names, and what only the fork imports: its config module (``aphrodite.config``:
the settings come from ``vllm_v1_engine.EngineConfig``, the scheduler's constructor takes
them as ``aphrodite_config``) and ``aphrodite.utils.mem_utils`` (a log message's
``format_gib``; the real module imports psutil: ``EXTRA``, the fork's entry in
``vllm_v1_engine.FORKS``, held there so that a load of the fork finds it whichever module
was imported first). The environment settings are the release's own ``aphrodite/envs.py``,
as vLLM's are.
"""

from __future__ import annotations

from . import aphrodite, vllm_v1_engine
from .vllm_v1_engine import EngineTarget

ENGINE_KEY = aphrodite.ENGINE_KEY  # "aphrodite", its row in install.ENGINES: 0.20.0 .. 0.24.1
EXTRA = vllm_v1_engine.FORKS[ENGINE_KEY][1]


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> EngineTarget:
    """aphrodite's v1 scheduler (``vllm_v1_engine.make``'s settings)."""
    return vllm_v1_engine.make(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                               version, max_model_len, engine=ENGINE_KEY)
