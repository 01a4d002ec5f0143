"""Adapter: vLLM v0's block manager v2 with its CPU pool (swapping), as a tiers target.

``kvcheck verify-tiers vllm-v0-swap[@VERSION]`` (also ``vllm-v0-swap-prefix``,
``vllm-v0-swap-lookahead``): the release's own ``BlockSpaceManagerV2``
(``vllm/core/block_manager_v2.py``, 0.5.0.post1 .. 0.6.2) or ``SelfAttnBlockSpaceManager``
(``vllm/core/block_manager.py``, 0.6.3 .. 0.9.2), built as the engine builds it:
``(block_size, num_gpu_blocks=num_blocks, num_cpu_blocks=host_blocks, watermark=0.0,
enable_caching=...)``. Its ``CpuGpuBlockAllocator`` holds both pools; the device pool is
``Device.GPU``, the host pool ``Device.CPU`` (kvcheck's ``host_blocks``). Releases: every
vLLM v0 release with block manager v2 and swaps, 0.5.0.post1 .. 0.9.2 (0.4.x's
``swap_in`` / ``swap_out`` raise ``NotImplementedError``): ``vllm-v0``'s row of ``kvcheck
install``, default its pinned 0.8.5. The files executed are ``vllm_v0``'s block modules
plus the manager, ``vllm/core/interfaces.py`` (``AllocStatus``) and
``vllm/core/block/utils.py`` (the encoder-decoder check).

Stand-ins, in one place (what the adapter does in the scheduler's place, and why):

``vllm.utils``, ``vllm.platforms``, ``vllm.logger``
    as ``vllm_v0`` (``Device``, ``cdiv``, ``chunk_list``; not HPU; a stdlib logger),
    and the two encoder-decoder messages ``vllm/core/block/utils.py`` imports.
``vllm.sequence``
    ``SequenceStatus`` (``WAITING``, ``RUNNING``, ``SWAPPED``: what the manager filters
    by) and annotation-only ``Sequence`` / ``SequenceGroup``. The manager is handed
    ``_Seq`` / ``_Group`` objects offering exactly what it reads: ``seq_id``,
    ``status``, ``get_token_ids()``, ``data.get_num_computed_tokens()``,
    ``extra_hash()`` (None: no LoRA or multimodal input), ``is_prefill()``; a group of
    one sequence: ``get_seqs(status)``, ``request_id``, ``is_encoder_decoder()`` (False),
    ``get_encoder_seq()`` (None), ``is_prefill()``.
The scheduler's calls (``vllm/core/scheduler.py``), one per kvcheck operation:
    ``allocate(seq, tokens)``: ``can_allocate(group)`` then, when ``OK``,
    ``allocate(group)`` (not ``OK``: ``OutOfBlocks``, nothing called); the sequence is
    then ``RUNNING``. ``append(seq, token)``: the token joins the sequence, then
    ``append_slots(seq, 0)`` (a decode step, no lookahead). ``can_append_slots`` is not
    asked first: it is a worst-case heuristic that also refuses appends needing no block
    (docs/findings.md, F3), and the tiers model has no refusal outcome, so the allocator's
    own ``NoFreeBlocksError`` is the out-of-blocks signal. ``free(seq)``: ``free(seq)``.
    ``can_swap_out`` / ``swap_out`` (``Scheduler._swap_out``): the sequence then
    ``SWAPPED``. ``can_swap_in(seq, lookahead)`` is ``can_swap_in(group, lookahead)`` is
    ``OK``; ``swap_in(seq, lookahead)`` is ``_schedule_swapped``'s ``_swap_in`` then
    ``_append_slots``: ``swap_in(group)``, the sequence ``RUNNING``, then
    ``append_slots(seq, lookahead)`` (nothing unseen). After every operation the
    scheduler step's bookkeeping: ``access_all_blocks_in_seq(seq, now)`` for every running
    sequence at a logical clock and ``mark_blocks_as_computed(group[, 1])``.
Lookahead slots (``vllm-v0-swap-lookahead``)
    the engine's ``num_lookahead_slots`` (speculative decoding, multi-step scheduling),
    a constant of its config: here ``lookahead_slots`` = one block (``block_size``), asked
    for at every swap-in (``_get_num_lookahead_slots`` of a decoding group). Decode steps
    (``append``) ask for none, so the slots a swap-in reserved are used up by the next
    tokens. The other targets swap in with no lookahead; there ``_append_slots`` after
    ``swap_in`` has nothing to append (no unseen token, no slot) and is not called: on
    0.5.1 .. 0.5.4 that empty call raises #7380's ``IndexError`` at a full last block,
    catalogued on its own (benchmarks/historical, vllm-7380).
Token ids (``vllm-v0-swap-prefix``)
    each request's tokens are made its own (token ``t`` of request ``q`` is the id of the
    pair ``(q, t)``): with a prefix shared between requests, the append that fills a
    block whose content another block already caches swaps it for that one
    (``promote_to_immutable_block``), a table change the tiers ``append`` does not
    describe. A
    request's own full blocks are still hashed, cached, left in the evictor by a free or a
    swap-out and revived by its swap-in, in both pools (the CPU allocator caches too):
    the path vLLM PR #6849 is about.
Watermark 0
    the engine's default 0.01 keeps ``int(0.01 * num_gpu_blocks)`` blocks back from
    ``can_allocate`` / ``can_swap_in``: 0 below 100 blocks; a reserve is a policy the
    tiers admission clause does not model.

Found by kvcheck on these targets (not known upstream; V1 and V2 are shown with the
release's own calls in tests/thirdparty/test_vllm_v0_swap.py; every release 0.5.0.post1
.. 0.9.2 at 8 + 8 blocks of 1 and 2, seed 0, 2,000 operations: docs/findings.md):

V1  (0.5.1 .. 0.9.2, the releases with ``BlockPool``) freeing a swapped-out sequence
    (the scheduler's abort of a swapped request, ``free_seq`` -> ``BlockSpaceManager.free``)
    returns its ``Block`` objects, which came
    from the GPU allocator's ``BlockPool`` (a swap moves the objects and re-points their
    ids), to the CPU allocator's pool: ``BlockPool.free_block`` appends a GPU pool id to
    the CPU pool's free ids, and the CPU pool's next ``init_block`` indexes its own
    ``_pool`` with it: ``IndexError`` in ``swap_out`` once that id passes the CPU pool's
    size (4 x ``num_cpu_blocks``; the GPU pool, short of the objects it lost, doubles).
V2  with prefix caching, the same free first calls
    ``LastAccessBlocksTracker.update_seq_blocks_last_access`` with the CPU block ids, and
    ``CpuGpuBlockAllocator.mark_blocks_as_accessed`` hands them to the GPU allocator:
    ``KeyError`` (``_block_tracker[cpu id]``) once the sequence had been scheduled.
V3  with prefix caching, 0.6.5 .. 0.9.2 (the evictor's heap with lazy deletion): nothing
    marks a CPU block accessed (the tracker marks the GPU's only), so every CPU evictor
    entry has the same ``last_accessed``; ``LRUEvictor.evict`` then takes a stale heap
    entry of a block the evictor holds again, under another hash, for a live one and
    ``_maybe_allocate_evicted_block_id`` trips ``assert content_hash_to_evict in
    self._cached_blocks`` in ``swap_out`` (``make_prefix_no_swapped_abort``, 8 + 8 blocks of
    1 or 2, seed 0: 12 to 21 operations on every release 0.6.5 .. 0.9.2).
V4  with lookahead slots, 0.6.3.post1 .. 0.9.2: ``can_swap_out`` counts the full blocks
    and the blocks an append of the unseen tokens touches, never a block that holds only
    lookahead slots, which ``swap_out`` moves too: a swap-out right after a swap-in with
    lookahead slots is admitted with a CPU block too few. The engine swaps a group out at
    a step's start, when the token of the previous step is unseen and sits in those
    slots, so whether a real step reaches it (more slots than unseen tokens: rejected
    speculative drafts) is not established; the lookahead targets do not issue such a
    swap-out (``admits``).

The ``*_no_swapped_abort`` factories never free a swapped-out sequence (``admits``), so
that the admission counts are checked past V1 and V2 (benchmarks/historical: vllm-6849,
vllm-8824); the registered targets free any live sequence, as the engine's abort does.

Observation. Block ids are each pool's physical ids (``get_physical_block_id``: the CPU
pool's count from 0). ``refcount`` = the allocator's ``RefCounter`` plus one for a block
the prefix cache names (``_cached_blocks``: the cache is a holder, docs/tiers.md);
``free_blocks`` = the free deque (of the prefix allocator's hashless allocator);
``evictable_blocks`` = the evictor's blocks (cached, no sequence's); ``cache_entries`` =
``_cached_blocks``' ((pool, hash), block) pairs (the GPU and the CPU allocator cache
independently: a host block is no backup of a device one, and is evicted on its own).
So an evictor block is evictable, not on the free list, and counts as room
(``TierState.available``): v0's ``get_num_free_blocks`` counts it. No jobs: a v0 swap
is synchronous (``pending_jobs`` is ``{}``). ``capabilities``: ``allocate``, ``append``,
``free``, ``swap_out``, ``swap_in`` (and ``lookahead``); v0's block manager has no store,
load, completion or host-cache eviction of its own.
"""

