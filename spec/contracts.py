"""Operation contracts and step invariants, written once.

A contract relates the state before an operation (``pre``), the state after
it (``post``) and the operation with its outcome (``op``). It describes the
*allowed* outcomes, not the reference's choices: an allocator may hand out
any free block. Each contract is a generator of clauses
``(name, element, formula)``; ``element`` is the block or sequence a
per-element clause is about (``None`` otherwise). ``dom`` gives the blocks
and sequences the frame clauses range over: the whole state for proofs and
full checks, only what the operation touched for the oracle's fast mode.

Step invariants (named like the state invariants, so reports agree):
    isolation         no write lands in a block another live sequence can read
    exception_safety  an out-of-blocks failure leaves every observable
                      structure unchanged
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, OOB = "ok", "oob"


@dataclass(slots=True)
class Op:
    """One operation and what it returned.

    ``seq`` is the subject (the parent for ``fork``), ``child`` the fork
    target. For ``append_slot`` the result is ``(block, offset, cow_src)``
    with ``has_cow`` true iff ``cow_src`` is not None.
    """

    kind: str
    seq: int = 0
    child: int = 0
    n_tokens: int = 0
    outcome: str = OK
    block: Any = None
    offset: Any = None
    cow_src: Any = None
    has_cow: Any = False


@dataclass
class Domain:
    """What frame clauses quantify over."""

    blocks: Any
    seqs: Any


def precondition(L, s, op: Op):
    """When an operation may be called at all (else it is caller misuse)."""
    if op.kind == "allocate":
        return L.and_(L.not_(s.live(op.seq)), op.n_tokens >= 1)
    if op.kind == "fork":
        return L.and_(s.live(op.seq), L.not_(s.live(op.child)), op.seq != op.child)
    return s.live(op.seq)


# -- step invariants -----------------------------------------------------------
def isolation(L, pre, post, op: Op):
    """No write lands in a block another live sequence can read: the block
    append_slot returns is the writer's last block and no other table entry
    names it."""
    yield "isolation", op.block, L.and_(post.tail(op.seq) == op.block, post.holders(op.block) == 1)


def exception_safety(L, pre, post, op: Op, dom: Domain):
    """An operation that fails with out-of-blocks leaves every observable
    structure unchanged: refcounts, the free list and every block table."""
    yield "exception_safety: free list length unchanged", None, post.num_free() == pre.num_free()
    for b in dom.blocks:
        yield "exception_safety: refcount unchanged", b, post.ref(b) == pre.ref(b)
        yield "exception_safety: free-list membership unchanged", b, (
            post.free_count(b) == pre.free_count(b)
        )
    for q in dom.seqs:
        yield "exception_safety: block table unchanged", q, L.and_(
            post.live(q) == pre.live(q),
            post.length(q) == pre.length(q),
            post.same_table(q, pre, q),
        )


def unchanged_others(L, pre, post, dom: Domain, changed: tuple):
    """Frame: sequences the operation does not name keep their tables."""
    for q in dom.seqs:
        if q not in changed:
            yield "other sequences untouched", q, L.and_(
                post.live(q) == pre.live(q),
                post.length(q) == pre.length(q),
                post.same_table(q, pre, q),
            )


def _cow_src(L, op: Op):
    """``cow_src`` as a number: -1 when the operation copied nothing."""
    return L.ite(op.has_cow, op.cow_src, -1)


def _returned_ids_valid(L, post, op: Op):
    n, cow = post.num_blocks, _cow_src(L, op)
    return L.and_(0 <= op.block, op.block < n, L.implies(op.has_cow, L.and_(0 <= cow, cow < n)))


# -- operation contracts -------------------------------------------------------
def allocate(L, pre, post, op: Op, dom: Domain):
    """allocate(seq, n): all or nothing. On success seq holds ceil(n/B)
    distinct blocks that were all free, each now with refcount 1; on
    out-of-blocks (allowed only when fewer than ceil(n/B) blocks are free)
    nothing changed."""
    q, n = op.seq, op.n_tokens
    need = L.ceil_div(n, pre.block_size)
    if op.outcome == OOB:
        yield "out-of-blocks only when fewer than ceil(n/B) blocks are free", None, (
            need > pre.num_free()
        )
        yield from exception_safety(L, pre, post, op, dom)
        return
    yield "sequence is live with n tokens", q, L.and_(post.live(q), post.length(q) == n)
    yield "holds exactly ceil(n/B) blocks", q, post.nblocks(q) == need
    yield "the table is its own object", q, post.sharers(q) == 1
    for i in post.positions(q):
        yield "every block handed out was free", q, L.implies(
            i < need, pre.free_count(post.table(q, i)) >= 1
        )
    yield "free list shrinks by ceil(n/B)", None, post.num_free() == pre.num_free() - need
    for b in dom.blocks:
        got = post.occurrences(q, b)
        yield "blocks handed out are distinct", b, got <= 1
        yield "refcount +1 for each block handed out, others unchanged", b, (
            post.ref(b) == pre.ref(b) + got
        )
        yield "blocks handed out leave the free list, others stay", b, (
            post.free_count(b) == pre.free_count(b) - got
        )
    yield from unchanged_others(L, pre, post, dom, (q,))


def append_slot(L, pre, post, op: Op, dom: Domain):
    """append_slot(seq) -> (block, offset, cow_src): reserve the slot of
    token number len. A fresh block only when the last block is full (offset
    0); a partial last block with refcount > 1 is copied first (its first
    writer copies: a fresh block replaces it, cow_src names it, its refcount
    drops by one); a partial last block with refcount 1 is written in place.
    A full block is never copied. Out-of-blocks is allowed only when a block
    is needed and none is free, and then nothing changed."""
    q, B = op.seq, pre.block_size
    n, k, tail = pre.length(q), pre.nblocks(q), pre.tail(q)
    offset = L.mod(n, B)
    boundary = offset == 0
    shared = L.and_(L.not_(boundary), pre.ref(tail) > 1)
    needs_block = L.or_(boundary, shared)
    if op.outcome == OOB:
        yield "out-of-blocks only when a new block is needed and none is free", q, L.and_(
            needs_block, pre.num_free() == 0
        )
        yield from exception_safety(L, pre, post, op, dom)
        return
    new = post.tail(q)
    yield "returns block ids of the pool", q, _returned_ids_valid(L, post, op)
    yield "returns the sequence's last block", q, op.block == new
    yield "returns the slot of token len: offset = len % block_size", q, op.offset == offset
    yield "the sequence stays live, one token longer", q, L.and_(post.live(q), post.length(q) == n + 1)
    yield "a full block is never copied", q, L.implies(boundary, L.not_(op.has_cow))
    yield "a new block only at a block boundary", q, L.ite(
        boundary,
        L.and_(post.nblocks(q) == k + 1, post.same_table(q, pre, q, k)),
        post.nblocks(q) == k,
    )
    yield "the sole holder of a partial block writes in place", q, L.implies(
        L.and_(L.not_(boundary), L.not_(shared)),
        L.and_(post.same_table(q, pre, q), L.not_(op.has_cow)),
    )
    yield "a shared partial block is copied first (cow_src = old last block)", q, L.implies(
        shared,
        L.and_(op.has_cow, _cow_src(L, op) == tail, post.same_table(q, pre, q, k - 1)),
    )
    yield "a new block was free", q, L.implies(needs_block, pre.free_count(new) >= 1)
    taken = L.ite(needs_block, 1, 0)
    yield "free list shrinks by one exactly when a block is taken", None, (
        post.num_free() == pre.num_free() - taken
    )
    for b in dom.blocks:
        gained = L.ite(L.and_(needs_block, b == new), 1, 0)
        dropped = L.ite(L.and_(shared, b == tail), 1, 0)
        yield "refcounts change only as the operation says", b, (
            post.ref(b) == pre.ref(b) + gained - dropped
        )
        yield "free list changes only as the operation says", b, (
            post.free_count(b) == pre.free_count(b) - gained
        )
    yield from isolation(L, pre, post, op)
    yield from unchanged_others(L, pre, post, dom, (q,))


def fork(L, pre, post, op: Op, dom: Domain):
    """fork(parent, child): child gets its own table listing exactly the
    parent's blocks, each block's refcount grows by one per entry; nothing is
    allocated or copied, the parent is unchanged."""
    p, c = op.seq, op.child
    yield "child is live with the parent's length", c, L.and_(
        post.live(c), post.length(c) == pre.length(p)
    )
    yield "child's table lists exactly the parent's blocks", c, post.same_table(c, pre, p)
    yield "child's table is its own object", c, post.sharers(c) == 1
    yield "parent unchanged", p, L.and_(
        post.live(p), post.length(p) == pre.length(p), post.same_table(p, pre, p)
    )
    yield "free list unchanged", None, post.num_free() == pre.num_free()
    for b in dom.blocks:
        yield "refcount +1 per parent entry, others unchanged", b, (
            post.ref(b) == pre.ref(b) + pre.occurrences(p, b)
        )
        yield "free list unchanged", b, post.free_count(b) == pre.free_count(b)
    yield from unchanged_others(L, pre, post, dom, (p, c))


def free_seq(L, pre, post, op: Op, dom: Domain):
    """free_seq(seq): seq is gone; each of its blocks loses one reference per
    entry, and exactly those reaching refcount 0 join the free list."""
    q = op.seq
    yield "sequence is gone", q, L.not_(post.live(q))
    released = []
    for b in dom.blocks:
        held = pre.occurrences(q, b)
        back = L.and_(held > 0, post.ref(b) == 0)
        released.append(back)
        yield "refcount -1 per entry of the freed table", b, post.ref(b) == pre.ref(b) - held
        yield "a block joins the free list exactly when its refcount reaches 0", b, (
            post.free_count(b) == pre.free_count(b) + L.ite(back, 1, 0)
        )
    yield "free list grows by the blocks released", None, (
        post.num_free() == pre.num_free() + L.count(released)
    )
    yield from unchanged_others(L, pre, post, dom, (q,))


CONTRACTS = {"allocate": allocate, "append_slot": append_slot, "fork": fork, "free_seq": free_seq}

STEP_INVARIANTS = {"isolation": isolation.__doc__, "exception_safety": exception_safety.__doc__}


def clauses(L, pre, post, op: Op, dom: Domain):
    """Every clause the operation must satisfy."""
    return CONTRACTS[op.kind](L, pre, post, op, dom)
