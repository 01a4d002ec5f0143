"""Raw replays of the catalogued bugs: the engine's own objects, no kvcheck adapter.

Each ``replay_*(version)`` loads the release's files (``impl/thirdparty/_loader`` with the
adapter module's stand-ins for the engine's unrelated imports, never its ``*Target``
class), performs the bug's minimal operations with the engine's calls spelled out, and
returns ``(reproduced, evidence)``: whether the release shows the bug, and what its own
state said. On the buggy release ``reproduced`` must be True, on the fixed one False.
"""

from __future__ import annotations

import enum

from kvcheck.impl.thirdparty import (
    _loader,
    install,
    nano_vllm,
    vllm_v0,
    vllm_v0_legacy,
    vllm_v1,
    vllm_v1_early,
    vllm_v1_engine,
)


def _v0(version: str, allocator_type: str, num_blocks: int, block_size: int):
    mods = vllm_v0.load(version)
    table_cls = mods["vllm.core.block.block_table"].BlockTable
    allocator = mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type=allocator_type, num_gpu_blocks=num_blocks, num_cpu_blocks=0,
        block_size=block_size)
    return mods, table_cls, allocator


def replay_vllm_4761(version: str) -> tuple[bool, str]:
    """PR #4761: a block popped from the evictor for new content stayed in
    ``_cached_blocks`` under its old hash, so a later prompt with that old content is
    served the block another sequence now writes. 5 blocks of 1 token."""
    _, table_cls, alloc = _v0(version, "prefix_caching", 5, 1)
    old = table_cls(1, alloc)
    old.allocate([1, 2, 3])  # cached: three full blocks
    old.free()  # -> evictor, still cached
    other = table_cls(1, alloc)
    other.allocate([4])
    other.free()
    writer = table_cls(1, alloc)
    writer.allocate([5, 6])  # a miss: takes free blocks, then evicts a cached one
    again = table_cls(1, alloc)
    again.allocate([1, 2, 3])  # the old prompt again
    shared = sorted(set(writer.physical_block_ids) & set(again.physical_block_ids))
    return bool(shared), (f"tables [5, 6] -> {writer.physical_block_ids}, [1, 2, 3] again -> "
                          f"{again.physical_block_ids}; shared: {shared or 'none'}")


def replay_vllm_5364(version: str) -> tuple[bool, str]:
    """PR #5364: a block reused from the evictor for new content kept its computed mark,
    so the engine skips computing the new prompt's first block. 5 blocks of 1 token; the
    computed prefix as the release's block manager derives it for one sequence."""
    mods, table_cls, alloc = _v0(version, "prefix_caching", 5, 1)
    gpu = vllm_v0.gpu_allocator(alloc, mods)
    first = table_cls(1, alloc)
    first.allocate([1, 2, 3, 4, 5])  # fills the pool, all cached
    first.free()  # all evictable
    new = table_cls(1, alloc)
    new.allocate([6, 7])  # a miss: two blocks evicted for new content
    ids = new.physical_block_ids
    tracker_cls = getattr(mods["vllm.core.block.prefix_caching_block"],
                          "ComputedBlocksTracker", None)
    if tracker_cls is None:  # 0.4.x .. 0.5.0: the allocator walks the table
        computed = gpu.get_common_computed_block_ids([ids])
    else:  # 0.5.1 on: SelfAttnBlockSpaceManager's tracker
        tracker = tracker_cls(gpu)
        tracker.add_seq(1)
        computed = gpu.get_common_computed_block_ids(
            [tracker.get_cached_computed_blocks_and_update(1, ids)])
    return bool(computed), (f"new prompt [6, 7] in blocks {ids}; computed (skipped) block "
                            f"ids: {list(computed)}")


def replay_vllm_42571(version: str) -> tuple[bool, str]:
    """#42571 / PR #42612, the reported call sequence on ``BlockPool`` (a sliding-window
    request with eager SimpleCPUOffload, ``vllm/v1/simple_kv_offload/manager.py``): the
    request takes block X at position i, its window drops X (``free_blocks([X])``), its
    next allocation gets X back for position j; the connector's eager store scan, which
    accumulates every block id the request was given (``StoreRequestState.block_ids``),
    touches X for both positions (``touch([X, X])``); the request finishes
    (``free_blocks([X])``), then the store completes and the connector drops its
    references in one call (``_process_store_completion``: ``free_blocks([X, X])``).
    0.20.2 decrements X twice, then queues every listed block at ref_cnt 0: X twice, the
    free count one ahead of the free blocks. One usable block (and the null block)."""
    return _double_listed_free(vllm_v1.load(version)["vllm.v1.core.block_pool"].BlockPool)


def replay_aphrodite_42571(version: str) -> tuple[bool, str]:
    """vLLM #42571 as aphrodite-engine carries it: ``replay_vllm_42571``'s calls on
    aphrodite's own ``BlockPool`` (``aphrodite/v1/core/block_pool.py``; 0.20.0 / 0.21.0
    read as vLLM 0.20's, whose ``free_blocks`` queues every listed block at ref_cnt 0;
    0.22.0 queues a block at the decrement that reaches 0, as vLLM 0.24.0 does)."""
    from kvcheck.impl.thirdparty import aphrodite

    return _double_listed_free(aphrodite.load(version)["aphrodite.v1.core.block_pool"].BlockPool)


def _double_listed_free(pool_cls) -> tuple[bool, str]:
    pool = pool_cls(num_gpu_blocks=2, enable_caching=True, hash_block_size=1)
    (first,) = pool.get_new_blocks(1)  # position i
    pool.free_blocks([first])  # behind the window (remove_skipped_blocks)
    (block,) = pool.get_new_blocks(1)  # position j: the only free block, X again
    pool.touch([first, block])  # the connector's store scan names X for i and for j
    pool.free_blocks([block])  # the request finishes (its position i is the null block)
    pool.free_blocks([first, block])  # the store completes: both references in one call
    queued = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    count = pool.get_num_free_blocks()
    twice = queued.count(block.block_id) > 1 or count != len(queued)
    return twice, (f"block {block.block_id} (taken twice by one request: "
                   f"{first is block}): ref_cnt {block.ref_cnt}; free queue {queued}, "
                   f"get_num_free_blocks() = {count}")


def replay_nano_vllm_144(version: str) -> tuple[bool, str]:
    """nano-vllm #144: a prompt all of whose blocks hit the cache reports every token
    cached (``num_cached_tokens == len(seq)``): the model runner has no token to compute.
    ``version`` must be the pinned nano-vllm-fork (the adapter loads that one only)."""
    mods = nano_vllm.load()
    if mods.dist.version != version:
        raise ValueError(f"nano-vllm {version} is not the pinned {mods.dist.version}")
    manager = mods["nanovllm.engine.block_manager"].BlockManager(4, 2)
    seqs = []
    for _ in range(2):  # the same 2-token prompt twice, block size 2
        seq = mods["nanovllm.engine.sequence"].Sequence([1, 2])
        seq.block_size = 2
        manager.allocate(seq)
        seqs.append(seq)
    second = seqs[1]
    return second.num_cached_tokens >= len(second), (
        f"second prompt of {len(second)} tokens: num_cached_tokens = "
        f"{second.num_cached_tokens}, block_table {second.block_table}")


def _nano_manager(key: str, version: str, num_blocks: int, block_size: int):
    """A nano-vllm-shaped fork's ``BlockManager`` and ``Sequence`` class, loaded from the
    release's files (its ``sampling_params`` stood in as the nano-vllm adapter does)."""
    from kvcheck.impl.thirdparty import _loader, install

    engine = install.ENGINES[key]
    install.ensure(engine, version)
    top = engine.top
    stub = nano_vllm.STUBS["nanovllm.sampling_params"]
    files = (f"{top}.engine.block_manager", f"{top}.engine.sequence")
    mods = _loader.load(engine.dist_for(version), files, {f"{top}.sampling_params": stub},
                        entry=files)
    return (mods[f"{top}.engine.block_manager"].BlockManager(num_blocks, block_size),
            mods[f"{top}.engine.sequence"].Sequence)


def replay_nano_vllm_163(role_version: str) -> tuple[bool, str]:
    """nano-vllm #163: a freed block keeps its ``hash_to_block_id`` entry; reused for a
    miss, it gets new content under a new key, the old key still names it, and the
    lookup guards only by the block's own token ids. So [1, 5] after [2, 5] is served the
    block holding 5 after 2: a false hit (the KV was computed for another prefix).
    ``role_version`` is ``nano-vllm-npu==0.0.2`` (buggy) or ``nano-vllm-fork==20260210``
    (its deallocate drops the entry). 3 blocks of 1 token."""
    dist, _, version = role_version.partition("==")
    key = "nano-vllm-npu" if dist == "nano-vllm-npu" else "nano-vllm"
    manager, seq_cls = _nano_manager(key, version, 3, 1)

    def seq(tokens):
        s = seq_cls(list(tokens))
        s.block_size = 1
        return s

    a = seq([1, 5])
    manager.allocate(a)
    manager.deallocate(a)
    b = seq([2, 5])
    manager.allocate(b)
    b_table = list(b.block_table)
    held = {bid: (2, 5)[: i + 1] for i, bid in enumerate(b_table)}
    manager.deallocate(b)
    c = seq([1, 5])
    manager.allocate(c)
    wrong = [(i, bid) for i, bid in enumerate(c.block_table[: c.num_cached_tokens])
             if held.get(bid, (1, 5)[: i + 1]) != (1, 5)[: i + 1]]
    return bool(wrong), (f"[1, 5] then [2, 5] in {b_table}, then [1, 5] -> "
                         f"{c.block_table} with {c.num_cached_tokens} cached token(s); "
                         f"served from another prefix: {wrong or 'none'}")