from __future__ import annotations

import enum
import itertools
import types
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, vllm_v0

ENGINE_KEY = vllm_v0.ENGINE_KEY  # vLLM v0's releases (kvcheck install vllm-v0==VERSION)
MANAGERS = ("vllm.core.block_manager", "vllm.core.block_manager_v2")  # 0.6.3 on; before


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2


def _stub_sequence(mod: types.ModuleType, _: _loader.Loaded) -> None:
    class Sequence:  # annotation only
        pass

    class SequenceGroup:  # annotation only
        pass

    mod.Sequence, mod.SequenceGroup, mod.SequenceStatus = Sequence, SequenceGroup, SequenceStatus


def _stub_utils(mod: types.ModuleType, loaded: _loader.Loaded) -> None:
    vllm_v0.STUBS["vllm.utils"](mod, loaded)  # Device, cdiv, chunk_list
    mod.STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = "prefix caching: not for encoder/decoder models"
    mod.STR_NOT_IMPL_ENC_DEC_SWA = "sliding window: not for encoder/decoder models"


STUBS = {**vllm_v0.STUBS, "vllm.utils": _stub_utils, "vllm.sequence": _stub_sequence}


def load(version: str | None = None):
    """``(modules, manager class)`` of the release at ``version`` (``vllm_v0.load``'s
    choice of release; ``ThirdPartyMissing`` if not installed, ``MisuseError`` for a
    release whose block manager v2 cannot swap)."""
    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    manager = next((m for m in MANAGERS if (root / (m.replace(".", "/") + ".py")).is_file()),
                   None)
    if manager is None:
        raise MisuseError(f"vllm {dist.version}: no block manager v2 file")
    files = (*vllm_v0.files(root), manager, "vllm.core.interfaces", "vllm.core.block.utils")
    mods = _loader.load(dist, files, STUBS,
                        entry=(manager, "vllm.core.block.cpu_gpu_block_allocator"))
    cls = getattr(mods[manager], "SelfAttnBlockSpaceManager", None) or \
        mods[manager].BlockSpaceManagerV2
    if "NotImplementedError" in (root / (manager.replace(".", "/") + ".py")).read_text() \
            .split("def swap_in", 1)[-1].split("def ", 1)[0]:
        raise MisuseError(f"vllm {dist.version}: block manager v2 does not swap yet "
                          f"(swap_in raises NotImplementedError); use 0.5.0.post1 .. 0.8.5")
    return mods, cls


