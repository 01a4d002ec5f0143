"""Buggy allocators for sliding-window tables and null blocks (issue 15, section 2).

Each subclasses ``WindowBlockManager`` (the engine reference whose
``drop_behind_window`` releases the blocks wholly behind the attention window and
leaves ``None``, the null block, in their entries) and breaks exactly one thing, named
in its docstring's first line. ``WINDOW`` maps a name to (class, the kind of violation
kvcheck must report, the length of the minimal trace) and is merged into
``buggy.CORPUS``.
"""

from kvcheck.impl.block_manager import NULL_BLOCK, WindowBlockManager
from kvcheck.impl.errors import OutOfBlocks


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Drop(WindowBlockManager):
    """The reference's drop in steps, so a bug can change one of them."""

    def _behind(self, seq, window):
        """How many first blocks lie wholly behind the window."""
        return max(0, self.lens[seq] - window) // self.block_size

    def _placeholder(self, seq, i):
        return NULL_BLOCK

    def _drop_one(self, table, i, seq):
        self._release(table[i])
        table[i] = self._placeholder(seq, i)

    def drop_behind_window(self, seq, window):
        table = self._live(seq)
        for i in range(self._behind(seq, window) - 1, -1, -1):
            if table[i] is NULL_BLOCK:
                break
            self._drop_one(table, i, seq)


class WindowDropsInside(_Drop):
    """drop_behind_window rounds up: the block holding the window's first tokens is dropped too."""

    def _behind(self, seq, window):
        n = self.lens[seq]  # bug: a block partly inside the window counts as behind it
        return min(_cdiv(max(0, n - window), self.block_size), len(self.tables[seq]))


class WindowCountsReservedAsTokens(_Drop):
    """drop_behind_window measures the window from the end of the reserved blocks, as if they held tokens."""

    def _behind(self, seq, window):
        table, n, bs = self.tables[seq], self.lens[seq], self.block_size
        spare = (len(table) - _cdiv(n, bs)) * bs  # whole blocks reserved past the last token
        return max(0, n + spare - window) // bs  # bug: the reserved slots counted as tokens


class WindowKeepsReference(_Drop):
    """drop_behind_window nulls the entry but forgets to release the dropped block's reference."""

    def _drop_one(self, table, i, seq):
        table[i] = NULL_BLOCK  # bug: no _release: the block leaks


class WindowFreesShared(_Drop):
    """drop_behind_window frees a dropped block outright, though a fork still shares it."""

    def _drop_one(self, table, i, seq):
        block = table[i]
        self.ref[block] = 0  # bug: other holders ignored
        self.free.append(block)
        table[i] = NULL_BLOCK


class WindowRealIdPlaceholder(_Drop):
    """drop_behind_window marks a dropped entry with block 0 (as if the pool's first block were null)."""

    def _placeholder(self, seq, i):
        return 0  # bug: a pool block id, not the null placeholder


class WindowDropsOnRelease(_Drop):
    """drop_behind_window releases the dropped block but leaves its id in the table."""

    def _placeholder(self, seq, i):
        return self.tables[seq][i]  # bug: the entry still names the released block


class WindowFreeCountsNullEntries(WindowBlockManager):
    """free_seq puts one free-list entry per table entry that holds no reference, the null ones too (vLLM #42571)."""

    def free_seq(self, seq):
        table = self._live(seq)
        del self.tables[seq], self.lens[seq]
        for block in table:
            if block is not NULL_BLOCK:
                self.ref[block] -= 1
        # bug: the candidates are the table's entries, not its blocks: the null block (one
        # placeholder named many times) is counted into the free list once per entry
        self.free.extend(b for b in table if b is NULL_BLOCK or self.ref[b] == 0)


class WindowAdmitsByWindow(WindowBlockManager):
    """allocate admits a prompt by the blocks its window needs, then takes every prompt block (vLLM #11168)."""

    WINDOW = 2  # the model's sliding window, in tokens

    def allocate(self, seq, n_tokens):
        need = _cdiv(n_tokens, self.block_size)
        admit = min(need, _cdiv(self.WINDOW, self.block_size))  # bug: can_allocate's cap
        if admit > len(self.free):
            raise OutOfBlocks(f"need {admit} blocks, {len(self.free)} free")
        table = self.tables[seq] = []
        self.lens[seq] = n_tokens
        for _ in range(need):
            if not self.free:
                raise OutOfBlocks("ran out of blocks mid-allocation")  # the blocks taken stay
            table.append(self._take())


WINDOW = {
    "window-drops-inside": (WindowDropsInside, "contract", 2),
    "window-counts-reserved-as-tokens": (WindowCountsReservedAsTokens, "contract", 3),
    "window-keeps-reference": (WindowKeepsReference, "contract", 2),
    "window-frees-shared": (WindowFreesShared, "contract", 3),
    "window-real-id-placeholder": (WindowRealIdPlaceholder, "contract", 2),
    "window-drops-on-release": (WindowDropsOnRelease, "contract", 2),
    "window-free-counts-null-entries": (WindowFreeCountsNullEntries, "contract", 3),
    "window-admits-by-window": (WindowAdmitsByWindow, "contract", 2),  # 1 on a 1-block pool
}

LEGAL = {
    "window-in-steps": _Drop,
}
