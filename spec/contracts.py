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

from .state import NULL, Dropped

OK, OOB, REFUSED = "ok", "oob", "refused"


@dataclass(slots=True)
class Op:
    """One operation and what it returned.

    ``seq`` is the subject (the parent for ``fork``, the source for
    ``rebase``), ``child`` the fork or rebase target. ``n_tokens`` is
    allocate's prompt, append_slots' new tokens and rollback's dropped ones;
    ``lookahead`` append_slots' reserved slots. For ``append_slot`` the result
    is ``(block, offset, cow_src)`` with ``has_cow`` true iff ``cow_src`` is not
    None; for ``append_slots``, ``fork`` and ``rebase`` it is ``copies``, the
    ``(src, dst)`` block copies the caller must make before it writes (none
    for a lazy fork). ``cycle`` is the target's cyclic sliding window in blocks
    (``W``, 0: none): an engine whose tables reuse their blocks cyclically (vLLM's
    BlockSpaceManager v1) declares it (``Target.cyclic_window``, in tokens) and the
    oracle stamps it on every operation it issues; ``allocate`` and ``append_slot``
    read it (``cyclic_behind``, ``cyclic_pre``). It is not part of a trace: replay
    stamps the replaying target's.
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
    lookahead: Any = 0
    copies: Any = None
    cycle: Any = 0


@dataclass
class Domain:
    """What frame clauses quantify over."""

    blocks: Any
    seqs: Any


def precondition(L, s, op: Op):
    """When an operation may be called at all (else it is caller misuse). A single-slot
    append needs a live sequence only: one holding reserved slots (a lookahead's, a
    rollback's) writes the first of them, as every engine that reserves lookahead lets
    its decode step do; a rollback keeps at least one token, and never reaches back into
    the null entries behind a sliding window (their KV is gone: the block that then
    holds the last token must be a pool block); a window is at least one token."""
    kind = op.kind
    if kind == "allocate":
        return L.and_(L.not_(s.live(op.seq)), op.n_tokens >= 1)
    if kind == "fork":
        return L.and_(s.live(op.seq), L.not_(s.live(op.child)), op.seq != op.child)
    if kind == "rebase":
        return L.and_(s.live(op.seq), s.live(op.child), op.seq != op.child)
    if kind == "append_slots":
        return L.and_(s.live(op.seq), op.n_tokens >= 1, op.lookahead >= 0)
    if kind == "rollback":
        left = s.length(op.seq) - op.n_tokens
        return L.and_(s.live(op.seq), op.n_tokens >= 1, op.n_tokens < s.length(op.seq),
                      s.table(op.seq, L.ceil_div(left, s.block_size) - 1) != NULL)
    if kind == "drop_behind_window":
        return L.and_(s.live(op.seq), op.n_tokens >= 1)
    return s.live(op.seq)


def reserved_after(L, pre, op: Op, nblocks_after):
    """The slots ``op``'s sequence (a fork's or rebase's child) holds reserved beyond its
    tokens afterwards, given its table's length then: what append_slots asked for ahead
    (at least its lookahead, at least what was reserved and not written); after a
    rollback, whatever of the old reservation and the dropped tokens' slots the kept
    blocks still hold; a fork or rebase child reserves what its source does; a
    single-slot append writes the first reserved slot, if any (the rest stay reserved);
    nothing after an allocation; a window drop keeps what was reserved."""
    B = pre.block_size
    if op.kind == "append_slot":
        left = pre.reserved(op.seq) - 1
        return L.ite(left > 0, left, 0)
    if op.kind == "append_slots":
        left = pre.reserved(op.seq) - op.n_tokens
        return L.ite(left > op.lookahead, left, op.lookahead)
    if op.kind == "rollback":
        q = op.seq
        capacity = pre.length(q) + pre.reserved(q)
        kept = nblocks_after * B
        return L.ite(capacity < kept, capacity, kept) - (pre.length(q) - op.n_tokens)
    if op.kind in ("fork", "rebase", "drop_behind_window"):
        return pre.reserved(op.seq)
    return 0


# -- step invariants -----------------------------------------------------------
def isolation(L, pre, post, op: Op):
    """No write lands in a block another live sequence can read: the block
    append_slot returns is the one the writer's table holds its slot in (the
    block of token number len: its last block, or a block it reserved) and no
    other table entry names it."""
    at = slot_position(L, pre, op.seq)
    yield "isolation", op.block, L.and_(post.table(op.seq, at) == op.block,
                                        post.holders(op.block) == 1)


def slot_position(L, pre, q):
    """The position in q's table of the block holding slot number len (q's next token):
    len // block_size. Past the table's last block exactly when the table ends at a
    block boundary with nothing reserved."""
    return L.ceil_div(pre.length(q) + 1, pre.block_size) - 1


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
            post.reserved(q) == pre.reserved(q),
            post.same_table(q, pre, q),
        )


def unchanged_others(L, pre, post, dom: Domain, changed: tuple):
    """Frame: sequences the operation does not name keep their tables."""
    for q in dom.seqs:
        if q not in changed:
            yield "other sequences untouched", q, L.and_(
                post.live(q) == pre.live(q),
                post.length(q) == pre.length(q),
                post.reserved(q) == pre.reserved(q),
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
    nothing changed. Under a cyclic window of W blocks (``op.cycle``) a prompt
    longer than W blocks takes W fresh blocks, for its last W positions; the
    entries before them are null (behind the window: ``cyclic_behind``), and the
    counts above read min(ceil(n/B), W)."""
    q, n = op.seq, op.n_tokens
    need = L.ceil_div(n, pre.block_size)
    behind = cyclic_behind(L, need, op)
    fresh = need - behind if op.cycle else need  # the blocks handed out
    if op.outcome == OOB:
        yield "out-of-blocks only when fewer than ceil(n/B) blocks are free", None, (
            fresh > pre.num_free()
        )
        yield from exception_safety(L, pre, post, op, dom)
        return
    yield "sequence is live with n tokens", q, L.and_(post.live(q), post.length(q) == n)
    yield "nothing is reserved", q, post.reserved(q) == reserved_after(L, pre, op, need)
    yield "holds exactly ceil(n/B) blocks", q, post.nblocks(q) == need
    yield "the table is its own object", q, post.sharers(q) == 1
    for i in post.positions(q):
        handed = L.and_(behind <= i, i < need) if op.cycle else i < need
        yield "every block handed out was free", q, L.implies(
            handed, pre.free_count(post.table(q, i)) >= 1
        )
        if op.cycle:
            yield "an entry behind a cyclic window is null", q, L.implies(
                i < behind, post.table(q, i) == NULL)
    yield "free list shrinks by ceil(n/B)", None, post.num_free() == pre.num_free() - fresh
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