class _Data:
    def __init__(self, seq: _Seq):
        self._seq = seq

    def get_num_computed_tokens(self) -> int:
        return self._seq.computed


class _Seq:
    """What the block manager reads of a ``Sequence``."""

    def __init__(self, seq_id: int, token_ids: list[int]):
        self.seq_id = seq_id
        self.token_ids = token_ids
        self.status = SequenceStatus.WAITING
        self.computed = 0  # tokens whose KV the engine computed (all but an unseen one)
        self.data = _Data(self)

    def get_token_ids(self) -> list[int]:
        return self.token_ids

    def get_len(self) -> int:
        return len(self.token_ids)

    def extra_hash(self) -> None:
        return None

    def is_prefill(self) -> bool:
        return self.status == SequenceStatus.WAITING


class _Group:
    """What the block manager reads of a ``SequenceGroup`` of one sequence."""

    def __init__(self, seq: _Seq):
        self.seq = seq
        self.request_id = str(seq.seq_id)

    def get_seqs(self, status=None) -> list[_Seq]:
        return [self.seq] if status is None or self.seq.status == status else []

    def is_encoder_decoder(self) -> bool:
        return False

    def get_encoder_seq(self) -> None:
        return None

    def is_prefill(self) -> bool:
        return self.seq.is_prefill()


