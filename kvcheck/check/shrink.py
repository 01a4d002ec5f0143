"""Shrinking: from a failing run to a minimal counterexample, for every model.

``shrink`` searches for a smaller run that fails *the same way* (the same
violation kind and rule, ``Violation.key``), greedily and to a fixpoint,
replaying every candidate from scratch in full mode (``kvcheck.check.run.replay``):

  1. halve each size of the scope above ``HALVE_ABOVE`` while the run still fails the
     same way (a full-mode step reads the whole pool, so at a large one every later
     replay is slow; where a halved scope fails so, the run is never replayed at the
     whole one); cut everything after the violating step;
  2. delete chunks of operations, halving the chunk size down to one;
  3. the model's own candidates (``Model.shrink_candidates``: e.g. fold an
     append into its sequence's allocation, drop an allocation together with
     the blocks it held, move a request's arrival earlier);
  4. lower each count argument (to 1, the model's hints, half, one less) and
     cut each token list the same way;
  5. lower each size of the scope (``Model.scope_fields``, smallest first),
     as is or with the operations the model adapts to it
     (``Model.scope_variants``);
  6. renumber sequence ids from 0 in order of first use;
  7. breadth-first search (``kvcheck.check.explore``) over every shorter run
     within the trace's own scope (``Model.exploration_scope``); if one fails
     the same way, start again from it.

The result is 1-minimal: no single deletion, model move, lowered count or
lowered size still fails the same way; and when the search completes within
the budget it is a *shortest* run for its scope (``Shrunk.shortest``).

The budget (``Budget``) is counted in work, not time: ``steps``, the operations replayed
in all (each candidate costs its length, BFS its operations run), so the same run shrinks
to the same trace on an idle and on a loaded machine. ``seconds`` is only an outer
wall-clock cap; when it cuts, the trace says so (it is still a real counterexample, only
perhaps longer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvcheck.check.model import COUNT, SEQS, TOKENS, Model, Options, lower
from kvcheck.check.run import Replay, replay
from kvcheck.defaults import SHRINK_SECONDS, SHRINK_STEPS


@dataclass(frozen=True)
class Budget:
    """What shrinking may spend: ``steps`` operations replayed in all (deterministic) and, as
    an outer limit only, ``seconds`` of wall clock."""

    steps: int = SHRINK_STEPS
    seconds: float = SHRINK_SECONDS

    @classmethod
    def of(cls, budget) -> Budget:
        """A ``Budget``; None is the defaults, a number the wall-clock cap alone (callers
        written before the budget was counted in steps)."""
        if budget is None:
            return cls()
        return budget if isinstance(budget, Budget) else cls(seconds=float(budget))


STEPS, SECONDS = "steps", "seconds"  # which limit stopped a shrink (Shrunk.stopped_by)


class _Meter:
    """A shrink's spending against its ``Budget``; ``stopped_by`` once a limit was reached."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.left = budget.steps
        self.deadline = time.monotonic() + budget.seconds
        self.stopped_by = ""

    def live(self) -> bool:
        if self.left <= 0:
            self.stopped_by = self.stopped_by or STEPS
            return False
        if time.monotonic() >= self.deadline:
            self.stopped_by = self.stopped_by or SECONDS
            return False
        return True

    def spend(self, steps: int) -> None:
        self.left -= steps

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass
class Shrunk:
    ops: list
    scope: object
    violation: object
    states: list[dict]
    attempts: int
    shortest: str = ""  # set when BFS showed nothing shorter exists within the scope
    one_minimal: bool = True  # False if the budget ran out before the greedy passes settled
    stopped_by: str = ""  # not one_minimal: the limit reached (STEPS, or SECONDS: the wall)
    steps: int = 0  # operations replayed

    @property
    def num_blocks(self) -> int:  # the block-manager scopes' names, for old callers
        return self.scope.num_blocks

    @property
    def block_size(self) -> int:
        return self.scope.block_size


def renumber(model: Model, ops: list) -> list:
    """``ops`` with sequence ids renumbered from 0 in order of first use."""
    ids: dict[int, int] = {}

    def new(q: int) -> int:
        if q not in ids:
            ids[q] = len(ids)
        return ids[q]

    return [model.spec_of(op).renamed(op, new) for op in ops]


