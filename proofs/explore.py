"""Bounded exhaustive exploration of an implementation.

Breadth-first over every sequence of operations within a scope (pool size,
block size, sequence slots, largest prompt, depth), each step checked by the
oracle in full mode. States are deduplicated up to renaming of block and
sequence ids, so each distinct situation is expanded once; BFS order makes
the first violation found a shortest one within the scope.

Deduplication looks at what the oracle can observe (tables, lengths,
refcounts, the free list *in order*). An allocator whose future depends on
hidden state (counters, caches) can be under-explored by it; ``dedup=False``
turns it off.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kvcheck.check.trace import request
from kvcheck.check.violation import Violation
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.proofs.renaming import canonical_tables
from kvcheck.spec.contracts import Op
from kvcheck.targets.loading import build


@dataclass(frozen=True)
class Scope:
    num_blocks: int = 4
    block_size: int = 2
    seqs: int = 3
    max_tokens: int = 4
    depth: int = 8

    def describe(self) -> str:
        return (f"{self.num_blocks} blocks x {self.block_size} slots, {self.seqs} sequences, "
                f"prompts <= {self.max_tokens}, depth {self.depth}")


@dataclass
class Exploration:
    scope: Scope
    explored: int = 0  # operations executed (edges)
    distinct: int = 0  # distinct states reached
    depth: int = 0  # deepest level completed
    seconds: float = 0.0
    complete: bool = True  # False if stopped by the time budget
    violation: Violation | None = None
    ops: list[Op] = field(default_factory=list)  # shortest failing sequence
    key_filter: tuple | None = None


def moves(oracle: Oracle, scope: Scope) -> list[Op]:
    """Every operation worth trying next (one fresh id suffices by symmetry)."""
    live = sorted(oracle.lengths)
    fresh = next((q for q in range(scope.seqs) if q not in oracle.lengths), None)
    caps = oracle.target.capabilities
    out: list[Op] = []
    if fresh is not None and "allocate" in caps:
        out += [Op("allocate", seq=fresh, n_tokens=n) for n in range(1, scope.max_tokens + 1)]
    for q in live:
        if "append_slot" in caps:
            out.append(Op("append_slot", seq=q))
        if fresh is not None and "fork" in caps:
            out.append(Op("fork", seq=q, child=fresh))
        if "free_seq" in caps:
            out.append(Op("free_seq", seq=q))
    return out


def canonical(oracle: Oracle) -> tuple:
    """The observed state with sequence and block ids renamed canonically.

    Sequences are ordered by a renaming-invariant signature; blocks are
    numbered by first appearance in the tables in that order, then along the
    free list. Equal keys mean isomorphic observable states.
    """
    snap = oracle.observed
    tables, label = canonical_tables(
        {q: (oracle.lengths.get(q, 0), t) for q, t in snap.tables.items()}, snap.ref)
    free_order = tuple(label.setdefault(b, len(label)) for b in oracle.target.free_blocks()) \
        if hasattr(oracle.target, "free_blocks") else ()
    refs = tuple(sorted((label.get(b, -1 - b), snap.ref(b)) for b in snap.blocks() if snap.ref(b)))
    return tables, free_order, refs


def explore(factory, scope: Scope, out_of_blocks=None, timeout: float | None = 10.0,
            budget: float | None = None, key: tuple | None = None, dedup: bool = True,
            progress=None) -> Exploration:
    """BFS to ``scope.depth``; stops at the first violation (with ``key``, if given).
    ``progress(depth, distinct states, operations explored)`` is told of each state expanded."""
    start = time.perf_counter()
    res = Exploration(scope, key_filter=key)
    root = Oracle(build(factory, scope.num_blocks, scope.block_size, out_of_blocks), mode="full",
                  timeout=timeout)
    if root.violation is not None:
        res.violation = root.violation
        return res
    can_copy = _copyable(root, scope, lambda: Oracle(
        build(factory, scope.num_blocks, scope.block_size, out_of_blocks), mode="full",
        timeout=timeout))
    seen = {canonical(root)} if dedup else set()
    res.distinct = 1
    frontier: deque = deque([(root, [])])
    for level in range(1, scope.depth + 1):
        nxt: deque = deque()
        while frontier:
            oracle, path = frontier.popleft()
            if progress is not None:
                progress(level, res.distinct, res.explored)
            for op in moves(oracle, scope):
                if budget is not None and time.perf_counter() - start > budget:
                    res.complete = False
                    res.seconds = time.perf_counter() - start
                    return res
                child = _child(oracle, path, factory, scope, out_of_blocks, timeout, can_copy)
                v = child.step(op)
                res.explored += 1
                if v is not None:
                    if key is None or v.key == key:
                        res.violation, res.ops = v, [*path, op]
                        res.seconds = time.perf_counter() - start
                        return res
                    continue
                if dedup:
                    k = canonical(child)
                    if k in seen:
                        continue
                    seen.add(k)
                res.distinct += 1
                nxt.append((child, [*path, op]))
        res.depth = level
        frontier = nxt
        if not frontier:
            break
    res.seconds = time.perf_counter() - start
    return res


def _copyable(oracle: Oracle, scope: Scope, fresh, steps: int = 60) -> bool:
    """Whether copies of this target behave exactly like the original.

    Some allocators copy unfaithfully (their objects customise ``deepcopy``
    for other purposes and drop fields). Before trusting copies, a fresh
    target (never copied) and a copy of the root are driven through the same
    pseudo-random walk, the copy copied again at every step as the search
    does; outcomes and observable states must agree throughout. Otherwise the
    search replays each path from scratch (slower, always faithful).
    """
    import random

    try:
        a, b = fresh(), oracle.clone()
        rng = random.Random(12345)
        for _ in range(steps):
            options = moves(a, scope)
            if not options:
                break
            op = rng.choice(options)
            b = b.clone()  # copies of copies, as the search makes them
            oa, ob = request(op), request(op)
            va, vb = a.step(oa), b.step(ob)
            if (va is None) != (vb is None):
                return False
            if va is not None:
                return va.key == vb.key
            if (oa.outcome, oa.block, oa.offset, oa.cow_src) != (ob.outcome, ob.block, ob.offset,
                                                                  ob.cow_src):
                return False
            if canonical(a) != canonical(b):
                return False
        return True
    except Exception:  # noqa: BLE001 - fall back to replaying from scratch
        return False


def _child(oracle, path, factory, scope, out_of_blocks, timeout, can_copy) -> Oracle:
    if can_copy:
        return oracle.clone()
    fresh = Oracle(build(factory, scope.num_blocks, scope.block_size, out_of_blocks), mode="full",
                   timeout=timeout)
    for op in path:
        fresh.step(request(op))
    return fresh