def replay_vllm_43569(version: str) -> tuple[bool, str]:
    """PR #43569 (open): ``scripts/replay_raw_v1_commit.py``'s scheduler-order replay on
    vLLM's own ``KVCacheManager`` (priority preemption between ``allocate_slots`` and the
    step's write): the resumed request is served a cached block no forward pass wrote.
    The script drives the pinned 0.33.0 only."""
    import importlib.util
    from pathlib import Path

    if version != vllm_v1.load().dist.version:
        raise ValueError(f"the replay drives vLLM {vllm_v1.load().dist.version}, not {version}")
    path = Path(__file__).resolve().parents[2] / "scripts" / "replay_raw_v1_commit.py"
    spec = importlib.util.spec_from_file_location("kvcheck_replay_raw_v1_commit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.replay(2)
    return bool(out["unwritten_hits"]), (f"block size 2: the resumed request hits blocks "
                                        f"{out['hit_blocks']}, unwritten: {out['unwritten_hits']}")


def replay_vllm_1556(version: str) -> tuple[bool, str]:
    """#1556 / PR #3347: BlockSpaceManager v1 with a sliding window of one block (block
    size 2, window 2 tokens, 4 blocks). The scheduler allocates a group of two sequences
    (``best_of=2``) sharing a 3-token prompt: the table [x, x] names block x at positions
    0 and 1 (cyclic reuse), refcount 2. The first sequence's next token copies the shared
    last block (``append_slot``: ``free(x)``, x at refcount 1); freeing that sequence walks
    ``set(block_table)``, which still names x at position 0, and frees x again; freeing the
    second sequence then raises "Double free!". 0.4.0 frees only the table's last window."""
    running = vllm_v0_legacy.SequenceStatus.RUNNING
    m = vllm_v0_legacy.build(version, num_blocks=4, block_size=2, sliding_window=2)
    a, c = vllm_v0_legacy.Seq(0, 3, 2), vllm_v0_legacy.Seq(1, 3, 2)
    m.allocate(vllm_v0_legacy.Group(a, c))
    a.status = c.status = running
    shared = m.get_block_table(a)
    a.n_tokens += 1
    cow = m.append_slot(a)
    after = m.get_block_table(a)
    try:
        m.free(a)
        m.free(c)
    except ValueError as exc:
        return True, (f"tables {shared} (both), append_slot copies {cow} -> {after}; "
                      f"freeing both: {exc}")
    free = m.get_num_free_gpu_blocks()
    return free != 4, (f"tables {shared} (both), append_slot copies {cow} -> {after}; "
                       f"both freed: {free} of 4 blocks free")


def replay_aphrodite_1556(version: str) -> tuple[bool, str]:
    """vLLM #1556 (PR #3347's fork half) as aphrodite-engine 0.5.x ships it: its
    ``BlockSpaceManager`` (``aphrodite/processing/block_manager.py``) with a sliding window
    of one block (block size 2, window 2 tokens, 4 blocks). A 3-token prompt's table is
    [x, x] (cyclic reuse, one reference); the engine forks the parent for a ``best_of``
    sibling after the prompt step (``Scheduler.fork_seq`` -> ``fork``), which increments
    every entry: x at refcount 3 for two tables. Freeing both walks ``set(block_table)``
    once each: x is left at refcount 1 in no table, never free again (a leak). 0.6.0's
    ``BlockSpaceManagerV1`` forks ``set(src_block_table)`` and frees every block."""
    running = vllm_v0_legacy.SequenceStatus.RUNNING
    m = vllm_v0_legacy.build(version, num_blocks=4, block_size=2, sliding_window=2,
                             engine=vllm_v0_legacy.APHRODITE_KEY)
    a, c = vllm_v0_legacy.Seq(0, 3, 2), vllm_v0_legacy.Seq(1, 3, 2)
    m.allocate(vllm_v0_legacy.Group(a))
    a.status = c.status = running
    m.fork(a, c)
    shared = m.get_block_table(a)
    refs = sorted({b.block_number: b.ref_count for b in m.block_tables[a.seq_id]}.items())
    m.free(a)
    m.free(c)
    free = m.get_num_free_gpu_blocks()
    return free != 4, (f"table {shared} forked (refcounts {refs}); both freed: {free} of 4 "
                       f"blocks free")


def replay_v1_window_stale_entry(version: str) -> tuple[bool, str]:
    """Not a catalogue entry (no fixed release): what PR #3347 left in BlockSpaceManager v1
    (0.3.3 and 0.4.0 alike; the v1 manager's fork and free read the same to 0.6.x). Window
    of two blocks, block size 1, 6 blocks. A group of two sequences shares the 3-token
    prompt [x0, x1, x0]; the first sequence's next two tokens reuse x1 and x0 and copy each
    away from the sharer (``append_slot``: n1, n0), but entries 0 and 1 still name x0 and
    x1, and the cycle (``block_table[len % W]``) brings x1 back for the sixth token:
    refcount 1, held by the other sequence alone, so ``append_slot`` writes into it in
    place. Returns whether that write happened (the other sequence's live block)."""
    running = vllm_v0_legacy.SequenceStatus.RUNNING
    m = vllm_v0_legacy.build(version, num_blocks=6, block_size=1, sliding_window=2)
    a, c = vllm_v0_legacy.Seq(0, 3, 1), vllm_v0_legacy.Seq(1, 3, 1)
    m.allocate(vllm_v0_legacy.Group(a, c))
    a.status = c.status = running
    steps = []
    for _ in range(3):
        a.n_tokens += 1
        steps.append(m.append_slot(a))
    mine, theirs = m.get_block_table(a), m.get_block_table(c)
    written = mine[-1]
    crossed = written in theirs[-2:] and steps[-1] is None
    return crossed, (f"other sequence {theirs}; this one {mine} after copies {steps}: the "
                     f"sixth token is written in place into block {written}")


def _stub_waiting_sequence(mod, _loaded) -> None:
    """Stand-in for ``vllm.sequence``: what ``SelfAttnBlockSpaceManager.can_allocate`` and
    ``allocate`` read of a group with one waiting decoder-only sequence (its token ids,
    ``extra_hash`` None: no multimodal or LoRA input)."""

    class SequenceStatus(enum.IntEnum):
        WAITING = 0

    class Sequence:
        def __init__(self, seq_id: int, token_ids: list[int]):
            self.seq_id, self._token_ids = seq_id, list(token_ids)

        def get_token_ids(self) -> list[int]:
            return list(self._token_ids)

        def extra_hash(self):
            return None

        def is_prefill(self) -> bool:  # a waiting (or just admitted) prompt
            return True

    class SequenceGroup:
        def __init__(self, request_id: str, seq: Sequence):
            self.request_id, self._seq = request_id, seq

        def get_seqs(self, status=None) -> list[Sequence]:
            return [self._seq]

        def is_encoder_decoder(self) -> bool:
            return False

    mod.Sequence, mod.SequenceGroup, mod.SequenceStatus = Sequence, SequenceGroup, SequenceStatus


def _stub_utils_with_messages(mod, loaded) -> None:
    vllm_v0._stub_utils(mod, loaded)  # Device, cdiv, chunk_list
    # vllm/core/block/utils.py imports these two messages (encoder-decoder checks only)
    mod.STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = "prefix caching: not for encoder/decoder models"
    mod.STR_NOT_IMPL_ENC_DEC_SWA = "sliding window: not for encoder/decoder models"


def _block_manager(version: str, engine: str = vllm_v0.ENGINE_KEY):
    """The release's block manager v2 (vLLM's ``vllm/core/block_manager.py``,
    ``SelfAttnBlockSpaceManager``, 0.6.3 on; ``block_manager_v2.py``'s
    ``BlockSpaceManagerV2`` before, and in aphrodite-engine 0.6.x under
    ``aphrodite/processing/``: ``vllm_v0.LAYOUTS``) with the block modules,
    ``vllm.sequence`` stood in by one waiting sequence per group; ``(modules under vLLM's
    names, release root, the manager class)``."""
    dist = install.select(engine, version)
    root = _loader.require(dist)
    rename = vllm_v0.LAYOUTS[engine] or (lambda n: n)
    manager = next((m for m in ("vllm.core.block_manager", "vllm.core.block_manager_v2")
                    if (root / (rename(m).replace(".", "/") + ".py")).is_file()), None)
    if manager is None:
        raise ValueError(f"{dist.dist} {version}: no block manager v2 file")
    stubs = {**vllm_v0.STUBS, "vllm.sequence": _stub_waiting_sequence,
             "vllm.utils": _stub_utils_with_messages}
    files = (*vllm_v0.files(root, engine),
             *(rename(m) for m in (manager, "vllm.core.interfaces", "vllm.core.block.utils")))
    loaded = _loader.load(dist, files, {rename(k): v for k, v in stubs.items()},
                          entry=(rename(manager),))
    mods = vllm_v0.Modules(loaded, rename)
    cls = getattr(mods[manager], "SelfAttnBlockSpaceManager", None) or mods[manager].BlockSpaceManagerV2
    return mods, root, cls


def replay_vllm_18957(version: str) -> tuple[bool, str]:
    """PR #17305 / #18957: ``Scheduler._schedule_prefills`` counts a waiting group's cached
    tokens (``get_num_cached_tokens``) before ``can_allocate``; on LATER the group waits
    and, to 0.8.5, ``ComputedBlocksTracker`` keeps the count (a prefill is not recounted),
    so after the cache changed the admitting step skips tokens whose KV is gone. 0.9.x's
    scheduler calls ``remove_seq_from_computed_blocks_tracker`` on LATER (read from the
    release's ``vllm/core/scheduler.py``, and done here as it does). 4 blocks of 1 token:
    A = [1] admitted and finished (its block cached, evictable), B = [7, 8] running, W =
    [1, 2, 3] counted (1 cached token) and refused (3 blocks needed, 2 free), B decodes
    two tokens (the second evicts A's block), B finishes, W is counted again."""
    mods, root, manager_cls = _block_manager(version)
    seqs = mods["vllm.sequence"]
    manager = manager_cls(
        block_size=1, num_gpu_blocks=4, num_cpu_blocks=0, watermark=0.0, enable_caching=True)
    scheduler = (root / "vllm/core/scheduler.py").read_text()
    forgets = "remove_seq_from_computed_blocks_tracker" in scheduler

    def admit(seq_id, tokens):
        seq = seqs.Sequence(seq_id, tokens)
        group = seqs.SequenceGroup(str(seq_id), seq)
        manager.get_num_cached_tokens(seq)  # the scheduler's count, before can_allocate
        status = manager.can_allocate(group)
        if status.name == "OK":
            manager.allocate(group)
        return seq, group, status.name

    a, _, _ = admit(0, [1])
    manager.free(a)  # finished: its block [1] stays cached in the evictor
    b, _, _ = admit(1, [7, 8])
    w = seqs.Sequence(2, [1, 2, 3])
    first = manager.get_num_cached_tokens(w)
    status = manager.can_allocate(seqs.SequenceGroup("2", w))
    if status.name == "LATER" and forgets:
        manager.remove_seq_from_computed_blocks_tracker(w)  # 0.9.x, before its break
    table = manager.block_tables[b.seq_id]
    for token in (9, 10):  # B decodes: the second new block is A's cached one, evicted
        b._token_ids.append(token)
        table.append_token_ids([token])
    manager.free(b)
    again = manager.get_num_cached_tokens(w)
    tracker = manager._computed_blocks_tracker
    actual = len(manager.block_allocator.find_cached_blocks_prefix(
        tracker._seq_id_to_blocks_hashes[w.seq_id]))
    return again > actual, (
        f"W = [1, 2, 3]: {first} cached token(s) counted, can_allocate -> {status.name}"
        f"{' (record dropped)' if forgets else ''}; after B's decode evicted [1]: counted "
        f"{again}, cached in fact {actual}")


def replay_vllm_11168(version: str) -> tuple[bool, str]:
    """#11168: with a sliding window, ``SelfAttnBlockSpaceManager.can_allocate`` caps a
    prompt's required blocks at ``max_block_sliding_window`` while ``allocate`` takes a
    block for every prompt token: a 4-token prompt, block size 1, window 1 (3 blocks
    needed at most by the cap), 3 free blocks: ``can_allocate`` says OK, ``allocate``
    raises ``NoFreeBlocksError`` keeping what it took. The release's own block manager
    (``vllm/core/block_manager.py``, 0.6.3 on; ``block_manager_v2.py`` before)."""
    return _window_cap(version, vllm_v0.ENGINE_KEY)


def replay_aphrodite_11168(version: str) -> tuple[bool, str]:
    """vLLM #11168 as aphrodite-engine 0.6.x carries it: ``BlockSpaceManagerV2.can_allocate``
    (``aphrodite/processing/block_manager_v2.py``) caps the required blocks at
    ``max_block_sliding_window``, ``allocate`` takes a block per prompt token; the
    replay of ``replay_vllm_11168`` on aphrodite's own manager."""
    return _window_cap(version, "aphrodite-v0")


def _window_cap(version: str, engine: str) -> tuple[bool, str]:
    mods, _, manager_cls = _block_manager(version, engine)
    seqs = mods["vllm.sequence"]
    manager = manager_cls(
        block_size=1, num_gpu_blocks=3, num_cpu_blocks=0, watermark=0.0, sliding_window=1,
        enable_caching=False)
    group = seqs.SequenceGroup("0", seqs.Sequence(0, [1, 2, 3, 4]))
    gpu = mods["vllm.utils"].Device.GPU
    status = manager.can_allocate(group)
    try:
        manager.allocate(group)
        outcome = "allocated"
    except Exception as exc:  # the engine's NoFreeBlocksError (its own class per release)
        outcome = f"raised {type(exc).__name__}"
    admitted = status.name == "OK"
    failed = outcome != "allocated"
    free = manager.block_allocator.get_num_free_blocks(gpu)
    return admitted and failed, (
        f"4-token prompt, 3 free blocks, max_block_sliding_window "
        f"{manager.max_block_sliding_window}: can_allocate -> {status.name}, allocate "
        f"{outcome}; {free} of 3 blocks free after, no block table")


def _empty_append(version: str, engine: str) -> tuple[bool, str]:
    """vLLM #7371 / PR #7380 (aphrodite-engine PR #679): a later chunk of a chunked
    prefill calls ``append_slots`` with no unseen tokens, i.e. ``BlockTable.
    append_token_ids([], num_lookahead_slots=0, num_computed_slots=c)``; when the prompt
    fills its last block the release indexes the block past the table's end
    (``BlockList.append_token_ids(first_block_idx, [])``). Block size 2, a 4-token
    prompt in chunks of 2 (4 blocks, naive allocator)."""
    mods = vllm_v0.load(version, engine)
    alloc = mods["vllm.core.block.cpu_gpu_block_allocator"].CpuGpuBlockAllocator.create(
        allocator_type="naive", num_gpu_blocks=4, num_cpu_blocks=0, block_size=2)
    table = mods["vllm.core.block.block_table"].BlockTable(2, alloc)
    table.allocate([1, 2, 3, 4])  # the scheduler allocates the whole prompt at its first chunk
    before = table.physical_block_ids
    try:  # the second chunk's step: BlockSpaceManagerV2.append_slots, nothing unseen
        table.append_token_ids([], num_lookahead_slots=0, num_computed_slots=2)
    except IndexError as exc:
        return True, (f"prompt [1, 2, 3, 4] in {before}; the second chunk's "
                      f"append_token_ids([]) raised IndexError: {exc}")
    return False, (f"prompt [1, 2, 3, 4] in {before}; the second chunk's append_token_ids([]) "
                   f"returned, table {table.physical_block_ids}, {table.num_full_slots} slots")


def replay_vllm_7380(version: str) -> tuple[bool, str]:
    return _empty_append(version, vllm_v0.ENGINE_KEY)


def replay_aphrodite_679(version: str) -> tuple[bool, str]:
    return _empty_append(version, "aphrodite-v0")


# -- vLLM v1, its first releases (impl/thirdparty/vllm_v1_early.py's stand-ins) ------------
def _early_manager(version: str, block_size: int, num_blocks: int, **kw):
    """The release's own ``KVCacheManager`` (constructor of 0.6.x .. 0.8.2: no null block),
    with the release's defaults (``num_preallocate_tokens`` 64) unless ``kw`` says."""
    mods = vllm_v1_early.load(version)
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    return mods, cls(block_size=block_size, num_gpu_blocks=num_blocks, **kw)


def _early_request(rid: str, tokens):
    return vllm_v1_early.Request(rid, tokens)


def _hits(m, req) -> list:
    """``get_computed_blocks``: the blocks (0.6.x), or the first of (blocks, count) (0.7.0 on)."""
    got = m.get_computed_blocks(req)
    return got[0] if isinstance(got, tuple) else got


def replay_vllm_11186(version: str) -> tuple[bool, str]:
    """PR #11186: a prompt whose every block is cached (length a multiple of the block
    size). 0.6.4.post1's scheduler then drops the last hit block and schedules only the
    last token (``num_computed_tokens -= 1``), but ``allocate_slots`` places the dropped
    block's tokens in a fresh block: the tokens before the last one in that block are never
    computed (and the fresh block is keyed by the wrong tokens as decoding fills it). 0.6.5
    recomputes the whole block (``-= block_size``). Block size 2, the same 4-token prompt
    twice; the scheduler's branch is the release's own (its ``scheduler.py``: see
    ``vllm_v1_early.full_hit_edge``)."""
    kw = {} if version == "0.6.4.post1" else {"max_model_len": 64}  # (0.6.4.post1: no cap)
    mods, m = _early_manager(version, 2, 80, **kw)  # room for both preallocations (32 each)
    first = _early_request("a", [1, 2, 3, 4])
    m.allocate_slots(first, 4, _hits(m, first))
    second = _early_request("b", [1, 2, 3, 4])
    computed = _hits(m, second)  # both blocks hit
    num_computed = len(computed) * 2
    edge = vllm_v1_early.full_hit_edge(mods)
    if num_computed == second.num_tokens:
        num_computed -= 1 if edge == "token" else 2
        computed.pop()
    m.allocate_slots(second, second.num_tokens - num_computed, computed)
    table = [b.block_id for b in m.req_to_blocks["b"][:2]]  # (then preallocated blocks)
    mine = [b.block_id for b in m.req_to_blocks["a"][:2]]
    served = len(computed) * 2  # tokens whose KV the hit blocks hold
    skipped = list(range(served, num_computed))
    return bool(skipped), (
        f"scheduler ({edge}): num_computed_tokens = {num_computed}, the hit blocks hold "
        f"{served} token(s); prompt blocks {table} (the first request's {mine}): "
        + (f"token(s) {skipped} in fresh block {table[-1]} never computed" if skipped
           else "every skipped token is in a hit block"))


def replay_vllm_11565(version: str) -> tuple[bool, str]:
    """PR #11565 (issue #11562): 0.6.5 and 0.6.6.post1's ``allocate_slots`` touches the
    prefix-cache hits (``ref_cnt += 1``, out of the free queue) before it checks for free
    blocks; when it then returns ``None`` the touch is not undone, and the scheduler, which
    leaves the request waiting and asks again next step, touches them again: the blocks
    never return to the pool. Two blocks of one token, ``max_model_len`` 2 (a shape the
    release starts with: ``verify-engine``'s start-up checks are asked first):
    [0] is admitted and cached, and holds the other block too (the default preallocation,
    capped at the block-table row's 2 columns); then [0, 1] hits [0]'s block and needs one
    block more, which is not there. Freed, the first request gives both back unless the
    second's touches were kept."""
    # the release's start-up checks of the shape (vllm_config.check_pool, through the engine
    # target): one it refuses raises MisuseError, so no replay runs on it
    vllm_v1_engine.EngineTarget(vllm_v1_engine.EngineSettings(2, 1, max_model_len=2), version)
    _, m = _early_manager(version, 1, 2, max_model_len=2)
    first = _early_request("a", [0])
    m.allocate_slots(first, 1, _hits(m, first))
    block = m.req_to_blocks["a"][0]
    held = len(m.req_to_blocks["a"])
    second = _early_request("b", [0, 1])
    answers = []
    for _ in range(2):  # the scheduler retries the waiting request next step
        computed = _hits(m, second)
        answers.append(m.allocate_slots(second, 2 - len(computed), computed))
    m.free(first)
    free = m.free_block_queue.num_free_blocks
    return block.ref_cnt != 0 or free != 2, (
        f"the first prompt holds {held} of 2 blocks; allocate_slots of the second prompt -> "
        f"{answers} twice; after the first request is freed its cached block has ref_cnt "
        f"{block.ref_cnt}, {free} of 2 blocks free")


def replay_vllm_10730(version: str) -> tuple[bool, str]:
    """PR #10730: with preallocation (``num_preallocate_tokens`` 64, the default the
    scheduler never changes) 0.6.4.post1's ``allocate_slots`` takes
    ``min(needed + 64 / block_size, free)`` blocks, more than the request's block-table
    row holds (``max_model_len // block_size`` columns on the GPU); 0.6.5 caps it at
    ``max_num_blocks_per_req``. Block size 1, 16 blocks, max_model_len 4, a 2-token prompt."""
    kw = {} if version == "0.6.4.post1" else {"max_model_len": 4}  # 0.6.4.post1 has no cap
    _, m = _early_manager(version, 1, 16, **kw)
    req = _early_request("a", [1, 2])
    m.allocate_slots(req, 2, _hits(m, req))
    n = len(m.req_to_blocks["a"])
    return n > 4, f"a 2-token prompt holds {n} blocks; the block table has 4 columns"


def replay_vllm_19459(version: str) -> tuple[bool, str]:
    """#19459: 0.9.0's ``FullAttentionManager.find_longest_cache_hit`` indexes
    ``block_hashes[i]`` for every block below ``num_tokens - 1``, but the manager hashes a
    block only when ``allocate_slots`` caches it, and drafts are left out
    (``num_draft_tokens``): after a step whose drafts were accepted the request's tokens run
    blocks ahead of its hashes, and a preemption then (the pool full) resumes it into an
    ``IndexError`` that kills the engine core. 0.9.1 zips the range with the hashes. Block
    size 4: a 5-token prompt, one step of 1 + 3 drafts (all accepted), preempt, resume."""
    mods = vllm_v1_early.load(version)
    m, _ = vllm_v1_early.build_manager(mods, 3, 4, enable_caching=True)
    req = vllm_v1_early.Request("a", [1, 2, 3, 4, 5])
    computed, n = m.get_computed_blocks(req)
    m.allocate_slots(req, 5, n, computed)
    req.num_computed_tokens = 5
    req.append_output_token_ids(6)  # sampled
    req.spec_token_ids = [7, 8, 9]  # drafts
    m.allocate_slots(req, 4, num_draft_tokens=3)
    req.num_computed_tokens = 9
    req.append_output_token_ids([7, 8, 9])  # verification accepts every draft
    req.spec_token_ids = []
    hashes = len(m.req_to_block_hashes["a"])
    m.free(req)  # preempted
    req.status = vllm_v1.RequestStatus.PREEMPTED
    req.num_computed_tokens = 0
    try:
        _, n = m.get_computed_blocks(req)  # resumed from the waiting queue
    except IndexError as exc:
        return True, (f"{req.num_tokens} tokens, {hashes} block hash(es): resuming raises "
                      f"IndexError: {exc}")
    return False, f"{req.num_tokens} tokens, {hashes} block hash(es): resumed, {n} cached"




def replay_sglang_34399(version: str) -> tuple[bool, str]:
    """sglang #34399 (PRs #22035, #30892, #32780, #34400): ``PagedTokenToKVPoolAllocator``'s
    ``alloc_extend`` / ``alloc_decode`` launch the Triton allocation kernel before checking
    that ``free_pages`` holds the pages the batch needs; on an exhausted pool the kernel
    reads ``free_pages`` past its end (an empty tensor's data pointer is 0: an illegal
    memory access on the GPU, SIGSEGV under Triton's CPU interpreter), then the allocator
    returns ``None``. 3 pages of 4 slots: a 12-token prefill fills the pool, then a decode
    token and a 4-token prefill each need a page. The kernel names ``paged.py`` launches
    are wrapped to record each launch's free pages and needed pages (a launch the pool
    cannot serve is recorded, not run); the release's GPU path is taken
    (``use_triton_kernels = True`` where the release has the torch path, 0.5.22 on, after
    the prefill, which runs on its torch path)."""
    import torch

    from kvcheck.impl.thirdparty import sglang

    loaded = sglang.load(version)
    paged = loaded[sglang.ALLOCATOR if sglang.single_file(loaded.root)  # 0.4.8 .. 0.5.12
                   else f"{sglang.ALLOCATOR}.paged"]
    ps, launches = 4, []

    class Recorder:
        def __init__(self, name, real, needed):
            self.name, self.real, self.needed = name, real, needed

        def __getitem__(self, grid):
            def launch(*args):
                free = args[3] if self.name == "alloc_extend_kernel" else args[2]
                need = self.needed(*args)
                if need > free.numel():  # would read past free_pages: record, do not run
                    launches.append((self.name, free.numel(), need))
                    return None
                return self.real[grid](*args)
            return launch

    def extend_need(prefix_lens, seq_lens, *_):
        return int(((seq_lens + ps - 1) // ps - (prefix_lens + ps - 1) // ps).sum())

    def decode_need(seq_lens, *_):
        return int(((seq_lens - 1) % ps == 0).sum())

    # the kernels' argument order (alloc_extend_kernel: prefix, seq, last_loc, free_pages,
    # out, ...; alloc_decode_kernel: seq, last_loc, free_pages, out, ...) is the same in
    # every release from 0.4.8 (0.4.8 .. 0.5.2 pass a ret_values tensor after out)

    saved = {n: getattr(paged, n) for n in ("alloc_extend_kernel", "alloc_decode_kernel")}
    paged.alloc_extend_kernel = Recorder("alloc_extend_kernel", saved["alloc_extend_kernel"],
                                         extend_need)
    paged.alloc_decode_kernel = Recorder("alloc_decode_kernel", saved["alloc_decode_kernel"],
                                         decode_need)
    try:
        cls = paged.PagedTokenToKVPoolAllocator
        alloc = cls(3 * ps, ps, torch.float16, "cpu", None, *(
            [False] if sglang.takes(cls.__init__, "need_sort") else []))

        def t(v):
            return torch.tensor(v, dtype=torch.int64)

        row = sglang.alloc_extend(alloc, t([0]), t([12]), t([-1]), 12)
        if hasattr(alloc, "use_triton_kernels"):
            alloc.use_triton_kernels = True  # the CUDA path
        decode = sglang.alloc_decode(alloc, t([13]), row[11:12].clone())
        extend = sglang.alloc_extend(alloc, t([0]), t([4]), t([-1]), 4)
    finally:
        for n, k in saved.items():
            setattr(paged, n, k)
    return bool(launches), (
        f"prefill of 12 tokens -> pages {sorted({s // ps for s in row.tolist()})}, free pages "
        f"left {alloc.free_pages.numel()}; decode -> {decode}, 4-token prefill -> {extend}; "
        f"kernel launches with fewer free pages than needed (kernel, free, needed): "
        f"{launches or 'none'}")


def _stub_swa_base(mod, _loaded) -> None:
    """Stand-in for ``mem_cache/base_swa_memory_pool.py`` (it imports the 260 KB
    ``memory_pool.py``): the SWA allocator asserts its KV pool is a ``BaseSWAKVPool``,
    registers its full-to-SWA mapping with it and translates ``last_loc`` through it, as
    the real ``SWAKVPool`` does (``full_to_swa_index_mapping[kv_indices]``); no KV buffers."""

    class BaseSWAKVPool:
        full_kv_pool = swa_kv_pool = None
        full_to_swa_index_mapping = None

        def register_mapping(self, mapping):
            self.full_to_swa_index_mapping = mapping

        def translate_loc_from_full_to_swa(self, kv_indices):
            return self.full_to_swa_index_mapping[kv_indices]

    mod.BaseSWAKVPool = BaseSWAKVPool


def replay_sglang_27779(version: str) -> tuple[bool, str]:
    """sglang PR #27779: ``SWATokenToKVPoolAllocator.free_swa`` at page size > 1 clears the
    full-to-SWA mapping of the tokens it is given only, while the SWA allocator frees their
    whole page; a later ``free_swa`` of another token of that page reads the stale mapping
    and frees the same SWA page again. 4 full and 4 SWA pages of 2 slots: a 4-token prefill,
    then ``free_swa`` of its first token, then of its second (one page)."""
    import torch

    from kvcheck.impl.thirdparty import sglang

    def stub_utils(mod, loaded):
        sglang._stub_utils(mod, loaded)
        sglang.real_functions(mod, loaded, "sglang/srt/utils/common.py", ("is_npu",),
                              {"torch": torch})

    def stub_common(mod, loaded):
        sglang.real_functions(mod, loaded, "sglang/srt/utils/common.py",
                              ("ceil_div", "get_num_new_pages"),
                              {"torch": torch, "Optional": __import__("typing").Optional})

    swa = f"{sglang.ALLOCATOR}.swa"
    loaded = sglang.load_dist(
        install.select("sglang", version), (*sglang.FILES, swa),
        {**sglang.STUBS, "sglang.srt.utils": stub_utils, "sglang.srt.utils.common": stub_common,
         "sglang.srt.mem_cache.base_swa_memory_pool": _stub_swa_base},
        (*sglang.FILES, swa))
    pool = loaded["sglang.srt.mem_cache.base_swa_memory_pool"].BaseSWAKVPool()
    ps = 2
    alloc = loaded[swa].SWATokenToKVPoolAllocator(4 * ps, 4 * ps, ps, torch.float16, "cpu",
                                                  pool, False)

    def t(v):
        return torch.tensor(v, dtype=torch.int64)

    row = sglang.alloc_extend(alloc, t([0]), t([4]), t([-1]), 4)
    swa_of = alloc.full_to_swa_index_mapping[row].tolist()
    alloc.free_swa(row[0:1])  # the first token's SWA page goes back
    after_first = alloc.full_to_swa_index_mapping[row].tolist()
    alloc.free_swa(row[1:2])  # the second token of the same page
    pages = sglang.free_pages_of(alloc.swa_attn_allocator)
    twice = len(pages) != len(set(pages))
    return twice, (f"prefill -> full slots {row.tolist()}, SWA slots {swa_of}; mapping after "
                   f"free_swa(first token): {after_first}; SWA free pages after "
                   f"free_swa(second token): {sorted(pages)}"
                   f"{' (a page twice)' if twice else ''}")


def replay_sglang_4989(version: str) -> tuple[bool, str]:
    """sglang PR #4989 (issue #4987): ``HiRadixCache.evict_host`` loops ``while num_evicted <
    num_tokens`` and, before 0.4.5, never adds what it evicts, so one call evicts every
    host-only node. The release's own calls (``sglang_hicache.load``: its stand-ins for
    the controller's thread and streams, never its Target): 4 device and 8 host slots; two
    one-token requests' prompts inserted (``insert``), each backed up (``write_backup``)
    and acked as the write thread and ``writing_check`` do, both evicted from the device
    (``evict(2)``: host-only nodes), then ``evict_host(1)``."""
    import torch

    from kvcheck.impl.thirdparty import sglang_hicache as hc

    mods = hc.load(version)
    pool, hiradix = mods[f"{hc.MEM}.memory_pool"], mods[hc.HIRADIX]
    alloc = pool.TokenToKVPoolAllocator(4, torch.float16, "cpu", hc._DevicePool(4))
    rows = pool.ReqToTokenPool(4, 8, "cpu", False)
    kw = {"req_to_token_pool": rows, "token_to_kv_pool_allocator": alloc,
          "tp_cache_group": None, "page_size": 1}
    if hc.takes(hiradix.HiRadixCache.__init__, "hicache_ratio"):
        kw["hicache_ratio"] = 2.0
    tree = hiradix.HiRadixCache(**kw)
    ctl, host = tree.cache_controller, tree.token_to_kv_pool_host
    for token in (7, 8):
        tree.insert([token], alloc.alloc(1))
        node = tree.root_node.children[token]
        tree.write_backup(node)
        op = ctl.write_queue.get()  # the write thread's step
        host.complete_io(op.host_indices)
        ctl.ack_write_queue.put(node.id)
        tree.writing_check()
    tree.evict(2)
    before = int(host.available_size())
    tree.evict_host(1)
    freed = int(host.available_size()) - before
    left = sorted(k for k, n in tree.root_node.children.items() if n.host_value is not None)
    return freed > 1, (f"two host-only nodes of 1 slot each; evict_host(1) freed {freed} host "
                       f"slot(s), host-only nodes left: {left}")


def replay_sglang_13501(version: str) -> tuple[bool, str]:
    """sglang PR #13501 (issue #13483): with the storage tier on, a prefetch whose pages do
    not all come back has its unfilled host pages queued for release twice before 0.5.6 --
    by ``HiCacheController._page_transfer`` and again by ``prefetch_io_aux_func`` after it
    -- so the scheduler's drain puts them on the host pool's free list twice. The release's
    own objects as ``sglang_hicache.make_storage`` builds them (4 device, 8 host slots; the
    stand-in storage backend holding every page it is asked about, returning none of them;
    the controller's threads never started): ``prefetch_from_storage`` of 3 tokens under
    the root, one pass of the release's own ``prefetch_thread_func`` and
    ``prefetch_io_aux_func`` loops over that operation (``_OneShot``: a queue that stops
    its loop after the last item), then the scheduler's ``check_prefetch_progress`` and
    ``drain_storage_control_queues``; the host pool's ``free_slots`` read back."""
    from kvcheck.impl.thirdparty import sglang_hicache as hc

    target = hc.make_storage(4, 1, 8, version=version)
    tree, host = target.tree, target.host
    before = sorted(int(x) for x in host.free_slots.tolist())
    tree.prefetch_from_storage("r", tree.root_node, [5, 6, 7], None)  # (no prefix keys)
    pages = sorted(int(x) for x in tree.ongoing_prefetch["r"][2].tolist())
    _prefetch_query(target)
    # (the storage returns none of the pages it said it had)
    _prefetch_transfer(target, "r", filled=0)
    free = [int(x) for x in host.free_slots.tolist()]
    twice = sorted({x for x in free if free.count(x) > 1})
    return bool(twice), (f"a prefetch of 3 host pages {pages} (free list before: "
                         f"{len(before)} slots), 0 filled, drained: {len(free)} free-list "
                         f"entries, pages on it twice: {twice}")


def _prefetch_query(target):
    """The prefetch thread's pass (its own ``prefetch_thread_func`` loop: the storage hit
    query) over the one queued operation, on a ``_OneShot`` queue that stops the loop
    after it; returns the operation."""
    from kvcheck.impl.thirdparty import sglang_hicache as hc

    ctl, stop = target.ctl, target._stop()
    op = ctl.prefetch_queue.get_nowait()
    stop.set()  # (the prefetch thread's loop runs until its queue is empty)
    ctl.prefetch_queue = hc._OneShot([op], stop)
    ctl.prefetch_thread_func()
    stop.clear()
    return op


def _prefetch_transfer(target, rid: str, filled: int | None = None) -> None:
    """The aux thread's pass (its own ``prefetch_io_aux_func`` loop: ``_page_transfer``,
    ``filled`` pages back, every page when None, then its own release of the rest) over
    what ``prefetch_buffer`` holds, then the scheduler's ``check_prefetch_progress(rid)``
    and ``drain_storage_control_queues``."""
    import queue

    from kvcheck.impl.thirdparty import sglang_hicache as hc

    tree, ctl, stop = target.tree, target.ctl, target._stop()
    ctl.prefetch_buffer = hc._OneShot(list(ctl.prefetch_buffer.queue), stop)
    ctl.storage_backend.limit = filled
    ctl.prefetch_io_aux_func()
    stop.clear()
    ctl.prefetch_queue, ctl.prefetch_buffer = queue.Queue(), queue.Queue()
    tree.check_prefetch_progress(rid)
    tree.drain_storage_control_queues()


def _host_pages_lost(tree, host) -> tuple[list[int], list[int]]:
    """(free list, pages on neither the host pool's free list nor any node's host_value)."""
    free = sorted(int(x) for x in host.free_slots.tolist())
    held, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node is not tree.root_node and node.host_value is not None:
            held += [int(x) for x in node.host_value.tolist()]
        stack.extend(node.children.values())
    return free, sorted(set(range(int(host.size))) - set(free) - set(held))


def prefetch_refill(version: str, cached_first: bool = True) -> tuple[bool, str]:
    """H2 (docs/findings.md; sglang PR #30106, closed): a storage prefetch's completion
    (``check_prefetch_progress`` -> ``_insert_helper_host``) hangs its host-only node under
    whatever node its key now walks to, here a device node another request cached meanwhile,
    with no host copy. That node then looks like a device leaf (its only other child
    evicted), and the device eviction removes it as a plain one (``_evict_regular``,
    ``_delete_leaf``) with the prefetched node under it: 0.5.3 .. 0.5.10 lose its host page
    (on no free list, in no node), 0.5.11 on stop at ``_evict_regular``'s ``assert
    len(node.children) == 0, "non-leaf"`` (the scheduler's step raises).
    0.5.16 .. 0.5.18 allocate the prefetch's host pages only in the scheduler's drain,
    once the prefetch thread's storage hit query has queued the operation on
    ``prefetch_hit_queue`` (``drain_storage_control_queues`` ->
    ``_drain_and_alloc_storage_hit``): that drain runs between the prefetch thread's pass
    and the aux thread's, and the replay raises the same AssertionError there.

    The release's own objects as ``sglang_hicache.make_storage`` builds them (4 device, 12
    host slots; its stand-ins: the storage backend, a dict holding every page asked about;
    the controller's threads never started, one pass of their own loops run over the one
    operation, ``_OneShot``), the write_through_selective policy at the release's own
    threshold (2: a node is backed up on its second hit). R1 = [5, 6] arrives with nothing
    cached: the scheduler's ``_prefetch_kvcache`` prefetches both tokens under the root
    (``prefetch_from_storage``); R2 = [5, 9] runs and is cached (``insert``: one hit, no
    host copy); the prefetch's pages both arrive (``prefetch_thread_func``,
    ``prefetch_io_aux_func``, then ``check_prefetch_progress`` and
    ``drain_storage_control_queues``), splitting R2's node at [5]; then the device evicts 2
    tokens. ``cached_first=False`` is the control: the prefetch completes before R2 is
    cached (its node [5, 6] host-only; R2's insert gives [5] a device value and hangs [9]
    under it), and nothing is lost."""
    from kvcheck.impl.thirdparty import sglang_hicache as hc

    target = hc.make_storage(4, 1, 12, version=version)
    tree, ctl, host, alloc = target.tree, target.ctl, target.host, target.alloc
    tree.write_through_threshold = 2  # write_through_selective's own (make_storage: never)
    do = _hicache_calls(version)
    last_host = do.match(tree, [5]).last_host_node  # R1's match: nothing, the root
    more = (None,) if hc.takes(type(tree).prefetch_from_storage, "prefix_keys") else ()
    tree.prefetch_from_storage("r1", last_host, [5, 6], last_host.get_last_hash_value(),
                               *more)
    lazy = hasattr(ctl, "prefetch_hit_queue")  # 0.5.16 on: host pages allocated later
    pages = [] if lazy else [int(x) for x in tree.ongoing_prefetch["r1"][2].tolist()]

    def r2_cached():
        do.insert(tree, [5, 9], alloc.alloc(2))  # R2's KV cached (cache_finished_req)

    if cached_first:
        r2_cached()
    op = _prefetch_query(target)  # the storage hit query: both pages
    if lazy:  # the scheduler's drain (_drain_and_alloc_storage_hit): the host pages
        tree.drain_storage_control_queues()  # allocated for the hit, op to prefetch_buffer
        pages = [int(x) for x in op.host_indices.tolist()]
    _prefetch_transfer(target, "r1")  # both pages arrive; the scheduler: the refill inserted
    if not cached_first:
        r2_cached()
    five = _child(tree, 5)
    hung = [list(c.key) for c in five.children.values()
            if c.value is None and c.host_value is not None]
    shape = (f"node [5] {'with' if five.backuped else 'without'} a host copy, host-only "
             f"children {hung}")
    try:
        do.evict(tree, 2)  # (alloc_token_slots: the device evicts for 2 tokens)
    except AssertionError as exc:
        return True, (f"prefetch of [5, 6] into host pages {pages}, R2 = [5, 9] cached "
                      f"{'before' if cached_first else 'after'} its completion: {shape}; "
                      f"evict(2) raised AssertionError: {exc}")
    free, lost = _host_pages_lost(tree, host)
    return bool(lost), (f"prefetch of [5, 6] into host pages {pages}, R2 = [5, 9] cached "
                        f"{'before' if cached_first else 'after'} its completion: {shape}; "
                        f"after evict(2): {len(free)} of {int(host.size)} host pages free, "
                        f"lost (free nowhere, in no node): {lost}")


def replay_sglang_30106(version: str) -> tuple[bool, str]:
    """H2 / sglang PR #30106 (closed): ``prefetch_refill`` with R2 cached before the
    prefetch completes."""
    return prefetch_refill(version, cached_first=True)


def _swap_manager(version: str, num_gpu: int, num_cpu: int, block_size: int, caching: bool):
    """The release's own block manager v2 (``BlockSpaceManagerV2`` to 0.6.2,
    ``SelfAttnBlockSpaceManager`` from 0.6.3) with a CPU pool, watermark 0, loaded with
    ``vllm_v0_swap``'s stand-ins for ``vllm.sequence`` (its ``_Seq`` / ``_Group`` carry
    what the manager reads); ``(manager, Seq, Group, RUNNING, SWAPPED, OK)``."""
    from kvcheck.impl.thirdparty import vllm_v0_swap

    mods, cls = vllm_v0_swap.load(version)
    manager = cls(block_size=block_size, num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu,
                  watermark=0.0, enable_caching=caching)
    status = vllm_v0_swap.SequenceStatus
    return (manager, vllm_v0_swap._Seq, vllm_v0_swap._Group, status.RUNNING, status.SWAPPED,
            mods["vllm.core.interfaces"].AllocStatus.OK)


def _admit(manager, seq_cls, group_cls, running, seq_id: int, tokens: list[int]):
    seq = seq_cls(seq_id, list(tokens))
    group = group_cls(seq)
    if hasattr(manager, "get_num_cached_tokens"):  # 0.6.5 on: the scheduler counts first
        manager.get_num_cached_tokens(seq)
    manager.allocate(group)
    seq.status, seq.computed = running, len(tokens)
    return seq, group


def replay_vllm_6849(version: str) -> tuple[bool, str]:
    """PR #6849: with prefix caching, ``can_swap_in`` counts a full block of the swapped
    sequence as touched only when its content is not cached on the GPU
    (``get_num_blocks_touched``: ``if not self.is_block_cached(block)``), though a cached
    block sitting unreferenced in the evictor is counted free too: taking it back uses up
    that free block. 5 GPU and 4 CPU blocks of 1 token: B = [1, 2, 3, 4] swapped out (its
    four blocks stay cached in the evictor), A = [9] decodes one token (evicting one of
    them), then B asks to come back: 3 blocks free (the evictor's), 4 needed."""
    manager, seq_cls, group_cls, running, swapped, ok = _swap_manager(version, 5, 4, 1, True)
    a, _ = _admit(manager, seq_cls, group_cls, running, 0, [9])
    b, group = _admit(manager, seq_cls, group_cls, running, 1, [1, 2, 3, 4])
    assert manager.can_swap_out(group)
    manager.swap_out(group)  # Scheduler._swap_out
    b.status = swapped
    a.token_ids.append(10)  # A's decode step: Scheduler._append_slots
    manager.append_slots(a, 0)
    free = manager.get_num_free_gpu_blocks()
    status = manager.can_swap_in(group, 0)
    if status != ok:
        return False, (f"B swapped out, A decoded: {free} GPU block(s) free, 4 needed; "
                       f"can_swap_in -> {status.name}")
    try:
        manager.swap_in(group)
    except Exception as exc:  # the engine's NoFreeBlocksError (its own class per release)
        return True, (f"B swapped out, A decoded: {free} GPU block(s) free, 4 needed; "
                      f"can_swap_in -> OK, swap_in raised {type(exc).__name__}")
    return False, f"can_swap_in -> OK and swap_in succeeded with {free} block(s) free"


def replay_vllm_8824(version: str) -> tuple[bool, str]:
    """PR #8824: ``can_swap_in(group, num_lookahead_slots)`` counted the lookahead slots
    only into a partial last block (``get_num_blocks_touched(blocks, device,
    num_lookahead_slots)``), so a sequence whose last block is full is admitted with a
    free block per block it holds, and the scheduler's ``_append_slots`` after
    ``_swap_in`` then finds no block for the lookahead slots. 1 GPU and 1 CPU block of 2
    tokens (naive): [1, 2] swapped out, swapped in with 2 lookahead slots."""
    manager, seq_cls, group_cls, running, swapped, ok = _swap_manager(version, 1, 1, 2, False)
    seq, group = _admit(manager, seq_cls, group_cls, running, 0, [1, 2])
    manager.swap_out(group)
    seq.status = swapped
    status = manager.can_swap_in(group, 2)
    if status != ok:
        return False, f"[1, 2] on the CPU, 1 GPU block free: can_swap_in(2) -> {status.name}"
    manager.swap_in(group)  # Scheduler._swap_in, then _append_slots with the lookahead
    seq.status = running
    try:
        manager.append_slots(seq, 2)
    except Exception as exc:  # the engine's NoFreeBlocksError
        return True, (f"[1, 2] on the CPU, 1 GPU block free: can_swap_in(2) -> OK, swap_in, "
                      f"then append_slots(seq, 2) raised {type(exc).__name__}")
    return False, "can_swap_in(2) -> OK and append_slots found the lookahead block"


def _hicache_write_back(version: str, device: int, host: int):
    """The release's HiRadixCache under the write_back policy, as
    ``sglang_hicache.make_write_back`` builds it (its stand-ins: the write thread's acks,
    or from 0.5.2 the write's event, given when an eviction waits for them)."""
    from kvcheck.impl.thirdparty import sglang_hicache as hc

    target = hc.make_write_back(device, 1, host, version=version)
    return target.tree, target.alloc, target.host


def _hicache_calls(version: str):
    """(insert, match) of the release's tree for a token list: a ``RadixKey`` from 0.5.3,
    ``MatchPrefixParams`` from 0.5.8, ``InsertParams`` from 0.5.9, as the release takes
    them (``match`` includes host-only nodes)."""
    import types

    from kvcheck.impl.thirdparty import sglang_hicache as hc

    mods = hc.load(version)
    radix_key = getattr(mods[hc.RADIX], "RadixKey", None)
    base = mods[f"{hc.MEM}.base_prefix_cache"]
    tree_cls = mods[hc.HIRADIX].HiRadixCache

    def key(tokens):
        return tokens if radix_key is None else radix_key(tokens, None)

    def insert(tree, tokens, value):
        if hc.takes(tree_cls.insert, "params"):
            return tree.insert(base.InsertParams(key=key(tokens), value=value))
        return tree.insert(key(tokens), value)

    def match(tree, tokens):
        if hc.takes(tree_cls.match_prefix, "params"):
            return tree.match_prefix(base.MatchPrefixParams(key=key(tokens)))
        return tree.match_prefix(key=key(tokens), include_evicted=True)

    def evict(tree, n):
        if hc.takes(tree_cls.evict, "params"):
            return tree.evict(base.EvictParams(num_tokens=n))
        return tree.evict(n)

    def load_back(tree, match):
        last = match.last_host_node if hasattr(match, "last_host_node") else match[2]
        if hc.takes(tree_cls.init_load_back, "params"):  # (0.5.12: best_match_node)
            name = ("best_match_node" if "best_match_node" in getattr(
                base.InitLoadBackParams, "__dataclass_fields__", ()) else "last_host_node")
            return tree.init_load_back(base.InitLoadBackParams(**{
                name: getattr(match, "best_match_node", last),
                "host_hit_length": match.host_hit_length}))
        if hasattr(match, "host_hit_length"):
            return tree.init_load_back(last, match.host_hit_length)
        return tree.init_load_back(last, match[0].as_subclass(_cuda_tensor()))

    return types.SimpleNamespace(insert=insert, match=match, evict=evict,
                                 load_back=load_back)


def _child(tree, token: int):
    """The root's child whose key starts with ``token`` (None if none)."""
    return next((c for c in tree.root_node.children.values() if list(c.key)[0] == token),
                None)


def replay_sglang_5499(version: str) -> tuple[bool, str]:
    """sglang #5499: ``HiRadixCache.evict`` under the write_back policy frees fewer device
    slots than it counts. 0.4.5 .. 0.4.5.post1: it writes an unbacked node back and waits,
    but never frees the node's device slots; 0.4.5.post2 .. 0.4.5.post3 free them, but
    ``write_backup`` locks the node and its ancestors (``inc_lock_ref``), so the parent
    the loop pushes next is skipped as locked; 0.4.6 takes no lock for a write-back. 3
    device and 4 host slots: node A = [5, 6] and its child B = [7], unlocked, then
    ``evict(2)``."""
    tree, alloc, host = _hicache_write_back(version, 3, 4)
    do = _hicache_calls(version)
    import torch

    a = alloc.alloc(2)
    do.insert(tree, [5, 6], a)
    do.insert(tree, [5, 6, 7], torch.cat([a, alloc.alloc(1)]))  # (the prefix matches A)
    before = int(alloc.available_size())
    do.evict(tree, 2)
    freed = int(alloc.available_size()) - before
    return freed < 2, (f"evict(2) of A = [5, 6] with child B = [7] under write_back: {freed} "
                       f"device slot(s) freed")


def replay_sglang_27631(version: str) -> tuple[bool, str]:
    """sglang PR #27631 (closed; #31427 open): ``HiRadixCache.load_back`` under write_back
    protects only the device ancestor of the nodes it loads; when the device allocation
    for the load evicts, the eviction writes back, and a host too full for that write makes
    ``evict_host`` free host-only nodes: the very nodes being loaded. 12 device and 14 host
    slots: node A (10 tokens: the release's load_back_threshold) written back and evicted
    to the host, node B (12 tokens) filling the device, then a request matching A loads it
    back."""
    tree, alloc, host = _hicache_write_back(version, 12, 14)
    do = _hicache_calls(version)
    do.insert(tree, list(range(100, 110)), alloc.alloc(10))
    do.evict(tree, 10)  # A written back, then evicted from the device: host-only
    a = _child(tree, 100)
    do.insert(tree, list(range(200, 212)), alloc.alloc(12))  # B, unbacked, fills the device
    match = do.match(tree, list(range(100, 110)))
    src = [int(x) for x in a.host_value.tolist()]
    do.load_back(tree, match)
    queue = tree.cache_controller.load_queue  # (0.5.2 on: a list, issued with the batch)
    ops = list(queue if isinstance(queue, list) else queue.queue)
    loading = [int(x) for op in ops for x in op.host_indices.tolist()]
    free = set(int(x) for x in host.free_slots.tolist())
    b = _child(tree, 200)
    reused = set(int(x) for x in b.host_value.tolist()) if b is not None and \
        b.host_value is not None else set()
    hit = sorted(set(loading) & (free | reused))
    return bool(hit), (f"A's host slots {src}; the load copies from {loading}; host free "
                       f"{sorted(free)}, B written back to {sorted(reused)}: "
                       f"{hit or 'none'} freed under the load")


def _unified_write_back(version: str, device: int, host: int):
    """The release's ``UnifiedRadixCache`` (components ``(FULL,)``) with HiCache under the
    write_back policy, built as the scheduler builds it (``UnifiedRadixCache(params)`` then
    ``init_hicache(server_args, params)``) from the modules ``sglang_unified.load`` loads,
    with its stand-ins (the device KV buffers, the copies' streams and events). Returns
    (modules, tree, allocator)."""
    import dataclasses
    import types

    import torch

    from kvcheck.impl.thirdparty import sglang_hicache as hc
    from kvcheck.impl.thirdparty import sglang_unified as su

    mods = su.load(version)
    allocators = mods[hc.sglang.ALLOCATOR]
    alloc = allocators.TokenToKVPoolAllocator(device, torch.float16, "cpu",
                                              hc._DevicePool(device), False)
    rows = mods[f"{hc.MEM}.memory_pool"].ReqToTokenPool(4, 64, "cpu", False)
    cls = mods[f"{hc.MEM}.cache_init_params"].CacheInitParams
    given = {"disable": False, "req_to_token_pool": rows, "token_to_kv_pool_allocator": alloc,
             "page_size": 1, "tp_cache_group": None, "enable_metrics": False,
             "enable_kv_cache_events": False,
             "tree_components": (mods[su.COMPONENTS].ComponentType.FULL,)}
    params = cls(**{k: v for k, v in given.items()
                    if k in {f.name for f in dataclasses.fields(cls)}})
    args = types.SimpleNamespace(**{
        **hc._server_defaults(mods.root), "hicache_ratio": host / device, "hicache_size": 0,
        "hicache_write_policy": "write_back", "hicache_io_backend": "direct",
        "hicache_mem_layout": "layer_first", "hicache_storage_backend": None,
        "disable_hicache_numa_detect": True, "extra_metric_labels": None})
    context = mods.modules.get("sglang.srt.runtime_context")
    if context is not None:
        context.current = args
    tree = mods[su.UNIFIED].UnifiedRadixCache(params)
    tree.init_hicache(args, params)
    return mods, tree, alloc


def hc_free(alloc) -> list:
    """The device allocator's free slots (``free_slots``; 0.5.13's package: ``free_pages``)."""
    from kvcheck.impl.thirdparty import sglang

    if hasattr(alloc, "free_slots"):
        return alloc.free_slots.tolist()
    return sglang.free_pages_of(alloc)


def replay_sglang_24585(version: str) -> tuple[bool, str]:
    """sglang issue #24869 (fix: PR #24585, first released in 0.5.13): under the write_back
    policy ``UnifiedRadixCache._evict_device_leaf`` writes an unbacked node back
    (``write_backup(node, write_back=True)``: no lock, ``ongoing_write_through[id] = (node,
    None)``) and demotes it to the host at once, without waiting for the write; the
    write's ack, read by the scheduler's next ``check_hicache_events`` -> ``writing_check``,
    then unlocks a node it never locked whose device value is gone: ``dec_lock_ref(node,
    None)`` asserts in the FULL component. 4 device and 5 host slots: node A = 4 tokens,
    ``evict(2)``, the write's copy ends, the next step's check."""
    mods, tree, alloc = _unified_write_back(version, 4, 5)
    base = mods["sglang.srt.mem_cache.base_prefix_cache"]
    radix_key = mods["sglang.srt.mem_cache.radix_cache"].RadixKey
    slots = alloc.alloc(4)
    tree.insert(base.InsertParams(key=radix_key([100, 101, 102, 103], None), value=slots))
    tree.evict(base.EvictParams(num_tokens=2))
    acks = tree.cache_controller.ack_write_queue
    pending = [a for a in acks if not a.finish_event.query()]
    free = sorted(int(x) for x in hc_free(alloc))
    left = (f"after evict(2): A's device slots {sorted(int(x) for x in slots.tolist())}, "
            f"device free {free}; {len(pending)} write(s) in flight, "
            f"ongoing_write_through {sorted(tree.ongoing_write_through)}")
    for ack in acks:  # the write stream's copy has ended by the scheduler's next step
        ack.finish_event.synchronize()
    try:
        tree.check_hicache_events()
    except AssertionError as exc:
        from kvcheck.impl.thirdparty.sglang_unified import _where

        return True, f"{left}; check_hicache_events raised AssertionError: {_where(exc)}"
    return False, f"{left}; check_hicache_events: nothing to unlock"


def replay_sglang_27444(version: str) -> tuple[bool, str]:
    """sglang PR #27444 (first released in 0.5.14; the crash reported as #32331):
    ``UnifiedRadixCache.load_back`` locks the device path above the nodes it loads but not
    their host copies; when the device is short, its ``evict`` writes an unbacked device
    leaf back (write_back), the host is short too, and ``write_backup``'s ``evict_host``
    takes the host-only leaf being loaded: its host pages are freed (and may be the write's
    destination) and the commit reads ``len(node.host_value)`` of None. 4 device and 5 host
    slots: node A = 3 tokens written back and evicted to the host, node B = 4 unbacked
    tokens filling the device, then ``init_load_back`` of A (0.5.14 on: A host-locked for
    the load, the write-back finds no room and keeps B, the load is declined)."""
    import dataclasses

    mods, tree, alloc = _unified_write_back(version, 4, 5)
    base = mods["sglang.srt.mem_cache.base_prefix_cache"]
    radix_key = mods["sglang.srt.mem_cache.radix_cache"].RadixKey
    tree.load_back_threshold = 1  # (256 tokens in the release: a short A loads back)
    a_tokens, b_tokens = [100, 101, 102], [200, 201, 202, 203]
    tree.insert(base.InsertParams(key=radix_key(a_tokens, None), value=alloc.alloc(3)))
    tree.evict(base.EvictParams(num_tokens=3))  # A written back, demoted: host-only
    a = next(c for c in tree.root_node.children.values() if list(c.key)[0] == 100)
    src = [int(x) for x in a.component_data[0].host_value.tolist()]
    tree.insert(base.InsertParams(key=radix_key(b_tokens, None), value=alloc.alloc(4)))
    match = tree.match_prefix(base.MatchPrefixParams(key=radix_key(a_tokens, None)))
    req = _load_back_req(match)
    fields = {f.name for f in dataclasses.fields(base.InitLoadBackParams)}
    params = base.InitLoadBackParams(**{k: v for k, v in {
        "best_match_node": match.best_match_node, "host_hit_length": match.host_hit_length,
        "req": req}.items() if k in fields})
    try:
        loaded, _last = tree.init_load_back(params)
    except TypeError as exc:
        host = a.component_data[0].host_value
        return True, (f"A's host copy {src}; init_load_back raised TypeError ({exc}): A's "
                      f"host_value is now {host}, freed by the nested evict_host")
    host = a.component_data[0].host_value
    return False, (f"A's host copy {src}; init_load_back loaded {len(loaded)} token(s), A's "
                   f"host copy {None if host is None else host.tolist()}")


def _load_back_req(match):
    """The request fields ``init_load_back`` reads: its device match (``last_node``)."""
    import types

    return types.SimpleNamespace(last_node=match.last_device_node,
                                 best_match_node=match.best_match_node, session=None,
                                 swa_uuid_for_lock=None)


def _cuda_tensor():
    from kvcheck.impl.thirdparty import sglang_hicache as hc

    return hc._device_tensor_class()


def _native_offload(version: str, num_blocks: int, block_size: int, host_blocks: int):
    """The release's own ``KVCacheManager`` (one full-attention group, GPU prefix caching
    off, ``num_blocks`` + the null block) and the native ``OffloadingConnector``'s scheduler
    half, ``OffloadingConnectorScheduler``, over its ``CPUOffloadingManager`` (LRU,
    ``host_blocks`` chunks of one block), loaded by ``vllm_v1_native_offload.load``; the
    ``VllmConfig`` and ``CPUOffloadingSpec`` are that module's stand-ins (``_settings``,
    ``_cpu_spec``: named in its doc), its ``_record`` / ``_kv_tensor`` fill the release's
    own config records. Layouts keyed by job (0.21.0 .. 0.33.0). Returns (modules,
    manager, connector, block hasher)."""
    import inspect

    from kvcheck.impl.thirdparty import vllm_v1_native_offload as native

    mods = native.load(version)
    iface, utils = mods["vllm.v1.kv_cache_interface"], mods["vllm.v1.core.kv_cache_utils"]
    sha256 = mods["vllm.utils.hashing"].sha256
    full = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=mods["torch"].float16)
    page = 2 * block_size * 2  # K and V, one head of size 1, float16
    config = iface.KVCacheConfig(
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[native._kv_tensor(iface, (num_blocks + 1) * page, page)],
        kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], full)])
    utils.init_none_hash(sha256)
    cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    kw = {"max_model_len": 1 << 20, "scheduler_block_size": block_size,
          "hash_block_size": block_size, "enable_caching": False}
    params = inspect.signature(cls.__init__).parameters
    manager = cls(config, **{k: v for k, v in kw.items() if k in params})
    cpu = mods["vllm.v1.kv_offload.cpu.manager"]
    params = inspect.signature(cpu.CPUOffloadingManager.__init__).parameters
    args = {("num_chunks" if "num_chunks" in params else "num_blocks"): host_blocks,
            "cache_policy": "lru", "enable_events": False,
            **({"store_threshold": 0} if "store_threshold" in params else {})}
    spec = native._cpu_spec(mods["vllm.v1.kv_offload.base"], cpu, args)
    sched = mods[native.CONNECTOR + ".scheduler"].OffloadingConnectorScheduler
    extra = {"offload_prompt_only": False}
    if "vllm.v1.kv_offload.config" not in mods.files:  # (0.21.0 .. 0.25.1)
        connector = sched(spec(native._settings(block_size, extra), config))
    else:
        cfg, rec = mods["vllm.v1.kv_offload.config"], native._record
        offload = rec(
            cfg.OffloadingConfig, extra_config=extra, engine_id="replay",
            groups=(rec(cfg.OffloadingGroupConfig, tokens_per_block=block_size,
                        layer_names=("layer.0",), group_id=0),),
            worker_kv_bytes_per_block=page, enable_kv_cache_events=False,
            model=rec(cfg.OffloadingModelConfig, name="replay", dtype="float16",
                      max_model_len=1 << 20),
            cache=cfg.OffloadingCacheConfig(tokens_per_hash=block_size, blocks_per_chunk=1),
            parallel=rec(cfg.OffloadingParallelConfig, rank=0, world_size=1, tp_size=1,
                         pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
                         data_parallel_size=1, data_parallel_rank_local=0,
                         is_parallelism_agnostic=False))
        connector = sched(spec(offload), native._settings(block_size), config)
    return mods, manager, connector, utils.get_request_block_hasher(block_size, sha256)


