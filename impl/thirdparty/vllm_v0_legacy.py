"""vLLM's BlockSpaceManager v1 (0.3.3 .. 0.6.2): raw replays and the ``Target`` ``vllm-v0-legacy``.

Before block manager v2, vLLM v0 kept its tables in ``BlockSpaceManager``
(``vllm/core/block_manager.py`` in 0.3.x, ``BlockSpaceManagerV1`` in
``vllm/core/block_manager_v1.py`` in 0.4.0): a table is a list of
``PhysicalTokenBlock`` objects, each with its own ``ref_count``, and with a sliding
window of ``W = sliding_window // block_size`` blocks a table longer than ``W``
reuses its blocks cyclically: logical block ``i >= W`` is ``block_table[i % W]``,
the block that fell behind the window, overwritten in place, one reference per
sequence however many entries name it. Only the last ``W`` entries are live; the
earlier ones are stale names (0.4.0's ``_free_block_table`` frees
``set(block_table[-W:])`` only).

``load(version)`` executes the release's own files (``vllm/block.py`` and the block
manager; 0.4.0 also ``vllm/core/interfaces.py`` and ``vllm/core/evictor.py``) through
``_loader`` with these stand-ins:

``vllm.utils``
    ``Device`` (an enum with ``GPU``, ``CPU``): the real module imports torch and
    psutil for unrelated helpers; the block manager only compares devices.
``vllm.sequence``
    ``Sequence`` and ``SequenceGroup`` for annotations, and ``SequenceStatus`` (the
    members the manager names: ``WAITING``, ``RUNNING``, ``SWAPPED``, the finished
    ones). The manager reads sequences only through ``seq_id``,
    ``logical_token_blocks``, ``is_finished()`` and groups through ``get_seqs``,
    ``num_seqs`` and ``prefix``: ``Seq`` and ``Group`` below provide exactly these,
    as ``Scheduler`` hands them over.
``vllm.logger``
    a stdlib logger.

The ``Target`` (``vllm-v0-legacy@VERSION``: every release with block manager v1, 0.3.3
.. 0.6.2; 0.6.3 removed it). 0.4.1 renamed ``append_slot`` / ``can_append_slot`` to
``append_slots(seq, num_lookahead_slots)`` / ``can_append_slots`` (called with no
lookahead; their copies a ``{src: [dst]}`` dict to 0.4.2, a list of pairs from 0.4.3),
0.4.2 renamed the evictor ``evictor_v1``, 0.4.3 added the encoder-decoder check
(``vllm.core.block.utils``: ``Group.is_encoder_decoder()`` is False, its messages are
stubbed in ``vllm.utils``), 0.5.1 reads ``seq.n_blocks`` for the logical blocks, 0.5.5
made ``BlockTable`` a class and imports ``vllm.core.block.common`` (a cache metric):
``load`` takes the files each release has, ``Seq`` and ``Group`` offer what each reads.
A sliding window of
``W`` blocks (``make``: ``W = 2``; ``make_window(n, B, W)``), no prefix caching, no
watermark, no CPU blocks. Each ``allocate`` is the scheduler admitting a new request (a
group of one sequence, ``can_allocate`` first); beam search's sequences come from
``fork`` (``Scheduler.fork_seq``: the engine forks a group's parent into its children
after a step), each appended to by ``append_slot`` (``can_append_slot`` first) and
freed by ``free``:

``allocate(seq, n)``
    ``can_allocate(group)``; not ``OK`` is out-of-blocks (it asks ``min(k, W)`` free
    blocks: exactly what ``allocate`` takes), else ``allocate(group)``.
``append_slot(seq)``
    the sequence one token longer, then ``can_append_slot(group)`` (a free block for
    its one running sequence; no is a declared refusal, ``Refused``: the scheduler
    preempts instead), then ``append_slot(seq)``: ``(last block, offset, cow)``. At a
    block boundary past the window the engine reuses the block leaving the window in
    place and, when that block is shared, copies it first: the copy carries the
    slots the spec's block-granular window reads as behind the window (the spec's
    reading: ``drop_behind_window((W - 1) * B)`` then an append at a boundary, which
    copies nothing), so the adapter reports no copy there.
``fork(parent, child)``, ``free_seq(seq)``
    ``fork`` / ``free``; an engine ``ValueError`` ("Double free!") is reported by
    the oracle as the call's crash, never raised past it.

The spec's reading of a cyclic table (``cyclic_window = W * B``: the oracle stamps
``Op.cycle``): only its last ``W`` entries hold a reference, so ``block_table``
reads every entry before them as ``NULL`` (a stale name: 0.4.0's ``_free_block_table``
frees ``set(block_table[-W:])``); ``allocate`` of ``k > W`` blocks takes ``W``, the rest
null; an append at a boundary past ``W`` is the drop behind the window, then the
append (``spec.contracts.cyclic_pre``). 0.3.3's fork counts stale entries
(``for block in src_block_table``) and its free frees them (``set(block_table)``):
vLLM #1556; 0.4.0 still has F10 (docs/findings.md).
"""

