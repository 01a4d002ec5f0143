"""Reference paged KV-cache block manager (the seed's API).

State, readable by anyone:
    ``free``    deque of free block ids, each at most once, refcount 0
    ``ref``     list, ``ref[b]`` = number of table entries naming block ``b``
    ``tables``  dict seq -> list of block ids, ``len == ceil(lens[seq] / block_size)``
    ``lens``    dict seq -> number of tokens

Every public method either succeeds or raises (``OutOfBlocks`` / ``MisuseError``)
with every structure unchanged: validation and allocation happen before any
release or mutation.

``BlockManager`` has the seed's four operations. ``EngineBlockManager`` adds the
ones engines use beyond them: ``append_slots`` (multi-token reservation with
lookahead, as chunked prefill and speculative decoding use), ``rollback`` (drop
rejected speculative tokens; the reference keeps their blocks as reservation),
``rebase`` (re-point a live sequence at another's history: beam search) and
``preempt`` (free for recompute). ``EagerForkBlockManager`` forks eagerly (a
partial last block copied at fork time), the other legal way. ``WindowBlockManager``
adds sliding-window attention: ``drop_behind_window`` releases the blocks wholly
behind a window and leaves ``None`` (the null block) in their table entries.
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

        A fresh block only when the slot lies past the last block; copy-on-write
        only when the block it lies in is shared (the caller copies ``cow_src`` into
        ``block`` before writing; a shared block not yet holding any of the
        sequence's tokens is replaced without a copy). Allocates before releasing,
        so ``OutOfBlocks`` leaves everything untouched.
        """
        table = self._live(seq)
        n = self.lens[seq]
        k, offset = divmod(n, self.block_size)
        cow_src = None
        if k == len(table):
            if not self.free:
                raise OutOfBlocks("no free block for a new tail block")
            table.append(self._take())
        elif self.ref[table[k]] > 1:
            if not self.free:
                raise OutOfBlocks("no free block for copy-on-write")
            new = self._take()
            old = table[k]
            self._release(old)
            table[k] = new
            cow_src = old if offset else None
        self.lens[seq] = n + 1
        return table[k], offset, cow_src

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