def replay_vllm_49118(version: str) -> tuple[bool, str]:
    """#49118 (PRs #49146, #49285): a request aborted while queued -- admitted, but
    ``allocate_slots`` found no room, so it never ran -- is named in the next step's
    ``finished_req_ids``; 0.26.0's store scan (``_build_store_jobs``, which walks finished
    requests too since PR #48596) takes a finished request as computed up to
    ``num_tokens``: two offload keys (the prompt's block hashes) and no block id, and
    ``assert len(offload_keys) == len(offload_block_ids)`` kills the engine. 0.27.0 scans
    an aborted request to its computed tokens and bounds the chunks by its blocks.
    The scheduler's calls, one block of 1 slot, a 2-token prompt: ``on_new_request``, the
    lookup (a miss), ``allocate_slots`` -> None, the step's ``build_connector_meta``; the
    abort (``finish_requests``: ``request_finished``, ``free``); the next step's build."""
    from kvcheck.impl.thirdparty import vllm_v1_native_offload as native

    mods, manager, connector, hasher = _native_offload(version, 1, 1, 4)
    empty = mods["vllm.v1.core.sched.output"].SchedulerOutput.make_empty
    req = native.OffloadRequest("0", [0, 0], hasher)
    connector.on_new_request(req)
    computed, num_local = manager.get_computed_blocks(req)[:2]
    hit, _ = connector.get_num_new_matched_tokens(req, num_local)
    got = manager.allocate_slots(req, 2 - num_local - hit, num_local, computed)
    connector.build_connector_meta(empty())  # the step: nothing scheduled, req waits
    req.status = mods["vllm.v1.request"].RequestStatus.FINISHED_ABORTED
    connector.request_finished(req)
    manager.free(req)
    status = connector._req_status.get(req.request_id)
    seen = f"allocate_slots -> {got}; after the abort " + (
        "the connector no longer tracks the request" if status is None else
        f"its offload keys: {len(status.group_states[0].offload_keys)}, its block ids: "
        f"{status.group_states[0].block_ids}")
    step = empty()
    step.finished_req_ids = {req.request_id}
    try:
        meta = connector.build_connector_meta(step)
    except AssertionError as exc:
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return True, (f"{seen}; the next step's build_connector_meta: AssertionError in "
                      f"{frame.name} (line {frame.lineno}: {frame.line})")
    return False, f"{seen}; the next step's build_connector_meta: store jobs {meta.store_jobs}"