def cyclic_behind(L, need, op: Op):
    """How many of a prompt's ``need`` block positions lie behind a cyclic window of
    ``op.cycle`` blocks (the positions a cyclic table names only by a stale id: the
    null entries allocate leaves): need - W when the prompt is longer, else 0."""
    if not op.cycle:
        return 0
    return L.ite(need > op.cycle, need - op.cycle, 0)


def cyclic_skip(L, pre, op: Op):
    """Under a cyclic window of W = ``op.cycle`` blocks, how many of ``op``'s sequence's
    first entries the engine's own drop nulls before an append: an append at a block
    boundary past W reuses the block leaving the window, which the spec reads as
    ``drop_behind_window(seq, (W - 1) * B)`` and then ``append_slot``, one engine call;
    0 when the append stays within the table (mid-block, or fewer than W blocks)."""
    if not op.cycle:
        return 0
    q, B = op.seq, pre.block_size
    wraps = L.and_(L.mod(pre.length(q), B) == 0, pre.nblocks(q) >= op.cycle)
    drop = Op("drop_behind_window", seq=q, n_tokens=(op.cycle - 1) * B)
    return L.ite(wraps, behind_window(L, pre, drop), 0)


def cyclic_pre(L, pre, op: Op):
    """The state an append under a cyclic window starts from: the state
    ``drop_behind_window`` leaves when the engine's call wraps (``cyclic_skip``), else
    ``pre`` itself. Concretely ``spec.state.Dropped`` (derived from ``pre``, never
    observed; tests/core check it meets the drop's own contract); symbolically the state
    class's own ``dropped`` (``SymState.dropped``: the same meaning, a null prefix of
    ``skip`` entries, ``pre`` itself when it is 0)."""
    skip = cyclic_skip(L, pre, op)
    if isinstance(skip, int):  # (a concrete state: a number)
        return Dropped(pre, op.seq, skip) if skip else pre
    return pre.dropped(op.seq, skip)


