"""Factories the historical-bug catalogue runs that the registry does not name (yet).

``v0_prefix_counted(n, b, version)``: vLLM v0's prefix-caching ``BlockTable`` behind the
engine's capacity checks (``vllm_v0.make_prefix_guarded``), whose ``allocate`` also
reports the number of prompt tokens the engine skips computing, as the release's
``SelfAttnBlockSpaceManager.get_common_computed_block_ids`` derives it for a sequence
group of one sequence (the model runner's ``context_len = len(computed_block_nums) *
block_size``). The derivation moved between releases, detected by feature:

* 0.4.x .. 0.5.0: the allocator's ``get_common_computed_block_ids([block_ids])`` walks
  the table itself (``takewhile(block_is_computed, ids[:-1])``);
* 0.5.1 .. 0.5.x: the block manager's ``ComputedBlocksTracker.
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
        self._tracker = tracker(self.allocator) if tracker is not None else None
        if self._tracker is not None and not hasattr(self._tracker,
                                                     "get_cached_computed_blocks_and_update"):
            raise NotImplementedError(f"vLLM {self.version}: ComputedBlocksTracker without "
                                      "get_cached_computed_blocks_and_update (0.6 on)")

    def allocate(self, seq, n_tokens, token_ids=None):
        super().allocate(seq, n_tokens, token_ids)
        ids = self.tables[seq].physical_block_ids
        if self._tracker is None:
            computed = self.allocator.get_common_computed_block_ids([ids])
        else:
            self._tracker.add_seq(seq)
            computed = self.allocator.get_common_computed_block_ids(
                [self._tracker.get_cached_computed_blocks_and_update(seq, ids)])
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
