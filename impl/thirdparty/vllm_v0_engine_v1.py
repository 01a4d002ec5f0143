"""Adapter: vLLM v0's engine core on block manager v1 -- the release's own ``Scheduler``
with its own ``BlockSpaceManagerV1`` (``vllm/core/block_manager_v1.py``), the block manager
the scheduler builds by default to 0.6.2 (``SchedulerConfig.use_v2_block_manager``
defaults to False there; 0.6.3 made v2 the default and removed v1).

``vllm-v0-engine-v1[@VERSION]`` (chunked prefill off) and ``vllm-v0-engine-v1-chunked``:
``vllm_v0_engine.VllmV0EngineTarget`` (the driver, the generated model output, the stand-ins
and the KV calls: its docstring) with ``use_v2_block_manager=False``, so the scheduler's
``BlockSpaceManager.get_block_space_manager_class("v1")`` builds ``BlockSpaceManagerV1``
from the release's file, with its ``vllm/block.py`` (``PhysicalTokenBlock``,
``LogicalTokenBlock``; ``BlockTable`` a class from 0.5.5) and ``vllm/core/evictor_v1.py``.
Every release with ``vllm/core/interfaces.py`` and ``block_manager_v1.py`` runs: 0.4.0 ..
0.6.2, from the ``vllm-v0-legacy`` install row (``ENGINE_KEY``: 0.3.3 .. 0.6.2, pinned 0.4.0,
the default here; ``kvcheck install vllm-v0-legacy==0.4.1``; the folders are the same as
``vllm-v0``'s); 0.3.3 (no such interface) and 0.6.3 on (no v1, outside the row): one line,
exit 2. 0.4.0 and 0.4.1 name the evictor ``vllm/core/evictor.py``; 0.4.0 has no
``vllm/core/block/`` (block manager v2's files), which this target does not need, names the
manager's methods ``can_append_slot`` / ``append_slot`` (recorded as the plural ones) and has
no chunked prefill (``-chunked`` refused in one line); 0.4.0 and 0.4.1 have no
``SequenceGroupMetadata.do_sample``: the engine processes a group's outputs once its
sequences are in their DECODE stage (0.4.1, ``LLMEngine._process_model_outputs``), every
scheduled group's (0.4.0), as the driver does there.

Observation (instead of block manager v2's): a table is the ``block_number`` of each
``PhysicalTokenBlock`` in ``block_tables[seq_id]``; a block's refcount is its own
``ref_count``. Without prefix caching the ``UncachedBlockAllocator`` makes every GPU block at
start-up (they are kept by number) and the free blocks are its ``free_blocks``; with it the
``CachedBlockAllocator`` makes them on demand (``allocate_block``): every block in use is in
its ``cached_blocks`` (hash -> block), every released one in its evictor
(``evictor.free_table``), and the free blocks are the evictor's and those not made yet.

Prefix caching (``CachedBlockAllocator``, the configuration users of 0.4 .. 0.6.2 ran with
``--enable-prefix-caching``). Every block in use carries a key: a prompt block
``Sequence.hash_of_block(i)``, the hash of the tokens up to the block's end -- for a partial
last block the tokens it holds --, a block appended during decode a counter value
(``default_hash_ctr``), re-keyed (``_promote_last_block``) to its full hash once it fills, or
swapped for the block already holding that hash. ``allocate(hash)`` shares whatever block
holds the key, full or partial, written or not, and revives a released one from the evictor;
an append into a shared last block copies it first (``blocks_to_copy``). What the model
runner skips is only the blocks marked ``computed`` (``compute_full_blocks_in_seq``: full
blocks behind the last one, 0.6.0 on those the step computes), read through
``get_common_computed_block_ids`` (``takewhile`` over the table but its last block). So the
spec's prefix-cache state is read as (option (a) of issue 34's v1 task; no spec change):

* the cache entries are the ``computed`` blocks (in use or in the evictor) under their key,
  ``block.block_hash``, whose meaning is the prefix the release's own ``hash_of_block``
  gives (``block_hashes``: the full blocks'); every clause of ``spec.prefix`` applies to
  them as to any target (``no_partial_cached``, ``key_after_write``, ``cache_content``...);
* a keyed block not computed -- a partial block under its partial key, a full block not
  marked yet, a decode block under its counter -- is a held block like any other, shared
  when ``ref_count`` > 1; released, it is on the free list's unkeyed part (a later
  ``allocate`` may revive it: the request is then given it to write, as a fresh block);
* the lookup (``get_computed_blocks``) returns ``computed_block_nums``, the rest of the table
  is the blocks the forward pass writes -- some shared with a request that holds them already
  (``keys_partial_blocks``: the engine oracle keeps what that request wrote, and a
  sharer's rewrite of the same token at the same slot keeps the slots after it);
* an ``append_slots`` that copies its shared last block (``_CopyRecorder``) returns the
  copy as its new block, with ``KVCall.copies`` naming the shared one: the oracle accepts
  the swap only for the table's last entry, a block another request holds, and gives the
  copy that block's written slots (what the worker's ``copy_blocks`` does); one that
  finds the full hash cached takes that block: a promotion (``APPENDS_DOC``), which may be
  a block another request promoted in the same step, its last slot written by that step.

Checked: 0.4.0 .. 0.6.2 (13 releases), seeds 0 .. 9, blocks of 2 and 4 (8 blocks, budget 16,
30 requests): every run passes, with hits, copies and promotions. Neither vLLM #4761 (v2: an
evicted block keeps its old key) nor #5364 (v2: a reused block keeps ``computed``) is in
v1's allocator: ``LRUEvictor.evict`` pops the block's key and clears ``computed``, and
``allocate_block`` gives it the new key, in every release; the same faults put into v1 are
caught (tests/thirdparty/test_vllm_v0_engine_v1_prefix.py). Chunked prefill with prefix
caching is refused in one line: to 0.5.5 the release's model runner refuses it (its words:
"chunked prefill cannot be used with prefix caching now."); 0.6.0 .. 0.6.2 accept it (no
refusal in ``arg_utils.py`` or ``config.py``), but ``get_all_computed_blocks`` leaves out a
table's last block even when it is computed, so a request given a computed block by its key
(revived from the evictor, say) recomputes it, in place: without chunks in the same step,
which the oracle follows; with chunks at a later step, so that between the two the request
holds a cached block it has not reached, which ``no_partial_cached`` reads as a partial
cached block, and the oracle, which forgets what a block given fresh held, reads another
request's hit on it as a hit on an unwritten block (0.6.0 .. 0.6.2, seeds 0 .. 9: blocks of
2 pass, blocks of 4 fail so on 8 seeds, 7 ``no_partial_cached`` and 1 the hit rule, each on a
block holding the prefix its key names). The release's design (the last block is left out
on purpose, "to avoid the case where the entire prompt is cached"), not a bug: not judged.
"""

