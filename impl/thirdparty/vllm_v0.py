"""Adapter: vLLM v0 ``BlockTable`` + block allocators (vllm 0.4.2 .. 0.9.2) as a ``Target``.

Releases: block manager v2 (``vllm/core/block/``) from 0.4.2, its first, to 0.8.5, the
last with the v0 engine; 0.8.5 by default (``vllm-v0@VERSION`` for another, installed by
``kvcheck install vllm-v0==VERSION``; the vLLM of this environment when it is in range,
see ``install.select``). What moved between releases is detected by what the files
have, not by the version string: the evictor module (``evictor_v2.py`` to 0.5.x), the
copy-on-write record (a ``{src: [dst]}`` dict before 0.5.0, ``(src, dst)`` pairs after),
``append_token_ids``' ``num_computed_slots`` (0.6 on) and ``mark_blocks_as_computed``
(raises in the releases that track computed blocks incrementally). What runs is its own
code, executed from the wheel's files (see ``_loader``):
``vllm/core/block/{block_table, common, interfaces, naive_block,
prefix_caching_block, cpu_gpu_block_allocator}.py`` and ``vllm/core/evictor.py``.
The allocator is built exactly as ``SelfAttnBlockSpaceManager`` builds it:
``CpuGpuBlockAllocator.create(allocator_type, num_gpu_blocks, num_cpu_blocks=0,
block_size)`` with ``"naive"`` (``make``) or ``"prefix_caching"``
(``make_prefix``); each sequence gets a ``BlockTable(block_size, allocator)``.

Stand-ins (every other ``vllm.*`` import raises, see ``_loader``):

``vllm.utils``
    ``Device`` (an enum with members ``GPU``, ``CPU``), ``cdiv`` (ceiling
    division) and ``chunk_list`` (consecutive slices, as a list) -- the three names the
    block modules import; the real module imports torch and much of the engine.
    They are re-implemented here, not copied, with the same results.
``vllm.platforms``
    ``current_platform.is_hpu()`` returns ``False``: ``CpuGpuBlockAllocator``
    reserves block 0 only on Intel Gaudi (HPU); we model CUDA, as vLLM does on
    a GPU.
``vllm.logger``
    ``init_logger`` returns a stdlib logger.
``vllm.sequence``
    ``Sequence`` is only an annotation; ``ComputedBlocksTracker`` reads a
    sequence's ``seq_id``, ``get_token_ids()``, ``extra_hash()`` (``None``: no
    LoRA or multimodal inputs) and ``is_prefill()``, which ``_TrackedSeq``
    provides for a prompt being admitted.

Operations, as ``SelfAttnBlockSpaceManager`` drives the tables:

``allocate(seq, n)``
    ``BlockTable.allocate(token_ids)`` with ``n`` fresh token ids (or the
    caller's ``token_ids``). With prefix caching it returns the engine's
    cached-token count, the prompt tokens whose prefill the engine skips:
    first, as the scheduler does before it allocates
    (``Scheduler._get_num_new_uncached_and_cached_tokens`` ->
    ``SelfAttnBlockSpaceManager.get_num_cached_tokens``), v0's own
    ``ComputedBlocksTracker.get_num_cached_tokens`` on the prompt (the leading
    full blocks whose hash is cached *and* computed, ``block_is_computed``:
    active and marked computed, or in the evictor); after the allocation the
    computed block ids are the table's first ``count / bs`` blocks
    (``get_common_computed_block_ids`` of a one-sequence group), and the model
    runner skips their tokens, all but the last token on a full hit
    (``ModelInputForGPUBuilder._compute_for_prefix_cache_hit``: "Full hit. Only
    compute the last token"; the runner imports torch, so that one rule is
    restated here). The naive allocator reports nothing (``None``).
``append_slot(seq)``
    one decode token: ``BlockTable.append_token_ids([tok])`` (what
    ``append_slots`` does with the one unseen token, no lookahead), then
    ``allocator.clear_copy_on_writes()`` -- the ``CopyOnWriteTracker``'s record
    of ``(src, dst)`` pairs that the engine hands to the cache engine as
    ``blocks_to_copy``. The slot of token ``L`` is ``(table[L // bs], L % bs)``;
    ``cow_src`` is the ``src`` of the recorded pair (at most one per append).
``append_slots(seq, n, lookahead)``
    ``SelfAttnBlockSpaceManager.append_slots(seq, num_lookahead_slots)`` on a
    sequence with ``n`` unseen tokens (a chunk of a chunked prefill, or the
    tokens a multi-step / speculative step produced):
    ``BlockTable.append_token_ids(tokens, num_lookahead_slots=lookahead,
    num_computed_slots=...)`` then ``allocator.clear_copy_on_writes()``, whose
    ``(src, dst)`` pairs are returned as the copies (the engine's
    ``blocks_to_copy``). Lookahead slots stay empty in the table's last blocks
    (the tokens of the next append land in them).
``fork(parent, child)``
    ``BlockTable.fork()``: lazy, every block shared (``copies`` = ``[]``); the
    first write into a shared block copies it (``CopyOnWriteTracker``).
``free_seq(seq)``
    ``BlockTable.free()``.
``preempt(seq)``
    preemption by recompute (``Scheduler._preempt_by_recompute``):
    ``free_seq`` of the sequence (``BlockTable.free()``), its token ids kept;
    re-admission is ``allocate(seq, n)`` of the same sequence with ``n`` its
    token count, which re-allocates exactly those token ids (the prefix-caching
    allocator may serve them from its own freed, evictable blocks). v0 preempts
    by recompute only a group with one running sequence (a group of several is
    swapped out), so the adapter ``admits`` a preemption only of a sequence with
    no live fork relative (parent, child or sibling).
``rollback``, ``rebase``
    not supported: v0's ``BlockTable`` has no way to drop tokens (speculative
    decoding keeps drafts in lookahead slots, which are not tokens, and appends
    only the accepted ones), and 0.8.5 has no beam search in the engine (it runs
    as separate requests in the frontend). ``capabilities`` excludes them.

Out-of-blocks. The allocators raise ``BlockAllocator.NoFreeBlocksError``; the
adapter re-raises it as ``OutOfBlocks`` and does *not* pre-check: the capacity
checks live in the engine's caller (``SelfAttnBlockSpaceManager.can_allocate``
/ ``can_append_slots``), not in the allocator or the table, so an unguarded
call shows what the allocator itself does when it runs dry.

Deliberate refusals (``guard="engine"``: ``make_guarded`` /
``make_prefix_guarded``). The guarded factories first run the caller's checks,
written after ``SelfAttnBlockSpaceManager``: allocate only if
``BlockTable.get_num_required_blocks(tokens, bs) <= free`` (``can_allocate``
with watermark 0: the default watermark of 0.01 gives ``int(0.01 * N) = 0``
blocks below 100 GPU blocks), append (``append_slot`` / ``append_slots``) only if
``BlockTable.get_num_blocks_touched_by_append_slots(tokens, lookahead) <= free``
(``can_append_slots``). When a check says no the allocator is not called and
the adapter raises ``EngineGuardRefused``, which ``is_refusal`` recognises: a
refusal under a declared policy (the spec's ``refused`` outcome), which may
come although blocks are free but must change nothing. That is what
``can_append_slots`` is: vLLM's own docstring calls it "a worst-case heuristic:
assume each touched block will require a new allocation", so it refuses an
append that writes in place into a private partial tail, or into a reserved
lookahead slot the sequence already holds, when no block is free (formerly
finding F3, now documented as a policy refusal in ``docs/findings.md``). The
scheduler then defers or preempts the group instead of calling the allocator.
With watermark 0 ``can_allocate`` is exact (it refuses only when fewer than
``ceil(n / bs)`` blocks are free, the spec's out-of-blocks condition), but it
is the same caller-side policy and is signalled the same way. Behind the guard
the allocator never runs dry, so ``NoFreeBlocksError`` (still ``OutOfBlocks``)
does not occur on the guarded targets; F1, F2 and F6 are unreachable there.

Observation: ``block_table`` = ``BlockTable.physical_block_ids``; ``refcount`` =
the allocator's ``RefCounter``; ``free_blocks`` = the naive free deque plus, with
prefix caching, the evictor's cached-but-unreferenced blocks (both are what
``get_num_free_blocks`` counts); ``table_identity`` = the ``BlockTable``;
``seq_len`` = ``BlockTable.num_full_slots``; the prefix cache (prefix caching only):
``cache_entries`` = the allocator's ``_cached_blocks``, ``evictable_blocks`` = its
evictor's ``free_table``, ``free_list_blocks`` = the hashless allocator's free deque.
"""