from __future__ import annotations

import enum
import types
from typing import Any

from kvcheck.spec.state import NULL

from ..errors import MisuseError, OutOfBlocks, Refused
from . import _loader, install
from ._loader import Loaded

ENGINE_KEY = "vllm-v0-legacy"


def _stub_utils(mod: types.ModuleType, _: Loaded) -> None:
    class Device(enum.Enum):
        GPU = enum.auto()
        CPU = enum.auto()

    mod.Device = Device
    # (0.5.5 on: the messages vllm.core.block.utils raises for encoder-decoder models)
    mod.STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = "Prefix caching is not supported with encoder/decoder models."
    mod.STR_NOT_IMPL_ENC_DEC_SWA = "Sliding window attention is not supported with encoder/decoder models."


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()


def _stub_sequence(mod: types.ModuleType, _: Loaded) -> None:
    class Sequence:  # annotation only
        pass

    class SequenceGroup:  # annotation only
        pass

    mod.Sequence = Sequence
    mod.SequenceGroup = SequenceGroup
    mod.SequenceStatus = SequenceStatus


STUBS = {
    "vllm.utils": _stub_utils,
    "vllm.logger": _loader.stub_logger,
    "vllm.sequence": _stub_sequence,
}


def manager_module(root) -> str:
    """``vllm.core.block_manager_v1`` where the release has it (0.4.0), else
    ``vllm.core.block_manager`` (0.3.x); aphrodite-engine's names under its root
    (``aphrodite.processing.block_manager_v1`` in 0.6.x, ``...block_manager`` in 0.5.x)."""
    if (root / "aphrodite").is_dir():
        return ("aphrodite.processing.block_manager_v1"
                if (root / "aphrodite/processing/block_manager_v1.py").is_file()
                else "aphrodite.processing.block_manager")
    return ("vllm.core.block_manager_v1" if (root / "vllm/core/block_manager_v1.py").is_file()
            else "vllm.core.block_manager")


# The engine files a release's block manager imports beside itself, where the release has
# them: its interfaces, its evictor (renamed evictor_v1 in 0.4.2), the encoder-decoder
# check (0.4.3 on) and, for a cache metric, vllm.core.block.common (0.5.5 on).
_ALSO = ("vllm.core.interfaces", "vllm.core.evictor_v1", "vllm.core.evictor",
         "vllm.core.block.utils", "vllm.core.block.common", "vllm.core.block.interfaces")


def _stub_aphrodite_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    _stub_utils(mod, loaded)  # Device
    # 0.6.x's processing/block/utils.py imports these two (encoder-decoder checks only)
    mod.STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = "prefix caching: not for encoder/decoder models"
    mod.STR_NOT_IMPL_ENC_DEC_SWA = "sliding window: not for encoder/decoder models"


def _stub_loguru(mod: types.ModuleType, _: Loaded) -> None:
    """aphrodite 0.6.x's ``block_manager_v1`` logs through ``loguru.logger`` (a logging
    library, not installed here): a stdlib logger; logging only reports."""
    import logging

    mod.logger = logging.getLogger("kvcheck.thirdparty.aphrodite")


APHRODITE_STUBS = {
    "aphrodite.common.utils": _stub_aphrodite_utils,
    "aphrodite.common.sequence": _stub_sequence,
    "loguru": _stub_loguru,
}
APHRODITE_KEY = "aphrodite-legacy"  # aphrodite-engine 0.5.x / 0.6.x's BlockSpaceManager (v1)