from __future__ import annotations

from typing import Any

from ..errors import MisuseError
from .vllm_v0_engine import ResultBlock, VllmV0EngineTarget

ENGINE_KEY = "vllm-v0-legacy"  # the install row of 0.3.3 .. 0.6.2, pinned 0.4.0 (the releases
# with block manager v1; vllm-v0's row starts at 0.4.2)
LOW = "0.4.0"  # the first with vllm/core/interfaces.py (BlockSpaceManager.get_..._class)


class VllmV0EngineV1Target(VllmV0EngineTarget):
    """vLLM v0's ``Scheduler`` with ``BlockSpaceManagerV1`` (see the module doc)."""

    block_manager_v2 = False

    def __init__(self, num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 max_model_len: int = 0, chunked: bool = False,
                 version: str | None = None, engine: str = ENGINE_KEY):
        from . import install
        from .vllm_v0_engine import load

        dist = install.select(engine, version)  # (before loading: 0.3.3 has other files)
        if install.version_key(dist.version) < install.version_key(LOW):
            raise MisuseError(f"vllm-v0-engine-v1 runs vLLM {LOW} .. 0.6.2, not "
                              f"{dist.version} (before 0.4.0 the scheduler has no "
                              f"BlockSpaceManager interface: vllm-v0-legacy drives its block "
                              f"manager)")
        mods = load(version, engine)
        if not mods.has("vllm.core.block_manager_v1"):
            raise MisuseError(f"vllm {mods.dist.version} has no block manager v1 "
                              f"(vllm/core/block_manager_v1.py: 0.4.0 .. 0.6.2); run "
                              f"vllm-v0-engine (block manager v2)")
        if chunked and not hasattr(mods["vllm.core.scheduler"].Scheduler,
                                   "_schedule_chunked_prefill"):
            raise MisuseError(f"vllm {mods.dist.version}'s scheduler has no chunked prefill "
                              f"(Scheduler._schedule_chunked_prefill: 0.4.1 on)")
        if chunked and caching:
            from .vllm_v0_engine import RUNNER_REFUSAL, runner_refuses_chunked_caching

            if runner_refuses_chunked_caching(mods):  # (to 0.5.5: the release's words)
                raise MisuseError(f"vllm {mods.dist.version}: chunked prefill with prefix "
                                  f"caching is not run: its model runner refuses it "
                                  f"(worker/model_runner.py raises '{RUNNER_REFUSAL} now.' on "
                                  f"a chunked step with cached blocks); run it with "
                                  f"--no-prefix-caching, or without chunked prefill")
            raise MisuseError(f"vllm {mods.dist.version}: chunked prefill with prefix caching "
                              f"on BlockSpaceManagerV1 is not modelled: its lookup leaves out "
                              f"a table's last block even when computed, so a chunk may hold "
                              f"a cached block it has not reached and rewrite it in place at a "
                              f"later step, which kvcheck's prefix rules read as a partial "
                              f"cached block; run it with --no-prefix-caching, or without "
                              f"chunked prefill")
        super().__init__(num_blocks, block_size, budget, max_seqs, policy, caching, spec,
                         max_model_len, chunked, version, engine)
        manager = type(self.manager)  # (the scheduler's own choice of class)
        if manager.__name__ != "BlockSpaceManagerV1":
            raise MisuseError(f"vllm {self.version}'s scheduler built {manager.__name__}, "
                              f"not BlockSpaceManagerV1")
        # the engine oracle's reading of a shared partial block, its copy on write and a
        # full block shared before it is computed (module doc, "Prefix caching")
        self.keys_partial_blocks = caching
        if not caching:
            self._blocks = {b.block_number: b for b in self.gpu.free_blocks}
            return
        name = "append_slots" if hasattr(manager, "append_slots") else "append_slot"
        setattr(self.manager, name, _CopyRecorder(self, getattr(self.manager, name)))

    def _gpu_allocator(self) -> Any:
        return self.manager.gpu_allocator

    def _table(self, s: Any) -> list[int]:
        t = self.manager.block_tables.get(s.seq_id)
        return [b.block_number for b in t] if t is not None else []

    def _pool(self) -> dict[int, Any]:
        """The GPU blocks the allocator has made, by number: with prefix caching the
        ``CachedBlockAllocator`` makes them on demand (``allocate_block``); every one in use
        is in ``cached_blocks`` (keyed by its hash), every one released in the evictor."""
        if not self.caching:
            return self._blocks
        gpu = self.gpu
        out = {b.block_number: b for b in gpu.evictor.free_table.values()}
        out.update((b.block_number, b) for b in gpu.cached_blocks.values())
        for t in self.manager.block_tables.values():
            out.update((b.block_number, b) for b in t)
        return out

    def refcount(self, block: int) -> int:
        b = self._pool().get(block)
        return 0 if b is None else b.ref_count

    def free_blocks(self) -> list[int]:
        if not self.caching:
            return [b.block_number for b in self.gpu.free_blocks]
        gpu = self.gpu  # the evictor's, then those not made yet
        return ([b.block_number for b in gpu.evictor.free_table.values()]
                + list(range(gpu.current_num_blocks, gpu.num_blocks)))

    def num_free(self) -> int:
        return self.gpu.get_num_free_blocks()

    def _hashes(self, s: Any) -> list:
        """The release's own keys of the sequence's full blocks (``Sequence.hash_of_block``:
        the hash of every token up to the block's end)."""
        if not self.caching:
            return []
        return [s.hash_of_block(i) for i in range(s.get_len() // self.block_size)]

    def cached_entries(self) -> list[tuple[Any, int]]:
        """The blocks a lookup lets the model runner skip: those marked ``computed``
        (``get_common_computed_block_ids`` takes them), in use or in the evictor, under
        their key (module doc)."""
        if not self.caching:
            return []
        return [(b.block_hash, n) for n, b in self._pool().items() if b.computed]

    def block_hash(self, block: int):
        if not self.caching:
            return None
        b = self._pool().get(block)
        return b.block_hash if b is not None and b.computed else None


class _CopyRecorder:
    """``append_slots`` (0.4.0: ``append_slot``) recorded by ``vllm_v0_engine``'s
    ``KVCallRecorder``, then the copy on write it returned (0.4.0: ``(shared block, its
    copy)``; 0.4.1, 0.4.2: ``{shared block: [its copy]}``; 0.4.3 on: ``[(shared, copy)]``)
    named on the recorded call: a fresh copy as the block it returns and in
    ``KVCall.copies``; a cached block holding the full prefix (the release's
    ``_allocate_last_physical_block`` finds its hash) as neither: the oracle reads it as a
    promotion. A plain object, so a deep copy of the scheduler records into the copy."""

    def __init__(self, target: VllmV0EngineV1Target, recorder: Any):
        self.target, self.recorder = target, recorder

    def __call__(self, *args, **kwargs):
        t = self.target
        at = len(t.kv_calls)
        result = self.recorder(*args, **kwargs)
        if isinstance(result, dict):  # 0.4.1 .. 0.4.2: {old: [new]}
            pairs = [(old, new) for old, news in result.items() for new in news]
        elif isinstance(result, tuple):  # 0.4.0: (old, new)
            pairs = [result]
        else:  # 0.4.3 on: [(old, new)]
            pairs = list(result or [])
        for old, new in pairs:
            if len(t.kv_calls) > at and t.refcount(new) == 1:
                c = t.kv_calls[at]
                c.result = [*(c.result or []), ResultBlock(new)]
                c.copies[old] = new
        return result


def make(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
         policy: str = "fcfs", caching: bool = True, spec: int = 0,
         version: str | None = None, max_model_len: int | None = None) -> VllmV0EngineV1Target:
    """vLLM v0's scheduler on block manager v1, chunked prefill off."""
    return VllmV0EngineV1Target(num_blocks, block_size, budget, max_seqs, policy, caching,
                                spec, max_model_len or 0, False, version)


def make_chunked(num_blocks: int, block_size: int, budget: int = 16, max_seqs: int = 8,
                 policy: str = "fcfs", caching: bool = True, spec: int = 0,
                 version: str | None = None,
                 max_model_len: int | None = None) -> VllmV0EngineV1Target:
    """vLLM v0's scheduler on block manager v1 with chunked prefill."""
    return VllmV0EngineV1Target(num_blocks, block_size, budget, max_seqs, policy, caching,
                                spec, max_model_len or 0, True, version)
