"""Adapter: vLLM v0's engine core with a sliding window -- ``vllm_v0_engine``'s target (the
release's own ``Scheduler``, ``SelfAttnBlockSpaceManager``, ``Sequence`` and ``SequenceGroup``,
driven step by step with no model: its module doc) with the cache configured as vLLM's own
engine configures it for a sliding-window model.

``vllm-v0-engine-window[@VERSION]`` (vLLM 0.4.3 .. 0.9.2, 0.8.5 by default) and
``aphrodite-v0-engine-window[@VERSION]`` (aphrodite-engine 0.6.0 .. 0.6.5): chunked prefill
off (v0's default), prefix caching off. ``vllm-v0-engine-window-chunked[@VERSION]`` and
``aphrodite-v0-engine-window-chunked[@VERSION]`` (the same releases): the same target with
chunked prefill on (``enable_chunked_prefill``, ``vllm_v0_engine``'s setting: the scheduler's
``_schedule_chunked_prefill``, ``update_num_computed_tokens`` by chunks), which those
releases accept with a window on block manager v2 (below). 0.4.2's block manager v2 asserts
"Sliding window not yet supported" when built with one: that assertion, in one line.

The setting. ``EngineArgs.create_engine_config`` builds ``CacheConfig(...,
sliding_window=model_config.get_sliding_window(), ...)`` (the model's ``sliding_window``, in
tokens), and ``Scheduler.__init__`` hands it to its block manager:
``BlockSpaceManagerImpl(..., sliding_window=self.cache_config.sliding_window, ...)``. The
stand-in ``CacheConfig`` (``vllm_v0_engine``'s record of the settings the scheduler reads)
carries ``sliding_window = S``; everything from there is the release's: the manager's
``max_block_sliding_window = S // block_size + 2``, its ``can_allocate`` (which caps the
blocks a prompt needs at that many: vLLM #11168), ``allocate`` (``BlockTable.allocate`` takes
a block for every prompt token) and ``append_slots`` (``BlockTable.append_token_ids`` replaces
every entry before block ``num_computed_tokens // block_size - max_block_sliding_window`` by
the allocator's ``NullBlock`` and frees the block). ``make``: ``S = block_size`` (the window
keeps 3 blocks; the spec's window of ``vllm_v0_sliding.make``); ``make_window(S)``: any ``S``.

Refused in one line, as the release refuses them: prefix caching with a sliding window
(``CacheConfig._verify_prefix_caching``: "Prefix caching is not supported with sliding
window"; v0 on every release here, aphrodite 0.6.x too); chunked prefill with a window where
the release's engine arguments refuse it (``window_refusal``: vLLM 0.4.3 .. 0.6.2's
``EngineArgs.create_engine_config`` and aphrodite 0.6.x's raise "Chunked prefill is not
supported with sliding window" when ``chunked_prefill_enabled and not
use_v2_block_manager``; the condition and the words are the release's own, compiled from
its ``engine/arg_utils.py`` / ``engine/args_tools.py``, evaluated on the target's settings).
The target sets ``use_v2_block_manager``, which those releases accept the combination with;
0.6.3 on has no such check (v2 the only manager; 0.6.3 .. 0.9.2's ``config.py`` refuses
nothing else of it: their arguments only leave chunked prefill off by default for a
windowed model). So the check refuses nothing here today: it is there so that a release
whose arguments refuse the target's settings stops in its own words.

With chunked prefill the window is the release's too: ``append_slots`` passes
``num_computed_slots = get_num_computed_tokens()`` (before the step's chunk), and
``BlockTable.append_token_ids`` drops the entries before block ``num_computed_slots //
block_size - max_block_sliding_window`` (its docstring: "Without chunked prefill, it should
be the same as _num_full_slots"), so a chunk's own blocks (from ``num_computed_slots //
block_size`` on) are never dropped before it is written. The adapter's forward pass writes
every token of the chunk (``vllm_v0_engine``'s rule); the release's runner leaves the first
``query_len - sliding_window`` tokens of a windowed prompt chunk unwritten
(``compute_slot_mapping_start_idx``: ``PAD_SLOT_ID``), a subset, so the adapter writes at
least what the runner writes, into the same blocks.

Stand-in, in one place (beyond ``vllm_v0_engine``'s): **the null block is taken at
construction**. v0 has no reserved null block: ``CpuGpuBlockAllocator.
allocate_or_get_null_block`` takes an ordinary GPU block the first time any windowed table
appends and keeps it for the allocator's life (refcount 1, in no table). The target builds a
pool of ``num_blocks + 1`` (``CacheConfig.num_gpu_blocks``) and asks the release's allocator
for its null block at once -- vLLM's block 0, outside the oracle's ids (``block_offset`` 1:
oracle id ``b`` is vLLM's ``b + 1``, and vLLM's 0 reads as ``spec.state.NULL``, as vLLM v1
reserves its block 0) -- which is the state the engine is in after its first windowed
append, so every later step is checked with ``num_blocks`` usable blocks. (Taken lazily, that
first append takes a block no table names: ``vllm_v0_sliding.make_lazy``, docs/findings.md
F8.) The manager's ``num_total_gpu_blocks`` and watermark are then those of ``num_blocks + 1``
(the watermark is ``int(0.01 * blocks)``: 0 below 99 blocks).

The oracle (``kvcheck.models.engine.oracle``) reads ``null_block`` (vLLM's id of the null
block, as the KV calls name it) and ``sliding_window``: a table entry replaced by the null
block at an ``append_slots`` is a block dropped behind the window (``spec.engine.WINDOW``:
legal only when it holds none of the last ``S`` tokens of the KV call's ``tokens``). The
tokens an ``append_slots`` call is recorded with are the request's up to and including the
next one the forward pass computes (``get_num_computed_tokens() + 1``, read before the
call): while decoding that is every token (the sampled one is next), but mid-way through a
chunked prefill the rest of the prompt is not attended to yet, and the window the next chunk
needs ends at its first token -- judged by the whole prompt, a drop of a block the next chunk
still reads would pass.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

from ..errors import MisuseError
from . import _loader, install
from .vllm_v0 import free_block_ids
from .vllm_v0_engine import ENGINE_KEY, VllmV0EngineTarget

NULL_ID = 0  # vLLM's id of the null block the target takes at construction
ARGS_FILES = ("engine/arg_utils.py", "engine/args_tools.py")  # vLLM's, aphrodite's


@functools.cache
def _window_checks(root: str, top: str) -> tuple:
    """The release's engine-argument checks refusing chunked prefill with a sliding window:
    ``(condition, words)`` for each ``if`` in its ``engine/arg_utils.py`` (aphrodite:
    ``args_tools.py``) whose body raises ``ValueError`` with a literal message naming both,
    the condition compiled from the release's own source (once per release and process)."""
    path = next((Path(root) / top / rel for rel in ARGS_FILES
                 if (Path(root) / top / rel).is_file()), None)
    if path is None:
        return ()
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.If):
            continue
        for stmt in node.body:
            exc = stmt.exc if isinstance(stmt, ast.Raise) else None
            if not (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name)
                    and exc.func.id == "ValueError" and exc.args):
                continue
            try:
                words = ast.literal_eval(exc.args[0])
            except ValueError:
                continue
            if (isinstance(words, str) and "sliding window" in words.lower()
                    and "chunked prefill" in words.lower()):
                condition = compile(ast.Expression(node.test), str(path), "eval")
                found.append((condition, words))
    return tuple(found)