from __future__ import annotations

import enum
import itertools
import types
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks, Refused
from . import _loader, install
from ._loader import Loaded, takes

FILES = (
    "vllm.core.block.block_table",
    "vllm.core.block.common",
    "vllm.core.block.interfaces",
    "vllm.core.block.naive_block",
    "vllm.core.block.prefix_caching_block",
    "vllm.core.block.cpu_gpu_block_allocator",
    "vllm.core.evictor",
)


def _stub_utils(mod: types.ModuleType, _: Loaded) -> None:
    class Device(enum.Enum):
        GPU = enum.auto()
        CPU = enum.auto()

    def cdiv(a: int, b: int) -> int:
        return (a + b - 1) // b

    def chunk_list(items: list, size: int) -> list:
        # a list: 0.4.x-0.5.x concatenate its result to a list; 0.6 on iterate it
        return [items[start : start + size] for start in range(0, len(items), size)]

    mod.Device = Device
    mod.cdiv = cdiv
    mod.chunk_list = chunk_list


def _stub_platforms(mod: types.ModuleType, _: Loaded) -> None:
    class _CudaLike:
        def is_hpu(self) -> bool:
            return False

    mod.current_platform = _CudaLike()


def _stub_sequence(mod: types.ModuleType, _: Loaded) -> None:
    class Sequence:  # annotation only
        pass

    mod.Sequence = Sequence


