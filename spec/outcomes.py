"""Outcome classes: the distinct ways each operation can go.

Used for vacuity checks (every class must be reachable, or the spec proves
nothing about it) and for coverage of implementations. Each class is a
predicate over the state before (``pre``), after (``post``) and the
operation with its outcome, in the logic layer.
"""

from __future__ import annotations

from .contracts import OK, OOB, REFUSED, _last_token_block, slot_position
from .state import NULL


def _append_case(L, pre, op):
    """(a fresh block with nothing to copy, a copy-on-write) for append_slot: the slot's
    block (``contracts.slot_position``: the last block, or a reserved one) is missing
    (the table grows) or shared with nothing of the sequence's in it yet (replaced, not
    copied); or shared and holding earlier tokens (copied first)."""
    q = op.seq
    p = slot_position(L, pre, q)
    starts = L.mod(pre.length(q), pre.block_size) == 0
    grows = p >= pre.nblocks(q)
    shared = L.and_(L.not_(grows), pre.ref(pre.table(q, p)) > 1)
    return L.or_(grows, L.and_(shared, starts)), L.and_(shared, L.not_(starts))


def _in_place(L, pre, op):
    """append_slot writes a block the sequence holds alone (its last, or a reserved one)."""
    q = op.seq
    p = slot_position(L, pre, q)
    return L.and_(p < pre.nblocks(q), pre.ref(pre.table(q, p)) <= 1)


def _released(L, pre, post, op):
    q = op.seq
    return L.any_(L.and_(pre.occurrences(q, b) > 0, post.ref(b) == 0) for b in pre.blocks())


def _copied_tail(L, pre, post, op):
    """A fork or rebase child's last block is not its source's: copied at fork time."""
    t, _ = _last_token_block(L, pre, op.seq)
    return post.table(op.child, t) != pre.table(op.seq, t)


def _reserve_case(L, pre, op):
    """(blocks appended past the table's end, some written block is shared) for append_slots."""
    q, B = op.seq, pre.block_size
    length, k = pre.length(q), pre.nblocks(q)
    first = L.ceil_div(length + 1, B) - 1
    last = L.ceil_div(length + op.n_tokens, B) - 1
    grows = L.ceil_div(length + op.n_tokens + op.lookahead, B) > k
    shared = L.any_(L.and_(first <= i, i <= last, i < k, pre.ref(pre.table(q, i)) > 1)
                    for i in pre.positions(q))
    return grows, shared


def _rollback_frees(L, pre, post, op):
    return post.nblocks(op.seq) < pre.nblocks(op.seq)


def _window_drops(L, pre, post, op):
    """Some entry of the sequence became the null placeholder now."""
    q = op.seq
    return L.any_(L.and_(i < pre.nblocks(q), pre.table(q, i) != NULL, post.table(q, i) == NULL)
                  for i in pre.positions(q))


def _always(L, pre, post, op):
    return True


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
    "fork/ok": ("fork", OK, lambda L, pre, post, op: L.not_(_copied_tail(L, pre, post, op))),
    "fork/copies-partial-tail": ("fork", OK, _copied_tail),
    "fork/out-of-blocks": ("fork", OOB, _always),
    "free/returns-blocks": ("free_seq", OK, _released),
    "free/only-drops-references": ("free_seq", OK,
                                   lambda L, pre, post, op: L.not_(_released(L, pre, post, op))),
    "allocate/refused": ("allocate", REFUSED, _always),
    "reserve/within-the-table": ("append_slots", OK, lambda L, pre, post, op: L.not_(
        L.or_(*_reserve_case(L, pre, op)))),
    "reserve/fresh-blocks": ("append_slots", OK, lambda L, pre, post, op: L.and_(
        _reserve_case(L, pre, op)[0], L.not_(_reserve_case(L, pre, op)[1]))),
    "reserve/copy-on-write": ("append_slots", OK, lambda L, pre, post, op: (
        _reserve_case(L, pre, op)[1])),
    "reserve/out-of-blocks": ("append_slots", OOB, _always),
    "reserve/refused": ("append_slots", REFUSED, _always),
    "rollback/frees-blocks": ("rollback", OK, _rollback_frees),
    "rollback/keeps-blocks-reserved": ("rollback", OK, lambda L, pre, post, op: L.not_(
        _rollback_frees(L, pre, post, op))),
    "rebase/shares": ("rebase", OK, lambda L, pre, post, op: L.not_(
        _copied_tail(L, pre, post, op))),
    "rebase/copies-partial-tail": ("rebase", OK, _copied_tail),
    "rebase/out-of-blocks": ("rebase", OOB, _always),
    "preempt/returns-blocks": ("preempt", OK, _released),
    "preempt/only-drops-references": ("preempt", OK,
                                      lambda L, pre, post, op: L.not_(
                                          _released(L, pre, post, op))),
    "window/releases-blocks": ("drop_behind_window", OK, _released),
    "window/only-drops-shared-references": ("drop_behind_window", OK, lambda L, pre, post, op: L.and_(
        _window_drops(L, pre, post, op), L.not_(_released(L, pre, post, op)))),
    "window/nothing-behind": ("drop_behind_window", OK, lambda L, pre, post, op: L.not_(
        _window_drops(L, pre, post, op))),
}


def classify(L, pre, post, op) -> str | None:
    """The class of a concrete step (``L`` = ``PY``)."""
    for name, (kind, outcome, pred) in OUTCOMES.items():
        if op.kind == kind and op.outcome == outcome and pred(L, pre, post, op):
            return name
    return None
