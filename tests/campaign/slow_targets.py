"""Targets for the campaign's tests: legal ones that are slow, lack an operation or refuse
some shapes, and a device bug from the device corpus on the torch backend."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kvcheck.campaign.plan import SMALL_BLOCK, SMALL_POOL
from kvcheck.impl.block_manager import BlockManager
from kvcheck.targets.protocol import SeedAdapter


class SlowAppends(BlockManager):
    """Correct, but every append takes 50 ms: no run of a few hundred operations ends
    within a one-second budget."""

    def append_slot(self, seq):
        time.sleep(0.05)
        return super().append_slot(seq)


class NoFork(SeedAdapter):
    """The reference without fork: the classes that need a fork cannot occur."""

    def __init__(self, num_blocks, block_size):
        super().__init__(BlockManager(num_blocks, block_size), num_blocks, block_size)
        self.capabilities = frozenset({"allocate", "append_slot", "free_seq"})


class DeclaresVacuous(NoFork):
    """NoFork, declaring one invariant vacuous (as SGLang's adapter declares its derived
    refcounts): a campaign's verdict must list it, as ``kvcheck verify``'s does."""

    vacuous = {"refcount_conservation": "the test target derives its counts"}


class OnlyBlockSizeOne(BlockManager):
    """Refuses every block size but 1 (at which every append starts a block)."""

    def __init__(self, num_blocks, block_size):
        if block_size != 1:
            raise ValueError("only block size 1 is supported")
        super().__init__(num_blocks, block_size)


def copy_full_block(num_blocks, block_size):
    """The device corpus' CopyFullBlock, float16 on the torch backend, on the CPU."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
    import device_bugs

    return device_bugs.CopyFullBlock(num_blocks, block_size, dtype="float16", device="cpu",
                                     num_layers=2, num_kv_heads=2, head_dim=3, backend="torch")