def append_slot(L, pre, post, op: Op, dom: Domain):
    """append_slot(seq) -> (block, offset, cow_src): reserve the slot of
    token number len, in the block at position len // B of seq's table: its
    last block, or one it holds reserved (a lookahead's or a rollback's: the
    first reserved slot is used, the rest stay reserved). A fresh block only
    when the table has none there (the last block is full, nothing reserved:
    offset 0); a block there with refcount > 1 is replaced by a fresh one (its
    first writer copies a partial one: cow_src names it; its refcount drops by
    one; a reserved one holding none of seq's tokens may be copied or not), the
    rest of the table kept; a block there with refcount 1 is written in place.
    A full block is never copied. Out-of-blocks is allowed only when a block
    is needed and none is free, and then nothing changed. Under a cyclic window
    (``op.cycle``) an append at a block boundary past the window is the drop behind
    the window the engine makes first, then this contract from the state the drop
    leaves (``cyclic_pre``): the block leaving the window is released, and the new
    block must be free then (the released one, reused in place, or a fresh one)."""
    observed = pre  # (a failed call changed nothing: not even the engine's own drop)
    if op.cycle:
        pre = cyclic_pre(L, pre, op)
    q, B = op.seq, pre.block_size
    n, k = pre.length(q), pre.nblocks(q)
    offset = L.mod(n, B)
    p = slot_position(L, pre, q)
    boundary = p >= k  # no block there: the table grows
    at = pre.table(q, p)  # (the block there, when there is one)
    shared = L.and_(L.not_(boundary), pre.ref(at) > 1)
    needs_block = L.or_(boundary, shared)
    if op.outcome == OOB:
        yield "out-of-blocks only when a new block is needed and none is free", q, L.and_(
            needs_block, pre.num_free() == 0
        )
        yield from exception_safety(L, observed, post, op, dom)
        return
    new = post.table(q, p)
    yield "returns block ids of the pool", q, _returned_ids_valid(L, post, op)
    yield "returns the block holding slot len", q, op.block == new
    yield "returns the slot of token len: offset = len % block_size", q, op.offset == offset
    yield "the sequence stays live, one token longer", q, L.and_(post.live(q), post.length(q) == n + 1)
    yield "the slot written leaves the reservation", q, (
        post.reserved(q) == reserved_after(L, pre, op, post.nblocks(q)))
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
        L.and_(L.implies(offset != 0, op.has_cow), L.implies(op.has_cow, _cow_src(L, op) == at),
               post.nblocks(q) == k, post.same_table(q, pre, q, p)),
    )
    for i in post.positions(q):  # (a reservation's blocks past the one replaced)
        yield "a shared partial block is copied first (cow_src = old last block)", q, L.implies(
            L.and_(shared, p < i), post.table(q, i) == pre.table(q, i))
    yield "a new block was free", q, L.implies(needs_block, pre.free_count(new) >= 1)
    taken = L.ite(needs_block, 1, 0)
    yield "free list shrinks by one exactly when a block is taken", None, (
        post.num_free() == pre.num_free() - taken
    )
    for b in dom.blocks:
        gained = L.ite(L.and_(needs_block, b == new), 1, 0)
        dropped = L.ite(L.and_(shared, b == at), 1, 0)
        yield "refcounts change only as the operation says", b, (
            post.ref(b) == pre.ref(b) + gained - dropped
        )
        yield "free list changes only as the operation says", b, (
            post.free_count(b) == pre.free_count(b) - gained
        )
    yield from isolation(L, pre, post, op)
    yield from unchanged_others(L, pre, post, dom, (q,))