def shrink(model: Model, factory, scope, ops: list, key: tuple, options: Options,
           budget: float | Budget | None = Budget(), progress: Callable[[int, int], None] | None = None,
           replayer: Callable | None = None) -> Shrunk | None:
    """The smallest run failing with the same ``key``; None if ``ops`` does not fail so.

    ``progress(attempts, length)``, if given, is told of every candidate tried and the
    length of the smallest failing run so far (``Model.size``). ``replayer`` replaces
    ``kvcheck.check.run.replay`` (same arguments and result: e.g. each replay in a process
    of its own); with one, no breadth-first search runs (it drives the target here)."""
    meter = _Meter(Budget.of(budget))
    run = replayer or replay
    attempts = 0
    smallest = model.size(ops)

    def fails(cand: list, sc) -> Replay | None:
        nonlocal attempts, smallest
        attempts += 1
        meter.spend(len(cand) + 1)
        try:
            r = run(model, factory, sc, cand, options)
        except Exception:  # noqa: BLE001 - a scope the target refuses is just not smaller
            r = None
        if r is not None and r.violation is not None and r.violation.key == key:
            smallest = min(smallest, model.size(r.ops))
        else:
            r = None
        if progress is not None:
            progress(attempts, smallest)
        return r

    # (a scope halved first: a run failing the same way there shows ``ops`` fails so too,
    # without its replay at the whole scope, the slowest of all; then the run cut to what
    # its last operation depends on (``Model.focus``), kept where it fails the same way)
    cur, sc = _halved(model, fails, ops, scope, meter)
    failing = sc != scope
    focused = model.focus(cur)
    if focused is not None:
        r = fails(focused, sc)
        if r is not None:
            cur, failing = _cut(r.ops, r.violation), True
    if not failing:
        r = fails(ops, scope)
        if r is None:
            return None
        cur = _cut(r.ops, r.violation)
    shortest = ""
    while True:
        cur, sc, settled = _greedy(model, fails, cur, sc, meter)
        if len(cur) <= 1 or not meter.live() or replayer is not None:
            break
        escope = model.exploration_scope(cur, sc)
        if escope is None:
            break
        from kvcheck.check.explore import explore

        found = explore(model, factory, escope, options, budget=meter.seconds_left(), key=key,
                        max_steps=min(meter.left, EXPLORE_STEPS))
        meter.spend(found.steps)
        if found.violation is None:
            if found.complete:
                shortest = f"no shorter trace exists within {escope.describe()}"
            elif found.stopped_by_time:
                meter.stopped_by = meter.stopped_by or SECONDS
            break
        cur = found.ops
    final = run(model, factory, sc, renumber(model, cur), options, record=True)
    if final.violation is None or final.violation.key != key:
        final = run(model, factory, sc, cur, options, record=True)
    return Shrunk(final.ops, sc, final.violation, final.states, attempts, shortest, settled,
                  "" if settled else meter.stopped_by or STEPS,
                  meter.budget.steps - meter.left)


EXPLORE_STEPS = 100_000
"""The most operations one breadth-first search while shrinking may run (a search that
reaches it claims no shortest trace)."""


def budget_ran_out(budget: float | Budget, length: int, unit: str, by: str = SECONDS) -> str:
    """The minimality of a counterexample whose shrinking was stopped by its budget: its
    steps (``--shrink-budget``, the same on any machine) or its wall-clock cap
    (``--shrink-seconds``, said so: on another machine it may have gone further)."""
    budget = Budget.of(budget)
    units = f"{length} {unit}{'' if length == 1 else 's'}, not proven 1-minimal"
    if by == STEPS:
        return f"shrinking stopped at its budget of {budget.steps:,} replayed operations: {units}"
    return (f"shrinking stopped at its {budget.seconds:g} s wall-clock cap (--shrink-seconds): "
            f"{units}")


# A hang is shrunk with at most this per-operation limit, so that each candidate that
# still hangs costs this long, not the run's whole timeout: a hang costs one full timeout.
HANG_SHRINK_TIMEOUT = 1.0


