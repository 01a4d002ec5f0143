"""The stateful Hypothesis test of the reference, run on the ``crosshair`` backend.

A small ``RuleBasedStateMachine`` drives an allocator through the runtime
oracle in full mode (``kvcheck.oracle.Oracle``: every operation checked
against the spec's contracts and invariants on whole snapshots). With
``settings(backend="crosshair")`` (the ``hypothesis-crosshair`` plugin),
Hypothesis's draws (which rule, which arguments) are symbolic values that
CrossHair's solver steers down new paths instead of random choices.

Rules never fail to apply: a rule's integer picks among the live sequences
(``live[i % len(live)]``) and new sequences get the smallest free id, so no
draw is wasted on an ``assume`` or a rule filter (with rule preconditions
and ``assume``, 97% of the backend's examples were invalid).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import Op
from kvcheck.targets.protocol import SeedAdapter

pytest.importorskip("hypothesis_crosshair_provider")

NUM_BLOCKS, BLOCK_SIZE, SEQS, MAX_TOKENS = 3, 2, 3, 3
STEPS = 5

picks = st.integers(0, SEQS - 1)


def machine_for(cls):
    class Machine(RuleBasedStateMachine):
        ops_run = 0  # over all examples: evidence the backend drove the machine

        def __init__(self):
            super().__init__()
            target = SeedAdapter(cls(NUM_BLOCKS, BLOCK_SIZE), NUM_BLOCKS, BLOCK_SIZE)
            self.oracle = Oracle(target, mode="full", timeout=None)

        def _live(self) -> list[int]:
            return sorted(self.oracle.lengths)

        def _fresh(self) -> int | None:
            return next((q for q in range(SEQS) if q not in self.oracle.lengths), None)

        def _step(self, op: Op | None) -> None:
            if op is None or not self.oracle.valid(op):
                return
            type(self).ops_run += 1
            v = self.oracle.step(op)
            assert v is None, f"{v.kind}: {v.name} ({v.witness})"

        @rule(n_tokens=st.integers(1, MAX_TOKENS))
        def allocate(self, n_tokens):
            fresh = self._fresh()
            self._step(None if fresh is None else Op("allocate", seq=fresh, n_tokens=n_tokens))

        @rule(i=picks)
        def append_slot(self, i):
            live = self._live()
            self._step(Op("append_slot", seq=live[i % len(live)]) if live else None)

        @rule(i=picks)
        def fork(self, i):
            live, fresh = self._live(), self._fresh()
            ok = live and fresh is not None
            self._step(Op("fork", seq=live[i % len(live)], child=fresh) if ok else None)

        @rule(i=picks)
        def free_seq(self, i):
            live = self._live()
            self._step(Op("free_seq", seq=live[i % len(live)]) if live else None)

        @invariant()
        def audited(self):
            v = self.oracle.sweep()
            assert v is None, f"{v.kind}: {v.name} ({v.witness})"

    Machine.__name__ = f"{cls.__name__}Machine"
    return Machine


def crosshair_settings(max_examples: int) -> settings:
    return settings(backend="crosshair", max_examples=max_examples, stateful_step_count=STEPS,
                    deadline=None, database=None, derandomize=True,
                    phases=(Phase.generate,), suppress_health_check=list(HealthCheck))


def test_reference_under_crosshair_backend():
    machine = machine_for(BlockManager)
    run_state_machine_as_test(machine, settings=crosshair_settings(30))
    assert machine.ops_run > 0


def test_crosshair_backend_finds_no_copy_on_write():
    from corpus.buggy import NoCopyOnWrite

    machine = machine_for(NoCopyOnWrite)
    with pytest.raises((AssertionError, Flaky)) as info:
        run_state_machine_as_test(machine, settings=crosshair_settings(200))
    assert "copied first" in str(info.value) or "isolation" in str(info.value)
