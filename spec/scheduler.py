"""The scheduler's policy, written once over a before/after view of a step.

Vocabulary of a scheduler state ``s`` (``SchedState``; the block manager's
own state is a ``kvcheck.spec.state.Snapshot`` in ``s.bm``):

    s.block_size, s.num_blocks, s.watermark
    s.waiting        tuple of (seq, n_tokens), head first
    s.running        tuple of seq ids, oldest first
    s.num_free()     free device blocks
    s.live(q)        q holds device blocks
    s.length(q)      q's token count in the block manager
    s.nblocks(q)     device blocks q holds
    s.host           the host pool's Snapshot, or None (recompute-only)

Which sequences sit where (queue *structure*: ids and positions) is concrete;
every number (lengths, free counts, needs, demands) goes through the logic
layer, so under Z3 the clauses are formulas over symbolic lengths and free
counts for a fixed queue shape (case-split on the admitted count ``k`` and
the survivor count ``m``, each defined below by a ``count``).

Each contract is a generator of clauses ``(name, element, formula)``, like
``kvcheck.spec.contracts``; the oracle reports the first that fails.

The policy defines the outcome of a step from the state before it:

    need(n)       = ceil(n / block_size)       blocks to prefill n tokens
    fits(i)       = free - need(w_0) - ... - need(w_i) >= watermark
    k             = count(fits(i))             admitted (fits is monotone)
    R             = running ++ w_0..w_{k-1}    oldest first
    len(R_i)      = its length (a waiting one: its queued n)
    demand(m)     = count(len(R_i) % block_size == 0, i < m)
                    (a slot at a block boundary takes a block)
    free_after    = free - need(w_0) - ... - need(w_{k-1})
    held(m)       = need(len(R_m)) + ... + need(len(R_last))
    feasible(m)   = demand(m) <= free_after + held(m)
    m             = count(feasible(m), 1 <= m <= |R|)   survivors (monotone)

and the step must leave ``running == R[:m]`` (each decoded once, oldest
first, one token longer) and ``waiting == [(R_i, len(R_i)) for i >= m] ++
w_k..`` (the newest preempted, re-queued at the front with their full length,
holding no blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .state import Snapshot


@dataclass(frozen=True)
class SchedState:
    block_size: int
    num_blocks: int
    watermark: int
    waiting: tuple[tuple[int, int], ...]
    running: tuple[int, ...]
    bm: Snapshot
    host: Snapshot | None = None

    def num_free(self) -> int:
        return self.bm.num_free()

    def live(self, q: int) -> bool:
        return self.bm.live(q)

    def length(self, q: int) -> int:
        return self.bm.length(q)

    def nblocks(self, q: int) -> int:
        return self.bm.nblocks(q)

    def waiting_ids(self) -> tuple[int, ...]:
        return tuple(q for q, _ in self.waiting)


# -- defined terms ---------------------------------------------------------------------
def need(L, s: SchedState, n):
    return L.ceil_div(n, s.block_size)


def admission(L, pre: SchedState):
    """``(fits, k)``: fits[i] = admitting w_0..w_i keeps free - need >= watermark."""
    fits, cum = [], 0
    for _, n in pre.waiting:
        cum = cum + need(L, pre, n)
        fits.append(pre.num_free() - cum >= pre.watermark)
    return fits, L.count(fits)


@dataclass
class Plan:
    """The policy's outcome of a step (concrete structure, logic-layer numbers)."""

    k: object  # admitted count
    order: list  # R: running ++ admitted, oldest first
    pre_len: dict  # seq -> length before decoding
    fits: list
    free_after: object
    feasible: list  # feasible[m - 1] for m = 1..|R|
    m: object  # survivors


def plan(L, pre: SchedState) -> Plan:
    fits, k = admission(L, pre)
    admitted = pre.waiting[:k]
    order = list(pre.running) + [q for q, _ in admitted]
    pre_len = {q: pre.length(q) for q in pre.running}
    pre_len.update({q: n for q, n in admitted})
    free_after = pre.num_free() - sum(need(L, pre, n) for _, n in admitted)
    B = pre.block_size
    boundary = [L.mod(pre_len[q], B) == 0 for q in order]
    feasible = []
    for m in range(1, len(order) + 1):
        demand = L.count(boundary[:m])
        held = sum(need(L, pre, pre_len[q]) for q in order[m:])
        feasible.append(demand <= free_after + held)
    return Plan(k, order, pre_len, fits, free_after, feasible, L.count(feasible))


