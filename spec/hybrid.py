"""Hybrid pools: several KV-cache groups sharing one pool of blocks, written once.

A hybrid model (vLLM v1's ``HybridKVCacheCoordinator``: e.g. full-attention and
sliding-window layers) keeps, per request, one block table *per KV-cache group*,
all drawing on one shared ``BlockPool``. Group ``g`` has a *window*: 0 for full
attention, ``W >= 1`` for a sliding window of ``W`` tokens (a token attends to
itself and the ``W - 1`` before it).

The state is read as a block-manager state whose sequences are the pairs
(request, group), numbered ``q = request * G + group`` (``G`` groups), so every
block-manager invariant of ``kvcheck.spec.invariants`` holds of it as written:
refcounts count the entries of every group's tables, the free list and the
allocator's count are the pool's, each group's table has the request's length
in blocks. On top of that the vocabulary of ``spec.state`` gains

    num_groups()       G
    group_of(q)        the group of (request, group) sequence q
    window_of(q)       the window of q's group (0: full attention)
    groups_naming(b)   how many groups have a live table naming block b
    tables_of(q)       how many groups hold a table for q's request
    served(q, i)       (an allocation's post state) position i of q's table was
                       served from the cache with a block that held, before the
                       call, exactly the request's tokens 0 .. (i+1)B - 1 computed
                       in q's group, and was full

``HYBRID_INVARIANTS`` are evaluated on that state after every operation; the
per-operation clauses below (``allocate``, ``append_slot``, ``append_tokens``,
``free_seq``) add
what one request-level call must do to all its groups at once; ``out_of_blocks``
what a failed one may do (nothing but a legal window drop).
"""

from __future__ import annotations

from .invariants import Invariant
from .state import NULL


def one_group_per_block(L, s, b):
    """A block of the shared pool serves one KV-cache group at a time: every table
    entry naming it belongs to tables of the same group (a full-attention layer and
    a sliding-window layer keep different KV for the same tokens, so a block handed
    to two groups is overwritten by one of them)."""
    return s.groups_naming(b) <= 1


def a_table_per_group(L, s, q):
    """A live request holds a block table in every KV-cache group (allocated,
    extended and freed together)."""
    return s.tables_of(q) == s.num_groups()


def window_nulls(L, s, q):
    """Only a sliding-window group drops blocks, and only blocks no later token can
    attend to: a null entry at position i of a group with window W lies wholly before
    the window of the next token (position len), i.e. (i+1)*B <= len - W + 1; a
    full-attention group (window 0) has no null entry. (Between steps; a step's own
    tokens need more, see the allocate and append_slot contracts.)"""
    B, W = s.block_size, s.window_of(q)
    return L.all_(
        L.implies(L.and_(i < s.nblocks(q), s.table(q, i) == NULL),
                  L.and_(W >= 1, (i + 1) * B + W <= s.length(q) + 1))
        for i in s.positions(q)
    )


HYBRID_INVARIANTS: list[Invariant] = [
    Invariant("one_group_per_block", "block", one_group_per_block),
    Invariant("a_table_per_group", "seq", a_table_per_group),
    Invariant("window_nulls", "seq", window_nulls),
]


def allocate(L, pre, post, op, seqs):
    """An allocation serves the same cached prefix to every group (the longest hit
    common to all groups, as the hybrid coordinator's fixed point finds it): each
    group reports the same number of cached tokens, a whole number of blocks that
    leaves at least one prompt token to compute; every position inside it is served
    from the cache with a full block that held exactly that prefix in the same group
    (or, in a sliding-window group, is a null entry behind the window). The step
    computes the tokens from the hit on, so a null entry lies wholly before the window
    of the first of them (position cached): (i+1)*B <= cached - W + 1."""
    cached = op.cached
    B = post.block_size
    first = cached[0]
    for g in range(1, len(seqs)):
        yield "allocate: every group serves the same number of cached tokens", seqs[g], \
            cached[g] == first
    yield "allocate: cached tokens are whole blocks and leave a token to compute", seqs[0], \
        L.and_(first >= 0, L.mod(first, B) == 0, first <= op.n_tokens - 1)
    for q in seqs:
        for i in post.positions(q):
            yield "allocate: a position inside the hit is served from the cache", q, \
                L.implies(i * B < first, L.or_(post.served(q, i), post.table(q, i) == NULL))
    for q in seqs:
        yield "allocate: a null entry lies behind the window of the first token computed", q, \
            _behind(L, post, q, first)


def append_slot(L, pre, post, op, seqs):
    """A decode step writes the new token (position len - 1 after it) in every group,
    into a pool block of that group's table that no other table entry names; the
    token attends to the W tokens ending with it, so a null entry lies wholly before
    them: (i+1)*B <= len - W (dropping against the length after the step, the next
    token's window, releases a block this token still reads)."""
    pos = (post.length(seqs[0]) - 1) // post.block_size
    for q in seqs:
        b = post.table(q, pos)
        yield "append_slot: each group writes the token into a block it holds alone", q, \
            L.and_(b != NULL, post.holders(b) == 1)
    for q in seqs:
        yield "append_slot: a null entry lies behind the window of the token written", q, \
            _behind(L, post, q, post.length(q) - 1)