def replay_vllm_34576(version: str) -> tuple[bool, str]:
    """PR #34576: ``ARCOffloadingManager.touch`` pops a key from T1, then, for a block
    not yet ready (just prepared for a store), ``self.t1.move_to_end`` of the popped key:
    ``KeyError``. The connector's store scan (``offloading_connector.py``
    ``_get_reqs_to_store``) calls ``prepare_store(new hashes)`` then ``touch`` of the
    request's hashes, new ones included: every first store of a block raises (0.11.1 ..
    0.16.0). 0.17.0 keeps the block in T1 (``self.t1[key] = block``). The release's own
    ARC manager over its ``CPUBackend``, 4 blocks of 1 slot; one block stored, touched."""
    from kvcheck.impl.thirdparty import vllm_v1_native_offload as native

    mods = native.load(version)
    backend = mods["vllm.v1.kv_offload.backends.cpu"].CPUBackend(block_size=1, num_blocks=4)
    arc = mods["vllm.v1.kv_offload.arc_manager"].ARCOffloadingManager(backend)
    key = b"block-0"
    out = arc.prepare_store([key])
    stored = f"prepare_store stores {out.block_hashes_to_store}, T1 {list(arc.t1)}"
    try:
        arc.touch([key])
    except KeyError as exc:
        return True, f"{stored}; touch raises KeyError {exc}"
    return False, f"{stored}; touch: T1 {list(arc.t1)}, T2 {list(arc.t2)}"


