"""The Python API for checking a target: ``verify``, ``make_state_machine``, ``counterexample``.

``verify`` drives a target with its model's seeded random driver under the
model's oracle (``kvcheck.check.run.drive``) and, on a violation, shrinks it
to a minimal replayable trace (``kvcheck.check.shrink.counterexample``).
``make_state_machine`` gives the same checks as a Hypothesis state machine.
Both work for every model; the defaults are the block manager's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from kvcheck.check import shrink as _shrink
from kvcheck.check.model import Options, model_named
from kvcheck.check.run import drive
from kvcheck.check.shrink import HANG_SHRINK_TIMEOUT
from kvcheck.check.trace import Trace
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.blocks.model import MODEL as BLOCKS
from kvcheck.models.blocks.model import BlockScope
from kvcheck.targets.loading import TargetError, resolve

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

    from kvcheck.check.model import Model
    from kvcheck.check.run import Replay

__all__ = ["HANG_SHRINK_TIMEOUT", "Op", "Result", "counterexample", "make_state_machine", "replay_ops",
           "replay_trace", "verify"]

TargetSpec: TypeAlias = str | Callable[..., object]
"""What ``verify`` accepts as TARGET: a registered name, ``module:attr``, ``file.py:attr``, or
a factory (``factory(num_blocks, block_size)``: a ``Target`` or a seed-shaped allocator)."""


@dataclass
class Result:
    verdict: str  # "pass" | "fail"
    ops: int  # operations run
    seconds: float
    violation: Violation | None
    trace: Trace | None  # the (shrunk) counterexample
    original_length: int = 0  # operations up to the violation, before shrinking
    state: object = None  # the model's run state at the end (statistics, coverage)
    deviations: list[Any] = field(default_factory=list)  # allowed ones (``allow``), in order
    refused: int = 0  # operations the target refused under its declared policy (all checked)
    # operation -> {outcome: how many} (run as drawn)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "ops": self.ops,
            "seconds": round(self.seconds, 3),
            "violation": None if self.trace is None else self.trace.to_json(),
            "original_length": self.original_length,
            "deviations": deviation_summary(self.deviations),
            "refused": self.refused,
            "operations": {k: dict(v) for k, v in self.counts.items()},
        }


def deviation_summary(deviations: list[Any]) -> dict[str, Any]:
    """Allowed deviations per clause: how many, and the first (its step and operation)."""
    out: dict[str, Any] = {}
    for d in deviations:
        entry = out.setdefault(d.clause, {"count": 0, "first": d.to_json()})
        entry["count"] += 1
    return out


def verify(target: TargetSpec = "reference", num_blocks: int = 32, block_size: int = 4,
           ops: int = 10_000, seed: int = 0, out_of_blocks: type[BaseException] | None = None,
           timeout: float | None = 10.0,
           mode: str = "fast", do_shrink: bool = True,
           shrink_budget: float | _shrink.Budget | None = None,
           progress: Callable[[int], None] | None = None, compiled: bool = True,
           shrink_progress: Callable[[int, int], None] | None = None, model: str = "blocks",
           scope: Any = None, extra: dict[str, Any] | None = None,
           deadline: float | None = None, allow: frozenset[str] = frozenset()) -> Result:
    """Check ``target`` for ``ops`` random operations. Raises ``TargetError`` on bad input.

    ``compiled=False`` evaluates the spec itself for every operation instead of
    its compiled form (same verdicts, slower; for comparison). ``progress(done)`` is told
    of the operations run, ``shrink_progress(attempts, length)`` of the shrinking.
    ``model`` names another model (its ``scope`` defaults to the pool given). ``allow``:
    clauses whose violations are documented deviations of the target, counted in
    ``Result.deviations`` and checked past (``kvcheck.check.run.allowed``)."""
    if mode not in ("fast", "full"):
        raise ValueError(f"mode must be 'fast' or 'full', not {mode!r}")
    m = BLOCKS if model == "blocks" else model_named(model)
    scope = scope or (BlockScope(num_blocks, block_size) if m is BLOCKS
                      else m.scope_from_json({"num_blocks": num_blocks, "block_size": block_size}))
    options = Options(mode=mode, timeout=timeout, out_of_blocks=out_of_blocks, compiled=compiled,
                      seed=seed, extra=dict(extra or {}), allow=frozenset(allow))
    start = time.perf_counter()
    with Watchdog(timeout):  # importing the target is target code too
        label, factory = m.resolve(target) or resolve(target)
    run = drive(m, factory, scope, options, seed, ops, progress, deadline)
    if run.violation is None and not run.history:  # nothing ran: nothing was checked
        raise TargetError(f"no operation ran on {label} ({ops} requested): nothing was checked")
    if run.violation is None:
        return Result("pass", run.steps, time.perf_counter() - start, None, None,
                      state=run.state, deviations=run.deviations, refused=_refused(run.history),
                      counts=operation_counts(run.history))
    trace = _shrink.counterexample(m, label, factory, scope, run.history, run.violation, seed,
                                   options, do_shrink, shrink_budget, shrink_progress)
    if options.allow:  # a replay allows what this run allowed (one name per line)
        trace.settings["allow"] = "\n".join(sorted(options.allow))
    return Result("fail", run.steps, time.perf_counter() - start, trace.violation, trace,
                  len(run.history), run.state, run.deviations, _refused(run.history),
                  operation_counts(run.history))


def operation_counts(history: list[Any]) -> dict[str, dict[str, int]]:
    """How many of each operation the run made, by outcome (``ok``, ``oob``, ``refused``;
    an operation the run stopped at counts as it ended), in the order first made."""
    out: dict[str, dict[str, int]] = {}
    for op in history:
        by = out.setdefault(op.kind, {})
        outcome = str(getattr(op, "outcome", None) or "ok")
        by[outcome] = by.get(outcome, 0) + 1
    return out


def _refused(history: list[Any]) -> int:
    return sum(1 for op in history if getattr(op, "outcome", None) == "refused")


def counterexample(label: str, factory: Callable[..., object], num_blocks: int, block_size: int,
                   history: list[Any], v: Violation, seed: int | None,
                   out_of_blocks: type[BaseException] | None = None,
                   timeout: float | None = 10.0, do_shrink: bool = True,
                   budget: float | _shrink.Budget | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Trace:
    """A replayable block-manager trace for violation ``v`` found after ``history``;
    shrunk if asked (see ``kvcheck.check.shrink.counterexample``)."""
    trace: Trace = _shrink.counterexample(BLOCKS, label, factory,
                                          BlockScope(num_blocks, block_size), history, v, seed,
                                          Options(timeout=timeout, out_of_blocks=out_of_blocks),
                                          do_shrink, budget, progress)
    return trace


def make_state_machine(factory: TargetSpec, num_blocks: int = 8, block_size: int = 4,
                       out_of_blocks: type[BaseException] | None = None,
                       mode: str = "full", max_tokens: int | None = None,
                       timeout: float | None = 10.0,
                       model: str = "blocks") -> type[RuleBasedStateMachine]:
    """A Hypothesis ``RuleBasedStateMachine`` class driving ``factory(num_blocks, block_size)``.

    ``factory`` is anything ``kvcheck verify`` accepts as TARGET (a callable, a registered
    name, ``module:attr``). ``out_of_blocks`` is the exception class signalling
    out-of-blocks (default: any exception named ``OutOfBlocks``). ``mode`` is the
    oracle's ("full" checks whole states each step; "fast" checks what each step
    touched and sweeps at teardown). Drop it into a pytest file::

        TestMine = make_state_machine(MyAllocator, num_blocks=8, block_size=4).TestCase
    """
    from kvcheck.check.stateful import machine
    from kvcheck.report.text import render

    if mode not in ("fast", "full"):
        raise ValueError(f"mode must be 'fast' or 'full', not {mode!r}")
    m = BLOCKS if model == "blocks" else model_named(model)
    scope = BlockScope(num_blocks, block_size) if m is BLOCKS else m.scope_from_json(
        {"num_blocks": num_blocks, "block_size": block_size})
    options = Options(mode=mode, timeout=timeout, out_of_blocks=out_of_blocks)
    with Watchdog(timeout):
        label, fac = m.resolve(factory) or resolve(factory)
        probe = m.build(fac, scope, options)  # fails early on bad input
    bounds = {"n_tokens": max_tokens or 3 * block_size, "tokens": max_tokens or 3 * block_size}

    shrunk: dict[Any, Trace] = {}  # violation key -> kvcheck's shrunk trace (once per broken rule)

    def explain(history: list[Any], v: Violation) -> str:
        head = f"{v.kind} violation at step {v.step}: {v.name}"
        if v.element is not None:
            head += f" (element {v.element})"
        head += f"\n  {v.witness}"
        try:
            trace = shrunk.get(v.key)
            if trace is None:  # kvcheck's shrinker, as verify's: the same minimal trace
                trace = shrunk[v.key] = _shrink.counterexample(
                    m, label, fac, scope, history, v, None, options, do_shrink=True)
            return (head + f"\n\nkvcheck shrank a run breaking this rule ({len(history)} "
                    f"operations) to:\n" + render(trace))
        except Exception as exc:  # noqa: BLE001 - the witness alone still says what broke
            return head + f"\n(could not render the trace: {type(exc).__name__}: {exc})"

    return machine(m, label, fac, scope, options, probe.capabilities, bounds, explain)


@dataclass(frozen=True)
class Op:
    """A request of any model, as a reproducer writes it: ``Op('allocate', seq=0, n_tokens=3)``
    (``replay_ops`` turns it into the model's own operation)."""

    kind: str
    args: dict[str, Any]

    def __init__(self, kind: str, **args: Any) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "args", args)


