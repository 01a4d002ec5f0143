"""Adapter: vLLM v1 (vllm==0.33.0) with the step's KV write as its own event, ``commit(seq)``.

The same real ``KVCacheManager`` as ``vllm_v1`` (see that module for what runs and
the stand-ins), driven in the order vLLM's v1 engine really calls it within one
step (``EngineCore.step``, ``vllm/v1/engine/core.py``):

1. ``Scheduler.schedule()`` -> ``KVCacheManager.allocate_slots(req, n, ...)``. Its
   last act is ``coordinator.cache_blocks(req, min(total_computed_tokens +
   num_new_tokens, req.num_tokens))``: the hashes of the full blocks of the tokens
   *scheduled* this step go into ``BlockPool.cached_block_hash_to_block`` now.
2. ``model_executor.execute_model(scheduler_output)``: the forward pass writes the
   scheduled tokens' KV into those blocks.
3. ``Scheduler.update_from_output()``: the step's results; for a prefill it
   changes nothing in the KV-cache manager (the blocks were cached at 1).

``allocate(seq, n, token_ids)`` is 1 (exactly ``VllmV1Target.allocate``: a request
scheduled with its prompt; the oracle counts its blocks as not yet written) and
``commit(seq)`` is 2 + 3: the forward pass wrote the prompt. It calls nothing in
vLLM because vLLM does nothing there (that is the point under test: the keys were
published at 1, before the write).

What may come between 1 and 2 for a request is what the engine can do between
``allocate_slots`` and the forward pass:

``preempt(seq)`` before ``commit(seq)``
    reachable. ``Scheduler.schedule()`` with ``SchedulingPolicy.PRIORITY``
    (``vllm/v1/core/sched/scheduler.py`` 0.33.0, lines 931-977): while scheduling
    the running queue, a request that cannot get blocks preempts
    ``max(self.running, key=(priority, arrival_time))``, and when that victim was
    already scheduled in this call (``preempted_req in scheduled_running_reqs``)
    its scheduled tokens are taken back and ``_preempt_request`` frees its blocks:
    the blocks ``allocate_slots`` just cached are freed without ever being
    written, hashes kept. (vLLM PR #43569 names the same path.) With FCFS the
    victim is ``self.running[-1]``, never scheduled earlier in the same loop.
``free_seq(seq)`` before ``commit(seq)``
    not issued (``admits``): an abort from the API is applied between steps
    (``_process_input_queue``) or, in ``EngineCore.step``, by
    ``_process_aborts_queue()`` after ``future.result()``, i.e. after the forward
    pass wrote the step's KV. With async scheduling the freed request's in-flight
    step has been dispatched and still writes its blocks before any later step
    reads them.

Mapping note. In the engine the victim of that preemption is a *running* request
(a chunked prefill's later chunk, or a decode), so what is published and freed
unwritten is the blocks of that step's chunk; its earlier chunks were written in
earlier steps. The adapter schedules a prompt in one ``allocate_slots`` call, so
the whole prompt plays that chunk: the manager's calls and state changes are the
same (``allocate_slots`` allocates and caches the chunk's full blocks, ``free``
drops the references, hashes stay). ``scripts/replay_raw_v1_commit.py`` replays
the two-chunk sequence on vLLM's own API.

Decode steps and speculative steps are the base adapter's (each is allocate_slots
and the step's verification in one operation: no separate write event).
"""

from __future__ import annotations

from ..errors import MisuseError
from .vllm_v1 import VllmV1Target

ENGINE_KEY = "vllm-v1"  # the sources vllm_v1.load picks (the engine line); make takes no version


class VllmV1LifecycleTarget(VllmV1Target):
    """``VllmV1Target`` with ``commit(seq)``: the forward pass of a scheduled prompt."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        super().__init__(num_blocks, block_size, enable_caching)
        self.unwritten: set[int] = set()  # scheduled, forward pass not run yet

    def admits(self, op) -> bool:
        """No abort between ``schedule()`` and the forward pass (see module docstring)."""
        if op.kind == "free_seq" and op.seq in self.unwritten:
            return False
        return super().admits(op)

    def allocate(self, seq, n_tokens, token_ids=None):
        got = super().allocate(seq, n_tokens, token_ids)
        self.unwritten.add(seq)
        return got

    def commit(self, seq: int) -> None:
        """The forward pass wrote the scheduled prompt (``execute_model``), then
        ``update_from_output``: nothing for vLLM's KV-cache manager to do."""
        self._live(seq)
        if seq not in self.unwritten:
            raise MisuseError(f"sequence {seq!r} has no scheduled, unwritten prompt")
        self.unwritten.discard(seq)

    def preempt(self, seq: int) -> None:
        super().preempt(seq)
        self.unwritten.discard(seq)

    def free_seq(self, seq: int) -> None:
        super().free_seq(seq)
        self.unwritten.discard(seq)


def make(num_blocks: int, block_size: int) -> VllmV1LifecycleTarget:
    """vLLM v1 with prefix caching, the prompt's KV write as ``commit(seq)``."""
    return VllmV1LifecycleTarget(num_blocks, block_size, enable_caching=True)


def make_no_cache(num_blocks: int, block_size: int) -> VllmV1LifecycleTarget:
    """vLLM v1 without prefix caching, the prompt's write as ``commit(seq)`` (nothing
    is published: the legal control)."""
    return VllmV1LifecycleTarget(num_blocks, block_size, enable_caching=False)