REPLAYS = {
    "sglang-4989": replay_sglang_4989,
    "sglang-5499": replay_sglang_5499,
    "sglang-27631": replay_sglang_27631,
    "sglang-24585": replay_sglang_24585,
    "sglang-27444": replay_sglang_27444,
    "sglang-30106": replay_sglang_30106,
    "aphrodite-1556": replay_aphrodite_1556,
    "aphrodite-42571": replay_aphrodite_42571,
    "vllm-7380": replay_vllm_7380,
    "aphrodite-679": replay_aphrodite_679,
    "aphrodite-11168": replay_aphrodite_11168,
    "vllm-43569": replay_vllm_43569,
    "nano-vllm-163": replay_nano_vllm_163,
    "nano-vllm-144": replay_nano_vllm_144,
    "vllm-4761": replay_vllm_4761,
    "vllm-5364": replay_vllm_5364,
    "vllm-42571": replay_vllm_42571,
    "vllm-1556": replay_vllm_1556,
    "vllm-11168": replay_vllm_11168,
    "vllm-18957": replay_vllm_18957,
    "vllm-11186": replay_vllm_11186,
    "vllm-11565": replay_vllm_11565,
    "vllm-10730": replay_vllm_10730,
    "vllm-19459": replay_vllm_19459,
    "sglang-34399": replay_sglang_34399,
    "sglang-27779": replay_sglang_27779,
    "vllm-6849": replay_vllm_6849,
    "vllm-8824": replay_vllm_8824,
    "vllm-49118": replay_vllm_49118,
    "vllm-34576": replay_vllm_34576,
}
