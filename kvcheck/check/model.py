"""What a model is: the one interface between the checker and a domain.

kvcheck checks several kinds of component (a block manager, a prefix cache, a
scheduler, a device-backed store) with one checker (``kvcheck.check``). A
*model* binds the spec's text (``kvcheck.spec``) to targets of one kind; it
never restates the spec. It says

* which **operations** there are, as data: ``OpSpec`` (name, arguments and
  their roles, recorded results, the spec contract's docstring), so that the
  checker can draw, copy, serialise, renumber and shrink operations without
  knowing what they mean;
* how to **build** a target from a factory and a scope, and how to start a
  **run** on it: ``Model.start`` returns the model's per-run checker state
  (its ``Oracle``: observation, ghost and shadow state, the step check),
  which speaks ``RunState`` below;
* how to **drive** it (``driver``: the seeded random workload), **explore**
  it (``moves``, ``canonical``) and **shrink** it (``scope_fields``,
  ``shrink_candidates``, ``exploration_scope``);
* how to **show** it (``describe``, ``state_line``).

Written like Porcupine's ``Model{Init, Step}`` and Hypothesis' rule-based
machines: the checker is generic, a model is data plus a few functions.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kvcheck.check import watchdog as watchdog_module

# Roles of an operation's arguments: what the checker may do with them.
SEQ = "seq"  # a live sequence id (renumbered; drawn from the live ones)
NEW_SEQ = "new_seq"  # a fresh sequence id (renumbered; drawn fresh)
COUNT = "count"  # a positive count (lowered by the shrinker)
TOKENS = "tokens"  # a list of token ids (truncated by the shrinker; its length is a count)
SEQS = "seqs"  # a list of live sequence ids (shortened by the shrinker; renumbered)
BLOCK = "block"  # a block id (results: where evidence tags a block)
VALUE = "value"  # anything else: copied, never changed
ROLES = (SEQ, NEW_SEQ, COUNT, TOKENS, SEQS, BLOCK, VALUE)


@dataclass(frozen=True)
class Arg:
    """One argument of an operation: the attribute holding it, its role, its name in a
    trace (``key``, default the attribute's name) and the least value a count may take.

    ``schema``, for a ``VALUE`` that is not a scalar (e.g. a list of per-sequence
    results), is the JSON Schema a trace holds it to (default: the role's)."""

    name: str
    role: str
    key: str | None = None
    low: int = 1
    schema: dict | None = dataclasses.field(default=None, compare=False)
    optional: bool = False  # may be left out of a trace (None then; written only when set)

    def __post_init__(self):
        assert self.role in ROLES, self.role

    @property
    def json_key(self) -> str:
        return self.key or self.name


@dataclass(frozen=True)
class OpSpec:
    """One operation of a model, as data.

    ``make(kind, **args)`` builds a request; the target is called as
    ``target.<kind>(*args)`` (``call``); ``results`` are the attributes a successful call
    fills in (recorded in traces), with their roles; ``doc`` is the wording of its
    contract, taken from the spec."""

    kind: str
    make: Callable[..., Any]
    args: tuple[Arg, ...] = ()
    results: tuple[Arg, ...] = ()
    doc: str = ""

    def call(self, target, op):
        """Run ``op`` on ``target``: its method named ``kind``, with the arguments in the
        table's order (``fork(parent, child)``, ``allocate(seq, n_tokens)``). Its result."""
        return getattr(target, self.kind)(*[getattr(op, a.name) for a in self.args])

    def caller(self):
        """``call`` specialised for this operation (the oracle's hot path)."""
        kind, names = self.kind, tuple(a.name for a in self.args)
        if len(names) == 1:
            (a,) = names
            return lambda target, op: getattr(target, kind)(getattr(op, a))
        if len(names) == 2:
            a, b = names
            return lambda target, op: getattr(target, kind)(getattr(op, a), getattr(op, b))
        return self.call

    def request(self, op):
        """A fresh copy of ``op``'s call, without any outcome."""
        return self.make(self.kind, **{a.name: copy.copy(getattr(op, a.name)) for a in self.args})

    def renamed(self, op, rename: Callable[[int], int]):
        """The call with every sequence id passed through ``rename``."""
        args = {}
        for a in self.args:
            v = getattr(op, a.name)
            if a.role in (SEQ, NEW_SEQ):
                v = rename(v)
            elif a.role == SEQS:
                v = [rename(q) for q in v]
            else:
                v = copy.copy(v)
            args[a.name] = v
        return self.make(self.kind, **args)


class RunState(Protocol):
    """What a model's per-run checker state (its oracle) offers the checker."""

    violation: Any  # kvcheck.check.violation.Violation | None
    steps: int  # operations checked

    def valid(self, op) -> bool:
        """Whether ``op`` meets its precondition now and the target supports it."""

    def step(self, op, watchdog=None):
        """Run ``op`` on the target and check it: the violation, or None. Fills in
        the outcome and results of ``op``."""

    def sweep(self, watchdog=None):
        """Audit everything the per-step checks did not (fast mode), and what must
        hold at the end of a run: the violation, or None."""

    def clone(self):
        """An independent copy, the target included (exploration)."""

    def observed_json(self) -> dict:
        """The state observed after the last step, as JSON (for traces)."""


def recorded_step(state: Any, op, watchdog, check: Callable[[Any, Any], Any]):
    """``RunState.step`` for an oracle whose ``valid`` is its operations' precondition (the
    scheduler's and the engine's): the run's violation again once there is one;
    ``ValueError`` for an ``op`` not valid now; else ``recorded``."""
    if state.violation is not None:
        return state.violation
    if not state.valid(op):
        raise ValueError(f"{op.kind} is not valid now: {op}")
    return recorded(state, op, watchdog, check)


def recorded(state: Any, op, watchdog, check: Callable[[Any, Any], Any]):
    """The rest of ``RunState.step`` once ``op`` met its precondition: the operation counted
    (``state.steps``: the number ``check`` reads as its step's), ``check(op, watchdog)``
    (the violation or None) under ``watchdog`` (default: the active one, also what
    ``check`` gets), the operation and its outcome given to the run's recorder
    (``kvcheck.check.watchdog.RECORDER``), and the violation kept as the run's."""
    state.steps += 1
    if watchdog is None:
        watchdog = watchdog_module.active_watchdog()
    recorder = watchdog_module.RECORDER
    if recorder is not None:
        recorder.op(op)
    if watchdog is not None:
        watchdog.enter()
    try:
        v = check(op, watchdog)
    finally:
        if watchdog is not None:
            watchdog.leave()
    if recorder is not None:
        recorder.outcome(op, v)
    state.violation = v
    return v


@dataclass(frozen=True)
class ScopeField:
    """A size a shrinker may lower (``low`` the least), in the scope's dataclass."""

    name: str
    low: int = 1


class Model:
    """Base class of the models: defaults for what most need; see the module doc."""

    name = "model"
    title = "a model"
    ops: dict[str, OpSpec] = {}
    scope_fields: tuple[ScopeField, ...] = ()

    # -- operations -------------------------------------------------------------
    def make_op(self, kind: str, **args):
        """A request for operation ``kind`` (``KeyError`` for a kind the model lacks)."""
        return self.ops[kind].make(kind, **args)

    def spec_of(self, op) -> OpSpec:
        return self.ops[op.kind]

    def request(self, op):
        return self.spec_of(op).request(op)

    def describe(self, op) -> str:
        spec = self.spec_of(op)
        args = ", ".join(f"{a.json_key}={getattr(op, a.name)!r}" for a in spec.args)
        return f"{op.kind}({args})"

    def op_to_json(self, op) -> dict:
        spec = self.spec_of(op)
        d: dict = {"op": op.kind}
        for a in spec.args:
            v = getattr(op, a.name)
            if a.optional and v is None:
                continue
            d[a.json_key] = list(v) if a.role in (TOKENS, SEQS) else v
        result: dict = {"outcome": op.outcome}
        got = [(r, getattr(op, r.name, None)) for r in spec.results]
        if op.outcome == "ok" and any(v is not None for _, v in got):
            for r, v in got:
                result[r.json_key] = list(v) if isinstance(v, (list, tuple)) else v
        d["result"] = result
        return d

    def op_from_json(self, d: dict):
        spec = self.ops[d["op"]]
        op = spec.make(d["op"], **{a.name: _value(a, d[a.json_key]) for a in spec.args
                                   if not a.optional or a.json_key in d})
        result = d.get("result", {"outcome": "ok"})
        op.outcome = result.get("outcome", "ok")
        for r in spec.results:
            if r.json_key in result:
                setattr(op, r.name, result[r.json_key])
        return op

    def check_op_json(self, d: dict, where: str) -> None:
        """What a trace's operation must satisfy beyond its schema (raise ``TraceError``)."""

    def check_state_json(self, state: dict, scope, where: str) -> None:
        """Likewise for a recorded state."""

    def history_error(self, ops: list, scope) -> tuple[int, str] | None:
        """The first of a trace's operations that could not have run where the trace puts
        it, as far as the operations before it and their recorded outcomes decide (its
        precondition fails in the trace's own history: a sequence no earlier operation
        created), with why; None if every one could. A trace is a run that happened: such a
        trace was edited, and is refused (``kvcheck.check.trace``). The default knows no
        history."""
        return None

    outcomes: tuple[str, ...] = ("ok", "oob")  # the outcomes an operation may have
    state_schema: dict = {"type": "object", "maxProperties": 64}  # a recorded state

    # -- runs ---------------------------------------------------------------------
    def resolve(self, spec) -> tuple[str, Any] | None:
        """``(label, factory)`` for a TARGET of this model (a registered name, module:attr,
        file.py:attr or a callable); None: the allocators' loader
        (``kvcheck.targets.loading.resolve``) finds it."""
        return None

    def build(self, factory, scope, options):
        raise NotImplementedError

    def start(self, target, scope, options):
        raise NotImplementedError

    def driver(self, seed: int, scope, target, options):
        raise NotImplementedError

    # -- exploration and shrinking -------------------------------------------------
    def moves(self, state, scope) -> list:
        """Every operation worth trying next from ``state`` (bounded exploration)."""
        return []

    def canonical(self, state) -> Any:
        """A key equal for states equal up to renaming (exploration's dedup)."""
        return id(state)

    def shrink_candidates(self, ops: list, scope) -> Iterable[tuple[list, Any]]:
        """Model-specific smaller candidates beyond the checker's generic ones."""
        return ()

    def shrink_groups(self, ops: list) -> list[list[int]] | None:
        """The run's operations in groups that stand or fall together (e.g. a request's
        every operation), each a list of indices: the shrinker deletes whole groups, in
        halves, then quarters ..., before single operations (a long random run whose
        failure needs a few requests spread across it loses the rest quickly, where
        deleting contiguous chunks would cut through those few). None (the default):
        operations only."""
        return None

    def focus(self, ops: list) -> list | None:
        """A failing run cut down to what its last operation can depend on, tried once
        before the greedy passes (a long random run shrinks in one replay where it fails
        the same way); None: no such cut (the default)."""
        return None

    def scope_variants(self, ops: list, scope, smaller) -> Iterable[list]:
        """Besides ``ops`` as they are, the operations adapted to the smaller scope
        ``smaller`` (e.g. prompts scaled down with the block size)."""
        return ()

    def exploration_scope(self, ops: list, scope):
        """The trace's own scope for a breadth-first search of shorter traces, or None."""
        return None

    def size(self, ops: list) -> int:
        """How long a run is in the model's own unit (what ``counterexample``'s ``unit``
        names, e.g. a scheduler's requests): its operations, by default."""
        return len(ops)

    def count_hints(self, scope) -> tuple[int, ...]:
        """Values worth trying when lowering a count (beyond 1, half and one less)."""
        return ()

    # -- showing ------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        """One recorded state, in one line."""
        return ", ".join(f"{k}: {v}" for k, v in state.items())

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        """What ``op`` did, in words, from the recorded states around it (either may be None)."""
        return f"{op.kind}: {op.outcome}"

    def initial_state_json(self, scope) -> dict | None:
        """The state before the first operation, as a trace would record it (None: unknown)."""
        return None

    def pool_of(self, state: dict) -> dict | None:
        """The pool in a recorded state, to draw (``tables``, ``lens``, ``refs``, ``free``):
        None if the state has none."""
        return state if isinstance(state, dict) and "refs" in state and "tables" in state else None

    def scope_words(self, scope) -> str:
        """What the scope holds beyond the pool, for a title (``, watermark 1``)."""
        return ""

    def scope_json(self, scope) -> dict:
        return dataclasses.asdict(scope)

    def scope_from_json(self, data: dict):
        raise NotImplementedError

    def legacy_trace(self, data: dict) -> dict | None:
        """A trace in this model's own format from before version 2 (``"format":
        "kvcheck.<model>-trace"``) as a version 2 trace's JSON, or None if the model never
        had one; raise ``TraceError`` for one it cannot read."""
        return None


def _value(arg: Arg, v):
    return list(v) if arg.role in (TOKENS, SEQS) else v


def lower(scope, name: str, value: int):
    """``scope`` with field ``name`` set to ``value``."""
    return dataclasses.replace(scope, **{name: value})


@dataclass
class Options:
    """How a run checks, for every model: ``mode`` "fast" (what each step touched,
    audited in sweeps) or "full" (everything after every step: replay and shrinking);
    ``timeout`` seconds per call into the target; ``out_of_blocks`` the exception class
    that signals it (None: the target's own test); ``compiled`` checks with the spec
    compiled from its text (False: the spec evaluated directly, for comparison);
    ``extra`` what a model alone reads (e.g. the scheduler's block manager)."""

    mode: str = "fast"
    timeout: float | None = 10.0
    out_of_blocks: type[BaseException] | None = None
    compiled: bool = True
    seed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)
    # clauses whose violation is a documented, deliberate deviation of the target: counted
    # and reported, the run resynchronised to what the target did and checked on
    allow: frozenset = frozenset()

    def full(self) -> Options:
        return dataclasses.replace(self, mode="full")


MODELS: dict[str, Model] = {}


def register(model: Model) -> Model:
    """Make ``model`` known by its name (traces name their model)."""
    MODELS[model.name] = model
    return model


def model_named(name: str) -> Model:
    """The model called ``name``; ``KeyError`` if there is none. The checker knows the
    models only by name: ``kvcheck.models.<name>`` registers itself when imported."""
    if name not in MODELS:
        import importlib
        import re

        if not re.fullmatch(r"[a-z][a-z_]{0,31}", name):
            raise KeyError(name)
        try:
            importlib.import_module(f"kvcheck.models.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kvcheck.models.{name}":
                raise KeyError(name) from None
            raise
    return MODELS[name]
