"""A corpus of buggy allocators, one per common mistake.

Each subclasses the reference and breaks exactly one thing. ``CORPUS`` maps
a name to (class, the kind of violation kvcheck must report, maximum length
of the minimal trace). The allocators of the operations engines use beyond the
seed's four live in ``engine`` and are merged in.
"""

from kvcheck.impl.block_manager import BlockManager
from kvcheck.impl.errors import OutOfBlocks

try:  # imported as tests/corpus, a package ...
    from corpus import cyclic, engine, window
except ImportError:  # ... or loaded as a file (a TARGET path), its folder importable
    import cyclic
    import engine
    import window


class CowFullBlocks(BlockManager):
    """Seed mistake: copy-on-write for every shared block, full ones included."""

    def append_slot(self, seq):
        table, n = self.tables[seq], self.lens[seq]
        offset, cow_src = n % self.block_size, None
        if self.ref[table[-1]] > 1:  # bug: ignores whether the last block is full
            if not self.free:
                raise OutOfBlocks
            new = self._take()
            cow_src = table[-1]
            self._release(cow_src)
            table[-1] = new
        if offset == 0:
            if not self.free:
                raise OutOfBlocks
            table.append(self._take())
        self.lens[seq] = n + 1
        return table[-1], offset, cow_src


class ReleaseBeforeAllocate(BlockManager):
    """Seed mistake: release the shared block before allocating its copy."""

    def append_slot(self, seq):
        table, n = self.tables[seq], self.lens[seq]
        offset, cow_src = n % self.block_size, None
        if offset == 0:
            if not self.free:
                raise OutOfBlocks
            table.append(self._take())
        elif self.ref[table[-1]] > 1:
            cow_src = table[-1]
            self._release(cow_src)  # bug: released first ...
            if not self.free:
                raise OutOfBlocks  # ... so this leaves the table on a block it no longer owns
            table[-1] = self._take()
        self.lens[seq] = n + 1
        return table[-1], offset, cow_src


class FreeWithoutRefcounts(BlockManager):
    """Seed mistake: free every block of a sequence, ignoring other holders."""

    def free_seq(self, seq):
        for b in self.tables.pop(seq):
            if self.ref[b] > 0:
                self.ref[b] = 0
                self.free.append(b)
        del self.lens[seq]


class PartialAllocate(BlockManager):
    """Seed mistake: allocate takes blocks one by one and fails half-way."""

    def allocate(self, seq, n_tokens):
        need = -(-n_tokens // self.block_size)
        table = []
        for _ in range(need):
            if not self.free:
                raise OutOfBlocks  # bug: the blocks already taken stay taken
            table.append(self._take())
        self.tables[seq] = table
        self.lens[seq] = n_tokens


class ForkWithoutRefcount(BlockManager):
    """Seed mistake: fork shares the blocks but forgets to count the new holder."""

    def fork(self, parent, child):
        self.tables[child] = list(self.tables[parent])
        self.lens[child] = self.lens[parent]


class AliasingFork(BlockManager):
    """The child gets the parent's table *object*, not a copy."""

    def fork(self, parent, child):
        for b in self.tables[parent]:
            self.ref[b] += 1
        self.tables[child] = self.tables[parent]
        self.lens[child] = self.lens[parent]


class NoCopyOnWrite(BlockManager):
    """Writes into a shared partial block in place."""

    def append_slot(self, seq):
        table, n = self.tables[seq], self.lens[seq]
        offset = n % self.block_size
        if offset == 0:
            if not self.free:
                raise OutOfBlocks
            table.append(self._take())
        self.lens[seq] = n + 1
        return table[-1], offset, None


class CrashOnFork(BlockManager):
    """Raises an unexpected exception."""

    def fork(self, parent, child):
        raise KeyError("boom")


class HangOnCow(BlockManager):
    """Never returns when it must copy."""

    def append_slot(self, seq):
        table, n = self.tables[seq], self.lens[seq]
        if n % self.block_size and self.ref[table[-1]] > 1:
            while True:
                pass
        return super().append_slot(seq)


class BadReturn(BlockManager):
    """append_slot returns only the block id."""

    def append_slot(self, seq):
        return super().append_slot(seq)[0]


CORPUS = {
    "cow-full-blocks": (CowFullBlocks, "contract", 4),
    "release-before-allocate": (ReleaseBeforeAllocate, "contract", 3),
    "free-without-refcounts": (FreeWithoutRefcounts, "contract", 3),
    "partial-allocate": (PartialAllocate, "contract", 2),
    "fork-without-refcount": (ForkWithoutRefcount, "contract", 2),
    "aliasing-fork": (AliasingFork, "invariant", 2),
    "no-copy-on-write": (NoCopyOnWrite, "contract", 3),
    "crash-on-fork": (CrashOnFork, "crash", 2),
    "bad-return": (BadReturn, "malformed", 2),
}
CORPUS.update(engine.ENGINE)
CORPUS.update(window.WINDOW)
CORPUS.update(cyclic.CYCLIC)
globals().update({cls.__name__: cls for cls, _, _ in engine.ENGINE.values()})
globals().update({cls.__name__: cls for cls, _, _ in window.WINDOW.values()})
globals().update({cls.__name__: cls for cls, _, _ in cyclic.CYCLIC.values()})
