"""Bounded exhaustive exploration of a target, for every model.

Breadth-first over every sequence of operations within a scope (the model's
``moves`` from each state, to a depth), each step checked in full mode.
States are deduplicated by the model's ``canonical`` key (equal up to
renaming block and sequence ids), so each distinct situation is expanded
once; BFS order makes the first violation found a shortest one within the
scope.

States are copied (``RunState.clone``, the target with ``copy.deepcopy``)
only after a faithfulness walk shows copies of this target behave like the
original; otherwise every path is replayed from scratch (slower, always
faithful). Deduplication sees what the model observes: a target whose
future depends on hidden state can be under-explored by it
(``dedup=False`` turns it off).
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

from kvcheck.check.model import Model, Options


@dataclass
class Exploration:
    scope: object
    explored: int = 0  # operations executed (edges)
    distinct: int = 0  # distinct states reached
    depth: int = 0  # deepest level completed
    seconds: float = 0.0
    complete: bool = True  # False if stopped by a budget (max_steps or the time budget)
    violation: object | None = None
    ops: list = field(default_factory=list)  # shortest failing sequence
    key_filter: tuple | None = None
    steps: int = 0  # operations run on targets (a path replayed from scratch counts whole)
    stopped_by_time: bool = False  # the wall-clock budget, not max_steps, stopped it


def explore(model: Model, factory, scope, options: Options, budget: float | None = None,
            key: tuple | None = None, dedup: bool = True, progress=None,
            max_steps: int | None = None) -> Exploration:
    """BFS to ``scope.depth``; stops at the first violation (with ``key``, if given).

    ``scope`` is the model's exploration scope: its sizes for building the target and
    ``depth``; ``progress(depth, distinct states, operations explored)`` is told of each
    state expanded. ``max_steps``: the most operations it may run (a count, the same on
    any machine); ``budget``: a wall-clock cap in seconds (an outer limit)."""
    start = time.perf_counter()
    options = options.full()
    res = Exploration(scope, key_filter=key)

    def fresh():
        return model.start(model.build(factory, scope, options), scope, options)

    root = fresh()
    if root.violation is not None:
        res.violation = root.violation
        return res
    can_copy = _copyable(model, root, scope, fresh)
    seen = {model.canonical(root)} if dedup else set()
    res.distinct = 1
    frontier: deque = deque([(root, [])])
    for level in range(1, scope.depth + 1):
        nxt: deque = deque()
        while frontier:
            state, path = frontier.popleft()
            if progress is not None:
                progress(level, res.distinct, res.explored)
            for op in model.moves(state, scope):
                if not state.valid(op):  # (a move the state's preconditions rule out)
                    continue
                over_time = budget is not None and time.perf_counter() - start > budget
                if over_time or (max_steps is not None and res.steps >= max_steps):
                    res.complete, res.stopped_by_time = False, over_time
                    res.seconds = time.perf_counter() - start
                    return res
                child = state.clone() if can_copy else _replayed(model, fresh, path)
                v = child.step(op)
                res.explored += 1
                res.steps += 1 if can_copy else len(path) + 1
                if v is not None:
                    if key is None or v.key == key:
                        res.violation, res.ops = v, [*path, op]
                        res.seconds = time.perf_counter() - start
                        return res
                    continue
                if dedup:
                    k = model.canonical(child)
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


def _copyable(model: Model, root, scope, fresh, steps: int = 60) -> bool:
    """Whether copies of this target behave exactly like the original.

    Some allocators copy unfaithfully (their objects customise ``deepcopy``
    for other purposes and drop fields). Before trusting copies, a fresh
    target (never copied) and a copy of the root are driven through the same
    pseudo-random walk, the copy copied again at every step as the search
    does; outcomes and observable states must agree throughout."""
    try:
        a, b = fresh(), root.clone()
        rng = random.Random(12345)
        for _ in range(steps):
            options = [op for op in model.moves(a, scope) if a.valid(op)]
            if not options:
                break
            op = rng.choice(options)
            b = b.clone()  # copies of copies, as the search makes them
            oa, ob = model.request(op), model.request(op)
            va, vb = a.step(oa), b.step(ob)
            if (va is None) != (vb is None):
                return False
            if va is not None:
                return va.key == vb.key
            if model.op_to_json(oa) != model.op_to_json(ob):
                return False
            if model.canonical(a) != model.canonical(b):
                return False
        return True
    except Exception:  # noqa: BLE001 - fall back to replaying from scratch
        return False


def _replayed(model: Model, fresh, path: list):
    state = fresh()
    for op in path:
        state.step(model.request(op))
    return state