def _last_token_block(L, pre, q):
    """(index of the block holding q's last token, whether that block is partial)."""
    n = pre.length(q)
    return L.ceil_div(n, pre.block_size) - 1, L.mod(n, pre.block_size) != 0


def _shares(L, pre, post, op: Op, dom: Domain, source, target, released: bool):
    """What a fork or a rebase does to ``target`` (the child): it holds ``source``'s
    blocks, each shared, except that a partial block holding the source's last token may
    be a copy made now (a fresh block; an eager fork). With ``released``, the child's
    old references go first (a rebase), so the copy may also land in a block only the
    child held, released by then. The clauses both operations share."""
    k = pre.nblocks(source)
    t, partial = _last_token_block(L, pre, source)
    copy = post.table(target, t)
    eager = L.and_(post.nblocks(target) == k, copy != pre.table(source, t))
    fresh = L.and_(eager, pre.free_count(copy) >= 1)  # the copy taken from the free list
    yield "child is live with the source's length", target, L.and_(
        post.live(target), post.length(target) == pre.length(source))
    yield "child's table lists the source's blocks, a partial last block possibly a copy", \
        target, L.and_(post.nblocks(target) == k, L.all_(
            L.implies(L.and_(i < k, i != t), post.table(target, i) == pre.table(source, i))
            for i in post.positions(target)))
    yield "only a partial last block is copied at fork time (a full block never)", target, (
        L.implies(eager, partial))
    if released:  # (released first, a block the child alone held may take the copy)
        yield "a block copied at fork time was free or the child's alone", target, L.implies(
            eager, L.or_(pre.free_count(copy) >= 1,
                         L.and_(pre.occurrences(target, copy) >= 1,
                                pre.ref(copy) == pre.occurrences(target, copy))))
    else:
        yield "a block copied at fork time was free", target, L.implies(
            eager, pre.free_count(copy) >= 1)
    yield "child's table is its own object", target, post.sharers(target) == 1
    yield "child reserves what the source reserves", target, (
        post.reserved(target) == reserved_after(L, pre, op, post.nblocks(target)))
    yield "source unchanged", source, L.and_(
        post.live(source), post.length(source) == pre.length(source),
        post.reserved(source) == pre.reserved(source), post.same_table(source, pre, source))
    back = []
    for b in dom.blocks:
        old = pre.occurrences(target, b) if released else 0
        freed = L.and_(pre.ref(b) > 0, post.ref(b) == 0)
        taken = L.and_(pre.ref(b) == 0, post.ref(b) > 0)
        back.append(freed)
        named = post.occurrences(target, b)
        touched = L.or_(named > 0, old > 0) if released else named > 0
        yield "refcount +1 per entry of the child's table, -1 per entry it had", b, L.implies(
            touched, post.ref(b) == pre.ref(b) + named - old)
        # (a block the child names neither before nor after: a table entry the spec reads as
        # holding nothing, e.g. a stale name behind a cyclic window, must not be counted)
        yield "a block the child's table does not name keeps its refcount", b, L.implies(
            L.not_(touched), post.ref(b) == pre.ref(b))
        yield "free list changes only as the operation says", b, (
            post.free_count(b) == pre.free_count(b) + L.ite(freed, 1, 0) - L.ite(taken, 1, 0))
    yield "free list changes by the blocks released and the copy taken", None, (
        post.num_free() == pre.num_free() + L.count(back) - L.ite(fresh, 1, 0))
    yield from unchanged_others(L, pre, post, dom, (source, target))


