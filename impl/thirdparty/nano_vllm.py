"""Adapter: nano-vllm's ``BlockManager`` (nano-vllm-fork==20260210) as a ``Target``.

What runs is ``nanovllm/engine/block_manager.py`` and
``nanovllm/engine/sequence.py`` from the installed wheel (see ``_loader``),
unchanged, with the real ``xxhash`` and ``numpy``: prefix caching by chained
xxh64 hashes of full blocks.

Stand-ins (every other ``nanovllm.*`` import raises, see ``_loader``):

``nanovllm.sampling_params``
    ``SamplingParams``: ``Sequence.__init__`` copies sampling fields
    (temperature, max_tokens, top-k/p, ...) off it; the block manager never reads
    them. The stand-in has the same field names and defaults, without the
    validation. The real module is importable, but ``nanovllm/__init__.py`` (which
    pulls in the engine, torch and transformers) would run first.

Operations, as nano-vllm's ``Scheduler`` drives the block manager:

``allocate(seq, n)``
    a ``Sequence`` of ``n`` fresh token ids (or the caller's ``token_ids``), then
    ``can_allocate(seq)`` -- ``False`` -> ``OutOfBlocks`` -- then
    ``allocate(seq)``. The check is the block manager's own API (``allocate``
    itself assumes it passed: it indexes ``free_block_ids[0]`` and would raise
    ``IndexError`` half-way through). Returns ``seq.num_cached_tokens``: the
    prompt tokens the model runner skips (``input_ids.extend(seq[num_cached_tokens:])``).
``append_slot(seq)``
    one decode token. nano-vllm's scheduler calls ``can_append`` /
    ``may_append`` *after* ``postprocess`` appended the sampled token, i.e. with
    ``len(seq)`` already counting the token whose slot is reserved. So:
    ``seq.append_token(tok)``; ``can_append(seq)`` -- ``False`` -> pop the token
    again (restoring ``token_ids``, ``num_tokens``, ``last_token``) and raise
    ``OutOfBlocks``; else ``may_append(seq)``. The slot of token ``L`` is
    ``(block_table[L // bs], L % bs)``; ``cow_src`` is always ``None`` (no fork, and
    shared prefix blocks are full, so never written).
``free_seq(seq)``
    ``deallocate(seq)``.
``preempt(seq)``
    ``Scheduler.preempt``: status WAITING, ``deallocate(seq)``; the ``Sequence``
    is kept (its token ids: prompt plus everything generated). Re-admission is
    ``allocate(seq, n)`` of the same sequence with ``n == len(seq)``: the same
    ``Sequence`` through ``can_allocate`` / ``allocate``, as the scheduler
    re-admits it from the waiting queue (its prefix-cache entries were dropped by
    ``deallocate`` when their refcount reached 0, so it recomputes everything).
    (An ``allocate`` of that id with another ``n`` is a new sequence.)
``fork``, ``append_slots``, ``rollback``, ``rebase``
    not supported: nano-vllm has no fork, reserves one slot per step
    (``can_append`` / ``may_append`` for the token just sampled: no chunked
    decode, no lookahead, no speculative decoding) and never drops tokens.
    ``capabilities`` excludes them.

Block size: ``Sequence.block_size`` is a *class* attribute (256) in nano-vllm;
the adapter sets it on each ``Sequence`` instance, so targets with different
block sizes coexist. nano-vllm's ``Config`` requires ``kvcache_block_size %
256 == 0``; smaller sizes are outside what the engine accepts, and
``block_size == 1`` breaks ``may_append`` (see docs/thirdparty-notes.md).

Observation: ``block_table`` = ``seq.block_table``; ``refcount`` =
``Block.ref_count``; ``free_blocks`` = ``free_block_ids`` (a deque);
``table_identity`` = the ``block_table`` list; ``seq_len`` = ``len(seq)``; the prefix
cache: ``cache_entries`` = ``hash_to_block_id``, ``free_list_blocks`` = ``free_block_ids``,
no evictable blocks.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader
from ._loader import NANO_VLLM, Loaded

FILES = ("nanovllm.engine.block_manager", "nanovllm.engine.sequence")


def _stub_sampling_params(mod: types.ModuleType, _: Loaded) -> None:
    class SamplingParams:
        def __init__(self, temperature: float = 1.0, max_tokens: int = 64,
                     ignore_eos: bool = False, cfg_scale: float = 1.0,
                     top_k: int | None = None, top_p: float | None = None,
                     repetition_penalty: float = 1.0, logits_processor: Any = None,
                     logits_processor_update_state: Any = None):
            self.temperature = temperature
            self.max_tokens = max_tokens
            self.ignore_eos = ignore_eos
            self.cfg_scale = cfg_scale
            self.top_k = top_k
            self.top_p = top_p
            self.repetition_penalty = repetition_penalty
            self.logits_processor = logits_processor
            self.logits_processor_update_state = logits_processor_update_state

    mod.SamplingParams = SamplingParams


STUBS = {"nanovllm.sampling_params": _stub_sampling_params}


def load() -> Loaded:
    """nano-vllm's block manager modules (``ThirdPartyMissing`` if not installed)."""
    return _loader.load(NANO_VLLM, FILES, STUBS, entry=FILES)