def load(version: str | None = None, engine: str = ENGINE_KEY) -> Loaded:
    """The release's block manager at ``version`` (default: the pinned 0.4.0);
    ``ThirdPartyMissing`` if it is not installed. ``engine="aphrodite-legacy"``:
    aphrodite-engine's own BlockSpaceManager v1 (0.5.x ``aphrodite/processing/
    block_manager.py`` with ``evictor.py``; 0.6.x ``block_manager_v1.py`` with
    ``evictor_v1.py``, ``interfaces.py``, ``block/{utils,common,interfaces}.py``: 0.6.4.post1
    on import the cache-metric class), ``aphrodite/common/block.py``
    and ``APHRODITE_STUBS``."""
    dist = install.select(engine, version or install.PINNED)
    root = _loader.require(dist)
    name = manager_module(root)
    if engine == APHRODITE_KEY:
        files = ["aphrodite.common.block", name]
        files += (["aphrodite.processing.evictor_v1", "aphrodite.processing.interfaces",
                   "aphrodite.processing.block.utils", "aphrodite.processing.block.common",
                   "aphrodite.processing.block.interfaces"] if name.endswith("_v1")
                  else ["aphrodite.processing.evictor"])
        return _loader.load(dist, files, APHRODITE_STUBS, entry=(name,))
    files = ["vllm.block", name]
    if name.endswith("_v1"):
        evictor = "vllm.core.evictor_v1" if (root / "vllm/core/evictor_v1.py").is_file() \
            else "vllm.core.evictor"
        files += [m for m in _ALSO if (m != "vllm.core.evictor_v1" and m != "vllm.core.evictor"
                                       or m == evictor)
                  and (root / (m.replace(".", "/") + ".py")).is_file()]
    return _loader.load(dist, files, STUBS, entry=(name,))


def manager_class(mods: Loaded) -> Any:
    root = mods.root
    mod = mods[manager_module(root)]
    return getattr(mod, "BlockSpaceManagerV1", None) or mod.BlockSpaceManager


class Seq:
    """What the block manager reads of a ``vllm.sequence.Sequence``: its id, its
    logical blocks (one entry per ``block_size`` tokens, as ``Sequence`` keeps them)
    and its status."""

    def __init__(self, seq_id: int, n_tokens: int, block_size: int):
        self.seq_id = seq_id
        self.block_size = block_size
        self.n_tokens = n_tokens
        self.status = SequenceStatus.WAITING

    @property
    def logical_token_blocks(self) -> list[int]:
        return list(range(self.n_blocks))

    @property
    def n_blocks(self) -> int:  # (vLLM 0.5.1 on and aphrodite 0.6.x count blocks so)
        return -(-self.n_tokens // self.block_size)

    def is_finished(self) -> bool:
        return self.status.name.startswith("FINISHED")

    # -- what aphrodite's block managers also read (its prefix-caching hooks, called with
    # caching off too: the hash is then ignored by BlockAllocator.allocate; a tuple, so
    # never equal to the allocator's own integer hashes)
    def hash_of_block(self, logical_idx: int) -> tuple:
        return ("kvcheck", self.seq_id, logical_idx)

    def num_hashed_tokens_of_block(self, logical_idx: int) -> int:
        return (logical_idx + 1) * self.block_size

    @property
    def data(self) -> Any:
        n = self.n_tokens

        class _Data:
            def get_token_ids(self) -> list[int]:
                return list(range(n))

        return _Data()

    def get_len(self) -> int:
        return self.n_tokens


class Group:
    """What the block manager reads of a ``vllm.sequence.SequenceGroup``."""

    prefix = None

    def __init__(self, *seqs: Seq):
        self.seqs = list(seqs)
        self.request_id = str(seqs[0].seq_id) if seqs else "0"

    def is_encoder_decoder(self) -> bool:  # vLLM 0.4.3 on, aphrodite 0.6.x ask (decoder-only)
        return False

    def get_encoder_seq(self) -> None:
        return None

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Seq]:
        return [s for s in self.seqs if status is None or s.status == status]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return len(self.get_seqs(status))


