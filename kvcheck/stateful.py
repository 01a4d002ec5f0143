"""A Hypothesis state machine for any allocator, checked by the oracle.

Drop it into your own pytest suite::

    from kvcheck import make_state_machine
    TestMine = make_state_machine(MyAllocator, num_blocks=8, block_size=4).TestCase

Hypothesis draws operations (allocate with a fresh id and a token count,
append_slot, fork onto a fresh id, free_seq, each on a sequence the oracle
knows to be live, and only those the target supports); every one runs
through ``kvcheck.oracle.Oracle.step``. A violation fails the test with its
witness and the run explained step by step (``kvcheck.explain``); Hypothesis
then shrinks the operation sequence itself.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import Op
from kvcheck.targets.loading import build, resolve


def _message(label, factory, num_blocks, block_size, history, v: Violation, out_of_blocks,
             timeout) -> str:
    """The violation with its witness, and the run explained (replayed in full mode)."""
    from kvcheck.report.text import render
    from kvcheck.verify import counterexample

    head = f"{v.kind} violation at step {v.step}: {v.name}"
    if v.element is not None:
        head += f" (element {v.element})"
    head += f"\n  {v.witness}"
    try:
        trace = counterexample(label, factory, num_blocks, block_size, history, v, None,
                               out_of_blocks, timeout, do_shrink=False)
        return head + "\n\n" + render(trace)
    except Exception as exc:  # noqa: BLE001 - the witness alone still says what broke
        return head + f"\n(could not render the trace: {type(exc).__name__}: {exc})"


def make_state_machine(factory, num_blocks: int = 8, block_size: int = 4, out_of_blocks=None,
                       mode: str = "full", max_tokens: int | None = None,
                       timeout: float | None = 10.0) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class driving ``factory(num_blocks, block_size)``.

    ``factory`` is anything ``kvcheck verify`` accepts as TARGET (a callable,
    a registered name, ``module:attr``). ``out_of_blocks`` is the exception
    class signalling out-of-blocks (default: any exception named
    ``OutOfBlocks``). ``mode`` is the oracle's ("full" checks whole states
    each step; "fast" checks what each step touched and sweeps at teardown).
    """
    if mode not in ("fast", "full"):
        raise ValueError(f"mode must be 'fast' or 'full', not {mode!r}")
    label, fac = resolve(factory)
    probe = build(fac, num_blocks, block_size, out_of_blocks)  # fails early on bad input
    caps = probe.capabilities
    max_tokens = max_tokens or 3 * block_size

    def __init__(self):
        RuleBasedStateMachine.__init__(self)
        self.history: list[Op] = []
        self.next_id = 0
        self._wd = Watchdog(timeout).__enter__()
        target = build(fac, num_blocks, block_size, out_of_blocks)
        self.oracle = Oracle(target, mode=mode, timeout=timeout)
        self._check(self.oracle.violation)

    def _check(self, v):
        if v is not None:
            raise AssertionError(_message(label, fac, num_blocks, block_size, self.history, v,
                                          out_of_blocks, timeout))

    def _fresh(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _run(self, op: Op) -> None:
        if not self.oracle.valid(op):  # cannot happen for the draws below; never misuse
            return
        self.history.append(op)
        self._check(self.oracle.step(op, self._wd))

    def _pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.oracle.lengths)), label="seq")

    def teardown(self):
        try:
            if self.oracle.violation is None and mode == "fast":
                self._check(self.oracle.sweep())
        finally:
            self._wd.__exit__(None, None, None)

    live = precondition(lambda self: bool(self.oracle.lengths))
    ns = {"__init__": __init__, "_check": _check, "_fresh": _fresh, "_run": _run,
          "_pick": _pick, "teardown": teardown, "factory_label": label}

    if "allocate" in caps:
        @rule(n_tokens=st.integers(1, max_tokens))
        def allocate(self, n_tokens):
            self._run(Op("allocate", seq=self._fresh(), n_tokens=n_tokens))
        ns["allocate"] = allocate

    if "append_slot" in caps:
        @live
        @rule(data=st.data())
        def append_slot(self, data):
            self._run(Op("append_slot", seq=self._pick(data)))
        ns["append_slot"] = append_slot

    if "fork" in caps:
        @live
        @rule(data=st.data())
        def fork(self, data):
            self._run(Op("fork", seq=self._pick(data), child=self._fresh()))
        ns["fork"] = fork

    if "free_seq" in caps:
        @live
        @rule(data=st.data())
        def free_seq(self, data):
            self._run(Op("free_seq", seq=self._pick(data)))
        ns["free_seq"] = free_seq

    name = "".join(ch for ch in f"{label.rpartition(':')[2].rpartition('.')[2]}" if ch.isalnum())
    cls = type(f"{name or 'Target'}StateMachine", (RuleBasedStateMachine,), ns)
    cls.__doc__ = f"kvcheck state machine over {label} ({num_blocks} blocks x {block_size}, {mode})"
    return cls
