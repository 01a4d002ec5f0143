"""``make_state_machine`` finds what ``verify`` finds, about as fast, and reports the trace
kvcheck's own shrinker makes (issue 35 §2): its ``kvcheck_driver`` rule plays kvcheck's
seeded workload, and Hypothesis does not shrink its own example by default."""

from __future__ import annotations

import re
import unittest

import pytest
from hypothesis import settings

from kvcheck.verify import make_state_machine, verify

from corpus.buggy import CORPUS

ENTRIES = ["no-copy-on-write", "rebase-double-release", "slots-copy-reversed",
           "window-frees-shared"]


def _ops(text: str) -> list[str]:
    """The numbered operation lines of a rendered trace, sequence numbers aside."""
    return [re.sub(r"\d+", "N", line.strip()) for line in text.splitlines()
            if re.match(r"\s*(>>)?\s*\d+\. ", line)]


@pytest.mark.parametrize("name", ENTRIES)
def test_the_machine_fails_with_kvcheck_s_minimal_trace(name):

    cls = CORPUS[name][0]
    want = verify(cls, 8, 2, 3000, 0).trace
    machine = make_state_machine(cls, num_blocks=8, block_size=2)
    assert "kvcheck_driver" in dir(machine)
    machine.TestCase.settings = settings(machine.TestCase.settings, database=None,
                                         max_examples=50, derandomize=True)
    result = unittest.TextTestRunner(stream=open("/dev/null", "w")).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(machine.TestCase))
    assert not result.wasSuccessful(), name
    message = (result.failures or result.errors)[0][1]
    shrunk = message[message.index("kvcheck shrank"):]
    shrunk = shrunk[:shrunk.index("VIOLATION")]
    assert "1-minimal" in message
    assert len(_ops(shrunk)) == len(want.ops)
    assert want.violation.name in message


def test_a_legal_allocator_passes_the_machine():
    machine = make_state_machine("reference-engine", num_blocks=6, block_size=2)
    machine.TestCase.settings = settings(machine.TestCase.settings, database=None,
                                         max_examples=15, derandomize=True)
    result = unittest.TextTestRunner(stream=open("/dev/null", "w")).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(machine.TestCase))
    assert result.wasSuccessful(), (result.failures or result.errors)[0][1]
