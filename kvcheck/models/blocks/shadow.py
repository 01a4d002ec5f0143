"""Shadow memory: which token each slot of each block holds.

The oracle plays the caller: it writes every token a sequence is given into
the slots the allocator names (copying ``cow_src`` into the new block first,
as an engine's ``copy_blocks`` would). A sequence then *reads back* through
its block table; it must see exactly its own tokens, in order. This checks the
allocator at the data level, beyond what refcounts can show.

The state is sparse: its size follows the operations run, never the block
size or the length of a prompt. Tokens are numbered consecutively as they are
handed out, and slots are described by *runs*: consecutive tokens in
consecutive slots, kept flat in a tuple as ``(offset, first token, count,
offset, first token, count, ...)``, in offset order and disjoint (a slot never
written holds nothing). A prompt of any length is one run per block; each
appended token extends a run or adds one.

    expected[q][k]   the runs sequence q expects to read in the k-th block of
                     its table: from offset 0 on, without gaps (block_size
                     slots; the last block up to q's length)
    slots[b]         block b's content as a pair ``(top, below)``: ``top``
                     runs from offset 0 on without gaps, up to some end e,
                     ``below`` what the block held before, seen only from e
                     on (e.g. what an earlier owner of the block left)

Writing where ``top`` ends (the next token of a sequence), or over a block
from offset 0 (a prompt, the first token in a fresh block), touches ``top``
alone; anything else rewrites the block as one list of runs. A sequence that
wrote a block itself then finds there exactly the runs it expects (``top`` is
even the very tuple: both are built together), so reading back is one
comparison; where they differ, the slots are compared run by run. Tuples are
immutable, so forks and copies share them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from kvcheck.spec.state import NULL

Runs = tuple  # (offset, first token, count) * k, flat
_EMPTY: tuple = ((), ())


def _end(runs: Runs) -> int:
    """Where ``runs`` (without gaps from offset 0) end."""
    return runs[-3] + runs[-1] if runs else 0


def _flat(block: tuple) -> Runs:
    """A block's content ``(top, below)`` as one tuple of runs."""
    top, below = block
    e = _end(top)
    i, n = 0, len(below)
    while i < n and below[i] + below[i + 2] <= e:
        i += 3
    rest = below[i:]
    if rest and rest[0] < e:  # the run crossing e: keep its part from e on
        a, t, c = rest[:3]
        rest = (e, t + (e - a), a + c - e) + rest[3:]
    if top and rest and rest[0] == e and top[-2] + top[-1] == rest[1]:  # one run across e
        return top[:-1] + (top[-1] + rest[2],) + rest[3:]
    return top + rest


def _split(runs: Runs) -> tuple:
    """``runs`` as a block ``(top, below)``: top = the runs from offset 0 without gaps."""
    i, e, n = 0, 0, len(runs)
    while i < n and runs[i] == e:
        e += runs[i + 2]
        i += 3
    return runs[:i], runs


def _put(runs: Runs, offset: int, tok: int, count: int) -> Runs:
    """``runs`` with slots ``offset..offset+count-1`` holding ``tok, tok+1, ...``."""
    end = offset + count
    n, i = len(runs), 0
    while i < n and runs[i] + runs[i + 2] <= offset:
        i += 3
    j = i
    while j < n and runs[j] < end:
        j += 3
    left, right = runs[:i], runs[j:]
    if i < j:  # runs i..j-1 overlap the new run: keep what lies outside it
        a, t, c = runs[i : i + 3]
        if a < offset:
            left += (a, t, offset - a)
        a, t, c = runs[j - 3 : j]
        if a + c > end:
            right = (end, t + (end - a), a + c - end) + right
    if left and left[-3] + left[-1] == offset and left[-2] + left[-1] == tok:
        offset, tok, count = left[-3], left[-2], left[-1] + count  # it continues the left run
        left = left[:-3]
    if right and right[0] == offset + count and right[1] == tok + count:
        count += right[2]  # the right run continues it
        right = right[3:]
    return left + (offset, tok, count) + right


def _first_difference(got: Runs, want: Runs) -> tuple[int, object, int] | None:
    """The first offset in ``want``'s span (runs without gaps) where ``got``
    (runs, gaps allowed) holds something else: ``(offset, read, expected)``,
    or None (the slots agree, however the runs are cut)."""
    starts = got[0::3]
    for w in range(0, len(want), 3):
        a, t, c = want[w : w + 3]
        j, end = a, a + c
        while j < end:
            i = 3 * (bisect_right(starts, j) - 1)
            if i < 0 or got[i] + got[i + 2] <= j:
                return j, None, t + (j - a)
            ga, gt, gc = got[i : i + 3]
            if gt - ga != t - a:  # both advance one token per slot: they differ from j on
                return j, gt + (j - ga), t + (j - a)
            j = min(end, ga + gc)
    return None


def _runs(toks: Sequence[int], offset: int = 0) -> Runs:
    """``toks`` (any token values) in consecutive slots from ``offset``, as runs."""
    out: list = []
    for i, tok in enumerate(toks, offset):
        if out and out[-2] + out[-1] == tok:
            out[-1] += 1
        else:
            out += (i, tok, 1)
    return tuple(out)


