"""Reference hybrid block manager: KV-cache groups (full attention, sliding windows)
sharing one pool, with prefix caching per group, as vLLM v1's hybrid coordinator.

``HybridBlockManager(num_blocks, block_size)`` has two groups: group 0 full attention,
group 1 a sliding window of ``2 * block_size`` tokens (at least 2). Per request it
keeps one table per group; every new block comes from the one free list.

``allocate(seq, tokens)``
    the longest prefix hit common to every group (whole blocks, at most ``n - 1``
    tokens: a full hit recomputes the last block): a full group needs every block of
    the prefix cached, a sliding group only the blocks covering the ``W - 1`` tokens
    before the hit's end (its entries before them are the null placeholder). The hit
    blocks are shared (revived from the free list when unreferenced), the rest taken
    fresh (a fresh block that still has a cache key is evicted). Returns the cached
    tokens per group. Out of blocks: nothing changes.
``append_slot(seq, token)``
    a decode step: first the sliding groups release the blocks no later token attends
    to (``(i + 1) * B <= len - W + 1``, computed on the length before the step, as
    vLLM's ``remove_skipped_blocks(num_computed_tokens)``), then each group takes a
    block if the token starts one. A block the token completes is cached.
``append_tokens(seq, tokens)``
    the same for several tokens computed in one step (a chunk of a streamed prompt):
    the drop is against the length before the step (the first new token's window).
``free_seq(seq)``
    every group's table, last block first; cached blocks stay findable (evictable).

Observation (the hybrid Target protocol, ``kvcheck.models.hybrid``): ``windows``,
``block_table(seq, group)``, ``table_identity(seq, group)``, ``refcount(b)``,
``free_blocks()``, ``num_free()``, ``seq_len(seq)``, ``seqs()``.
"""

from __future__ import annotations

from .block_manager import OutOfBlocks
from .errors import MisuseError

NULL = -1  # kvcheck.spec.state.NULL


class HybridBlockManager:
    capabilities = frozenset({"allocate", "append_slot", "append_tokens", "free_seq"})

    def __init__(self, num_blocks: int, block_size: int, windows: tuple[int, ...] | None = None,
                 caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.windows = tuple(windows) if windows is not None else (0, max(2, 2 * block_size))
        self.caching = caching
        self.ref = [0] * num_blocks
        self.free = list(range(num_blocks))  # taken from the front, returned at the back
        self.cache: dict = {}  # (group, prefix tokens) -> block
        self.key_of: dict[int, tuple] = {}  # block -> its key
        self.tables: dict[int, list[list[int]]] = {}
        self.tokens: dict[int, list[int]] = {}

    # -- helpers ------------------------------------------------------------------
    def _key(self, g: int, toks, i: int) -> tuple:
        return (g, tuple(toks[: (i + 1) * self.block_size]))

    def _needed_from(self, g: int, end: int) -> int:
        """The first block position group ``g`` still needs when the next token is ``end``."""
        W = self.windows[g]
        return 0 if W == 0 else max(0, (end - W + 1) // self.block_size)

    def _hit(self, toks) -> int:
        """The longest hit (in blocks) every group has cached."""
        if not self.caching:
            return 0
        B = self.block_size
        for h in range((len(toks) - 1) // B, 0, -1):
            if all(self._key(g, toks, i) in self.cache
                   for g in range(len(self.windows))
                   for i in range(self._needed_from(g, h * B), h)):
                return h
        return 0

    def _take(self) -> int:
        b = self.free.pop(0)
        key = self.key_of.pop(b, None)
        if key is not None:  # evicted: its old content is gone
            del self.cache[key]
        self.ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free.append(b)

    def _publish(self, g: int, toks, i: int, b: int) -> None:
        if not self.caching:
            return
        key = self._key(g, toks, i)
        if key not in self.cache and b not in self.key_of:
            self.cache[key] = b
            self.key_of[b] = key

    # -- operations ---------------------------------------------------------------
    def allocate(self, seq: int, tokens) -> list[int]:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        toks = list(tokens)
        if not toks:
            raise MisuseError("a prompt has at least one token")
        B, G = self.block_size, len(self.windows)
        n = len(toks)
        nb = -(-n // B)
        h = self._hit(toks)
        hits = {(g, i): self.cache[self._key(g, toks, i)]
                for g in range(G) for i in range(self._needed_from(g, h * B), h)}
        revived = {b for b in hits.values() if self.ref[b] == 0}
        if G * (nb - h) > len(self.free) - len(revived):
            raise OutOfBlocks(f"{G * (nb - h)} blocks needed, {len(self.free) - len(revived)} free")
        for b in revived:
            self.free.remove(b)
        tables = []
        for g in range(G):
            table = []
            for i in range(h):
                b = hits.get((g, i), NULL)
                if b != NULL:
                    self.ref[b] += 1
                table.append(b)
            for i in range(h, nb):
                b = self._take()
                table.append(b)
                if (i + 1) * B <= n:
                    self._publish(g, toks, i, b)
            tables.append(table)
        self.tables[seq] = tables
        self.tokens[seq] = toks
        return [h * B] * G

    def _drops(self, seq: int) -> list[tuple[int, int]]:
        """(group, position) of the pool entries the sliding groups release now."""
        length = len(self.tokens[seq])
        out = []
        for g, table in enumerate(self.tables[seq]):
            for i in range(min(self._needed_from(g, length), len(table))):
                if table[i] != NULL:
                    out.append((g, i))
        return out

    def append_slot(self, seq: int, token: int) -> None:
        self.append_tokens(seq, [token])

    def append_tokens(self, seq: int, tokens) -> None:
        tables, toks = self._live(seq)
        new = list(tokens)
        if not new:
            raise MisuseError("a step appends at least one token")
        B, length = self.block_size, len(toks)
        end = length + len(new)
        drops = self._drops(seq)
        need = sum(-(-end // B) - len(t) for t in tables)
        freed = sum(1 for g, i in drops if self.ref[tables[g][i]] == 1)
        if need > len(self.free) + freed:
            raise OutOfBlocks(f"{need} blocks needed for {len(new)} tokens")
        for g, i in drops:
            self._release(tables[g][i])
            tables[g][i] = NULL
        toks.extend(new)
        for g, table in enumerate(tables):
            while len(table) < -(-end // B):
                table.append(self._take())
            for i in range(length // B, end // B):
                self._publish(g, toks, i, table[i])

    def free_seq(self, seq: int) -> None:
        tables, _ = self._live(seq)
        for table in tables:
            for b in reversed(table):
                if b != NULL:
                    self._release(b)
        del self.tables[seq], self.tokens[seq]

    def _live(self, seq: int):
        if seq not in self.tables:
            raise MisuseError(f"unknown sequence {seq!r}")
        return self.tables[seq], self.tokens[seq]

    # -- observation --------------------------------------------------------------
    def seqs(self) -> list[int]:
        return list(self.tables)

    def block_table(self, seq: int, group: int) -> list[int]:
        return self.tables[seq][group]

    def table_identity(self, seq: int, group: int):
        return self.tables[seq][group]

    def refcount(self, b: int) -> int:
        return self.ref[b]

    def free_blocks(self) -> list[int]:
        return list(self.free)

    def num_free(self) -> int:
        return len(self.free)

    def seq_len(self, seq: int) -> int:
        return len(self.tokens[seq])

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


class NoCacheHybridBlockManager(HybridBlockManager):
    """The reference without prefix caching (every hit is 0 tokens)."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size, caching=False)
