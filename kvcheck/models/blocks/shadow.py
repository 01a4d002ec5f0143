"""Shadow memory: which token each slot of each block holds.

The oracle plays the caller: it writes every token a sequence is given into
the slots the allocator names (copying ``cow_src`` into the new block first,
as an engine's ``copy_blocks`` would). A sequence then *reads back* through
its block table; it must see exactly its own tokens, in order. This checks the
allocator at the data level, beyond what refcounts can show.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count


class ShadowMemory:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.slots: dict[int, list] = {}  # block -> its token slots (None = never written)
        self.expected: dict[int, list[int]] = {}  # seq -> the tokens it was given
        self._next = count()
        self._owner: list[int] = []  # token id -> the sequence that wrote it

    def clone(self) -> ShadowMemory:
        new = ShadowMemory(self.block_size)
        new.slots = {b: list(s) for b, s in self.slots.items()}
        new.expected = {q: list(t) for q, t in self.expected.items()}
        new._owner = list(self._owner)
        new._next = count(len(self._owner))
        return new

    def _fresh(self, seq: int) -> int:
        tok = next(self._next)
        self._owner.append(seq)
        return tok

    def owner(self, token: int) -> int | None:
        return self._owner[token] if 0 <= token < len(self._owner) else None

    def _block(self, b: int) -> list:
        slots = self.slots.get(b)
        if slots is None:
            slots = self.slots[b] = [None] * self.block_size
        return slots

    def allocate(self, seq: int, n_tokens: int, table: Sequence[int]) -> None:
        """The caller prefills ``n_tokens`` fresh tokens into ``table``."""
        toks = [self._fresh(seq) for _ in range(n_tokens)]
        self.expected[seq] = toks
        bs = self.block_size
        for start in range(0, n_tokens, bs):
            chunk = toks[start : start + bs]
            self._block(table[start // bs])[: len(chunk)] = chunk

    def append(self, seq: int, block: int, offset: int, cow_src: int | None) -> None:
        """The caller copies ``cow_src`` into ``block`` (if any), then writes one token."""
        if cow_src is not None:
            self.slots[block] = list(self._block(cow_src))
        tok = self._fresh(seq)
        self._block(block)[offset] = tok
        self.expected[seq].append(tok)

    def fork(self, parent: int, child: int) -> None:
        self.expected[child] = list(self.expected[parent])

    def free(self, seq: int) -> None:
        self.expected.pop(seq, None)

    def mismatch(self, seq: int, table: Sequence[int],
                 first: int = 0) -> tuple[int, object, int] | None:
        """First position >= ``first`` (rounded down to its block) where ``seq``
        reads back something else: ``(position, read, expected)``, or None."""
        want = self.expected[seq]
        bs = self.block_size
        start = (first // bs) * bs
        slots = self.slots
        if start == 0:  # the whole sequence: read it back in one go
            got = []
            for b in table:
                got.extend(slots.get(b, ()))
            if got[: len(want)] == want:
                return None
        for i in range(start, len(want), bs):
            b = table[i // bs] if i // bs < len(table) else None
            got = self.slots.get(b, ()) if b is not None else ()
            chunk = want[i : i + bs]
            if list(got[: len(chunk)]) != chunk:
                for j, tok in enumerate(chunk):
                    read = got[j] if j < len(got) else None
                    if read != tok:
                        return i + j, read, tok
        return None