def new_sequence(token_ids: Sequence[int], block_size: int, cls: Any = None) -> Any:
    """A real nano-vllm ``Sequence`` with its block size set on the instance (``cls``: the
    release's ``Sequence`` class, where the caller holds it: ``load()`` checks the install
    on disk, a fifth of a checked run when asked at every allocation)."""
    seq = (cls or load()["nanovllm.engine.sequence"].Sequence)(list(token_ids))
    seq.block_size = block_size
    return seq


def pop_token(seq: Any) -> None:
    """Undo ``Sequence.append_token`` (used when the append's slot is refused)."""
    seq.token_ids.pop()
    seq.num_tokens -= 1
    seq.last_token = seq.token_ids[-1]


class NanoVllmTarget:
    """``Target`` over a real nano-vllm ``BlockManager`` (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "free_seq", "preempt"})

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        mods = load()  # once: each load() checks the install on disk
        self.manager = mods["nanovllm.engine.block_manager"].BlockManager(num_blocks, block_size)
        self._Status = mods["nanovllm.engine.sequence"].SequenceStatus
        self._Sequence = mods["nanovllm.engine.sequence"].Sequence
        self.seqs: dict[int, Any] = {}
        self.preempted: dict[int, Any] = {}  # preempted seq -> its Sequence, to re-admit
        self._tokens = itertools.count(1)

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        if seq in self.seqs:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        s = self.preempted.get(seq)
        if s is None or len(s) != n_tokens or (
                token_ids is not None and list(token_ids) != list(s.token_ids)):
            tokens = list(token_ids) if token_ids is not None else [
                next(self._tokens) for _ in range(n_tokens)
            ]
            if len(tokens) != n_tokens:
                raise MisuseError("len(token_ids) != n_tokens")
            s = new_sequence(tokens, self.block_size, self._Sequence)
        if not self.manager.can_allocate(s):
            raise OutOfBlocks(f"nano-vllm can_allocate is False for {n_tokens} tokens")
        self.manager.allocate(s)
        self.preempted.pop(seq, None)
        s.status = self._Status.RUNNING
        self.seqs[seq] = s
        return s.num_cached_tokens  # what the model runner skips (``seq[num_cached_tokens:]``)

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        s = self._live(seq)
        length = len(s)
        s.append_token(next(self._tokens) if token_id is None else token_id)
        if not self.manager.can_append(s):
            pop_token(s)
            raise OutOfBlocks("nano-vllm can_append is False")
        self.manager.may_append(s)
        return s.block_table[length // self.block_size], length % self.block_size, None

    def fork(self, parent: int, child: int) -> None:
        raise NotImplementedError("nano-vllm has no fork")

    def free_seq(self, seq: int) -> None:
        s = self._live(seq)
        self.manager.deallocate(s)
        del self.seqs[seq]

    def preempt(self, seq: int) -> None:
        """``Scheduler.preempt``: WAITING, ``deallocate``; the Sequence kept to re-admit."""
        s = self._live(seq)
        s.status = self._Status.WAITING
        self.manager.deallocate(s)
        del self.seqs[seq]
        self.preempted[seq] = s

    def _live(self, seq: int) -> Any:
        s = self.seqs.get(seq)
        if s is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return s

    def _observed(self, seq: int):
        """Observation of an unknown sequence raises ``KeyError`` (the oracle's "no table")."""
        return self.seqs[seq]

    # -- observation --------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        return list(self._observed(seq).block_table)

    def refcount(self, block: int) -> int:
        return self.manager.blocks[block].ref_count

    def free_blocks(self) -> Iterable[int]:
        return list(self.manager.free_block_ids)

    def num_free(self) -> int:
        return len(self.manager.free_block_ids)

    def table_identity(self, seq: int) -> object | None:
        return self._observed(seq).block_table

    def seq_len(self, seq: int) -> int | None:
        return len(self._observed(seq))

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)

    def token_ids(self, seq: int) -> list[int]:
        return list(self._observed(seq).token_ids)

    # the prefix cache, as the prefix model reads any target (``kvcheck.engines``): the
    # manager's ``hash_to_block_id``; no evictable list (a freed block's entry is dropped)
    def cache_entries(self) -> list[tuple[int, int]]:
        return list(self.manager.hash_to_block_id.items())

    def evictable_blocks(self) -> list[int]:
        return []

    def free_list_blocks(self) -> list[int]:
        return list(self.manager.free_block_ids)


def make(num_blocks: int, block_size: int) -> NanoVllmTarget:
    return NanoVllmTarget(num_blocks, block_size)