# -- the step contract -----------------------------------------------------------------
def step(L, pre: SchedState, post: SchedState, decoded: Sequence[int]):
    """One scheduler step: FCFS admission by watermark, decode oldest first
    with one slot per running sequence, and on out-of-blocks preempt the
    newest running sequence, free its blocks and re-queue it at the front of
    waiting with its full length (prompt plus everything generated)."""
    p = plan(L, pre)
    W = pre.waiting
    w_ids = [q for q, _ in W]
    running = list(post.running)
    in_running = set(running)
    order_pos = {q: i for i, q in enumerate(p.order)}

    # decode
    for q in decoded:
        yield "no sequence is decoded twice in a step", q, L.count(d == q for d in decoded) == 1
    for q in decoded:
        yield "only running sequences are decoded", q, q in in_running
    for q in running:
        yield "every running sequence gets one slot per step", q, q in set(decoded)
    yield "decode is oldest first (in running order)", None, list(decoded) == running

    # admission
    for i, q in enumerate(w_ids):
        if q in in_running:
            for j in range(i):
                yield "admission is FCFS: nothing behind the head skips ahead", q, (
                    w_ids[j] in in_running)
    for i, q in enumerate(w_ids):
        if q in in_running:
            yield "admission keeps free blocks minus the request's need at or above the " \
                  "watermark", q, p.fits[i]

    # preemption
    for q, _ in post.waiting:
        yield "a waiting sequence holds no device blocks", q, L.not_(post.live(q))
    for q in running:
        yield "a running sequence was running or just admitted", q, q in order_pos
    known = [q for q in running if q in order_pos]
    for q in known:
        for j in range(order_pos[q]):
            yield "on out-of-blocks the newest running sequence is preempted", p.order[j], (
                p.order[j] in in_running)
    for i, q in enumerate(p.order):
        rule = ("admission stops only at the first request that does not fit"
                if i >= len(pre.running)
                else "a sequence is preempted only when the step runs out of blocks")
        yield rule, q, L.implies(i < p.m, q in in_running)
    victims = [q for q in p.order if q not in in_running]
    post_w = dict(post.waiting)
    for q in victims:
        yield "a preempted sequence is re-queued in waiting", q, q in post_w
    for q in victims:
        if q in post_w:
            yield "a preempted sequence is re-queued with its full length (prompt + generated)", \
                q, post_w[q] == p.pre_len[q]
    yield "preempted sequences go to the front of waiting (oldest first), the rest keep their " \
          "order", None, list(post.waiting_ids()) == victims + w_ids[p.k:]

    # lengths and blocks
    for q in running:
        if q in p.pre_len:
            yield "a decoded sequence grows by exactly one token", q, (
                post.length(q) == p.pre_len[q] + 1)
    for q in running:
        yield "a running sequence holds its blocks", q, post.live(q)
    yield from no_leak(L, post)


def no_leak(L, s: SchedState):
    yield "no blocks leak: every device block is free or held by a running sequence", None, (
        s.num_free() + sum(s.nblocks(q) for q in s.running) == s.num_blocks)


# -- finish ----------------------------------------------------------------------------
def finish(L, pre: SchedState, post: SchedState, q: int):
    """finish(q): q leaves running and the block manager; every block it held
    is free or still held by another sequence; nothing else changes."""
    yield "finish: the sequence leaves running", q, q not in set(post.running)
    yield "finish: the sequence's blocks are released", q, L.not_(post.live(q))
    for i in pre.bm.positions(q):
        b = pre.bm.table(q, i)
        yield "finish: every block of the sequence is free or still held by others", b, L.or_(
            post.bm.free_count(b) >= 1, post.bm.holders(b) >= 1)
    yield "finish: the other running sequences keep their order", q, (
        list(post.running) == [r for r in pre.running if r != q])
    yield "finish: waiting is unchanged", q, post.waiting == pre.waiting
    yield from no_leak(L, post)


# -- swap ------------------------------------------------------------------------------
def swap_state(L, s: SchedState):
    """With a host pool: exactly the swapped-out sequences hold host blocks,
    each waiting with its full length and ceil(n / block_size) host blocks;
    no running sequence holds any."""
    h = s.host
    if h is None:
        return
    waiting: Mapping[int, int] = dict(s.waiting)
    for q in h.seqs():
        yield "swap: only a waiting sequence holds host blocks", q, q in waiting
        if q in waiting:
            yield "swap: a swapped-out sequence's host copy has its full length", q, (
                h.nblocks(q) == need(L, s, waiting[q]))
    for q in s.running:
        yield "swap: a running sequence holds no host blocks", q, L.not_(h.live(q))
    yield "swap: no host blocks leak", None, (
        h.num_free() + sum(h.nblocks(q) for q in h.seqs()) == h.num_blocks)


CLAUSES = {"step": step, "finish": finish}
DOCS = {"step": " ".join(step.__doc__.split()), "finish": " ".join(finish.__doc__.split()),
        "swap": " ".join(swap_state.__doc__.split())}