STUBS = {
    "vllm.utils": _stub_utils,
    "vllm.platforms": _stub_platforms,
    "vllm.logger": _loader.stub_logger,
    "vllm.sequence": _stub_sequence,
}


ENGINE_KEY = "vllm-v0"  # its row in install.ENGINES: the releases this adapter loads


def _aphrodite_name(name: str) -> str:
    """vLLM's v0 module name -> aphrodite-engine's (0.6.x: ``aphrodite/processing/`` holds
    ``vllm/core/``, ``aphrodite/common/`` holds ``vllm/{utils, sequence, logger, config,
    sampling_params, pooling_params}.py``; the other packages keep their names under
    ``aphrodite``: ``inputs``, ``lora``, ``multimodal``, ...)."""
    for old, new in (("vllm.core.", "aphrodite.processing."),
                     ("vllm.utils", "aphrodite.common.utils"),
                     ("vllm.sequence", "aphrodite.common.sequence"),
                     ("vllm.logger", "aphrodite.common.logger"),
                     ("vllm.config", "aphrodite.common.config"),
                     ("vllm.sampling_params", "aphrodite.common.sampling_params"),
                     ("vllm.pooling_params", "aphrodite.common.pooling_params"),
                     ("vllm.", "aphrodite.")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


LAYOUTS = {  # engine key -> its module names, from vLLM's (the names the adapter uses)
    ENGINE_KEY: None,
    "aphrodite-v0": _aphrodite_name,
    "vllm-v0-legacy": None,  # (vllm_v0_engine_v1 on 0.4.0, 0.4.1: the releases of that row)
}


class Modules:
    """A load's modules under vLLM's names (``mods["vllm.core.block.block_table"]``), for an
    engine whose files carry vLLM's v0 block manager under other module names (a fork's
    layout, ``LAYOUTS``); the files are the fork's own, executed as they are."""

    def __init__(self, loaded: Loaded, rename):
        self.loaded, self.rename, self.dist = loaded, rename, loaded.dist

    def __getitem__(self, name: str):
        return self.loaded[self.rename(name)]

    def __getattr__(self, attr: str):  # root, modules, ...: the load's own
        return getattr(self.loaded, attr)


def files(root, engine: str = ENGINE_KEY) -> tuple[str, ...]:
    """The module files to execute, by what the release has: the evictor module is
    ``vllm/core/evictor_v2.py`` up to 0.5.x (beside the v1 block manager's
    ``evictor_v1.py``), ``vllm/core/evictor.py`` from 0.6.0 (vLLM's names; a fork's own
    under ``LAYOUTS``)."""
    rename = LAYOUTS[engine] or (lambda n: n)
    has = (root / rename("vllm.core.evictor").replace(".", "/")).with_suffix(".py").is_file()
    evictor = "vllm.core.evictor" if has else "vllm.core.evictor_v2"
    return tuple(rename(f) for f in (*FILES[:-1], evictor))


def stubs(engine: str = ENGINE_KEY) -> dict:
    """``STUBS`` under the engine's module names."""
    rename = LAYOUTS[engine] or (lambda n: n)
    return {rename(k): v for k, v in STUBS.items()}


def load(version: str | None = None, engine: str = ENGINE_KEY):
    """vLLM's v0 block modules at ``version`` (see ``install.select``: default the vLLM
    installed in this environment if it is in range, else 0.8.5); ``ThirdPartyMissing``
    if not installed. ``engine``: another row of ``install.ENGINES`` whose releases carry
    these modules under a fork's names (``LAYOUTS``: aphrodite-engine 0.6.x); its modules
    are then returned under vLLM's names (``Modules``)."""
    if engine not in LAYOUTS:
        raise ValueError(f"no v0 module layout for engine {engine!r}")
    dist = install.select(engine, version)
    root = _loader.require(dist)
    rename = LAYOUTS[engine]
    if rename is None:
        return _loader.load(
            dist, files(root), STUBS,
            entry=("vllm.core.block.block_table", "vllm.core.block.cpu_gpu_block_allocator"),
        )
    entry = tuple(rename(n) for n in ("vllm.core.block.block_table",
                                      "vllm.core.block.cpu_gpu_block_allocator"))
    return Modules(_loader.load(dist, files(root, engine), stubs(engine), entry=entry), rename)


def build_allocator(num_blocks: int, block_size: int, allocator_type: str = "naive",
                    mods: Loaded | None = None):
    """A real ``CpuGpuBlockAllocator`` with ``num_blocks`` GPU blocks and no CPU blocks."""
    mods = mods or load()
    return mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type=allocator_type,
        num_gpu_blocks=num_blocks,
        num_cpu_blocks=0,
        block_size=block_size,
    )


