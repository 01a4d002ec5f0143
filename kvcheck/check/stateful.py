"""A Hypothesis state machine for any model and any of its targets, checked by its oracle.

Drop it into your own pytest suite::

    from kvcheck import make_state_machine
    TestMine = make_state_machine(MyAllocator, num_blocks=8, block_size=4).TestCase

One rule per operation of the model (``Model.ops``), only for those the
target supports; each argument is drawn by its role (``kvcheck.check.model``):
a live sequence, a fresh id, a count up to the model's bound, a token list, a
set of live sequences. And one rule, ``kvcheck_driver(seed, n)``, that runs the
next ``n`` operations of kvcheck's own seeded driver (the workload ``kvcheck
verify`` draws: pool pressure, shared prefixes, the target's extra operations),
so the machine finds what ``verify`` finds in about as many operations. Every
operation runs through the model's oracle; a violation fails the test with its
witness and the counterexample shrunk by kvcheck's own shrinker (computed once
per broken rule, the same minimal trace ``verify`` prints), while Hypothesis
shrinks its own example as usual.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvcheck.check.model import COUNT, NEW_SEQ, SEQ, SEQS, TOKENS, VALUE, Model, Options
from kvcheck.check.watchdog import Watchdog

DRIVER_STEPS = 64  # the most operations one kvcheck_driver rule runs


def machine(model: Model, label: str, factory, scope, options: Options, capabilities,
            bounds: dict, explain, driver: bool = True) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class driving ``factory`` at ``scope`` under ``model``.

    ``bounds`` gives, per argument name, the largest count (or token id) to draw;
    ``explain(history, violation) -> str`` renders a failure."""

    def __init__(self):
        RuleBasedStateMachine.__init__(self)
        self.history: list = []
        self.next_id = 0
        self._wd = Watchdog(options.timeout).__enter__()
        self.target = model.build(factory, scope, options)
        self.state = model.start(self.target, scope, options)
        self._check(self.state.violation)

    def _check(self, v):
        if v is not None:
            raise AssertionError(explain(self.history, v))

    def _fresh(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _live(self) -> list[int]:
        return sorted(self.state.live_seqs())

    def _run(self, op) -> None:
        if not self.state.valid(op):  # cannot happen for the draws below; never misuse
            return
        self.history.append(op)
        self._check(self.state.step(op, self._wd))

    def teardown(self):
        try:
            if self.state.violation is None:
                self._check(self.state.sweep(self._wd))
        finally:
            self._wd.__exit__(None, None, None)

    @rule(seed=st.integers(0, 2**16), n=st.integers(1, DRIVER_STEPS))
    def kvcheck_driver(self, seed, n):
        """The next ``n`` operations of kvcheck's driver at ``seed``; its fresh ids start
        after the machine's (an id already used is an invalid operation, skipped)."""
        driver = model.driver(seed, scope, self.target, options)
        counters = [(obj, attr) for obj in (driver, getattr(driver, "driver", None))
                    for attr in ("next_id", "next_seq")
                    if obj is not None and isinstance(getattr(obj, attr, None), int)]
        for obj, attr in counters:
            setattr(obj, attr, max(getattr(obj, attr), self.next_id))
        for _ in range(n):
            op = driver.next_op(self.state)
            if op is None:
                break
            self._run(op)
        for obj, attr in counters:
            self.next_id = max(self.next_id, getattr(obj, attr))

    ns = {"__init__": __init__, "_check": _check, "_fresh": _fresh, "_run": _run,
          "_live": _live, "teardown": teardown, "factory_label": label}
    if driver:
        ns["kvcheck_driver"] = kvcheck_driver
    for kind, spec in model.ops.items():
        if kind in capabilities:
            ns[kind] = _rule(spec, bounds)
    name = "".join(ch for ch in f"{label.rpartition(':')[2].rpartition('.')[2]}" if ch.isalnum())
    cls = type(f"{name or 'Target'}StateMachine", (RuleBasedStateMachine,), ns)
    cls.__doc__ = f"kvcheck state machine over {label} ({model.title}, {options.mode} mode)"
    # kvcheck's shrinker gives the minimal trace (in the failure's message), so Hypothesis
    # does not shrink its own example by default; no deadline (a step of a slow target is
    # kvcheck's watchdog's to judge, not a flaky timing); a user's settings replace these
    cls.TestCase.settings = settings(deadline=None, phases=(Phase.explicit, Phase.reuse,
                                                            Phase.generate),
                                     suppress_health_check=(HealthCheck.too_slow,))
    return cls


def _rule(spec, bounds: dict):
    needs_live = any(a.role in (SEQ, SEQS) for a in spec.args)

    @rule(data=st.data())
    def run_op(self, data):
        live = self._live()
        args = {}
        for a in spec.args:
            if a.role == SEQ:
                args[a.name] = data.draw(st.sampled_from(live), label=a.json_key)
            elif a.role == NEW_SEQ:
                args[a.name] = self._fresh()
            elif a.role == COUNT:
                args[a.name] = data.draw(st.integers(a.low, max(a.low, bounds.get(a.name, 8))),
                                         label=a.json_key)
            elif a.role == TOKENS:
                vocab = bounds.get("vocab", 3)
                args[a.name] = data.draw(st.lists(st.integers(0, vocab), min_size=1,
                                                  max_size=bounds.get(a.name, 8)), label=a.json_key)
            elif a.role == SEQS:
                args[a.name] = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True),
                                         label=a.json_key)
            elif a.role == VALUE:
                args[a.name] = data.draw(st.integers(0, bounds.get(a.name, 3)), label=a.json_key)
        self._run(spec.make(spec.kind, **args))

    run_op.__name__ = spec.kind
    if needs_live:
        run_op = precondition(lambda self: bool(self.state.live_seqs()))(run_op)
    return run_op
