"""Driving a target, and replaying operations on a fresh one: the same loop for every model.

``drive`` asks the model's driver for operations, checks each through the
model's run state (``Model.start``), stops at the first violation and ends
with the model's sweep. ``replay`` re-runs a list of requests on a fresh
target in full mode, skipping any whose precondition no longer holds (so
deleting an allocation silently drops the operations on its sequence): the
shrinker's and ``kvcheck replay``'s only way of running anything.

Everything happens inside one watchdog session (``kvcheck.check.watchdog``):
importing and building the target, every step, every observation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvcheck.check.model import Model, Options
from kvcheck.check.watchdog import Watchdog


@dataclass
class Drive:
    """One driven run: its violation (or None), the operations as run, and figures."""

    violation: object | None
    history: list
    steps: int
    seconds: float
    state: object = None  # the model's run state at the end (statistics, coverage)
    deviations: list = field(default_factory=list)  # allowed ones (see ``allowed``)


def drive(model: Model, factory, scope, options: Options, seed: int, ops: int,
          progress: Callable[[int], None] | None = None, deadline: float | None = None) -> Drive:
    """Check ``ops`` operations drawn by the model's seeded driver (fewer if the driver
    ends its workload, or at ``deadline`` by ``time.monotonic()``).

    ``options.extra["watch"]``, if given, is called with the run state once it has started
    (before the first operation; drive only, never a replay): e.g. a campaign counting
    outcome classes."""
    start = time.perf_counter()
    with Watchdog(options.timeout) as wd:
        target = model.build(factory, scope, options)
        state = model.start(target, scope, options)
        watch = options.extra.get("watch")
        if watch is not None:
            watch(state)
        driver = model.driver(seed, scope, target, options)
        history: list = []
        deviations: list = []
        v = state.violation
        next_op, valid, step = driver.next_op, state.valid, state.step
        allow = options.allow
        for i in range(ops):
            if v is not None:
                break
            op = next_op(state)
            if op is None:
                break
            if not valid(op):
                continue
            history.append(op)
            v = step(op, wd)
            if v is not None and allow:
                v = allowed(model, state, op, v, allow, len(history), deviations)
            if i % 1024 == 0:
                if progress is not None:
                    progress(i)
                if deadline is not None and time.monotonic() > deadline:
                    break
        if v is None:
            v = state.sweep(wd)
    return Drive(v, history, state.steps, time.perf_counter() - start, state, deviations)


@dataclass
class Deviation:
    """A violation of a clause the user allows (``Options.allow``): what and where."""

    step: int  # 1-based, in the run's operations
    clause: str
    operation: str

    def to_json(self) -> dict:
        return {"step": self.step, "clause": self.clause, "operation": self.operation}


def matches(v, allow: frozenset) -> bool:
    """Whether violation ``v`` is of an allowed clause: its full name (``fork: child is
    live with the source's length``), the clause alone, or an invariant's name."""
    name = v.name
    return name in allow or name.split(": ", 1)[-1] in allow


def allowed(model: Model, state, op, v, allow: frozenset, step: int, into: list | None):
    """``v`` if it must stop the run; None when it is an allowed deviation the run state
    could resynchronise past (``state.resync``: take what the target did as the new
    state), recorded in ``into``."""
    resync = getattr(state, "resync", None)
    if v.kind not in ("contract", "invariant") or not matches(v, allow) or resync is None:
        return v
    if not resync(op):
        return v
    if into is not None:
        into.append(Deviation(step, v.name, model.describe(op)))
    return None


@dataclass
class Replay:
    violation: object | None
    ops: list  # the operations actually run, with their outcomes
    states: list[dict] = field(default_factory=list)  # observed after each
    implied: int = 0  # of ``ops``, the last ones the model ran itself to end the run


def replay(model: Model, factory, scope, ops, options: Options, record: bool = False) -> Replay:
    """Run the requests ``ops`` on a fresh target, checked in full mode."""
    options = options.full()
    with Watchdog(options.timeout) as wd:
        target = model.build(factory, scope, options)
        state = model.start(target, scope, options)
        ran: list = []
        states: list[dict] = []
        if state.violation is not None:
            return Replay(state.violation, ran, states)
        for req in ops:
            op = model.request(req)
            if not state.valid(op):
                continue
            v = state.step(op, wd)
            ran.append(op)
            if v is not None and options.allow:
                v = allowed(model, state, op, v, options.allow, len(ran), None)
            if record:
                states.append(state.observed_json())
            if v is not None:
                return Replay(v, ran, states)
        v = state.sweep(wd)
        extra = getattr(state, "implied", None)  # operations the model ran to end the run
        if extra:
            ran.extend(extra)
            if record:
                states.extend(getattr(state, "implied_states", []))
        return Replay(v, ran, states, len(extra or ()))
