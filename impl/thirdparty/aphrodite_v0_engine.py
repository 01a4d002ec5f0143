"""Adapter: aphrodite-engine 0.6.x's v0 engine core (a vLLM v0 fork) -- the release's own
``Scheduler``, ``BlockSpaceManagerV2``, ``Sequence`` and ``SequenceGroup`` -- driven step by
step with no model.

Issue 34 §2. ``aphrodite-v0-engine[@VERSION]`` (chunked prefill off) and
``aphrodite-v0-engine-chunked[@VERSION]`` (``enable_chunked_prefill``) and
``aphrodite-v0-engine-window[@VERSION]`` (a sliding window: ``vllm_v0_engine_window``, whose
module doc says what it sets and what it stands in for) and
``aphrodite-v0-engine-window-chunked[@VERSION]`` (the window with chunked prefill: aphrodite's
``args_tools.py`` refuses the pair only without block manager v2, which the target uses);
0.6.5 by default,
0.6.0 .. 0.6.5 (the ``aphrodite-v0`` install key: ``kvcheck install
aphrodite-engine==VERSION``). aphrodite 0.6.x carries vLLM v0's scheduler, block manager v2
and sequence files under its own module names (``aphrodite/processing/scheduler.py``,
``interfaces.py``, ``block_manager_v2.py``, ``placeholder_block_space_manager.py`` (0.6.5),
``block/*``, ``evictor_v2.py``; ``aphrodite/common/sequence.py``). So the adapter *is*
``vllm_v0_engine.VllmV0EngineTarget`` (driver, KV calls, observation: its docstring) on
aphrodite's files: ``vllm_v0_engine.load(version, "aphrodite-v0")`` maps the module names
through ``vllm_v0.LAYOUTS["aphrodite-v0"]``. The stand-ins are ``vllm_v0_engine.STUBS``
(named there with their reasons) under aphrodite's names (``aphrodite.common.config``,
``aphrodite.common.utils``, ``aphrodite.common.sampling_params``, ``aphrodite.inputs``,
...), and ``loguru``, aphrodite's logger. What differs from vLLM is read from the files
(``SchedulerConfig.is_attention_free``, read by aphrodite 0.6.1 on, is a setting of the
stand-in config; ``is_valid_encoder_decoder_llm_inputs`` is cut out of whichever of
``inputs/parse.py`` / ``inputs/data.py`` defines it), never from the version string.
"""

from __future__ import annotations

from .vllm_v0_engine import VllmV0EngineTarget
from .vllm_v0_engine_window import VllmV0EngineWindowTarget

ENGINE_KEY = "aphrodite-v0"  # its row in install.ENGINES


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> VllmV0EngineTarget:
    """aphrodite's v0 scheduler without chunked prefill (its default)."""
    return VllmV0EngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, False, version, engine=ENGINE_KEY)


def make_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 version: str | None = None,
                 max_model_len: int | None = None) -> VllmV0EngineTarget:
    """aphrodite's v0 scheduler with chunked prefill (``enable_chunked_prefill``)."""
    return VllmV0EngineTarget(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                              max_model_len or 0, True, version, engine=ENGINE_KEY)


def make_window(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                policy: str = "fcfs", caching: bool = False, spec: int = 0,
                version: str | None = None,
                max_model_len: int | None = None) -> VllmV0EngineWindowTarget:
    """aphrodite's v0 scheduler with a sliding window of ``block_size`` tokens
    (``CacheConfig.sliding_window``; ``vllm_v0_engine_window.make`` on aphrodite's files)."""
    return VllmV0EngineWindowTarget(num_blocks, block_size, block_size, budget, max_seqs,
                                    policy, caching, spec, max_model_len or 0, version,
                                    engine=ENGINE_KEY)


def make_window_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                        policy: str = "fcfs", caching: bool = False, spec: int = 0,
                        version: str | None = None,
                        max_model_len: int | None = None) -> VllmV0EngineWindowTarget:
    """``make_window`` with chunked prefill on (``enable_chunked_prefill``)."""
    return VllmV0EngineWindowTarget(num_blocks, block_size, block_size, budget, max_seqs,
                                    policy, caching, spec, max_model_len or 0, version,
                                    engine=ENGINE_KEY, chunked=True)
