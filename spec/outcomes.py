"""Outcome classes: the distinct ways each operation can go.

Used for vacuity checks (every class must be reachable, or the spec proves
nothing about it) and for coverage of implementations. Each class is a
predicate over the state before (``pre``), after (``post``) and the
operation with its outcome, in the logic layer.
"""

from __future__ import annotations

from .contracts import OK, OOB


def _append_case(L, pre, op):
    q = op.seq
    boundary = L.mod(pre.length(q), pre.block_size) == 0
    shared = L.and_(L.not_(boundary), pre.ref(pre.tail(q)) > 1)
    return boundary, shared


def _in_place(L, pre, op):
    boundary, shared = _append_case(L, pre, op)
    return L.and_(L.not_(boundary), L.not_(shared))


def _released(L, pre, post, op):
    q = op.seq
    return L.any_(L.and_(pre.occurrences(q, b) > 0, post.ref(b) == 0) for b in pre.blocks())


# name -> (operation, outcome, predicate(L, pre, post, op) refining it)
OUTCOMES = {
    "allocate/ok": ("allocate", OK, lambda L, pre, post, op: True),
    "allocate/out-of-blocks": ("allocate", OOB, lambda L, pre, post, op: True),
    "append/fresh-block": ("append_slot", OK, lambda L, pre, post, op: _append_case(L, pre, op)[0]),
    "append/in-place": ("append_slot", OK, lambda L, pre, post, op: _in_place(L, pre, op)),
    "append/copy-on-write": ("append_slot", OK, lambda L, pre, post, op: _append_case(L, pre, op)[1]),
    "append/out-of-blocks-at-boundary": ("append_slot", OOB,
                                         lambda L, pre, post, op: _append_case(L, pre, op)[0]),
    "append/out-of-blocks-in-copy-on-write": ("append_slot", OOB,
                                              lambda L, pre, post, op: _append_case(L, pre, op)[1]),
    "fork/ok": ("fork", OK, lambda L, pre, post, op: True),
    "free/returns-blocks": ("free_seq", OK, _released),
    "free/only-drops-references": ("free_seq", OK,
                                   lambda L, pre, post, op: L.not_(_released(L, pre, post, op))),
}


def classify(L, pre, post, op) -> str | None:
    """The class of a concrete step (``L`` = ``PY``)."""
    for name, (kind, outcome, pred) in OUTCOMES.items():
        if op.kind == kind and op.outcome == outcome and pred(L, pre, post, op):
            return name
    return None