def fork(L, pre, post, op: Op, dom: Domain):
    """fork(parent, child): child gets its own table listing the parent's blocks,
    the parent unchanged. Lazily (the seed's way) every block is shared: its
    refcount grows by one per entry, nothing is allocated or copied. Eagerly, a
    partial block holding the parent's last token is copied at fork time (the
    child's is a fresh block: copies names it; the parent's keeps its refcount),
    every other block shared. Both are legal. A full block is never copied. An
    eager fork may run out of blocks (only then: a partial last block and no
    free block), and then nothing changed. A block the child's table does not name
    keeps its refcount."""
    if op.outcome == OOB:
        t, partial = _last_token_block(L, pre, op.seq)
        yield "out-of-blocks only when a partial last block needs a copy and none is free", \
            None, L.and_(partial, pre.num_free() == 0)
        yield from exception_safety(L, pre, post, op, dom)
        return
    yield from _shares(L, pre, post, op, dom, op.seq, op.child, released=False)


def rebase(L, pre, post, op: Op, dom: Domain):
    """rebase(source, child): beam search re-points a live child at another beam's
    history. The child's old references are released (each block loses one per
    entry, joining the free list when that was its last), then it holds the
    source's blocks as a fork would (full blocks shared, a partial last block
    shared or copied now, into a free block or one the child alone held), with the
    source's length; the source is unchanged.
    An eager copy may run out of blocks, and then nothing changed."""
    if op.outcome == OOB:
        t, partial = _last_token_block(L, pre, op.seq)
        yield "out-of-blocks only when a partial last block needs a copy and none is free", \
            None, L.and_(partial, pre.num_free() == 0)
        yield from exception_safety(L, pre, post, op, dom)
        return
    yield from _shares(L, pre, post, op, dom, op.seq, op.child, released=True)


def append_slots(L, pre, post, op: Op, dom: Domain):
    """append_slots(seq, n, lookahead) -> copies: reserve the slots of the next n
    tokens (which the caller then writes) and lookahead more slots beyond them
    (reserved, not written), all or nothing, as chunked prefill and speculative
    decoding do. New blocks exactly for the slots past the table's last block.
    Every block a new token lands in is the sequence's alone afterwards: a shared
    one is replaced by a fresh block (its first writer copies a partial one, and
    copies names the copy), a block the sequence holds alone is written in
    place, a block holding only earlier tokens is never copied or replaced.
    Out-of-blocks is allowed only when the fresh blocks it needs outnumber the
    free ones, and then nothing changed."""
    q, n, B = op.seq, op.n_tokens, pre.block_size
    length, k = pre.length(q), pre.nblocks(q)
    first = L.ceil_div(length + 1, B) - 1  # the block the first new token lands in
    last = L.ceil_div(length + n, B) - 1  # ... and the last one
    need = L.ceil_div(length + n + op.lookahead, B)
    grown = L.ite(need > k, need - k, 0)
    replaced = [L.and_(first <= i, i <= last, i < k, pre.ref(pre.table(q, i)) > 1)
                for i in pre.positions(q)]
    fresh = L.count(replaced) + grown
    if op.outcome == OOB:
        yield "out-of-blocks only when more fresh blocks are needed than are free", q, (
            fresh > pre.num_free())
        yield from exception_safety(L, pre, post, op, dom)
        return
    yield "the sequence stays live, n tokens longer", q, L.and_(
        post.live(q), post.length(q) == length + n)
    yield "new blocks exactly for the slots past the last block", q, post.nblocks(q) == k + grown
    yield "the reservation is what was asked ahead", q, (
        post.reserved(q) == reserved_after(L, pre, op, post.nblocks(q)))
    for i in post.positions(q):
        old, new = pre.table(q, i), post.table(q, i)
        written = L.and_(first <= i, i <= last)
        yield "a block holding only earlier tokens is never copied or replaced", q, L.implies(
            L.and_(i < first, i < k), new == old)
        yield "a block the sequence holds alone is written in place", q, L.implies(
            L.and_(i < k, pre.ref(old) == 1), new == old)
        yield "every block a new token lands in is the sequence's alone", q, L.implies(
            L.and_(written, i < post.nblocks(q)), post.holders(new) == 1)
        yield "a block not written stays as it was", q, L.implies(
            L.and_(last < i, i < k), new == old)
        yield "a new or replacing block was free", q, L.implies(
            L.and_(i < post.nblocks(q), L.or_(k <= i, new != old)), pre.free_count(new) >= 1)
    back = []
    for b in dom.blocks:
        taken = L.and_(pre.ref(b) == 0, post.ref(b) > 0)
        freed = L.and_(pre.ref(b) > 0, post.ref(b) == 0)  # replaced, and it was its last holder
        back.append(freed)
        yield "refcounts change only as the sequence's table does", b, (
            post.ref(b) == pre.ref(b) + post.occurrences(q, b) - pre.occurrences(q, b))
        yield "free list changes only as the operation says", b, (
            post.free_count(b) == pre.free_count(b) + L.ite(freed, 1, 0) - L.ite(taken, 1, 0))
    yield "free list shrinks by the fresh blocks taken, grows by the blocks released", None, (
        post.num_free() == pre.num_free() - fresh + L.count(back))
    yield from unchanged_others(L, pre, post, dom, (q,))


