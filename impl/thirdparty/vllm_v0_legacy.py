"""vLLM's BlockSpaceManager v1 (0.3.3 .. 0.4.0), loaded for raw replays -- no ``Target`` yet.

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

Why there is no ``Target`` adapter yet: the spec's contracts describe an
allocation taking ``ceil(n / B)`` distinct free blocks and an append taking a free
block at a boundary; a cyclic window allocates ``min(ceil(n / B), W)`` blocks and at
a boundary past ``W`` reuses ``block_table[len % W]`` in place (benchmarks/historical/catalogue.json, vllm-1556;
docs/findings.md F10).
"""

from __future__ import annotations

import enum
import types
from typing import Any

from . import _loader, install
from ._loader import Loaded

ENGINE_KEY = "vllm-v0-legacy"


def _stub_utils(mod: types.ModuleType, _: Loaded) -> None:
    class Device(enum.Enum):
        GPU = enum.auto()
        CPU = enum.auto()

    mod.Device = Device


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
        files += ["vllm.core.interfaces", "vllm.core.evictor"]
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
        return list(range(-(-self.n_tokens // self.block_size)))

    @property
    def n_blocks(self) -> int:  # aphrodite 0.6.x's block_manager_v1 counts blocks so
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

    def is_encoder_decoder(self) -> bool:  # aphrodite 0.6.x asks (decoder-only here)
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
