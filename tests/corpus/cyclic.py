"""Buggy allocators under a cyclic sliding window (vLLM's BlockSpaceManager v1, #1556).

Each subclasses ``_Stale``: the legal ``CyclicBlockManager`` (the reference: only a
table's last ``W`` entries hold references, the ones before are ``None``) that also keeps
every table as vLLM's v1 block manager holds it (``full``: the entries behind the window
still name the blocks they named, stale), and breaks exactly one thing, named in its
docstring's first line, the way a vLLM release did. ``CYCLIC`` maps a name to (class, the
kind of violation kvcheck must report, the length of the minimal trace) and is merged
into ``buggy.CORPUS``; ``LEGAL`` lists the legal ones.
"""

from kvcheck.impl.block_manager import NULL_BLOCK, CyclicBlockManager
from kvcheck.impl.errors import OutOfBlocks


class _Stale(CyclicBlockManager):
    """The reference, also keeping each table as the engine does (``full``)."""

    def __init__(self, num_blocks, block_size, window_blocks=2):
        super().__init__(num_blocks, block_size, window_blocks)
        self.full = {}

    def hidden_table(self, seq):  # (what exploration must not merge away)
        return self.full[seq]

    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        t, W = self.tables[seq], self.window_blocks
        first = max(0, len(t) - W)  # the first live position: block_table[i % W] before it
        self.full[seq] = [t[first + (i - first) % W] if i < first else t[i]
                          for i in range(len(t))]

    def append_slot(self, seq):
        grew = self.lens[seq] % self.block_size == 0
        result = super().append_slot(seq)
        full = self.full[seq]
        if grew:
            full.append(self.tables[seq][-1])
        else:
            full[-1] = self.tables[seq][-1]
        return result

    def fork(self, parent, child):
        super().fork(parent, child)
        self.full[child] = list(self.full[parent])

    def free_seq(self, seq):
        super().free_seq(seq)
        del self.full[seq]


class CyclicForkCountsStale(_Stale):
    """fork adds a reference per entry of the engine's table, stale entries included.

    vLLM 0.3.3, #1556 (``for block in src_block_table``)."""

    def fork(self, parent, child):
        super().fork(parent, child)
        behind = len(self.tables[parent]) - self.window_blocks
        for block in self.full[parent][:max(0, behind)]:  # bug: `for block in src_block_table`
            self.ref[block] += 1


class CyclicFreesStale(_Stale):
    """free_seq frees every distinct block the engine's table names, stale entries included.

    vLLM 0.3.3, #1556: a later free raises "Double free!"."""

    def free_seq(self, seq):
        self._live(seq)
        blocks = set(self.full.pop(seq))  # bug: `for block in set(block_table)`
        del self.tables[seq]
        del self.lens[seq]
        for block in blocks:
            if self.ref[block] == 0:
                raise ValueError(f"Double free! block {block} is already freed.")
            self._release(block)


class CyclicReusesStaleEntry(_Stale):
    """an append past the window reuses the entry the cycle points at, not the one leaving it.

    ``block_table[len % W]``: vLLM 0.3.3 .. 0.6.2, F10."""

    def append_slot(self, seq):
        table, n, bs, W = self._live(seq), self.lens[seq], self.block_size, self.window_blocks
        k = n // bs
        if n % bs or k < W:
            return super().append_slot(seq)
        reused = self.full[seq][k % W]  # bug: a stale name once a copy replaced its entry
        if self.ref[reused] == 1:
            block = reused
        else:  # (as the engine: copy-on-write of a block it believes shared)
            if not self.free:
                raise OutOfBlocks("no free block for the copy")
            if self.ref[reused] == 0:
                raise ValueError(f"Double free! block {reused} is already freed.")
            block = self._take()
            self._release(reused)
        table[k - W] = NULL_BLOCK  # (the block that left the window keeps its reference)
        table.append(block)
        self.full[seq].append(block)
        self.lens[seq] = n + 1
        return block, 0, None


class CyclicTakesEveryBlock(_Stale):
    """allocate takes a block for every prompt position, though the window holds only the last W."""

    def allocate(self, seq, n_tokens):
        need = -(-n_tokens // self.block_size)
        if need > len(self.free) or need <= self.window_blocks:
            return super().allocate(seq, n_tokens)
        super().allocate(seq, n_tokens)
        table = self.tables[seq]
        for i in range(need - self.window_blocks):  # bug: the positions behind get blocks too
            table[i] = self._take()
        self.full[seq] = list(table)


class CyclicOneBlock(CyclicBlockManager):
    """Legal: a window of a single block (every boundary append reuses it)."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, 1)


CYCLIC = {
    "cyclic-fork-counts-stale": (CyclicForkCountsStale, "contract", 2),
    "cyclic-frees-stale": (CyclicFreesStale, "contract", 6),  # (6: its "Double free!")
    "cyclic-reuses-stale-entry": (CyclicReusesStaleEntry, "crash", 16),  # (the engine's Double free!)
    "cyclic-takes-every-block": (CyclicTakesEveryBlock, "contract", 1),
}

# For the corpus-wide exploration tests (tests/proofs/test_explore.py, tests/traces): a
# cyclic bug needs a prompt longer than the window (2 blocks of 2 tokens there), so their
# bounded BFS runs with prompts up to BFS_MAX_TOKENS; BEYOND_BFS are the bugs whose
# shortest trace is longer than those tests' depth (tests/core/test_cyclic.py and
# test_corpus_caught cover them).
BFS_MAX_TOKENS = 6
BEYOND_BFS = {"cyclic-reuses-stale-entry": "its shortest trace is 16 operations"}

LEGAL = {
    "cyclic": CyclicBlockManager,
    "cyclic-engine-view": _Stale,
    "cyclic-one-block": CyclicOneBlock,
}
