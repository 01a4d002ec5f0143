"""The live sequences in the order they were allocated, kept step by step.

The prefix driver picks a live sequence by position (``rng.choice(live)``), in allocation
order, so that both modes, a replay and a shrink draw the same operations. A plain list
costs O(live sequences) per free (``list.remove``): at 100,000 blocks, with thousands of
sequences live, that was a fifth of a checked run. ``LiveOrder`` is that list as a
sequence with O(log n) ``append``, ``remove`` and indexing: the sequences in their slots
in order of arrival, a freed one's slot emptied, and a Fenwick tree over the slots
counting the live ones (emptied slots are dropped once they outnumber the live ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


class LiveOrder(Sequence):
    """A list of distinct ids in arrival order: ``len``, ``[i]``, iteration, ``in``,
    ``append`` at the end and ``remove`` anywhere, each O(log n) (iteration O(n))."""

    __slots__ = ("_slots", "_tree", "_pos", "_n")

    def __init__(self, items: Iterable[int] = ()):
        self._build(list(items))

    def _build(self, items: list) -> None:
        self._slots: list = items  # id, or None where one left
        self._pos = {q: i for i, q in enumerate(items)}
        if len(self._pos) != len(items):
            raise ValueError("LiveOrder: ids must be distinct")
        self._n = len(items)
        tree = [0] + [1] * len(items)  # Fenwick tree, 1-based: linear build
        for i in range(1, len(tree)):
            j = i + (i & -i)
            if j < len(tree):
                tree[j] += tree[i]
        self._tree = tree

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __getitem__(self, k):
        if isinstance(k, slice):
            return list(self)[k]
        n = self._n
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("LiveOrder index out of range")
        tree, pos = self._tree, 0
        step = 1 << (len(tree) - 1).bit_length()
        while step:  # the largest pos whose prefix count is <= k: slot pos holds the k-th
            nxt = pos + step
            if nxt < len(tree) and tree[nxt] <= k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return self._slots[pos]

    def __iter__(self) -> Iterator[int]:
        return (q for q in self._slots if q is not None)

    def __contains__(self, q) -> bool:
        return q in self._pos

    def __eq__(self, other) -> bool:
        if isinstance(other, LiveOrder | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # (mutable)

    def __repr__(self) -> str:
        return f"LiveOrder({list(self)!r})"

    def append(self, q: int) -> None:
        if q in self._pos:
            raise ValueError(f"LiveOrder: {q!r} is already in")
        slots, tree = self._slots, self._tree
        i = len(tree)  # the new slot's 1-based index: its node covers (i - lowbit(i), i]
        lo, total, j = i - (i & -i), 1, i - 1
        while j > lo:
            total += tree[j]
            j -= j & -j
        tree.append(total)
        slots.append(q)
        self._pos[q] = i - 1
        self._n += 1

    def remove(self, q: int) -> None:
        i = self._pos.pop(q, None)
        if i is None:
            raise ValueError(f"LiveOrder.remove({q!r}): not in")
        self._slots[i] = None
        tree, j = self._tree, i + 1
        while j < len(tree):
            tree[j] -= 1
            j += j & -j
        self._n -= 1
        if len(self._slots) - self._n > max(64, self._n):  # mostly empty slots: compact
            self._build([x for x in self._slots if x is not None])
