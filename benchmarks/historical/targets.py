"""Factories the historical-bug catalogue runs that the registry does not name (yet).

``v0_prefix_counted(n, b, version)``: vLLM v0's prefix-caching ``BlockTable`` behind the
engine's capacity checks (``vllm_v0.make_prefix_guarded``), whose ``allocate`` also
reports the number of prompt tokens the engine skips computing, as the release's
``SelfAttnBlockSpaceManager.get_common_computed_block_ids`` derives it for a sequence
group of one sequence (the model runner's ``context_len = len(computed_block_nums) *
block_size``). The derivation moved between releases, detected by feature:

* 0.4.x .. 0.5.0: the allocator's ``get_common_computed_block_ids([block_ids])`` walks
  the table itself (``takewhile(block_is_computed, ids[:-1])``);
* 0.5.1 .. 0.6.4: the block manager's ``ComputedBlocksTracker.
  get_cached_computed_blocks_and_update(seq_id, block_ids)`` gives the computed prefix
  of the table (the last block excluded), then the allocator's
  ``get_common_computed_block_ids`` of it.

A count is what ``spec.prefix.cached_tokens`` checks (vLLM PR #5364: a block reused from
the evictor kept its computed mark). The adapter itself (``impl/thirdparty/vllm_v0.py``)
is to report the count on its own; this wrapper exists for the releases the benchmark
pins and runs the allocator's own code only.
"""

from __future__ import annotations

from kvcheck.impl.thirdparty import vllm_v0


class CountingV0Prefix(vllm_v0.VllmV0Target):
    def __init__(self, num_blocks: int, block_size: int, version: str | None = None):
        super().__init__(num_blocks, block_size, "prefix_caching", guard="engine",
                         version=version)
        mods = vllm_v0.load(version)
        tracker = getattr(mods["vllm.core.block.prefix_caching_block"],
                          "ComputedBlocksTracker", None)
        if tracker is not None and not hasattr(tracker, "get_cached_computed_blocks_and_update"):
            raise NotImplementedError(
                f"vLLM {self.version}: its ComputedBlocksTracker counts cached tokens of a "
                f"Sequence (get_num_cached_tokens, 0.6.5 on); this wrapper reads 0.4.x .. 0.6.4")
        self._tracker = tracker(self.allocator) if tracker is not None else None

    def allocate(self, seq, n_tokens, token_ids=None):
        # the engine asks for the computed blocks when it schedules the prompt, before the
        # step's forward pass and before the step's mark_blocks_as_computed (0.6 on)
        self._caching = False
        try:
            super().allocate(seq, n_tokens, token_ids)
        finally:
            self._caching = True
        ids = self.tables[seq].physical_block_ids
        if self._tracker is None:
            computed = self.allocator.get_common_computed_block_ids([ids])
        else:
            self._tracker.add_seq(seq)
            computed = self.allocator.get_common_computed_block_ids(
                [self._tracker.get_cached_computed_blocks_and_update(seq, ids)])
        self._engine_step()
        return len(computed) * self.block_size

    def fork(self, parent, child):
        super().fork(parent, child)
        if self._tracker is not None:  # SelfAttnBlockSpaceManager.fork tracks the child
            self._tracker.add_seq(child)

    def free_seq(self, seq):
        super().free_seq(seq)
        if self._tracker is not None:
            self._tracker.remove_seq(seq)


def v0_prefix_counted(num_blocks: int, block_size: int, version: str | None = None):
    return CountingV0Prefix(num_blocks, block_size, version)
