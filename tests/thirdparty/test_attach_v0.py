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

And 0.6.2 (whose scheduler builds block manager v1, ``BlockSpaceManagerV1``, by default): its
``tests/core/test_block_manager.py`` (v1's) -- ``test_swap`` judged on v1's
``PhysicalTokenBlock`` reading, and ``test_append_slot_cow``, which calls ``fork()`` into a
sequence that already holds a table (the test's staging: its manager stops being judged, with
the reason, instead of a flag for the reference the overwritten table drops).
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


@pytest.fixture(scope="module")
def outcome_v1_manager():
    try:
        return attach.run("vllm-v0==0.6.2", ["test_block_manager.py"],
                          ["-k", "test_swap and not encoder or test_append_slot_cow"],
                          say=lambda _m: None)
    except attach.AttachError as exc:
        pytest.fail(f"kvcheck attach: {exc}", pytrace=False)


def test_block_manager_v1_is_read_and_a_forks_precondition_broken_by_the_test_is_not_judged(
        outcome_v1_manager):
    f = outcome_v1_manager.files["tests/core/test_block_manager.py"]
    assert (f.passed, f.engine, f.kvcheck, f.not_run) == (2, 0, 0, 0)
    assert f.judged == 2 and f.checks >= 4  # test_swap's states, and the cow test's before fork
    (why, n), = f.unjudged.items()
    assert n == 1 and "called fork() into sequence 2, which already holds a block table" in why


# -- the v0 reader's rules on stand-in objects (no sdist: named here, with why) ---------------
# A ``Seq`` / ``Group`` stands in for vLLM's ``Sequence`` / ``SequenceGroup`` (only ``seq_id``
# and ``get_seqs()`` are read), a ``Block`` / ``Allocator`` / ``BlockSpaceManagerV1`` for block manager
# v1's ``PhysicalTokenBlock`` / ``UncachedBlockAllocator`` / ``BlockSpaceManagerV1`` (the
# attributes ``V0Reader._read_v1`` reads): the rules are kvcheck's, so they are checked on
# objects whose state the test sets exactly.

class Seq:
    def __init__(self, seq_id):
        self.seq_id = seq_id


class Group:
    def __init__(self, *seqs):
        self.seqs = list(seqs)

    def get_seqs(self):
        return self.seqs


class Manager:
    def __init__(self):
        self.block_tables = {}


def test_a_second_sequence_under_one_id_is_the_tests_not_the_engines():
    from kvcheck.cli.attach.observe import READERS

    reader, m = READERS["vllm-v0"], Manager()
    first, twin = Seq(1), Seq(1)
    assert reader.outside_contract(m, "allocate", (Group(first),), {}, False) is None
    m.block_tables[1] = []
    # the same Sequence allocated twice: still judged (it would be the engine's doing)
    assert reader.outside_contract(m, "allocate", (Group(first),), {}, False) is None
    why = reader.outside_contract(m, "allocate", (Group(twin),), {}, False)
    assert why is not None and "two sequences with seq_id 1" in why


def test_a_fork_into_a_held_sequence_is_staging_only_when_the_test_calls_it():
    from kvcheck.cli.attach.observe import READERS

    reader, m = READERS["vllm-v0"], Manager()
    m.block_tables = {1: [], 2: []}
    assert reader.outside_contract(m, "fork", (Seq(1), Seq(2)), {}, False) is None
    why = reader.outside_contract(m, "fork", (Seq(1), Seq(2)), {}, True)
    assert why is not None and "fork() into sequence 2" in why
    assert reader.outside_contract(m, "fork", (Seq(1), Seq(3)), {}, True) is None


class Device:
    def __init__(self, name):
        self.name = name


class Block:
    def __init__(self, device, number, ref_count=0):
        self.device, self.block_number, self.ref_count = Device(device), number, ref_count


class Allocator:
    def __init__(self, device, num_blocks, free):
        self.num_blocks = num_blocks
        self.free_blocks = [Block(device, b) for b in free]

    def get_num_free_blocks(self):
        return len(self.free_blocks)


class BlockSpaceManagerV1:  # (the reader dispatches on the class name)
    block_sliding_window = None
    enable_caching = False

    def __init__(self, gpu_free, cpu_free, tables):
        self.gpu_allocator = Allocator("GPU", 3, gpu_free)
        self.cpu_allocator = Allocator("CPU", 2, cpu_free)
        self.block_tables = tables
        self.cross_block_tables = {}


def test_block_manager_v1_one_pool_of_two_devices_and_a_lost_block():
    from kvcheck.cli.attach import observe

    reader = observe.READERS["vllm-v0"]
    held = [Block("GPU", 0, 1), Block("CPU", 1, 1)]  # kvcheck's 0 and 3 + 1 = 4
    ok = reader.read(BlockSpaceManagerV1([1, 2], [0], {7: held}))
    assert ok.tables[("sequence 7", None)] == (0, 4) and ok.refs == [1, 0, 0, 0, 1]
    assert observe.check(ok) is None
    # CPU block 0 is neither free nor held: lost (its ref_count cannot be read)
    lost = reader.read(BlockSpaceManagerV1([1, 2], [], {7: held}))
    broken = observe.check(lost)
    assert broken is not None and broken.clause == "free_list"
    assert "(vLLM CPU block 0)" in broken.subject and "a block lost" in broken.evidence
