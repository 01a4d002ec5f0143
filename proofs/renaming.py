"""States up to renaming: a canonical numbering of sequences and blocks.

Sequence ids and block ids carry no meaning (the allocator may hand out any
free block), so two states that differ only by a renaming are the same state
for search. ``canonical_tables`` orders sequences by a renaming-invariant
signature and numbers blocks by first appearance along the tables in that
order; the callers add what else their state holds (free list, refcounts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvcheck.spec.state import NULL  # (the null placeholder keeps its name: it is no block)


def canonical_tables(tables: Mapping[int, tuple[int, Sequence[int]]],
                     ref: Callable[[int], int]) -> tuple[tuple, dict[int, int]]:
    """``tables``: seq -> (its length, its block ids); ``ref(b)``: b's refcount.

    Returns the rows ``(length, renamed block ids)`` in canonical sequence order,
    and the block renaming used (extend it with ``label.setdefault(b, len(label))``).
    """
    order = sorted(tables, key=lambda q: (tables[q][0], tuple(ref(b) for b in tables[q][1])))
    label: dict[int, int] = {}
    rows = tuple((tables[q][0], tuple(b if b == NULL else label.setdefault(b, len(label))
                                      for b in tables[q][1]))
                 for q in order)
    return rows, label
