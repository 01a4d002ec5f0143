"""Replay and shrinking: from a failing run to a minimal counterexample.

``replay`` runs a list of operation requests on a fresh target with the
oracle in full mode, skipping any request whose precondition no longer holds
(so deleting an allocate silently drops the operations on that sequence).

``shrink`` then searches for a smaller trace that fails *the same way*
(same violation kind and rule), greedily and to a fixpoint:
  1. cut everything after the violating step;
  2. delete chunks of operations, halving the chunk size down to one;
  3. fold an append into its sequence's allocation (one token longer);
  4. lower each allocate's token count;
  5. lower the pool size (also by dropping an allocation together with
     the blocks it held), then the block size (as is, or with every
     prompt scaled down along with it, so that full blocks stay full);
  6. renumber sequence ids from 0 in order of first use;
  7. breadth-first search (``kvcheck.proofs.explore``) over all shorter
     traces within the trace's own scope; if one fails the same way, start
     again from it.
The result is 1-minimal: removing any single operation, folding any append
or lowering any token count, pool or block size by one step no longer
reproduces it; and when the search completes within the budget it is a
*shortest* trace for its scope (``Shrunk.shortest`` says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvcheck.check.trace import request
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.proofs.explore import Scope, explore
from kvcheck.spec.contracts import Op
from kvcheck.targets.loading import build


@dataclass
class Replay:
    violation: Violation | None
    ops: list[Op]  # the operations actually run, with outcomes
    states: list[dict] = field(default_factory=list)


def state_json(snap) -> dict:
    return {
        "tables": {str(q): list(t) for q, t in snap.tables.items()},
        "lens": {str(q): snap.length(q) for q in snap.tables},
        "refs": list(snap.refs),
        "free": sorted(snap.free.elements()),
    }


def replay(factory, num_blocks: int, block_size: int, ops, out_of_blocks=None,
           timeout: float | None = 10.0, record: bool = False) -> Replay:
    target = build(factory, num_blocks, block_size, out_of_blocks)
    oracle = Oracle(target, mode="full", timeout=timeout)
    ran: list[Op] = []
    states: list[dict] = []
    if oracle.violation is not None:
        return Replay(oracle.violation, ran, states)
    with Watchdog(timeout) as wd:
        for req in ops:
            op = request(req)
            if not oracle.valid(op):
                continue
            v = oracle.step(op, wd)
            ran.append(op)
            if record:
                states.append(state_json(oracle.observed))
            if v is not None:
                return Replay(v, ran, states)
    return Replay(None, ran, states)


def _fold_append(ops: list[Op], i: int) -> list[Op] | None:
    """``ops`` without the append at ``i``, its sequence allocated one token longer."""
    if ops[i].kind != "append_slot":
        return None
    q = ops[i].seq
    for j in range(i - 1, -1, -1):
        if ops[j].kind == "allocate" and ops[j].seq == q:
            cand = [request(o) for o in ops]
            cand[j].n_tokens += 1
            del cand[i]
            return cand
        if ops[j].kind == "fork" and ops[j].child == q:
            return None
    return None


def renumber(ops: list[Op]) -> list[Op]:
    ids: dict[int, int] = {}

    def new(q: int) -> int:
        if q not in ids:
            ids[q] = len(ids)
        return ids[q]

    out = []
    for op in ops:
        r = request(op)
        r.seq = new(op.seq)
        if op.kind == "fork":
            r.child = new(op.child)
        out.append(r)
    return out


@dataclass
class Shrunk:
    ops: list[Op]
    num_blocks: int
    block_size: int
    violation: Violation
    states: list[dict]
    attempts: int
    shortest: str = ""  # set when BFS showed nothing shorter exists within the scope
    one_minimal: bool = True  # False if the budget ran out before the greedy passes settled


def shrink(factory, num_blocks: int, block_size: int, ops: list[Op], key: tuple,
           out_of_blocks=None, timeout: float | None = 10.0, budget: float = 60.0,
           progress=None) -> Shrunk | None:
    """Smallest trace failing with the same ``key`` (kind, rule); None if ``ops`` does not fail.

    ``progress(attempts, length)``, if given, is told of every candidate tried and the length
    of the smallest failing trace so far."""
    deadline = time.monotonic() + budget
    attempts = 0
    smallest = len(ops)

    def fails(cand: list[Op], nb: int, bs: int) -> Replay | None:
        nonlocal attempts, smallest
        attempts += 1
        try:
            r = replay(factory, nb, bs, cand, out_of_blocks, timeout)
        except Exception:  # noqa: BLE001 - a scope the target refuses is just not smaller
            r = None
        if r is not None and r.violation is not None and r.violation.key == key:
            smallest = min(smallest, len(r.ops))
        else:
            r = None
        if progress is not None:
            progress(attempts, smallest)
        return r

    nb, bs = num_blocks, block_size
    r = fails(ops, nb, bs)
    if r is None:
        return None
    cur = r.ops
    shortest = ""
    while True:
        cur, nb, bs, settled = _greedy(fails, cur, nb, bs, deadline)
        # 7. breadth-first search for anything shorter within the trace's own scope
        left = deadline - time.monotonic()
        if len(cur) <= 1 or left <= 0:
            break
        scope = Scope(nb, bs, seqs=len({q for o in cur for q in (o.seq, o.child)}),
                      max_tokens=max([o.n_tokens for o in cur if o.kind == "allocate"] or [1]),
                      depth=len(cur) - 1)
        found = explore(factory, scope, out_of_blocks, timeout, budget=min(left, 10.0), key=key)
        if found.violation is None:
            if found.complete:
                shortest = f"no shorter trace exists within {scope.describe()}"
            break
        cur = found.ops
    # 6. renumber, and record the final run with its states
    final = replay(factory, nb, bs, renumber(cur), out_of_blocks, timeout, record=True)
    if final.violation is None or final.violation.key != key:
        final = replay(factory, nb, bs, cur, out_of_blocks, timeout, record=True)
    return Shrunk(final.ops, nb, bs, final.violation, final.states, attempts, shortest, settled)


def _greedy(fails, cur, nb, bs, deadline):
    """Passes 2-5 to a fixpoint; ``settled`` is False if the deadline stopped them first."""
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        # 2. delete chunks
        size = max(1, len(cur) // 2)
        while size >= 1 and time.monotonic() < deadline:
            i = 0
            while i < len(cur) and time.monotonic() < deadline:
                cand = cur[:i] + cur[i + size:]
                got = fails(cand, nb, bs)
                if got is not None:
                    cur, changed = got.ops, True
                else:
                    i += size
            size //= 2
        # 3. fold appends into their sequence's allocation (allocate n, append == allocate n+1
        #    when nothing in between reads the sequence)
        i = 0
        while i < len(cur) and time.monotonic() < deadline:
            cand = _fold_append(cur, i)
            got = fails(cand, nb, bs) if cand is not None else None
            if got is not None:
                cur, changed = got.ops, True
            else:
                i += 1
        # 4. lower token counts
        for i, op in enumerate(cur):
            if op.kind != "allocate" or time.monotonic() >= deadline:
                continue
            for n in sorted({1, bs, op.n_tokens // 2, op.n_tokens - 1}):
                if 1 <= n < op.n_tokens:
                    cand = [request(o) for o in cur]
                    cand[i].n_tokens = n
                    got = fails(cand, nb, bs)
                    if got is not None:
                        cur, changed = got.ops, True
                        break
        # 5. lower the pool size, then the block size
        for smaller in range(1, nb):
            if time.monotonic() >= deadline:
                break
            got = fails(cur, smaller, bs)
            if got is not None:
                cur, nb, changed = got.ops, smaller, True
                break
        # 5c. drop an allocation together with the pool space it held (a trace that
        #     fills the pool before the failing step often needs neither)
        i = 0
        while i < len(cur) and time.monotonic() < deadline:
            op = cur[i]
            held = -(-op.n_tokens // bs) if op.kind == "allocate" else 0
            got = fails(cur[:i] + cur[i + 1:], nb - held, bs) if 0 < held < nb else None
            if got is not None:
                cur, nb, changed = got.ops, nb - held, True
            else:
                i += 1
        for smaller in range(1, bs):
            if time.monotonic() >= deadline:
                break
            got = fails(cur, nb, smaller)
            if got is None:  # 5b. the same, every prompt scaled along (n -> ceil(n*smaller/bs))
                got = fails(_scaled(cur, bs, smaller), nb, smaller)
            if got is not None:
                cur, bs, changed = got.ops, smaller, True
                break
    return cur, nb, bs, not changed and time.monotonic() < deadline


def _scaled(ops: list[Op], bs: int, smaller: int) -> list[Op]:
    """``ops`` with each prompt of ``n`` tokens cut to ``ceil(n * smaller / bs)``: about as many
    blocks of the smaller size, full blocks staying full."""
    out = [request(o) for o in ops]
    for o in out:
        if o.kind == "allocate":
            o.n_tokens = max(1, -(-o.n_tokens * smaller // bs))
    return out


def budget_ran_out(budget: float, length: int, unit: str) -> str:
    """The minimality of a counterexample whose shrinking was stopped by its time budget."""
    return (f"shrinking stopped at its {budget:g} s budget: {length} {unit}"
            f"{'' if length == 1 else 's'}, not proven 1-minimal")