class VllmV0SwapTarget:
    """A tiers target over the release's own block manager v2 (see the module doc)."""

    capabilities = frozenset({"allocate", "append", "free", "swap_out", "swap_in"})

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 caching: bool = False, lookahead: int = 0, aborts_swapped: bool = True,
                 version: str | None = None):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size),
                        ("host_blocks", host_blocks)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MisuseError(f"{name} must be a positive integer, got {v!r}")
        mods, cls = load(version)
        self.version = mods.dist.version
        self.num_blocks, self.block_size, self.host_blocks = num_blocks, block_size, host_blocks
        self.caching = caching
        self.aborts_swapped = aborts_swapped
        if lookahead:
            self.capabilities = VllmV0SwapTarget.capabilities | {"lookahead"}
            self.lookahead_slots = lookahead
        self.manager = cls(block_size=block_size, num_gpu_blocks=num_blocks,
                           num_cpu_blocks=host_blocks, watermark=0.0, enable_caching=caching)
        device = mods["vllm.utils"].Device
        self._dev = {"device": device.GPU, "host": device.CPU}
        self._alloc = {p: self.manager.block_allocator._allocators[d]
                       for p, d in self._dev.items()}
        self._ids = {p: sorted(a.all_block_ids) for p, a in self._alloc.items()}
        self._phys = {p: {b: i for i, b in enumerate(ids)} for p, ids in self._ids.items()}
        self._NoFree = mods["vllm.core.block.interfaces"].BlockAllocator.NoFreeBlocksError
        self._OK = mods["vllm.core.interfaces"].AllocStatus.OK
        self._marks_chunk = _loader.takes(_function(self.manager.mark_blocks_as_computed),
                                          "token_chunk_size")
        self.seqs: dict[int, _Seq] = {}
        self.where: dict[int, str] = {}
        self._token_ids: dict = {}  # (request, token) -> its id (caching: its own)
        self._next_id = itertools.count(1)
        self._clock = 0.0

    # -- helpers --------------------------------------------------------------------------
    def _id(self, seq: int, token) -> int:
        key = (seq, token) if self.caching else token
        got = self._token_ids.get(key)
        if got is None:
            if not self.caching and type(token) is int and token >= 0:
                return token
            got = self._token_ids[key] = next(self._next_id) + (1 << 40)
        return got

    def _live(self, seq: int, pool: str | None = None) -> _Seq:
        s = self.seqs.get(seq)
        if s is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        if pool is not None and self.where[seq] != pool:
            raise MisuseError(f"sequence {seq!r} is not in the {pool} pool")
        return s

    def _step(self) -> None:
        """The scheduler step's bookkeeping for every running sequence (see module doc)."""
        self._clock += 1.0
        for q, s in self.seqs.items():
            if self.where[q] != "device":
                continue
            self.manager.access_all_blocks_in_seq(s, self._clock)
            group = _Group(s)
            if self._marks_chunk:
                self.manager.mark_blocks_as_computed(group, 1)
            else:
                self.manager.mark_blocks_as_computed(group)

    # -- operations -----------------------------------------------------------------------
    def allocate(self, seq: int, tokens) -> None:
        if seq in self.seqs:
            raise MisuseError(f"sequence {seq!r} already exists")
        toks = [self._id(seq, t) for t in tokens]
        if not toks:
            raise MisuseError("a prompt has at least one token")
        s = _Seq(seq, toks)
        group = _Group(s)
        count = getattr(self.manager, "get_num_cached_tokens", None)
        if count is not None:  # 0.6.5 on: the scheduler counts cached tokens first
            count(s)
        status = self.manager.can_allocate(group)
        if status != self._OK:
            raise OutOfBlocks(f"can_allocate: {status.name} for {len(toks)} tokens")
        try:
            self.manager.allocate(group)
        except self._NoFree as exc:
            raise OutOfBlocks(f"vLLM v0 NoFreeBlocksError allocating {len(toks)} tokens") \
                from exc
        s.status, s.computed = SequenceStatus.RUNNING, len(toks)
        self.seqs[seq], self.where[seq] = s, "device"
        self._step()

    def append(self, seq: int, token) -> tuple[int, int]:
        s = self._live(seq, "device")
        n = len(s.token_ids)
        s.token_ids.append(self._id(seq, token))
        try:
            self.manager.append_slots(s, 0)
        except self._NoFree as exc:
            s.token_ids.pop()
            raise OutOfBlocks("vLLM v0 NoFreeBlocksError appending one token") from exc
        s.computed = n + 1
        table = self.manager.block_tables[seq].physical_block_ids
        self._step()
        return self._phys["device"].get(table[n // self.block_size], -1), n % self.block_size

    def free(self, seq: int) -> None:
        s = self._live(seq)
        self.manager.free(s)
        del self.seqs[seq], self.where[seq]
        self._step()

    def can_swap_out(self, seq: int) -> bool:
        return bool(self.manager.can_swap_out(_Group(self._live(seq, "device"))))

    def swap_out(self, seq: int) -> dict[int, int]:
        s = self._live(seq, "device")
        try:
            mapping = self.manager.swap_out(_Group(s))
        except self._NoFree as exc:
            raise OutOfBlocks("vLLM v0 NoFreeBlocksError swapping out") from exc
        s.status, self.where[seq] = SequenceStatus.SWAPPED, "host"
        self._step()
        return dict(mapping)

    def can_swap_in(self, seq: int, lookahead: int = 0) -> bool:
        group = _Group(self._live(seq, "host"))
        return self.manager.can_swap_in(group, lookahead) == self._OK

    def swap_in(self, seq: int, lookahead: int = 0) -> dict[int, int]:
        s = self._live(seq, "host")
        try:
            mapping = self.manager.swap_in(_Group(s))
            s.status, self.where[seq] = SequenceStatus.RUNNING, "device"
            if lookahead:  # Scheduler._append_slots after _swap_in (nothing unseen)
                self.manager.append_slots(s, lookahead)
        except self._NoFree as exc:
            raise OutOfBlocks(f"vLLM v0 NoFreeBlocksError swapping in (lookahead "
                              f"{lookahead})") from exc
        self._step()
        return dict(mapping)

    def admits(self, op) -> bool:
        """Everything, except (``aborts_swapped=False``) the free of a swapped-out
        sequence (module doc, V1 and V2), and, with lookahead slots, the swap-out of a
        sequence holding a block with nothing but lookahead slots in it (V4)."""
        if op.kind == "free" and not self.aborts_swapped and self.where.get(op.seq) == "host":
            return False
        if op.kind == "swap_out" and getattr(self, "lookahead_slots", 0) and op.seq in self.seqs:
            held = len(self.manager.block_tables[op.seq].blocks)
            return held <= -(-len(self.seqs[op.seq].token_ids) // self.block_size)
        return True

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)

    # -- observation (docs/tiers.md) ------------------------------------------------------
    def pools(self) -> dict[str, int]:
        return {"device": self.num_blocks, "host": self.host_blocks}

    def _cached(self, pool: str) -> dict:
        return dict(getattr(self._alloc[pool], "_cached_blocks", None) or {})

    def refcount(self, pool: str, b: int) -> int:
        absolute = self._ids[pool][b]
        cached = absolute in set(self._cached(pool).values())
        return self._alloc[pool]._refcounter.get(absolute) + cached

    def free_blocks(self, pool: str) -> list[int]:
        alloc = self._alloc[pool]
        naive = getattr(alloc, "_hashless_allocator", alloc)
        return [self._phys[pool].get(b, -1) for b in naive._free_block_indices]

    def table(self, seq: int) -> tuple[str, list[int]] | None:
        if seq not in self.seqs:
            return None
        pool = self.where[seq]
        ids = self.manager.block_tables[seq].physical_block_ids
        # (a swap that raised midway leaves blocks with no id: not reported)
        return pool, [self._phys[pool].get(b, -1) for b in ids if b is not None]

    def live_seqs(self) -> list[int]:
        return list(self.seqs)

    def pending_jobs(self) -> dict:
        return {}

    def cache_entries(self, pool: str) -> list[tuple[object, int]]:
        # (each pool's allocator keeps a cache of its own: a key names its pool too)
        return [((pool, h), self._phys[pool].get(b, -1)) for h, b in self._cached(pool).items()]

    def evictable_blocks(self, pool: str) -> list[int]:
        evictor = getattr(self._alloc[pool], "evictor", None)
        if evictor is None:
            return []
        return [self._phys[pool].get(b, -1) for b in evictor.free_table]


def _function(method: Any) -> Any:
    return getattr(method, "__func__", method)


def make(num_blocks: int, block_size: int, host_blocks: int,
         version: str | None = None) -> VllmV0SwapTarget:
    """vLLM v0 block manager v2, naive allocators, swaps with no lookahead."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, version=version)


def make_prefix(num_blocks: int, block_size: int, host_blocks: int,
                version: str | None = None) -> VllmV0SwapTarget:
    """vLLM v0 block manager v2 with prefix caching (``enable_caching=True``), swaps with no
    lookahead."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, caching=True,
                            version=version)


def make_lookahead(num_blocks: int, block_size: int, host_blocks: int,
                   version: str | None = None) -> VllmV0SwapTarget:
    """vLLM v0 block manager v2, naive allocators, every swap-in with one block of
    lookahead slots (``num_lookahead_slots = block_size``)."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, lookahead=block_size,
                            version=version)


def make_prefix_no_swapped_abort(num_blocks: int, block_size: int, host_blocks: int,
                                 version: str | None = None) -> VllmV0SwapTarget:
    """``make_prefix`` that never frees a swapped-out sequence (``admits``): the
    admission counts checked past V1 and V2 (module doc)."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, caching=True,
                            aborts_swapped=False, version=version)


def make_lookahead_no_swapped_abort(num_blocks: int, block_size: int, host_blocks: int,
                                    version: str | None = None) -> VllmV0SwapTarget:
    """``make_lookahead`` that never frees a swapped-out sequence (``admits``), as
    ``make_prefix_no_swapped_abort``."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, lookahead=block_size,
                            aborts_swapped=False, version=version)


def make_no_swapped_abort(num_blocks: int, block_size: int, host_blocks: int,
                          version: str | None = None) -> VllmV0SwapTarget:
    """``make`` that never frees a swapped-out sequence (``admits``)."""
    return VllmV0SwapTarget(num_blocks, block_size, host_blocks, aborts_swapped=False,
                            version=version)