def gpu_allocator(allocator: Any, mods: Loaded | None = None) -> Any:
    """The GPU ``NaiveBlockAllocator`` / ``PrefixCachingBlockAllocator`` inside."""
    mods = mods or load()
    return allocator._allocators[mods["vllm.utils"].Device.GPU]


def free_block_ids(gpu: Any) -> list[int]:
    """Every id the allocator can hand out next, with multiplicity."""
    naive = getattr(gpu, "_hashless_allocator", gpu)
    free = list(naive._free_block_indices)
    evictor = getattr(gpu, "evictor", None)
    if evictor is not None:
        free += list(evictor.free_table)
    return free


def copy_pairs(cows: Any) -> list[tuple[int, int]]:
    """``clear_copy_on_writes()`` as ``(src, dst)`` pairs: a list of pairs from 0.5.0, a
    ``{src: [dst, ...]}`` dict before."""
    if isinstance(cows, dict):
        return [(src, dst) for src, dsts in cows.items() for dst in dsts]
    return [(src, dst) for src, dst in cows]


def _function(method: Any) -> Any:
    """A bound method's function (one object for every call; ``_loader.takes`` caches by it)."""
    return getattr(method, "__func__", method)


def append_tokens(table: Any, tokens: list[int], lookahead: int = 0) -> None:
    """``BlockTable.append_token_ids`` as ``SelfAttnBlockSpaceManager.append_slots`` calls
    it: with ``num_computed_slots`` where the release has that parameter (0.6.x on)."""
    if takes(_function(table.append_token_ids), "num_computed_slots"):
        table.append_token_ids(tokens, num_lookahead_slots=lookahead,
                               num_computed_slots=table.num_full_slots)
    else:
        table.append_token_ids(tokens, num_lookahead_slots=lookahead)


class _TrackedSeq:
    """What v0's ``ComputedBlocksTracker`` reads of a ``Sequence`` being admitted."""

    def __init__(self, seq_id: int, tokens: list[int]):
        self.seq_id = seq_id
        self._tokens = tokens

    def get_token_ids(self) -> list[int]:
        return self._tokens

    def extra_hash(self) -> None:
        return None

    def is_prefill(self) -> bool:
        return True


def runner_skips(computed_blocks: int, n_tokens: int, block_size: int) -> int:
    """The prompt tokens v0's model runner skips given its computed blocks
    (``_compute_for_prefix_cache_hit``: a partial hit skips the blocks' tokens, a full
    hit computes only the last token)."""
    cached = computed_blocks * block_size
    return cached if cached < n_tokens else n_tokens - 1


class EngineGuardRefused(Refused):
    """The engine's caller check (``guard="engine"``: ``can_allocate`` /
    ``can_append_slots``) declined the operation; the allocator was not called."""


