"""The Hypothesis state machine speaks every operation a target offers: it passes the
references (lazy and eager) and catches a buggy reservation, rollback, rebase and
preemption."""

import pytest
from hypothesis import settings

from kvcheck import make_state_machine
from kvcheck.impl.block_manager import EagerForkBlockManager, EngineBlockManager

from corpus.engine import PreemptFreesShared, RebaseLeaks, RollbackLeaks, SlotsWriteSharedInPlace


def quick(machine):
    """The machine's own settings (no Hypothesis shrinking: kvcheck's shrinker does it)."""
    return settings(machine.TestCase.settings, max_examples=60, stateful_step_count=30,
                    database=None)


@pytest.mark.parametrize("cls", [EngineBlockManager, EagerForkBlockManager])
def test_the_references_pass(cls):
    machine = make_state_machine(cls, num_blocks=8, block_size=2)
    machine.TestCase.settings = quick(machine)
    machine.TestCase().runTest()


@pytest.mark.parametrize("cls", [SlotsWriteSharedInPlace, RollbackLeaks, RebaseLeaks,
                                 PreemptFreesShared])
def test_a_bug_in_an_engine_operation_is_caught(cls):
    machine = make_state_machine(cls, num_blocks=8, block_size=2)
    machine.TestCase.settings = quick(machine)
    with pytest.raises(AssertionError, match="violation"):
        machine.TestCase().runTest()
