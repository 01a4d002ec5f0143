"""``kvcheck attach`` on vLLM v0 (0.8.5, the ``vllm-v0`` pin): the release's own ``tests/core/``
tests with its block space manager observed (issue 34 §3).

The sdist is downloaded from the package index at test time (once, into kvcheck's cache, never
into this repository), and v0's attach dependencies (``attach.DEPS`` and
``attach.ENGINE_DEPS["vllm-v0"]``: transformers, which v0's ``vllm/config.py`` imports at module
level) are installed once into kvcheck's cache; without a network and without
``$KVCHECK_SDIST_DIR`` the tests fail with attach's one line. One pytest child runs a few of
the engine's own tests:

* ``test_scheduler_schedule_simple``: the release's ``Scheduler`` with its own
  ``SelfAttnBlockSpaceManager``, built from ``SchedulerConfig`` / ``CacheConfig``: it passes,
  and kvcheck checked the states of the manager the scheduler built;
* ``test_swap`` (block manager, six parameter sets): GPU -> CPU -> GPU swaps, read as one pool
  of the two allocators' disjoint ids: they pass with their states checked;
* ``test_scheduler_schedule_preempt_abort`` with ``CpuGpuBlockAllocator.free`` patched to lose
  the first block it is asked to free (a leak inside the engine): kvcheck fails it with
  ``refcount_conservation`` after ``SelfAttnBlockSpaceManager.free()`` (preemption by
  recompute frees the preempted sequence).
"""

from __future__ import annotations

import pytest

from kvcheck.cli import attach

LEAK = '''
import pytest

@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    if item.name != "test_scheduler_schedule_preempt_abort":
        return
    import vllm.core.block.cpu_gpu_block_allocator as m
    real = m.CpuGpuBlockAllocator.free
    lost = []

    def leaky(self, block):  # the first block freed keeps its reference
        if not lost:
            lost.append(block.block_id)
            return None
        return real(self, block)

    leaky.__kvcheck_real__ = real
    m.CpuGpuBlockAllocator.free = leaky


def pytest_runtest_teardown(item):
    import vllm.core.block.cpu_gpu_block_allocator as m
    real = getattr(m.CpuGpuBlockAllocator.free, "__kvcheck_real__", None)
    if real is not None:
        m.CpuGpuBlockAllocator.free = real
'''

SCHEDULER = "tests/core/test_scheduler.py"
BLOCK_MANAGER = "tests/core/block/test_block_manager.py"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    folder = tmp_path_factory.mktemp("leak")
    (folder / "kvcheck_v0_leak_plugin.py").write_text(LEAK)
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(folder))
    failure = None
    try:  # (no network and no $KVCHECK_SDIST_DIR: attach's one line fails the tests)
        return attach.run("vllm-v0==0.8.5", ["test_scheduler.py", "test_block_manager.py"],
                          ["-p", "kvcheck_v0_leak_plugin", "-k",
                           "test_scheduler_schedule_simple or test_scheduler_schedule_preempt_abort"
                           " or test_swap and not test_swap_in"],
                          say=lambda _m: None)
    except attach.AttachError as exc:
        failure = f"kvcheck attach: {exc}"
    finally:
        mp.undo()
    pytest.fail(failure, pytrace=False)


def test_the_schedulers_own_test_passes_with_its_managers_states_checked(outcome):
    f = outcome.files[SCHEDULER]
    assert f.passed == 1 and f.engine == 0 and f.not_run == 0
    assert f.judged == 2 and f.checks > 2  # the passing test's manager and the leaking one's


def test_swaps_between_the_gpu_and_cpu_pools_are_judged_and_pass(outcome):
    f = outcome.files[BLOCK_MANAGER]
    assert (f.passed, f.engine, f.kvcheck, f.not_run) == (6, 0, 0, 0)
    assert f.judged == 6 and f.checks >= 6 * 4  # allocate, swap_out, swap_in, ... per test


def test_a_lost_free_fails_the_schedulers_test_by_kvcheck(outcome):
    f = outcome.files[SCHEDULER]
    assert f.kvcheck == 1
    (test, why), = f.kvcheck_failures
    assert test == "test_scheduler_schedule_preempt_abort"
    assert "refcount_conservation" in why and "SelfAttnBlockSpaceManager.free()" in why
    assert "(vLLM GPU block " in why and "refcount is 1, but 0 table entries" in why


def test_the_report_names_the_release_and_each_kind(outcome):
    text = attach.render(outcome, "vllm-v0==0.8.5")
    assert "7 passed, 0 failed by the engine's own assertions, 1 failed by kvcheck, 0 not run" \
        in text