class VllmV0Target:
    """``Target`` over vLLM v0 ``BlockTable``s on a real allocator (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "fork", "free_seq", "append_slots",
                              "preempt"})
    # On a full hit the runner recomputes the prompt's last token into the cached last
    # block the table shares (the same KV): a position the prefill computes may name the
    # cached block holding that very prefix (``spec.prefix.unwritten``'s ``twins``).
    writes_cached_twins = True

    def __init__(self, num_blocks: int, block_size: int, allocator_type: str = "naive",
                 guard: str | None = None, version: str | None = None,
                 engine: str = ENGINE_KEY, prefill_chunk: int | None = None):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise MisuseError(f"prefill_chunk must be positive, got {prefill_chunk!r}")
        # chunked prefill (make_chunked): a prompt longer than this many tokens is
        # prefilled in chunks; see _prefill_chunks
        self.prefill_chunk = prefill_chunk
        if guard not in (None, "engine"):
            raise ValueError(f"guard must be None or 'engine', got {guard!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.guard = guard
        mods = load(version, engine)  # not kept: the module table is shared, never copied
        self.engine = engine  # the install.ENGINES row whose files run (a fork's: LAYOUTS)
        self.version = mods.dist.version
        self._gpu = mods["vllm.utils"].Device.GPU
        self._BlockTable = mods["vllm.core.block.block_table"].BlockTable
        self._NoFree = mods["vllm.core.block.interfaces"].BlockAllocator.NoFreeBlocksError
        self.allocator = build_allocator(num_blocks, block_size, allocator_type, mods)
        self.gpu = gpu_allocator(self.allocator, mods)
        self.tables: dict[int, Any] = {}
        self.tokens: dict[int, list[int]] = {}  # seq -> its token ids
        self.group: dict[int, int] = {}  # seq -> its sequence group (fork relatives share one)
        self.preempted: dict[int, list[int]] = {}  # preempted seq -> its token ids
        self._tokens = itertools.count(1)
        self._caching = allocator_type == "prefix_caching"
        if not (hasattr(self.gpu, "_cached_blocks") and hasattr(self.gpu, "evictor")):
            # no prefix cache to observe (a naive allocator): the prefix model refuses it
            self.cache_entries = self.evictable_blocks = self.free_list_blocks = None
            self.num_evictable = None
        # the engine's skip-prefill state (prefix caching only): SelfAttnBlockSpaceManager's
        # ComputedBlocksTracker, whose shape moved between releases (see _cached_count)
        tracker = getattr(mods["vllm.core.block.prefix_caching_block"], "ComputedBlocksTracker",
                          None) if self._caching else None
        self._counts = None if not self._caching else (
            "tokens" if hasattr(tracker, "get_num_cached_tokens") else  # 0.6.5 on
            "blocks" if tracker is not None else  # 0.5.1 .. 0.6.4
            "allocator")  # 0.4.x .. 0.5.0: the allocator walks the table itself
        self._computed = (tracker(self.allocator, block_size, True) if self._counts == "tokens"
                          else tracker(self.allocator) if self._counts == "blocks" else None)
        self._tracked: set[int] = set()  # sequences the tracker holds a record of
        self._clock = 0.0  # logical time for the engine's access marks (deterministic)
        self._marks_computed = True  # the release's engine calls mark_blocks_as_computed

    # -- operations ---------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int | None:
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        again = self.preempted.get(seq)
        if token_ids is None and again is not None and len(again) == n_tokens:
            token_ids = again  # re-admitted for recompute: prompt plus everything generated
        tokens = list(token_ids) if token_ids is not None else [
            next(self._tokens) for _ in range(n_tokens)
        ]
        if len(tokens) != n_tokens:
            raise MisuseError("len(token_ids) != n_tokens")
        if self.guard == "engine":
            need = self._required_blocks(tokens)
            free = self.allocator.get_num_free_blocks(self._gpu_device())
            if need > free:
                raise EngineGuardRefused(f"can_allocate: {need} blocks required > {free} free")
        cached = None
        if self._counts == "tokens":  # the scheduler's count, taken before it allocates
            cached = self._computed.get_num_cached_tokens(_TrackedSeq(seq, tokens))
            self._tracked.add(seq)
        table = self._new_table()
        try:
            table.allocate(tokens)
            self._prefill_chunks(table, n_tokens)
        except self._NoFree as exc:
            self._untrack(seq)
            raise OutOfBlocks(f"vLLM v0 NoFreeBlocksError allocating {n_tokens} tokens") from exc
        except BaseException:
            self._untrack(seq)
            raise
        self.preempted.pop(seq, None)
        self.tables[seq] = table
        self.tokens[seq] = tokens
        self.group[seq] = seq
        if self._counts is None:
            self._engine_step()
            return None
        computed = self._computed_blocks(seq, table, cached)  # before the step's marks
        self._engine_step()
        return runner_skips(len(computed), n_tokens, self.block_size)

    def _prefill_chunks(self, table: Any, n_tokens: int) -> None:
        """Chunked prefill (``prefill_chunk``): the scheduler allocates the whole prompt
        when it schedules its first chunk (``BlockSpaceManagerV2.allocate``); every later
        chunk's step calls ``append_slots(seq, num_lookahead_slots=0)``, which appends the
        prompt's unseen tokens -- none: the table holds them all -- that is
        ``BlockTable.append_token_ids([], num_lookahead_slots=0,
        num_computed_slots=tokens computed so far)``. The chunks are ``prefill_chunk``
        tokens; the spec's ``allocate`` is the whole composite (nothing may change but
        the allocation). vLLM 0.5.1 .. 0.5.4 (and aphrodite-engine 0.6.0 .. 0.6.0.post1)
        raise ``IndexError`` there when the prompt fills its last block (vLLM #7371,
        PR #7380; benchmarks/historical, vllm-7380)."""
        chunk = self.prefill_chunk
        if chunk is None:
            return
        computed_kw = takes(_function(table.append_token_ids), "num_computed_slots")
        for computed in range(chunk, n_tokens, chunk):  # (0.4.2 has no num_computed_slots)
            extra = {"num_computed_slots": computed} if computed_kw else {}
            table.append_token_ids([], num_lookahead_slots=0, **extra)
        self.allocator.clear_copy_on_writes()

    def _computed_blocks(self, seq: int, table: Any, cached: int | None) -> list[int]:
        """The computed block ids of a one-sequence group, as the release's
        ``SelfAttnBlockSpaceManager.get_common_computed_block_ids`` derives them when the
        scheduler schedules the prompt (before the step's forward pass and its
        ``mark_blocks_as_computed``): from 0.6.5 the table's first ``cached / bs`` blocks
        (``ComputedBlocksTracker.get_num_cached_tokens``); 0.5.1 .. 0.6.4 the tracker's
        ``get_cached_computed_blocks_and_update`` then the allocator's
        ``get_common_computed_block_ids``; 0.4.x .. 0.5.0 the allocator's
        ``get_common_computed_block_ids([block_ids])``, which walks the table itself."""
        ids = table.physical_block_ids
        if self._counts == "tokens":
            return ids[: cached // self.block_size]
        if self._counts == "blocks":
            self._computed.add_seq(seq)
            self._tracked.add(seq)
            ids = self._computed.get_cached_computed_blocks_and_update(seq, ids)
        return list(self.allocator.get_common_computed_block_ids([ids]))

    def _untrack(self, seq: int) -> None:
        """The engine forgets a sequence's computed-blocks record when it frees it."""
        if seq in self._tracked:
            self._tracked.discard(seq)
            self._computed.remove_seq(seq)

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        table = self._live(seq)
        length = table.num_full_slots
        tok = next(self._tokens) if token_id is None else token_id
        if self.guard == "engine":
            touched = table.get_num_blocks_touched_by_append_slots([tok], 0)
            free = self.allocator.get_num_free_blocks(self._gpu_device())
            if touched > free:  # SelfAttnBlockSpaceManager.can_append_slots
                raise EngineGuardRefused(f"can_append_slots: {touched} block(s) touched > "
                                         f"{free} free")
        try:
            append_tokens(table, [tok])  # num_computed_slots=length where it exists (a window reads it)
        except self._NoFree as exc:
            raise OutOfBlocks("vLLM v0 NoFreeBlocksError appending one token") from exc
        finally:
            cows = copy_pairs(self.allocator.clear_copy_on_writes())
        assert len(cows) <= 1, cows
        self.tokens[seq].append(tok)
        ids = table.physical_block_ids
        self._engine_step()
        return ids[length // self.block_size], length % self.block_size, (
            cows[0][0] if cows else None
        )

    def _new_table(self) -> Any:
        """A sequence's table, as ``SelfAttnBlockSpaceManager._allocate_sequence`` builds it."""
        return self._BlockTable(self.block_size, self.allocator)

    def _required_blocks(self, tokens: list[int]) -> int:
        """The blocks ``can_allocate`` asks for (watermark 0)."""
        return self._BlockTable.get_num_required_blocks(tokens, self.block_size)

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0) -> list[tuple[int, int]]:
        """``SelfAttnBlockSpaceManager.append_slots`` with ``n_tokens`` unseen tokens."""
        table = self._live(seq)
        if n_tokens < 1 or lookahead < 0:
            raise MisuseError(f"append_slots({n_tokens}, {lookahead}): bad counts")
        toks = [next(self._tokens) for _ in range(n_tokens)]
        if self.guard == "engine":  # SelfAttnBlockSpaceManager.can_append_slots
            touched = table.get_num_blocks_touched_by_append_slots(toks, lookahead)
            free = self.allocator.get_num_free_blocks(self._gpu_device())
            if touched > free:
                raise EngineGuardRefused(f"can_append_slots: {touched} block(s) touched > "
                                         f"{free} free")
        try:
            append_tokens(table, toks, lookahead)
        except self._NoFree as exc:
            raise OutOfBlocks(f"vLLM v0 NoFreeBlocksError appending {n_tokens} tokens and "
                              f"{lookahead} lookahead slots") from exc
        finally:
            cows = copy_pairs(self.allocator.clear_copy_on_writes())
        self.tokens[seq].extend(toks)
        self._engine_step()
        return [(src, dst) for src, dst in cows]

    def fork(self, parent: int, child: int) -> None:
        table = self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        self.tables[child] = table.fork()
        self.tokens[child] = list(self.tokens[parent])
        self.group[child] = self.group[parent]
        self._engine_step()

    def free_seq(self, seq: int) -> None:
        table = self._live(seq)
        table.free()
        del self.tables[seq]
        del self.group[seq]
        self.tokens.pop(seq)
        self._untrack(seq)
        self._engine_step()

    def admits(self, op) -> bool:
        """A preemption by recompute only of a sequence alone in its group (v0 swaps a
        group of several out instead); every other operation its precondition allows."""
        if op.kind == "preempt":
            g = self.group.get(op.seq)
            return sum(1 for h in self.group.values() if h == g) == 1
        return True

    def preempt(self, seq: int) -> None:
        """Preemption by recompute: the sequence is freed, its token ids kept to re-admit."""
        self._live(seq)
        tokens = self.tokens[seq]
        self.free_seq(seq)
        self.preempted[seq] = tokens

    def _engine_step(self) -> None:
        """The prefix-caching bookkeeping v0's engine does every scheduler step
        (``SelfAttnBlockSpaceManager.access_all_blocks_in_seq`` and
        ``mark_blocks_as_computed``), once per operation: every live sequence's
        blocks are marked accessed at a logical clock, the touched blocks computed.
        v0's LRU evictor tells stale entries apart by their access time, so
        without it eviction returns stale hashes and trips its own assertion."""
        if not self._caching:
            return
        self._clock += 1.0
        for table in self.tables.values():
            self.allocator.mark_blocks_as_accessed(table.physical_block_ids, self._clock)
        if self._marks_computed:
            try:
                self.allocator.mark_blocks_as_computed([])
            except NotImplementedError:
                # 0.5.1 .. 0.6.x track computed blocks incrementally: their allocator's
                # mark_blocks_as_computed raises, and their block manager never calls it
                self._marks_computed = False

    def _live(self, seq: int) -> Any:
        table = self.tables.get(seq)
        if table is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return table

    def _gpu_device(self) -> Any:
        return self._gpu

    def _observed(self, seq: int):
        """Observation of an unknown sequence raises ``KeyError`` (the oracle's "no table")."""
        return self.tables[seq]

    # -- observation --------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        return list(self._observed(seq).physical_block_ids)

    def refcount(self, block: int) -> int:
        return self.gpu._refcounter.get(block)

    def free_blocks(self) -> Iterable[int]:
        return free_block_ids(self.gpu)

    def num_free(self) -> int:
        return self.allocator.get_num_free_blocks(self._gpu_device())

    def table_identity(self, seq: int) -> object | None:
        return self._observed(seq)

    def seq_len(self, seq: int) -> int | None:
        return self._observed(seq).num_full_slots

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        """The allocator's own ``NoFreeBlocksError`` (re-raised as ``OutOfBlocks``)."""
        return isinstance(exc, OutOfBlocks)

    def is_refusal(self, exc: BaseException) -> bool:
        """The engine guard's refusal (``guard="engine"`` only raises it)."""
        return isinstance(exc, EngineGuardRefused)

    # the prefix cache, as the prefix model reads any target (``kvcheck.engines``): the
    # prefix-caching allocator's hash map, its evictor and its hashless allocator's free
    # deque; a naive allocator has no cache (``__init__`` leaves these methods out)
    def cache_entries(self) -> list[tuple[Any, int]]:
        return [(key, int(b)) for key, b in self.gpu._cached_blocks.items()]

    def evictable_blocks(self) -> list[int]:
        return [int(b) for b in self.gpu.evictor.free_table]

    def num_evictable(self) -> int:
        return int(self.gpu.evictor.num_blocks)

    def free_list_blocks(self) -> list[int]:
        return [int(b) for b in self.gpu._hashless_allocator._free_block_indices]


class VllmV0WaitingTarget(VllmV0Target):
    """``make_prefix_guarded`` with the scheduler's order of the cached-token count and the
    admission (0.6.5 on): ``Scheduler._schedule_prefills`` takes the count
    (``_get_num_new_uncached_and_cached_tokens`` -> ``get_num_cached_tokens``) *before*
    ``can_allocate``; a group ``can_allocate`` answers LATER stays waiting, and
    ``ComputedBlocksTracker`` keeps its count (``_seq_id_to_num_tokens_computed``: a
    sequence in prefill is not recounted), so the step that admits it reads the count of
    the step that refused it. Here: an allocate refused by the guard keeps the tracker's
    record; the same sequence's next allocate with the same prompt is that group admitted
    later (another prompt under the same id is a new request: the record is dropped, as a
    new ``Sequence`` has a new id in the engine). Up to 0.8.5 that count is stale when the
    cache changed meanwhile (vLLM PR #17305, closed; fixed by PR #18957 in 0.9.x, whose
    scheduler drops the record on LATER: ``forgets_when_refused``, read from the
    release's ``vllm/core/scheduler.py``)."""

    retries_refused = True  # a group can_allocate declines stays waiting and comes again

    def __init__(self, num_blocks: int, block_size: int, version: str | None = None):
        super().__init__(num_blocks, block_size, "prefix_caching", guard="engine",
                         version=version)
        if self._counts != "tokens":
            raise MisuseError(f"vLLM {self.version}: the scheduler counts cached tokens "
                              f"before can_allocate from 0.6.5 (get_num_cached_tokens); "
                              f"use make_prefix_guarded")
        self._waiting: dict[int, list[int]] = {}  # refused seq -> its prompt (still waiting)
        # vLLM PR #18957 (0.9.x): the scheduler drops a group's record when can_allocate
        # answers LATER (remove_seq_from_computed_blocks_tracker before its break); read
        # from the release's own scheduler.py
        root = _loader.require(install.select(ENGINE_KEY, self.version))
        scheduler = root / "vllm" / "core" / "scheduler.py"
        self.forgets_when_refused = scheduler.is_file() and (
            "remove_seq_from_computed_blocks_tracker" in scheduler.read_text())

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int | None:
        if token_ids is None or seq in self.tables or seq in self.preempted:
            return super().allocate(seq, n_tokens, token_ids)  # fresh tokens: a new prompt
        tokens = list(token_ids)
        if self._waiting.get(seq, tokens) != tokens:
            self._untrack(seq)  # a new request under a reused id
            del self._waiting[seq]
        if seq not in self._waiting and len(tokens) == n_tokens:
            # the scheduler's count, before can_allocate
            self._computed.get_num_cached_tokens(_TrackedSeq(seq, tokens))
            self._tracked.add(seq)
        self._waiting[seq] = tokens
        try:
            got = super().allocate(seq, n_tokens, tokens)
        except EngineGuardRefused:
            if self.forgets_when_refused:  # LATER: 0.9.x drops the record, then waits
                self._untrack(seq)
                del self._waiting[seq]
            raise  # LATER: the group stays waiting (to 0.8.5 its count recorded)
        except BaseException:
            self._waiting.pop(seq, None)
            self._untrack(seq)
            raise
        del self._waiting[seq]
        return got


def make(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """vLLM v0, naive allocator (no prefix caching), unguarded."""
    return VllmV0Target(num_blocks, block_size, "naive", version=version)


def make_prefix(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """vLLM v0, prefix-caching allocator, unguarded."""
    return VllmV0Target(num_blocks, block_size, "prefix_caching", version=version)


def make_guarded(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """vLLM v0 naive, with ``SelfAttnBlockSpaceManager``'s capacity checks first; a check
    that says no is a refusal (``EngineGuardRefused``), see the module docstring."""
    return VllmV0Target(num_blocks, block_size, "naive", guard="engine", version=version)


def make_chunked(num_blocks: int, block_size: int, version: str | None = None) -> VllmV0Target:
    """``make_guarded`` with chunked prefill, one block per chunk (``prefill_chunk =
    block_size``): an allocation is the scheduler's ``allocate`` at the prompt's first
    chunk followed by the ``append_slots`` call of each later chunk (no unseen tokens,
    see ``VllmV0Target._prefill_chunks``)."""
    return VllmV0Target(num_blocks, block_size, "naive", guard="engine", version=version,
                        prefill_chunk=block_size)


def make_prefix_waiting(num_blocks: int, block_size: int,
                        version: str | None = None) -> VllmV0Target:
    """``make_prefix_guarded`` with the count taken before the admission, as the 0.6.5 on
    scheduler does, kept while a refused group waits to 0.8.5 (``VllmV0WaitingTarget``)."""
    return VllmV0WaitingTarget(num_blocks, block_size, version=version)


def make_prefix_guarded(num_blocks: int, block_size: int,
                        version: str | None = None) -> VllmV0Target:
    """vLLM v0 prefix caching, with ``SelfAttnBlockSpaceManager``'s capacity checks first;
    a check that says no is a refusal (``EngineGuardRefused``), see the module docstring."""
    return VllmV0Target(num_blocks, block_size, "prefix_caching", guard="engine",
                        version=version)