def counterexample(model: Model, label: str, factory, scope, history: list, v, seed,
                   options: Options, do_shrink: bool = True, budget: float | Budget | None = Budget(),
                   progress: Callable[[int, int], None] | None = None, unit: str = "operation",
                   replayer: Callable | None = None):
    """A replayable trace (``kvcheck.check.trace.Trace``) for violation ``v`` found after
    ``history``: shrunk if asked, else replayed as found. Shrinking replays in full mode;
    where that names the violation otherwise than the run did (a fast mode sees less of
    the state at each step), it shrinks what the full mode found.

    A hang is replayed with a per-operation limit of at most ``HANG_SHRINK_TIMEOUT``
    (the trace says so): the run already paid one full timeout to find it. ``replayer``:
    see ``shrink`` (every replay made here goes through it)."""
    import dataclasses

    from kvcheck.check.trace import Trace
    from kvcheck.check.watchdog import Watchdog

    run = replayer or replay
    note = ""
    if v.kind == "hang" and options.timeout and options.timeout > HANG_SHRINK_TIMEOUT:
        options = dataclasses.replace(options, timeout=HANG_SHRINK_TIMEOUT)
        note = (f"; replayed with a {HANG_SHRINK_TIMEOUT:g} s limit per operation, shorter than "
                f"the run's, so that every replay that still hangs costs only that")
    sj = model.scope_json(scope)
    extra = {k: x for k, x in sj.items() if k not in ("num_blocks", "block_size")}

    def trace(ops, sc, violation, states, how):
        j = model.scope_json(sc)
        return Trace(label, j["num_blocks"], j["block_size"], ops, violation, seed, states,
                     how + note, model=model.name, extra=extra | {
                         k: x for k, x in j.items() if k not in ("num_blocks", "block_size")})

    with Watchdog(options.timeout):  # for the steps the shrinker's search runs without one
        if do_shrink:
            s = shrink(model, factory, scope, history, v.key, options, budget, progress, replayer)
            if s is None:  # a fast mode's finding the full mode names otherwise (it sees more)
                full = run(model, factory, scope, history, options).violation
                if full is not None and full.key != v.key:
                    s = shrink(model, factory, scope, history, full.key, options, budget, progress,
                               replayer)
            if s is not None:
                how = ("1-minimal: removing any one operation or lowering any size stops it "
                       "failing" if s.one_minimal else budget_ran_out(budget, model.size(s.ops),
                                                                       unit, s.stopped_by))
                if s.shortest:
                    how += f"; shortest: {s.shortest}"
                return trace(s.ops, s.scope, s.violation, s.states, how)
        r = run(model, factory, scope, history, options, record=True)
    if r.violation is not None:
        return trace(r.ops, scope, r.violation, r.states, "not shrunk")
    # Found only by the fast mode's sweep and not reproducible in full mode: keep it as found.
    return trace(history, scope, v, [], "not shrunk (fast mode only)")


def _cut(ops: list, violation) -> list:
    """The operations up to the violating step (the rest cannot matter)."""
    step = getattr(violation, "step", 0) or len(ops)
    return ops[:step] if 0 < step <= len(ops) else ops


def _requests(model: Model, ops: list) -> list:
    """``ops`` as the requests they are (arguments only), to compare runs."""
    return [model.op_to_json(model.request(o)) for o in ops]


HALVE_ABOVE = 64
"""A scope size above this is first halved, again and again while the run still fails the
same way, before the greedy passes (which try every smaller size later, smallest first,
on the shrunk run: the result is as minimal). At most this, a run is shrunk at its own
scope from the start (``kvcheck verify``'s default pool is 32 blocks)."""


def _fails_at(model: Model, replays_failing, cur: list, sc, new):
    """``cur`` (of scope ``sc``) replayed at the smaller scope ``new``, as is or as the
    model adapts it (``Model.scope_variants``): the first run failing the same way, or
    None."""
    for cand in (cur, *model.scope_variants(cur, sc, new)):
        got = replays_failing(cand, new)
        if got is not None:
            return got
    return None