def build(version: str | None, num_blocks: int, block_size: int, sliding_window: int,
          engine: str = ENGINE_KEY) -> Any:
    """A real ``BlockSpaceManager`` (v1) with ``num_blocks`` GPU blocks, no CPU blocks,
    no watermark, and ``sliding_window`` tokens (prefix caching off, the default)."""
    return manager_class(load(version, engine))(block_size, num_blocks, 0, watermark=0.0,
                                                sliding_window=sliding_window)


def _by_number(block) -> int:
    return block.block_number  # (an int's hash is itself: the same in every process)


def deterministic_hash(block_cls) -> None:
    """Give ``PhysicalTokenBlock`` a hash by its number. The class hashes by
    identity, so the order in which ``fork`` and ``free`` walk ``set(block_table)``, and
    with it the free list's order and every later block id, follows memory addresses
    and differs from run to run: a replay or a shrink candidate would take other blocks
    than the run it repeats. Equality stays identity, so a set or dict the manager
    builds holds exactly what it held before (a GPU and a CPU block of one number
    merely share a hash bucket)."""
    if block_cls.__dict__.get("__hash__") is not _by_number:
        block_cls.__hash__ = _by_number


def _copies(result) -> list[tuple[int, int]]:
    """An append's copy-on-write as ``(src, dst)`` pairs: ``append_slot``'s pair or None
    (0.3.3, 0.4.0), ``append_slots``' ``{src: [dst]}`` (0.4.1, 0.4.2) or list of pairs
    (0.4.3 on)."""
    if not result:
        return []
    if isinstance(result, dict):
        return [(src, dst) for src, dsts in result.items() for dst in dsts]
    if isinstance(result, tuple):
        return [result]
    return [tuple(pair) for pair in result]


class EngineRefused(Refused):
    """``can_append_slot`` said no: the scheduler would preempt, not append."""