class ShadowMemory:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.slots: dict[int, tuple[Runs, Runs]] = {}  # block -> (top, below), see above
        self.expected: dict[int, list[Runs]] = {}  # seq -> runs per block of its table
        self._next = 0  # the next fresh token
        self._own_start: list[int] = []  # token ranges handed out, by first token ...
        self._own_seq: list[int] = []  # ... and the sequence each range went to

    def clone(self) -> ShadowMemory:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.slots = dict(self.slots)
        new.expected = {q: list(e) for q, e in self.expected.items()}
        new._own_start = list(self._own_start)
        new._own_seq = list(self._own_seq)
        return new

    # -- tokens ----------------------------------------------------------------
    def _fresh(self, seq: int, n: int = 1) -> int:
        """Hand ``seq`` the next ``n`` tokens; the first of them."""
        tok = self._next
        self._next = tok + n
        if not self._own_seq or self._own_seq[-1] != seq:
            self._own_start.append(tok)
            self._own_seq.append(seq)
        return tok

    def owner(self, token: int) -> int | None:
        """The sequence that was handed ``token`` (None if no such token)."""
        if not (type(token) is int and 0 <= token < self._next):
            return None
        return self._own_seq[bisect_right(self._own_start, token) - 1]

    def length(self, seq: int) -> int:
        """How many tokens ``seq`` expects to read back."""
        e = self.expected.get(seq)
        return (len(e) - 1) * self.block_size + _end(e[-1]) if e else 0

    def tokens(self, seq: int, lo: int, hi: int) -> list:
        """The tokens ``seq`` expects at positions ``lo..hi-1``."""
        out: list = []
        bs = self.block_size
        for k in range(max(lo, 0) // bs, -(-hi // bs)):
            runs, base = self.expected[seq][k], k * bs
            for i in range(0, len(runs), 3):
                a, t, c = runs[i : i + 3]
                s, e = max(base + a, lo), min(base + a + c, hi)
                if s < e:
                    out.extend(range(t + (s - base - a), t + (e - base - a)))
        return out

    def content(self, block: int) -> Runs:
        """What ``block`` holds, as runs."""
        return _flat(self.slots.get(block, _EMPTY))

    # -- writes ----------------------------------------------------------------
    def _write(self, block: int, offset: int, run: Runs) -> Runs:
        """``write`` of the one run ``run`` (``(offset, tok, count)``); the block's
        new ``top`` when the run extends it or starts it (else ``()``)."""
        slots = self.slots
        top, below = slots.get(block, _EMPTY)
        e = _end(top)
        if offset == e:  # where top ends: extend it
            if top and top[-2] + top[-1] == run[1]:
                top = top[:-1] + (top[-1] + run[2],)
            else:
                top = top + run
        elif offset == 0:  # from offset 0: the new run is top, what it leaves visible below
            if run[2] < e:
                below = top if _end(below) <= e else _flat((top, below))
            top = run
        else:
            slots[block] = _split(_put(_flat((top, below)), offset, *run[1:]))
            return ()
        slots[block] = (top, below)
        return top

    def write(self, block: int, offset: int, tok: int, count: int = 1) -> None:
        """Slots ``offset..offset+count-1`` of ``block`` now hold ``tok, tok+1, ...``."""
        self._write(block, offset, (offset, tok, count))

    def write_tokens(self, block: int, offset: int, toks: Sequence[int]) -> None:
        """Slots from ``offset`` on now hold ``toks`` (any token values), in order."""
        runs = _runs(toks, offset)
        for i in range(0, len(runs), 3):
            self.write(block, *runs[i : i + 3])

    def copy(self, src: int, dst: int) -> None:
        """Block ``dst`` now holds exactly what ``src`` holds (a copy-on-write)."""
        self.slots[dst] = self.slots.get(src, _EMPTY)

    def expect(self, seq: int, toks: Sequence[int]) -> None:
        """``seq`` now expects exactly ``toks`` (any token values)."""
        bs = self.block_size
        self.expected[seq] = [_runs(toks[s : s + bs]) for s in range(0, len(toks), bs)]

    def expect_one_more(self, seq: int, tok: int) -> None:
        """``seq`` now also expects ``tok``, after everything it expected."""
        e = self.expected[seq]
        last = e[-1]
        end = _end(last)
        if end == self.block_size or not last:  # full (or null: dropped): a new one
            e.append((0, tok, 1))
        elif last[-2] + last[-1] == tok:
            e[-1] = last[:-1] + (last[-1] + 1,)
        else:
            e[-1] = last + (end, tok, 1)

    # -- what the caller does ------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int, table: Sequence[int]) -> None:
        """The caller prefills ``n_tokens`` fresh tokens into ``table``."""
        tok = self._fresh(seq, n_tokens)
        bs, write = self.block_size, self._write
        e = self.expected[seq] = []
        for k, start in enumerate(range(0, n_tokens, bs)):
            if table[k] == NULL:  # (a position behind a cyclic window: never read)
                e.append(())
                continue
            run = (0, tok + start, bs if n_tokens - start > bs else n_tokens - start)
            e.append(write(table[k], 0, run) or run)  # (the block's top, when it is the run)

    def append(self, seq: int, block: int, offset: int, cow_src: int | None) -> None:
        """The caller copies ``cow_src`` into ``block`` (if any), then writes one token."""
        slots = self.slots
        if cow_src is not None:
            slots[block] = slots.get(cow_src, _EMPTY)
        tok = self._next  # (``_fresh``, inlined: this is the oracle's hottest write)
        self._next = tok + 1
        own = self._own_seq
        if not own or own[-1] != seq:
            self._own_start.append(tok)
            own.append(seq)
        e = self.expected[seq]
        last = e[-1]
        top, below = slots.get(block, _EMPTY)
        if top is last and last and offset == last[-3] + last[-1] != self.block_size:
            # the block's top is what seq expects there, and the token goes on its end
            if last[-2] + last[-1] == tok:
                new = last[:-1] + (last[-1] + 1,)
            else:
                new = last + (offset, tok, 1)
            slots[block] = (new, below)
            e[-1] = new
            return
        top = self._write(block, offset, (offset, tok, 1))
        self.expect_one_more(seq, tok)
        if top == e[-1]:  # (share the tuple, so the next token takes the way above)
            e[-1] = top

    def append_token(self, seq: int, block: int, offset: int, tok: int) -> None:
        """``write(block, offset, tok)`` then ``expect_one_more(seq, tok)``, in one pass
        (``append``'s way: when the block's top is what seq expects there, the token goes
        on the end of both, one shared tuple)."""
        slots, e = self.slots, self.expected[seq]
        last = e[-1]
        top, below = slots.get(block, _EMPTY)
        if last and top is last and offset == last[-3] + last[-1] != self.block_size:
            if last[-2] + last[-1] == tok:
                new = last[:-1] + (last[-1] + 1,)
            else:
                new = last + (offset, tok, 1)
            slots[block] = (new, below)
            e[-1] = new
            return
        top = self._write(block, offset, (offset, tok, 1))
        self.expect_one_more(seq, tok)
        if top == e[-1]:  # (share the tuple, so the next token takes the way above)
            e[-1] = top

    def extend(self, seq: int, n: int, table: Sequence[int]) -> None:
        """The caller writes ``n`` fresh tokens after ``seq``'s last one, through ``table``
        (a multi-token reservation): one run per block written, whatever ``n``."""
        bs, e = self.block_size, self.expected[seq]
        start = self.length(seq)
        tok = self._fresh(seq, n)
        pos, end = start, start + n
        while pos < end:
            k, off = divmod(pos, bs)
            count = min(end, (k + 1) * bs) - pos
            run = (off, tok + (pos - start), count)
            top = self._write(table[k], off, run) if k < len(table) else ()
            if k < len(e):
                last = e[k]
                if last and last[-3] + last[-1] == off and last[-2] + last[-1] == run[1]:
                    want = last[:-1] + (last[-1] + count,)
                else:
                    want = last + run
                e[k] = top if top == want else want
            else:
                e.append(top if top == run else run)
            pos += count

    def truncate(self, seq: int, n: int) -> None:
        """``seq`` keeps only its first ``n`` tokens (a rollback)."""
        bs, e = self.block_size, self.expected[seq]
        keep = -(-n // bs)
        del e[keep:]
        cut = n - (keep - 1) * bs
        if e and cut < bs:
            runs, out = e[-1], ()
            for i in range(0, len(runs), 3):
                a, t, c = runs[i : i + 3]
                if a >= cut:
                    break
                out += (a, t, min(c, cut - a))
            e[-1] = out

    def drop(self, seq: int, k: int) -> None:
        """``seq``'s first ``k`` positions are null (behind its window): it expects
        nothing of them, and they are never read."""
        e = self.expected[seq]
        for i in range(min(k, len(e))):
            e[i] = ()

    def fork(self, parent: int, child: int) -> None:
        self.expected[child] = list(self.expected[parent])

    def free(self, seq: int) -> None:
        self.expected.pop(seq, None)

    # -- reading back ----------------------------------------------------------------
    def mismatch(self, seq: int, table: Sequence[int],
                 first: int = 0) -> tuple[int, object, int] | None:
        """First position >= ``first`` (rounded down to its block) where ``seq``
        reads back something else: ``(position, read, expected)``, or None."""
        e = self.expected[seq]
        slots, ntab = self.slots, len(table)
        for k in range(first // self.block_size, len(e)):
            want = e[k]
            if not want:  # (a null position behind a window: nothing to read)
                continue
            block = slots.get(table[k]) if k < ntab else None
            if block is not None:
                top = block[0]
                if top is want or top[: len(want)] == want:  # top covers what seq reads
                    continue
                got = _flat(block)
            else:
                got = ()
            diff = _first_difference(got, want)
            if diff is not None:
                j, read, tok = diff
                return k * self.block_size + j, read, tok
        return None