class MeetsAnother(BlockManager):
    """Correct; its constructor waits (up to 20 s) until a second run's target is being built
    at the same time, each run leaving its process id in ``$KVCHECK_TEST_MEET`` (a directory),
    and notes there whether they met: two runs met only if two workers ran them at once."""

    def __init__(self, num_blocks, block_size):
        where = Path(os.environ["KVCHECK_TEST_MEET"])
        (where / f"{os.getpid()}.here").write_text("")
        deadline = time.monotonic() + 20.0
        while len(list(where.glob("*.here"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        met = len(list(where.glob("*.here"))) >= 2
        (where / f"{os.getpid()}.{'met' if met else 'alone'}").write_text("")
        super().__init__(num_blocks, block_size)


class NotesItsPriority(BlockManager):
    """Correct; its constructor notes the niceness of the process it runs in, in
    ``$KVCHECK_TEST_NICE`` (a directory: one file per process, named by the pool's shape and
    the process id). The run at 32 blocks x 4 (a campaign's run 0) first waits a second, so
    that the runs beside it start while it is in flight; another run started at a raised
    niceness waits (up to 20 s) until its niceness is back to that of its parent, the
    campaign, and notes it again."""

    def __init__(self, num_blocks, block_size):
        note = Path(os.environ["KVCHECK_TEST_NICE"]) / f"{num_blocks}x{block_size}-{os.getpid()}"
        seen = [os.nice(0)]
        note.write_text(" ".join(map(str, seen)))
        if (num_blocks, block_size) == (32, 4):
            time.sleep(1.0)
        else:
            parent = os.getpriority(os.PRIO_PROCESS, os.getppid())
            deadline = time.monotonic() + 20.0
            if seen[0] != parent:
                while os.nice(0) != parent and time.monotonic() < deadline:
                    time.sleep(0.02)
                seen.append(os.nice(0))
                note.write_text(" ".join(map(str, seen)))
        super().__init__(num_blocks, block_size)


class OthersShrinkBesideRun0(BlockManager):
    """The mirror of ``ShrinksBesideAnother``. In a campaign's run 0 (the process whose first
    target is built at 32 blocks x 4): correct, each append taking 20 ms, its process id left
    in ``$KVCHECK_TEST_BESIDE`` (a directory). In any other run: leaks the blocks of every
    freed sequence, and every target built while that is shrunk notes there the state
    letter of ``/proc/PID/stat`` of run 0 (``T``: stopped); its first build waits (up to
    20 s) until run 0 has left its id."""

    builds = 0
    run0 = None

    def __init__(self, num_blocks, block_size):
        where = Path(os.environ["KVCHECK_TEST_BESIDE"])
        cls = OthersShrinkBesideRun0
        if cls.run0 is None:
            cls.run0 = (num_blocks, block_size) == (32, 4)
            if cls.run0:
                (where / f"{os.getpid()}.pid").write_text("")
        if not cls.run0:
            cls.builds += 1
            deadline = time.monotonic() + 20.0
            while not list(where.glob("*.pid")) and time.monotonic() < deadline:
                time.sleep(0.02)
            if cls.builds > 2:  # the replays: shrinking has begun
                time.sleep(0.05)
                for pid in where.glob("*.pid"):
                    try:
                        stat = Path(f"/proc/{pid.stem}/stat").read_text()
                    except OSError:
                        continue
                    with open(where / "seen", "a") as f:
                        f.write(stat.rsplit(")", 1)[1].split()[0])
        super().__init__(num_blocks, block_size)

    def append_slot(self, seq):
        if self.run0:
            time.sleep(0.02)
        return super().append_slot(seq)

    def free_seq(self, seq):
        if self.run0:
            return super().free_seq(seq)
        self._live(seq)
        del self.tables[seq]
        del self.lens[seq]


class ShrinksBesideAnother(BlockManager):
    """In a campaign's run 0 (the process whose first target is built at 32 blocks x 4):
    leaks the blocks of every freed sequence (a violation at the first free), and every
    target built while it is shrunk (each replay builds one, at any shape) notes, in
    ``$KVCHECK_TEST_BESIDE`` (a directory), the state letter of ``/proc/PID/stat`` of each
    run beside it (``T``: stopped); its first build waits (up to 20 s) until one is there.
    In any other run on a pool larger than a small-scope run's (``plan.SMALL_POOL``,
    ``SMALL_BLOCK``: a small-scope run goes on beside a shrink): correct, each append taking 20 ms,
    leaving its process id there. On a smaller pool: correct, at full speed."""

    builds = 0  # targets built in this process: the run's, then the replays'
    run0 = None  # whether this process is run 0 (its first target's shape says)
    slow = False  # whether this process's run goes slowly (its first target's shape says)
    small_too = False  # whether a small-scope run goes slowly too

    def __init__(self, num_blocks, block_size):
        where = Path(os.environ["KVCHECK_TEST_BESIDE"])
        cls = type(self)
        if cls.run0 is None:
            cls.run0 = (num_blocks, block_size) == (32, 4)
            cls.slow = num_blocks > SMALL_POOL or block_size > SMALL_BLOCK or cls.small_too
            if not cls.run0 and cls.slow:
                (where / f"{os.getpid()}.pid").write_text("")
        if cls.run0:
            cls.builds += 1
            deadline = time.monotonic() + 20.0
            while not list(where.glob("*.pid")) and time.monotonic() < deadline:
                time.sleep(0.02)
            if cls.builds > 2:  # the replays: shrinking has begun
                time.sleep(0.05)
                for pid in where.glob("*.pid"):
                    try:
                        stat = Path(f"/proc/{pid.stem}/stat").read_text()
                    except OSError:
                        continue
                    with open(where / "seen", "a") as f:
                        f.write(stat.rsplit(")", 1)[1].split()[0])
        super().__init__(num_blocks, block_size)

    def append_slot(self, seq):
        if not self.run0 and self.slow:
            time.sleep(0.02)
        return super().append_slot(seq)

    def free_seq(self, seq):
        if not self.run0:
            return super().free_seq(seq)
        self._live(seq)
        del self.tables[seq]
        del self.lens[seq]


class SmallRunsBesideAShrink(ShrinksBesideAnother):
    """``ShrinksBesideAnother`` whose every other run, a small-scope one too, goes slowly
    and leaves its process id (the small-scope runs beside run 0's shrink are noted)."""

    builds = 0
    run0 = None
    slow = False
    small_too = True