def rollback(L, pre, post, op: Op, dom: Domain):
    """rollback(seq, k): the last k tokens are dropped (speculative tokens that
    verification rejected); at least one stays. Blocks past the new last token
    may be freed (each loses its reference, joining the free list when that was
    its last) or kept as reservation: both are legal. The table keeps its first
    blocks (a prefix of the old one, never longer, still holding every token),
    and a rolled-back slot is written again only through append_slots or
    append_slot, which replace a shared block before its write."""
    q, B = op.seq, pre.block_size
    left = pre.length(q) - op.n_tokens
    yield "the sequence stays live, k tokens shorter", q, L.and_(
        post.live(q), post.length(q) == left)
    yield "the table keeps its first blocks (a prefix of the old one)", q, L.and_(
        post.nblocks(q) <= pre.nblocks(q), post.same_table(q, pre, q, post.nblocks(q)))
    yield "the table still holds every token left", q, post.nblocks(q) >= L.ceil_div(left, B)
    yield "the reservation is what the kept blocks hold", q, (
        post.reserved(q) == reserved_after(L, pre, op, post.nblocks(q)))
    back = []
    for b in dom.blocks:
        dropped = pre.occurrences(q, b) - post.occurrences(q, b)
        freed = L.and_(dropped > 0, post.ref(b) == 0)
        back.append(freed)
        yield "refcount -1 per entry dropped from the table", b, post.ref(b) == pre.ref(b) - dropped
        yield "a block joins the free list exactly when its refcount reaches 0", b, (
            post.free_count(b) == pre.free_count(b) + L.ite(freed, 1, 0))
    yield "free list grows by the blocks released", None, (
        post.num_free() == pre.num_free() + L.count(back))
    yield from unchanged_others(L, pre, post, dom, (q,))


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


def behind_window(L, pre, op: Op):
    """How many of ``op``'s sequence's first blocks lie wholly behind the window of its
    last ``window`` tokens: floor((len - window) / B), 0 when the window covers it all."""
    q, window = op.seq, op.n_tokens
    n = pre.length(q)
    return L.ite(n > window, L.ceil_div(n - window + 1, pre.block_size) - 1, 0)