def append_tokens(L, pre, post, op, seqs):
    """A step computing n new tokens at once (the next chunk of a streamed prompt, as
    chunked prefill schedules it) writes each of them, in every group, into a pool block
    that group holds alone; the first of them (position len - n) attends to the W tokens
    ending with it, so a null entry lies wholly before those: (i+1)*B <= len - n - W + 1
    (dropping against the chunk's last token releases blocks its first tokens read)."""
    B = post.block_size
    first = post.length(seqs[0]) - op.n_tokens
    for q in seqs:
        yield "append_tokens: each group writes the new tokens into blocks it holds alone", q, \
            L.all_(L.implies(L.and_(i * B < post.length(q), (i + 1) * B > first),
                             L.and_(post.table(q, i) != NULL,
                                    post.holders(post.table(q, i)) == 1))
                   for i in post.positions(q))
    for q in seqs:
        yield "append_tokens: a null entry lies behind the window of the first new token", q, \
            _behind(L, post, q, first)


def _behind(L, s, q, first):
    """Every null entry of q's table lies wholly before the window of the token at position
    ``first`` (which attends to first - W + 1 .. first)."""
    B, W = s.block_size, s.window_of(q)
    return L.all_(L.implies(L.and_(i < s.nblocks(q), s.table(q, i) == NULL),
                            (i + 1) * B + W <= first + 1)
                  for i in s.positions(q))


def free_seq(L, pre, post, op, seqs):
    """Freeing a request drops its table in every group (each entry's reference, by
    refcount_conservation; the blocks reaching 0 return to the pool, by free_list)."""
    for q in seqs:
        yield "free_seq: the request holds no table in any group", q, L.not_(post.live(q))


def out_of_blocks(L, pre, post, op, dom):
    """An operation that fails with out-of-blocks changes nothing, except that it may first
    release blocks behind a sliding window: the drop the step makes anyway (vLLM's
    allocate_slots calls remove_skipped_blocks before it checks the free blocks: "we can do
    this even if we cannot schedule this request"). Every table keeps its entries but for
    pool entries of a sliding-window group that become null behind the window (as
    window_nulls, at the unchanged length; the dropped entries extend the null prefix, as
    vLLM's remove_skipped_blocks does), a request the call would admit holds no table,
    and each block's refcount drops by exactly the entries released from it."""
    B = pre.block_size
    for q in dom.seqs:
        W = pre.window_of(q)
        yield "out of blocks: every table unchanged but for sliding-window drops", q, L.and_(
            post.live(q) == pre.live(q), post.nblocks(q) == pre.nblocks(q),
            L.all_(L.or_(post.table(q, i) == pre.table(q, i),
                         L.and_(post.table(q, i) == NULL, W >= 1,
                                (i + 1) * B + W <= pre.length(q) + 1,
                                True if i == 0 else post.table(q, i - 1) == NULL))
                   for i in pre.positions(q)))
    for b in dom.blocks:
        yield "out of blocks: a refcount drops only by the entries released", b, \
            post.ref(b) == pre.ref(b) - (pre.holders(b) - post.holders(b))


CONTRACTS = {"allocate": allocate, "append_slot": append_slot, "append_tokens": append_tokens,
             "free_seq": free_seq}


def clause_names() -> list[str]:
    """Every per-operation clause name (for ``--allow`` and documentation)."""
    import inspect
    import re

    names = []
    for fn in (*CONTRACTS.values(), out_of_blocks):
        names += re.findall(r'yield "([^"]+)"', inspect.getsource(fn))
    return names


class HybridSnapshot:
    """A concrete hybrid state: ``base`` (a ``spec.state.Snapshot`` over the (request,
    group) sequences ``request * G + group``), the groups' windows, and for an
    allocation's post state the positions served from the cache with the right content
    (``served_at``: (q, i) pairs). Every term of ``spec.state`` reads through to ``base``."""

    def __init__(self, base, windows, served_at=frozenset()):
        self.base = base
        self.windows = tuple(windows)
        self.G = len(self.windows)
        self.served_at = frozenset(served_at)
        naming: dict = {}
        for q, t in base.tables.items():
            for b in t:
                if b != NULL:
                    naming.setdefault(b, set()).add(q % self.G)
        self._naming = {b: len(gs) for b, gs in naming.items()}
        reqs: dict = {}
        for q in base.tables:
            reqs[q // self.G] = reqs.get(q // self.G, 0) + 1
        self._tables_of = reqs

    def __getattr__(self, name):
        return getattr(self.base, name)

    def num_groups(self) -> int:
        return self.G

    def group_of(self, q: int) -> int:
        return q % self.G

    def window_of(self, q: int) -> int:
        return self.windows[q % self.G]

    def groups_naming(self, b: int) -> int:
        return self._naming.get(b, 0)

    def tables_of(self, q: int) -> int:
        return self._tables_of.get(q // self.G, 0)

    def served(self, q: int, i: int) -> bool:
        return (q, i) in self.served_at