def window_refusal(root: Path | str, top: str, *, sliding_window: int, chunked: bool,
                   v2: bool) -> str | None:
    """The release's own words refusing chunked prefill with a window of ``sliding_window``
    tokens at start-up (``EngineArgs.create_engine_config``; see the module doc), or
    ``None`` when it accepts the settings. ``v2``: ``use_v2_block_manager``. A setting the
    release's condition reads that the stand-ins do not hold raises ``StandInMissing`` (one
    line, exit 2)."""
    where = "impl/thirdparty/vllm_v0_engine_window.py"
    scope = {
        "model_config": _loader.Settings("ModelConfig", where,
                                         get_sliding_window=lambda: sliding_window),
        "scheduler_config": _loader.Settings("SchedulerConfig", where,
                                             chunked_prefill_enabled=chunked,
                                             enable_chunked_prefill=chunked,
                                             use_v2_block_manager=v2)}
    for condition, words in _window_checks(str(root), top):
        if eval(condition, {"__builtins__": {}}, dict(scope)):  # noqa: S307 (the release's)
            return words
    return None


class _UpToNext:
    """The manager's recorded ``append_slots`` whose KV call carries the request's tokens up
    to and including the next one computed (the module doc: what the window rule reads). A
    plain object, so a deep copy of the target records into the copy."""

    def __init__(self, target: VllmV0EngineWindowTarget, recorder: Any):
        self.target, self.recorder = target, recorder

    def __call__(self, *args, **kwargs):
        seq = args[0] if args else next(iter(kwargs.values()))  # seq= (the scheduler's call)
        upto = seq.data.get_num_computed_tokens() + 1
        calls = self.target.kv_calls
        at = len(calls)
        try:
            return self.recorder(*args, **kwargs)
        finally:
            for c in calls[at:]:
                c.tokens = c.tokens[:upto]


