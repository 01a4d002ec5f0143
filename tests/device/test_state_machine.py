"""Hypothesis state machines over the device store, checked by the device model's run state:
one written by hand, and the one ``kvcheck.make_state_machine(..., model="device")`` makes
from the model's operation table."""

from __future__ import annotations

from functools import partial

import device_bugs as bugs
import pytest
from conftest import DEVICE, SHAPE
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcheck.impl.device import DeviceBlockManager
from kvcheck.models.device import DecodeStep
from kvcheck.models.device.oracle import DataOracle
from kvcheck.spec.contracts import Op
from kvcheck.verify import make_state_machine

BLOCKS, BS = 8, 2


def machine(factory):
    class DeviceStore(RuleBasedStateMachine):
        @initialize()
        def start(self):
            self.d = DataOracle(factory(BLOCKS, BS), seed=0)
            self.next_id = 0

        def _run(self, op):
            if self.d.valid(op):
                v = self.d.step(op)
                assert v is None, f"{v.kind} {v.name}: {v.witness}"

        @rule(n=st.integers(1, 3 * BS))
        def allocate(self, n):
            self.next_id += 1
            self._run(Op("allocate", seq=self.next_id, n_tokens=n))

        @precondition(lambda self: self.d.live())
        @rule(i=st.integers(0, 99))
        def append(self, i):
            live = self.d.live()
            self._run(Op("append_slot", seq=live[i % len(live)]))

        @precondition(lambda self: self.d.live())
        @rule(i=st.integers(0, 99))
        def fork(self, i):
            live = self.d.live()
            self.next_id += 1
            self._run(Op("fork", seq=live[i % len(live)], child=self.next_id))

        @precondition(lambda self: self.d.live())
        @rule(i=st.integers(0, 99))
        def free(self, i):
            live = self.d.live()
            self._run(Op("free_seq", seq=live[i % len(live)]))

        @precondition(lambda self: self.d.live())
        @rule(picks=st.lists(st.integers(0, 99), min_size=1, max_size=6))
        def decode_step(self, picks):
            live = self.d.live()
            seqs = list(dict.fromkeys(live[p % len(live)] for p in picks))
            v = self.d.step(DecodeStep(seqs=seqs))
            assert v is None, f"{v.kind} {v.name}: {v.witness}"

        @invariant()
        def everything_reads_back(self):
            if hasattr(self, "d"):
                assert self.d.check() is None

    return DeviceStore


def _run(factory, examples, steps, phases=tuple(Phase)):
    run_state_machine_as_test(machine(factory), settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        derandomize=True, suppress_health_check=list(HealthCheck), phases=phases,
        report_multiple_bugs=False))


def test_torch_backend():
    _run(partial(DeviceBlockManager, device=DEVICE, backend="torch", **SHAPE), 25, 30)


def test_triton_kernels():
    _run(partial(DeviceBlockManager, device=DEVICE, backend="triton", dtype="bfloat16",
                 **SHAPE), 8, 20)


@pytest.mark.parametrize("bug", [bugs.WriteBeforeCopy, bugs.StaleCopySource],
                         ids=lambda b: b.__name__)
def test_finds_a_device_bug(bug):
    with pytest.raises(AssertionError, match="data read-back"):
        _run(partial(bug, device=DEVICE, backend="torch", **SHAPE), 100, 30,
             phases=(Phase.generate,))


# -- the machine kvcheck makes from the device model ------------------------------------------
def _run_generated(factory, examples, steps, mode="full"):
    cls = make_state_machine(factory, num_blocks=BLOCKS, block_size=BS, mode=mode, model="device")
    assert hasattr(cls, "decode_step") and hasattr(cls, "allocate")  # one rule per operation
    run_state_machine_as_test(cls, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        derandomize=True, suppress_health_check=list(HealthCheck), phases=(Phase.generate,),
        report_multiple_bugs=False))


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_generated_machine_passes_the_torch_backend(mode):
    _run_generated(partial(DeviceBlockManager, device=DEVICE, backend="torch", **SHAPE), 15, 25,
                   mode)


@pytest.mark.parametrize("bug", [bugs.WriteBeforeCopy, bugs.SwappedCopy],
                         ids=lambda b: b.__name__)
def test_generated_machine_finds_a_device_bug(bug):
    with pytest.raises(AssertionError) as info:
        _run_generated(partial(bug, device=DEVICE, backend="torch", **SHAPE), 200, 30)
    text = str(info.value)
    assert "data violation" in text, text
    assert "Counterexample" in text and "VIOLATION" in text  # the run, explained