def drop_behind_window(L, pre, post, op: Op, dom: Domain):
    """drop_behind_window(seq, window): sliding-window attention reads only the last
    window tokens, so every block wholly before them is released (vLLM v1's
    SlidingWindowManager.remove_skipped_blocks) and its table entry becomes the null
    placeholder NULL (the null block: no pool block, no reference, never on the free
    list, never written). Each released entry drops one reference, the block joining
    the free list when that was its last (a block another table still names stays
    theirs); entries inside the window, and entries null already, stay as they were;
    the table keeps its length (null entries keep their positions), the sequence its
    tokens and reservation. It allocates nothing, so it never runs out of blocks."""
    q = op.seq
    k, skip = pre.nblocks(q), behind_window(L, pre, op)
    yield "the sequence stays live with its tokens, reservation and table length", q, L.and_(
        post.live(q), post.length(q) == pre.length(q), post.reserved(q) == pre.reserved(q),
        post.nblocks(q) == k)
    for i in post.positions(q):
        old, new = pre.table(q, i), post.table(q, i)
        yield "a block wholly behind the window becomes the null placeholder", q, L.implies(
            L.and_(i < k, L.or_(i < skip, old == NULL)), new == NULL)
        yield "a block inside the window stays", q, L.implies(
            L.and_(skip <= i, i < k, old != NULL), new == old)
    back = []
    for b in dom.blocks:
        dropped = pre.occurrences(q, b) - post.occurrences(q, b)
        freed = L.and_(dropped > 0, post.ref(b) == 0)
        back.append(freed)
        yield "refcount -1 per entry replaced by the null placeholder", b, (
            post.ref(b) == pre.ref(b) - dropped)
        yield "a block joins the free list exactly when its refcount reaches 0", b, (
            post.free_count(b) == pre.free_count(b) + L.ite(freed, 1, 0))
    yield "free list grows by the blocks released", None, (
        post.num_free() == pre.num_free() + L.count(back))
    yield from unchanged_others(L, pre, post, dom, (q,))


def preempt(L, pre, post, op: Op, dom: Domain):
    """preempt(seq): a running sequence is preempted for recompute: everything it
    holds is released exactly as free_seq releases it; the engine re-admits it
    later with its prompt plus everything it generated (an allocation of the same
    sequence, which prefix caching may serve from its own freed blocks)."""
    yield from free_seq(L, pre, post, op, dom)


CONTRACTS = {"allocate": allocate, "append_slot": append_slot, "fork": fork, "free_seq": free_seq,
             "append_slots": append_slots, "rollback": rollback, "rebase": rebase,
             "preempt": preempt, "drop_behind_window": drop_behind_window}
# The seed's four operations: what a seed-shaped allocator offers at the least.
SEED_OPERATIONS = ("allocate", "append_slot", "fork", "free_seq")

STEP_INVARIANTS = {"isolation": isolation.__doc__, "exception_safety": exception_safety.__doc__}


def refused(L, pre, post, op: Op, dom: Domain):
    """A deliberate refusal (a policy the target declares: a watermark, blocks held
    back for sibling beams, a lookahead cap) may come although blocks are free, but
    like out-of-blocks it leaves every observable structure unchanged."""
    yield from exception_safety(L, pre, post, op, dom)


def clauses(L, pre, post, op: Op, dom: Domain, contracts=None):
    """Every clause the operation must satisfy (``contracts``: a stand-in table, for
    proofs of a modified spec; the spec's own by default)."""
    if op.outcome == REFUSED:
        return refused(L, pre, post, op, dom)
    return (contracts or CONTRACTS)[op.kind](L, pre, post, op, dom)


def clause_names() -> dict[str, str]:
    """Every clause the contracts can name, as a violation names it (``kind: clause``),
    mapped to its operation; with the step invariants. What ``verify --allow`` accepts."""
    from .logic import Z3Logic
    from .symbolic import SymScope, SymState

    L = Z3Logic(None, max_quotient=3)
    scope = SymScope(2, 2, 2, 4)
    pre, post = SymState(L, scope, "pre"), SymState(L, scope, "post")
    dom = Domain(range(2), range(2))
    out: dict[str, str] = {}
    for kind in CONTRACTS:
        # (a cyclic window changes which clauses allocate yields; append_slot's are its own)
        for outcome, cycle in [(o, c) for o in (OK, OOB, REFUSED)
                               for c in ((0, 2) if kind == "allocate" else (0,))]:
            op = Op(kind, seq=0, child=1, outcome=outcome, n_tokens=L.var("n"),
                    lookahead=L.var("la"), block=L.var("b"), offset=L.var("o"),
                    cow_src=L.var("c"), has_cow=L.z3.Bool("h"), cycle=cycle)
            for name, _, _ in clauses(L, pre, post, op, dom):
                out.setdefault(f"{kind}: {name}", kind)
    return out
