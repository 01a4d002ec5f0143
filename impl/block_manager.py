"""Reference paged KV-cache block manager (the seed's API).

State, readable by anyone:
    ``free``    deque of free block ids, each at most once, refcount 0
    ``ref``     list, ``ref[b]`` = number of table entries naming block ``b``
    ``tables``  dict seq -> list of block ids, ``len == ceil(lens[seq] / block_size)``
    ``lens``    dict seq -> number of tokens

Every public method either succeeds or raises (``OutOfBlocks`` / ``MisuseError``)
with every structure unchanged: validation and allocation happen before any
release or mutation.
"""

from collections import deque

from .errors import MisuseError, OutOfBlocks


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MisuseError(f"{name} must be a positive integer, got {value!r}")
    return value


class BlockManager:
    """Free list + refcounts + per-sequence block tables, copy-on-write fork."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = _check_size("num_blocks", num_blocks)
        self.block_size = _check_size("block_size", block_size)
        self.free: deque[int] = deque(range(num_blocks))
        self.ref: list[int] = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    # -- internal -----------------------------------------------------------
    def _take(self) -> int:
        """Pop a free block and give it refcount 1 (caller checked availability)."""
        block = self.free.popleft()
        assert self.ref[block] == 0, f"block {block} on free list with refcount {self.ref[block]}"
        self.ref[block] = 1
        return block

    def _release(self, block: int) -> None:
        """Drop one reference; a block reaching refcount 0 returns to the free list."""
        count = self.ref[block] - 1
        assert count >= 0, f"double free of block {block}"
        self.ref[block] = count
        if count == 0:
            self.free.append(block)

    def _live(self, seq: int) -> list[int]:
        table = self.tables.get(seq)
        if table is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return table

    # -- operations ---------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int) -> None:
        """Give ``seq`` ceil(n_tokens / block_size) fresh blocks, all or nothing."""
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        _check_size("n_tokens", n_tokens)
        need = -(-n_tokens // self.block_size)
        if need > len(self.free):
            raise OutOfBlocks(f"need {need} blocks, {len(self.free)} free")
        self.tables[seq] = [self._take() for _ in range(need)]
        self.lens[seq] = n_tokens

    def append_slot(self, seq: int) -> tuple[int, int, int | None]:
        """Reserve the slot for one more token: ``(block, offset, cow_src)``.

        A fresh block only when the last block is full; copy-on-write only when
        the last block is partial and shared (the caller copies ``cow_src`` into
        ``block`` before writing). Allocates before releasing, so
        ``OutOfBlocks`` leaves everything untouched.
        """
        table = self._live(seq)
        n = self.lens[seq]
        offset = n % self.block_size
        cow_src = None
        if offset == 0:
            if not self.free:
                raise OutOfBlocks("no free block for a new tail block")
            table.append(self._take())
        elif self.ref[table[-1]] > 1:
            if not self.free:
                raise OutOfBlocks("no free block for copy-on-write")
            new = self._take()
            cow_src = table[-1]
            self._release(cow_src)
            table[-1] = new
        self.lens[seq] = n + 1
        return table[-1], offset, cow_src

    def fork(self, parent: int, child: int) -> None:
        """``child`` shares every block of ``parent`` (refcount +1 each), own table."""
        table = self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        ref = self.ref
        for block in table:
            ref[block] += 1
        self.tables[child] = list(table)
        self.lens[child] = self.lens[parent]

    def free_seq(self, seq: int) -> None:
        """Drop ``seq``; its blocks lose one reference each."""
        table = self._live(seq)
        del self.tables[seq]
        del self.lens[seq]
        for block in table:
            self._release(block)