def replay_ops(model: str | Model, target: TargetSpec, scope: dict[str, Any], ops: list[Any],
               timeout: float | None = 10.0, out_of_blocks: type[BaseException] | None = None,
               extra: dict[str, Any] | None = None) -> Replay:
    """Replay the requests ``ops`` of ``model`` (a model or its name; each an operation of
    the model or an ``Op``) on ``target`` (a TARGET string or a factory) at ``scope`` (the
    trace's scope as JSON), in full mode: the ``kvcheck.check.run.Replay`` (its
    ``violation`` is None when every check held)."""
    from kvcheck.check.run import replay

    m = model_named(model) if isinstance(model, str) else model
    ops = [m.make_op(o.kind, **o.args) if isinstance(o, Op) else o for o in ops]
    with Watchdog(timeout):
        _, factory = m.resolve(target) or resolve(target)
    extra = dict(extra or {})
    allow = frozenset(n for n in extra.pop("allow", "").split("\n") if n)
    options = Options(mode="full", timeout=timeout, out_of_blocks=out_of_blocks, extra=extra,
                      allow=allow)
    return replay(m, factory, m.scope_from_json(scope), ops, options, record=True)


def replay_trace(trace: Trace, target: TargetSpec | None = None, timeout: float | None = 10.0,
                 out_of_blocks: type[BaseException] | None = None,
                 extra: dict[str, Any] | None = None) -> Replay:
    """Replay a loaded trace's operations on ``target`` (default: the recorded one)."""
    return replay_ops(trace.model, target or trace.loadable_target(), trace.scope_json(),
                      trace.ops, timeout, out_of_blocks, {**trace.settings, **(extra or {})})