class VllmV0LegacyTarget:
    """``Target`` over vLLM's ``BlockSpaceManager`` v1 with a cyclic sliding window (see
    the module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "fork", "free_seq"})

    def __init__(self, num_blocks: int, block_size: int, window_blocks: int = 2,
                 version: str | None = None, engine: str = ENGINE_KEY):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        if type(window_blocks) is not int or window_blocks < 1:
            raise MisuseError(f"the window must be at least one block, got {window_blocks!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window_blocks = window_blocks
        self.cyclic_window = window_blocks * block_size  # tokens: vLLM's sliding_window
        mods = load(version, engine)  # not kept: the module table is shared, never copied
        self.version = mods.dist.version
        block = "aphrodite.common.block" if engine == APHRODITE_KEY else "vllm.block"
        deterministic_hash(mods[block].PhysicalTokenBlock)
        self.manager = manager_class(mods)(block_size, num_blocks, 0, watermark=0.0,
                                           sliding_window=self.cyclic_window)
        gpu = self.manager.gpu_allocator
        # Every block the allocator has made, by number: all of them at construction
        # (a free_blocks list), or, in aphrodite 0.5.x's allocator, each when first handed
        # out (current_num_blocks; a freed one waits in its evictor), noted after each call.
        self._lazy = not hasattr(gpu, "free_blocks")
        self._made: dict[int, Any] = {} if self._lazy else {
            b.block_number: b for b in gpu.free_blocks}
        assert self._lazy or sorted(self._made) == list(range(num_blocks))
        self.seqs: dict[int, Seq] = {}

    # -- the engine's calls ----------------------------------------------------------
    def _live(self, seq: int) -> Seq:
        s = self.seqs.get(seq)
        if s is None:
            raise MisuseError(f"sequence {seq} is not live")
        return s

    def allocate(self, seq: int, n_tokens: int) -> None:
        if seq in self.seqs:
            raise MisuseError(f"sequence {seq} is already live")
        if n_tokens < 1:
            raise MisuseError("a prompt has at least one token")
        s = Seq(seq, n_tokens, self.block_size)
        group = Group(s)
        status = self.manager.can_allocate(group)
        if status.name != "OK":
            raise OutOfBlocks(f"can_allocate: {status.name}")
        self.manager.allocate(group)
        s.status = SequenceStatus.RUNNING
        self.seqs[seq] = s
        self._note(seq)

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        s = self._live(seq)
        m = self.manager
        can = getattr(m, "can_append_slot", None) or m.can_append_slots  # (renamed in 0.4.1)
        if not can(Group(s)):
            raise EngineRefused("can_append_slot: no free block for the group")
        table = self.manager.block_tables[seq]
        grows = len(table) < -(-(s.n_tokens + 1) // self.block_size)
        wraps = grows and len(table) >= self.window_blocks
        s.n_tokens += 1
        try:
            copies = _copies(m.append_slot(s) if hasattr(m, "append_slot") else m.append_slots(s))
        except BaseException:
            s.n_tokens -= 1
            raise
        table = self.manager.block_tables[seq]
        self._note(seq)
        offset = (s.n_tokens - 1) % self.block_size
        if wraps:  # (the copy of the block leaving the window: see the module docstring)
            copies = []
        if len(copies) > 1:
            raise RuntimeError(f"append_slot returned {len(copies)} copies: {copies}")
        return table[-1].block_number, offset, copies[0][0] if copies else None

    def fork(self, parent: int, child: int) -> None:
        p = self._live(parent)
        if child in self.seqs:
            raise MisuseError(f"sequence {child} is already live")
        c = Seq(child, p.n_tokens, self.block_size)
        c.status = SequenceStatus.RUNNING
        self.manager.fork(p, c)
        self.seqs[child] = c

    def free_seq(self, seq: int) -> None:
        s = self._live(seq)
        del self.seqs[seq]  # (the scheduler drops a finished sequence whatever free does)
        s.status = SequenceStatus.FINISHED_STOPPED
        self.manager.free(s)

    def _note(self, seq: int) -> None:
        """Remember the blocks ``seq``'s table names (a lazy allocator's new ones)."""
        if self._lazy:
            made = self._made
            for b in self.manager.block_tables[seq]:
                made.setdefault(b.block_number, b)

    # -- observation -----------------------------------------------------------------
    def block_table(self, seq: int) -> list[int]:
        table = self.manager.block_tables[seq]
        live = len(table) - self.window_blocks
        return [NULL if i < live else b.block_number for i, b in enumerate(table)]

    def hidden_table(self, seq: int) -> list[int]:
        """The table as the engine holds it, stale names included: later appends read
        them (``block_table[len % W]``, F10), so exploration must not merge states that
        differ only there."""
        return [b.block_number for b in self.manager.block_tables[seq]]

    def refcount(self, block: int) -> int:
        b = self._made.get(block)
        return 0 if b is None else b.ref_count  # (a block not made yet: free, no holder)

    def refcounts(self) -> list[int]:
        made = self._made
        return [0 if made.get(i) is None else made[i].ref_count for i in range(self.num_blocks)]

    def free_blocks(self) -> list[int]:
        gpu = self.manager.gpu_allocator
        if not self._lazy:
            return [b.block_number for b in gpu.free_blocks]
        # (the numbers not made yet, which allocate_block hands out next, and the evictor's)
        return [*range(gpu.current_num_blocks, gpu.num_blocks),
                *(b.block_number for b in gpu.evictor.free_table.values())]

    def num_free(self) -> int:
        return self.manager.get_num_free_gpu_blocks()

    def table_identity(self, seq: int) -> object:
        return self.manager.block_tables.get(seq)

    def seq_len(self, seq: int) -> int | None:
        return None  # (the manager keeps no count: it reads the Sequence's logical blocks)

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)

    def is_refusal(self, exc: BaseException) -> bool:
        return isinstance(exc, EngineRefused)


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0LegacyTarget:
    """A window of two blocks (``sliding_window = 2 * block_size``)."""
    return VllmV0LegacyTarget(num_blocks, block_size, 2, version)


def make_window(num_blocks: int, block_size: int, window_blocks: int,
                version: str | None = None) -> VllmV0LegacyTarget:
    return VllmV0LegacyTarget(num_blocks, block_size, window_blocks, version)


def make_one_block(num_blocks: int, block_size: int,
                   version: str | None = None) -> VllmV0LegacyTarget:
    """A window of one block (``sliding_window = block_size``): the shape of #1556's raw
    replay, where every boundary append reuses the table's one block."""
    return VllmV0LegacyTarget(num_blocks, block_size, 1, version)
