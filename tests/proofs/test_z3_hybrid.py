"""Z3 rows for hybrid pools (issue 15 section 3): each hybrid invariant adds something to
the block-manager spec (a state every other rule accepts breaks it), and the one
relaxation of exception safety (an out-of-blocks step may first drop blocks behind a
sliding window) keeps every table invariant; weakening that allowance is refuted."""

import pytest

from kvcheck.proofs.hybrid import independence, oob_allowance
from kvcheck.spec import hybrid as H
from kvcheck.spec.symbolic import SymScope

SCOPE = SymScope(num_blocks=4, block_size=2, seqs=4, max_tokens=6)  # 2 requests x 2 groups
WINDOWS = (0, 3)


def test_every_hybrid_invariant_is_independent():
    rows = independence(SCOPE, WINDOWS)
    assert [r.property for r in rows] == [f"independent: {i.name}" for i in H.HYBRID_INVARIANTS]
    assert all(r.result == "proved" for r in rows), [(r.property, r.detail) for r in rows]


def test_the_out_of_blocks_allowance_keeps_every_table_invariant():
    rows = oob_allowance(SCOPE, WINDOWS)
    assert len(rows) >= 10
    assert all(r.result == "proved" for r in rows), [(r.property, r.detail) for r in rows]


def test_a_window_of_one_token_is_outside_what_the_allowance_keeps():
    """Why a hybrid target's windows must be 0 or >= 2: with W = 1 a failed step may drop
    the block of the last token (vLLM does), which null_entries forbids."""
    rows = {r.property: r for r in oob_allowance(SCOPE, (0, 1))}
    assert rows["out-of-blocks allowance keeps null_entries"].result == "violated"
    assert rows["out-of-blocks allowance keeps window_nulls"].result == "proved"


def _weakened(drop: str):
    """``out_of_blocks`` with one condition on a dropped entry left out."""
    from kvcheck.spec.state import NULL

    def clauses(L, pre, post, op, dom):
        B = pre.block_size
        for q in dom.seqs:
            W = pre.window_of(q)
            conds = {"window": lambda i, q=q, W=W: (i + 1) * B + W <= pre.length(q) + 1,
                     "sliding": lambda i, W=W: W >= 1,
                     "prefix": lambda i, q=q: True if i == 0 else post.table(q, i - 1) == NULL}
            yield "t", q, L.and_(post.live(q) == pre.live(q), post.nblocks(q) == pre.nblocks(q),
                                 L.all_(L.or_(post.table(q, i) == pre.table(q, i), L.and_(
                                     post.table(q, i) == NULL,
                                     *[c(i) for k, c in conds.items() if k != drop]))
                                     for i in pre.positions(q)))
        for b in dom.blocks:
            yield "r", b, post.ref(b) == pre.ref(b) - (pre.holders(b) - post.holders(b))
    return clauses


@pytest.mark.parametrize("drop,broken", [("window", "window_nulls"), ("sliding", "window_nulls"),
                                         ("prefix", "null_entries")])
def test_a_weakened_allowance_is_refuted(drop, broken):
    rows = {r.property: r for r in oob_allowance(SCOPE, WINDOWS, clauses=_weakened(drop))}
    assert rows[f"out-of-blocks allowance keeps {broken}"].result == "violated"