class VllmV0EngineWindowTarget(VllmV0EngineTarget):
    """vLLM v0's engine core with ``CacheConfig.sliding_window`` set (see the module doc)."""

    block_offset = 1  # vLLM's block 0 is the null block, outside the oracle's ids
    null_block = NULL_ID

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int,
                 budget: int = 16, max_seqs: int = 8, policy: str = "fcfs",
                 caching: bool = False, spec: int = 0, max_model_len: int = 0,
                 version: str | None = None, engine: str = ENGINE_KEY,
                 chunked: bool = False):
        if type(sliding_window) is not int or sliding_window < 1:
            raise MisuseError(f"the sliding window must be at least 1 token, got "
                              f"{sliding_window!r}")
        if caching:
            raise MisuseError("Prefix caching is not supported with sliding window (vLLM v0's "
                              "CacheConfig refuses it): run with --no-prefix-caching")
        if num_blocks < 1:
            raise MisuseError("vLLM v0 needs num_blocks >= 1 and block_size >= 1")
        # what the release's engine arguments refuse, before it builds anything
        dist = install.select(engine, version)
        said = window_refusal(_loader.require(dist), dist.top, sliding_window=sliding_window,
                              chunked=chunked, v2=self.block_manager_v2)
        if said is not None:
            raise MisuseError(f"{dist.dist} {dist.version} refuses these settings at start-up "
                              f"(its EngineArgs.create_engine_config): {said}")
        # the release's target, on a pool one larger (the null block's), its CacheConfig
        # carrying the window; chunked prefill as the release's SchedulerConfig sets it
        super().__init__(num_blocks + 1, block_size, budget, max_seqs, policy, False, spec,
                         max_model_len, chunked, version, engine, sliding_window=sliding_window)
        self.chunked = chunked
        name = "append_slots" if hasattr(type(self.manager), "append_slots") else "append_slot"
        setattr(self.manager, name, _UpToNext(self, getattr(self.manager, name)))
        self.num_blocks = num_blocks
        self.sliding_window = sliding_window
        self.window_blocks = self.manager.max_block_sliding_window
        null = self.manager.block_allocator.allocate_or_get_null_block()
        if null.block_id != NULL_ID:  # (the naive allocator hands out its ids in order)
            raise MisuseError(f"{self.version}: the null block took vLLM block "
                              f"{null.block_id}, not {NULL_ID}")

    # -- observation: oracle ids (vLLM's less one; the null block reads as NULL) ---------
    def blocks(self, seq: int) -> list[int]:
        return [b - self.block_offset for b in self._table(self._seq(seq))]

    def refcount(self, block: int) -> int:
        return self.gpu._refcounter.get(block + self.block_offset)

    def free_blocks(self) -> list[int]:
        return [b - self.block_offset for b in free_block_ids(self.gpu)]

    def block_hash(self, block: int) -> Any:
        return None  # (no prefix caching with a window)


def make_window(num_blocks: int, block_size: int, sliding_window: int, budget: int = 16,
                max_seqs: int = 8, policy: str = "fcfs", caching: bool = False,
                spec: int = 0, version: str | None = None,
                max_model_len: int | None = None, engine: str = ENGINE_KEY,
                chunked: bool = False) -> VllmV0EngineWindowTarget:
    """vLLM v0's scheduler with a sliding window of ``sliding_window`` tokens (``chunked``:
    chunked prefill on)."""
    return VllmV0EngineWindowTarget(num_blocks, block_size, sliding_window, budget, max_seqs,
                                    policy, caching, spec, max_model_len or 0, version, engine,
                                    chunked)


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = False, spec: int = 0,
         version: str | None = None,
         max_model_len: int | None = None) -> VllmV0EngineWindowTarget:
    """vLLM v0's scheduler with a sliding window of ``block_size`` tokens (the window keeps
    ``block_size // block_size + 2`` = 3 blocks)."""
    return make_window(num_blocks, block_size, block_size, budget, max_seqs, policy, caching,
                       spec, version, max_model_len)


def make_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = False, spec: int = 0,
                 version: str | None = None,
                 max_model_len: int | None = None) -> VllmV0EngineWindowTarget:
    """``make``'s window (``block_size`` tokens) with chunked prefill on
    (``enable_chunked_prefill``)."""
    return make_window(num_blocks, block_size, block_size, budget, max_seqs, policy, caching,
                       spec, version, max_model_len, chunked=True)