class EngineBlockManager(BlockManager):
    """The reference with the operations real engines use beyond the seed's four:
    multi-token reservation with lookahead (chunked prefill, speculative decoding),
    rollback of rejected tokens (their blocks kept as reservation), rebase (beam search)
    and preemption for recompute. A table may hold blocks beyond its tokens:
    ``len(tables[seq]) == ceil((lens[seq] + reserved) / block_size)``."""

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0) -> list[tuple[int, int]]:
        """Reserve the slots of ``n_tokens`` more tokens and ``lookahead`` slots beyond them,
        all or nothing: the ``(src, dst)`` copies the caller makes before writing.

        New blocks for the slots past the last block; a shared block a new token lands
        in is replaced by a fresh one (copied first if it already holds tokens of the
        sequence); blocks the sequence holds alone are written in place."""
        table = self._live(seq)
        _check_size("n_tokens", n_tokens)
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise MisuseError(f"lookahead must be a non-negative integer, got {lookahead!r}")
        n, bs = self.lens[seq], self.block_size
        first, last = n // bs, (n + n_tokens - 1) // bs
        grow = max(0, -(-(n + n_tokens + lookahead) // bs) - len(table))
        shared = [i for i in range(first, min(last, len(table) - 1) + 1) if self.ref[table[i]] > 1]
        if grow + len(shared) > len(self.free):
            raise OutOfBlocks(f"need {grow + len(shared)} blocks, {len(self.free)} free")
        fresh = [self._take() for _ in range(grow + len(shared))]  # allocate before releasing
        copies = []
        for i, new in zip(shared, fresh, strict=False):
            old = table[i]
            self._release(old)
            table[i] = new
            if i == first and n % bs:
                copies.append((old, new))
        table.extend(fresh[len(shared):])
        self.lens[seq] = n + n_tokens
        return copies

    def rollback(self, seq: int, n_tokens: int) -> None:
        """Drop the last ``n_tokens`` tokens (at least one stays); their blocks are kept as
        reservation, as an engine keeps the slots of rejected speculative tokens."""
        self._live(seq)
        _check_size("n_tokens", n_tokens)
        if n_tokens >= self.lens[seq]:
            raise MisuseError(f"rollback of {n_tokens} tokens leaves sequence {seq!r} none")
        self.lens[seq] -= n_tokens

    def rebase(self, source: int, child: int) -> None:
        """Re-point live ``child`` at ``source``'s history: it drops its own blocks and
        shares every block of ``source`` (refcount +1 each), with ``source``'s length."""
        table = self._live(source)
        old = self._live(child)
        if child == source:
            raise MisuseError(f"sequence {child!r} cannot be rebased onto itself")
        ref = self.ref
        for block in table:  # take the new references before dropping the old
            ref[block] += 1
        for block in old:
            self._release(block)
        self.tables[child] = list(table)
        self.lens[child] = self.lens[source]

    def preempt(self, seq: int) -> None:
        """Preempt ``seq`` for recompute: everything it holds is released, as by free_seq."""
        self.free_seq(seq)


class EagerForkBlockManager(EngineBlockManager):
    """The reference, but a fork (or rebase) copies a partial block holding the parent's
    last token at once instead of sharing it: the legal eager copy-on-write. Such a fork
    takes a block, so it may run out of blocks, and then changes nothing."""

    def _copy_tail(self, source: int) -> list[tuple[int, int]] | None:
        """The source's table with a partial last-token block copied, and the copy made."""
        table, n, bs = self.tables[source], self.lens[source], self.block_size
        if n % bs == 0:
            return None
        if not self.free:
            raise OutOfBlocks("no free block to copy a partial block at fork time")
        return [(table[(n - 1) // bs], self._take())]

    def _share(self, source: int, child: int) -> list[tuple[int, int]]:
        table, n, bs = self.tables[source], self.lens[source], self.block_size
        copies = self._copy_tail(source) or []
        new = list(table)
        for _src, dst in copies:
            new[(n - 1) // bs] = dst
        for i, block in enumerate(new):
            if not copies or i != (n - 1) // bs:
                self.ref[block] += 1
        return new, copies

    def fork(self, parent: int, child: int) -> list[tuple[int, int]]:
        self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        table, copies = self._share(parent, child)
        self.tables[child] = table
        self.lens[child] = self.lens[parent]
        return copies

    def rebase(self, source: int, child: int) -> list[tuple[int, int]]:
        self._live(source)
        old = self._live(child)
        if child == source:
            raise MisuseError(f"sequence {child!r} cannot be rebased onto itself")
        table, copies = self._share(source, child)
        for block in old:
            self._release(block)
        self.tables[child] = table
        self.lens[child] = self.lens[source]
        return copies


NULL_BLOCK = None  # the null placeholder a dropped table entry holds (vLLM v1's null block)


class WindowBlockManager(EngineBlockManager):
    """The engine reference with sliding-window attention, as vLLM v1's
    ``SlidingWindowManager.remove_skipped_blocks`` does it: the blocks wholly behind
    the last ``window`` tokens are released and their entries replaced by
    ``NULL_BLOCK``, which is no pool block, holds no reference and is never freed."""

    def _release(self, block) -> None:
        if block is not NULL_BLOCK:
            super()._release(block)

    def _hold(self, table) -> None:
        ref = self.ref
        for block in table:
            if block is not NULL_BLOCK:
                ref[block] += 1

    def drop_behind_window(self, seq: int, window: int) -> None:
        """Release every block wholly before ``seq``'s last ``window`` tokens."""
        table = self._live(seq)
        _check_size("window", window)
        skip = max(0, self.lens[seq] - window) // self.block_size
        for i in range(skip - 1, -1, -1):  # from the newest back, as vLLM does
            if table[i] is NULL_BLOCK:
                break  # (everything before it was dropped already)
            self._release(table[i])
            table[i] = NULL_BLOCK

    def fork(self, parent: int, child: int) -> None:
        table = self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        self._hold(table)
        self.tables[child] = list(table)
        self.lens[child] = self.lens[parent]

    def rebase(self, source: int, child: int) -> None:
        table = self._live(source)
        old = self._live(child)
        if child == source:
            raise MisuseError(f"sequence {child!r} cannot be rebased onto itself")
        self._hold(table)  # take the new references before dropping the old
        for block in old:
            self._release(block)
        self.tables[child] = list(table)
        self.lens[child] = self.lens[source]

    def rollback(self, seq: int, n_tokens: int) -> None:
        table = self._live(seq)
        _check_size("n_tokens", n_tokens)
        left = self.lens[seq] - n_tokens
        if left >= 1 and table[(left - 1) // self.block_size] is NULL_BLOCK:
            raise MisuseError(f"rollback of sequence {seq!r} reaches behind its window")
        super().rollback(seq, n_tokens)


class CyclicBlockManager(BlockManager):
    """The seed's four operations under a cyclic sliding window of ``window_blocks``
    blocks (vLLM's BlockSpaceManager v1, legally): a table holds its last ``W`` blocks
    (``cyclic_window = W * block_size`` tokens, which the oracle reads); every entry
    before them is ``NULL_BLOCK``. A prompt longer than the window takes ``W`` blocks;
    an append at a block boundary past the window releases the entry leaving the window
    and takes a block for the new position: the released one itself, reused in place
    when the sequence held it alone, else a fresh one (the engine's copy-on-write of a
    shared reused block, with nothing to copy in the spec's reading)."""

    def __init__(self, num_blocks: int, block_size: int, window_blocks: int = 2):
        super().__init__(num_blocks, block_size)
        self.window_blocks = _check_size("window_blocks", window_blocks)
        self.cyclic_window = window_blocks * block_size

    def _release(self, block) -> None:
        if block is not NULL_BLOCK:
            super()._release(block)

    def allocate(self, seq: int, n_tokens: int) -> None:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        _check_size("n_tokens", n_tokens)
        need = -(-n_tokens // self.block_size)
        fresh = min(need, self.window_blocks)
        if fresh > len(self.free):
            raise OutOfBlocks(f"need {fresh} blocks, {len(self.free)} free")
        self.tables[seq] = [NULL_BLOCK] * (need - fresh) + [self._take() for _ in range(fresh)]
        self.lens[seq] = n_tokens

    def append_slot(self, seq: int) -> tuple[int, int, int | None]:
        table = self._live(seq)
        n = self.lens[seq]
        k, offset = divmod(n, self.block_size)
        if k == len(table) and k >= self.window_blocks:  # the block leaving the window
            j = k - self.window_blocks
            old = table[j]
            if self.ref[old] == 1:  # the sequence's alone: reused in place
                block = old
            else:
                if not self.free:
                    raise OutOfBlocks("no free block for the reused block's copy")
                block = self._take()
                self._release(old)
            table[j] = NULL_BLOCK
            table.append(block)
            self.lens[seq] = n + 1
            return block, 0, None
        return super().append_slot(seq)

    def fork(self, parent: int, child: int) -> None:
        table = self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        for block in table:
            if block is not NULL_BLOCK:
                self.ref[block] += 1
        self.tables[child] = list(table)
        self.lens[child] = self.lens[parent]

    def free_seq(self, seq: int) -> None:
        table = self._live(seq)
        del self.tables[seq]
        del self.lens[seq]
        for block in table:
            self._release(block)