def _halved(model: Model, replays_failing, cur: list, sc, meter: _Meter):
    """Pass 1's halving: each scope size above ``HALVE_ABOVE`` halved while ``cur`` fails
    the same way there (``_fails_at``); the run that failed last, cut after its violation,
    and its scope (``sc`` itself and ``cur`` as given where no halving failed so)."""
    for f in model.scope_fields:
        value = getattr(sc, f.name)
        while value > HALVE_ABOVE and meter.live():
            new = lower(sc, f.name, max(f.low, value // 2))
            got = _fails_at(model, replays_failing, cur, sc, new)
            if got is None:
                break
            cur, sc, value = _cut(got.ops, got.violation), new, getattr(new, f.name)
    return cur, sc


def _greedy(model: Model, replays_failing, cur: list, sc, meter: _Meter):
    """Passes 2-5 to a fixpoint; ``settled`` is False if the budget stopped them first.

    A candidate counts only if the run it replays to differs from the current one: a model
    whose run state ends a run with operations of its own (``implied``: e.g. a scheduler
    draining its workload) may replay a deletion back to the very same run."""
    live = meter.live

    def same(got, csc) -> bool:
        return csc == sc and _requests(model, got.ops) == _requests(model, cur)

    def fails(cand: list, csc):
        got = replays_failing(cand, csc)
        return None if got is None or same(got, csc) else got

    changed = True
    while changed and live():
        changed = False
        # 2. delete chunks: of the model's groups first (``Model.shrink_groups``), then of
        # operations
        groups = model.shrink_groups(cur)
        size = max(1, len(groups) // 2) if groups else 0
        while groups and size >= 1 and live():
            i = 0
            while i < len(groups) and live():
                drop = {k for g in groups[i:i + size] for k in g}
                got = fails([o for k, o in enumerate(cur) if k not in drop], sc)
                if got is not None:
                    cur, changed = got.ops, True
                    groups = model.shrink_groups(cur) or []
                else:
                    i += size
            size //= 2
        size = max(1, len(cur) // 2)
        while size >= 1 and live():
            i = 0
            while i < len(cur) and live():
                got = fails(cur[:i] + cur[i + size:], sc)
                if got is not None:
                    cur, changed = got.ops, True
                else:
                    i += size
            size //= 2
        # 3. the model's own moves (first success taken, then looked at again)
        moved = True
        while moved and live():
            moved = False
            for cand, csc in model.shrink_candidates(cur, sc):
                if not live():
                    break
                got = fails(cand, csc)
                if got is not None:
                    cur, sc, changed, moved = got.ops, csc, True, True
                    break
        # 4. lower counts and cut token lists
        for i in range(len(cur)):
            if not live() or i >= len(cur):
                break
            for cand in _lowered(model, cur, i, sc):
                got = fails(cand, sc)
                if got is not None:
                    cur, changed = got.ops, True
                    break
        # 5. lower each size of the scope, smallest first
        for f in model.scope_fields:
            value = getattr(sc, f.name)
            for smaller in range(f.low, value):
                if not live():
                    break
                new = lower(sc, f.name, smaller)
                got = _fails_at(model, fails, cur, sc, new)
                if got is not None:
                    cur, sc, changed = got.ops, new, True
                    break
    return cur, sc, not changed and live()


def _lowered(model: Model, ops: list, i: int, sc):
    """Candidates with one count of operation ``i`` lowered, or one token list cut."""
    op = ops[i]
    spec = model.spec_of(op)
    hints = model.count_hints(sc)
    for a in spec.args:
        if a.role == COUNT:
            n = getattr(op, a.name)
            for m in sorted({a.low, *hints, n // 2, n - 1}):
                if a.low <= m < n:
                    cand = [model.request(o) for o in ops]
                    setattr(cand[i], a.name, m)
                    yield cand
        elif a.role == TOKENS:
            toks = list(getattr(op, a.name))
            n = len(toks)
            for m in sorted({1, *hints, n - max(hints or (1,)), n // 2, n - 1}):
                if 1 <= m < n:
                    cand = [model.request(o) for o in ops]
                    cand[i] = spec.make(op.kind, **{
                        x.name: (toks[:m] if x is a else getattr(cand[i], x.name))
                        for x in spec.args})
                    yield cand
        elif a.role == SEQS:
            qs = list(getattr(op, a.name))
            for j in range(len(qs)) if len(qs) > 1 else ():
                cand = [model.request(o) for o in ops]
                setattr(cand[i], a.name, qs[:j] + qs[j + 1:])
                yield cand

