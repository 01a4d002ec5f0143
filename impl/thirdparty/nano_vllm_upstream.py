"""Adapter: nano-vllm-npu's ``BlockManager`` (nano-vllm-npu 0.0.1.post1 .. 0.0.2) as a ``Target``.

nano-vllm-npu is a PyPI fork that carries upstream nano-vllm's block manager as it was
before nano-vllm-fork's change to ``deallocate``: a freed block keeps its
``hash_to_block_id`` entry and stays revivable from the plain free list (a hit on it
goes through ``_allocate_block``, which takes it off the free list again). What runs is
``nanovllmnpu/engine/{block_manager,sequence}.py`` from the installed wheel
(``kvcheck install nano-vllm-npu``), with the real ``xxhash`` and ``numpy``; the
stand-in for ``nanovllmnpu.sampling_params`` is nano-vllm's (``nano_vllm.py``).

Operations, capabilities and observation are the nano-vllm adapter's
(``NanoVllmTarget``: allocate with ``can_allocate`` first, append with
``can_append`` / ``may_append``, free, preempt; no fork, no append_slots), on this
fork's classes. The prefix cache is reported through the ``cache_entries`` /
``evictable_blocks`` / ``free_list_blocks`` methods the prefix model reads: every
``hash_to_block_id`` entry; a free block some entry names is *evictable* (cached,
unreferenced, revivable, and taken for new content by a miss), a free block no entry
names is on the plain free list.

``make(num_blocks, block_size, version=None)``; ``TARGET@VERSION`` picks the release
(``kvcheck.impl.thirdparty.nano_vllm_upstream:make@0.0.2``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install, nano_vllm
from ._loader import Loaded

ENGINE_KEY = "nano-vllm-npu"  # its row in install.ENGINES


def load(version: str | None = None) -> Loaded:
    """The fork's block-manager modules at ``version`` (``ThirdPartyMissing`` if absent)."""
    dist = install.select(ENGINE_KEY, version)
    _loader.require(dist)
    top = dist.top
    files = (f"{top}.engine.block_manager", f"{top}.engine.sequence")
    stubs = {f"{top}.sampling_params": nano_vllm.STUBS["nanovllm.sampling_params"]}
    return _loader.load(dist, files, stubs, entry=files)


class NanoUpstreamTarget(nano_vllm.NanoVllmTarget):
    """``NanoVllmTarget``'s operations on nano-vllm-npu's classes (see module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, version: str | None = None):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        mods = load(version)  # not kept: the module table is shared, never copied
        top = mods.dist.top
        self.version = mods.dist.version
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.manager = mods[f"{top}.engine.block_manager"].BlockManager(num_blocks, block_size)
        self._Status = mods[f"{top}.engine.sequence"].SequenceStatus
        self._Sequence = mods[f"{top}.engine.sequence"].Sequence
        self.seqs: dict[int, Any] = {}
        self.preempted: dict[int, Any] = {}
        self._tokens = itertools.count(1)

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        if seq in self.seqs:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        s = self.preempted.get(seq)
        if s is None or token_ids is not None or len(s) != n_tokens:
            tokens = list(token_ids) if token_ids is not None else [
                next(self._tokens) for _ in range(n_tokens)
            ]
            if len(tokens) != n_tokens:
                raise MisuseError("len(token_ids) != n_tokens")
            s = self._Sequence(tokens)
            s.block_size = self.block_size  # a class attribute (256) in nano-vllm
        if not self.manager.can_allocate(s):
            raise OutOfBlocks(f"nano-vllm-npu can_allocate is False for {n_tokens} tokens")
        self.manager.allocate(s)
        self.preempted.pop(seq, None)
        s.status = self._Status.RUNNING
        self.seqs[seq] = s
        return s.num_cached_tokens

    # -- the prefix cache, as the prefix model reads it --------------------------------
    def cache_entries(self) -> list[tuple[int, int]]:
        return list(self.manager.hash_to_block_id.items())

    def _named(self) -> set[int]:
        return set(self.manager.hash_to_block_id.values())

    def evictable_blocks(self) -> list[int]:
        named = self._named()
        return [b for b in self.manager.free_block_ids if b in named]

    def free_list_blocks(self) -> list[int]:
        named = self._named()
        return [b for b in self.manager.free_block_ids if b not in named]


def make(num_blocks: int, block_size: int, version: str | None = None) -> NanoUpstreamTarget:
    return NanoUpstreamTarget(num_blocks, block_size, version)
