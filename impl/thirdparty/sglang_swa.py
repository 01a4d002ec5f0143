"""Adapter: SGLang's ``SWATokenToKVPoolAllocator`` as a tiers target with a second device
pool behind a mapping (``sglang-swa``, 0.5.23 pinned; ``sglang-swa@VERSION`` for 0.5.13 ..
0.5.23; ``kvcheck verify-tiers sglang-swa@0.5.13``).

What runs is the wheel's own ``sglang/srt/mem_cache/allocator/{__init__,base,token,paged,
swa}.py`` (loaded as ``sglang.py`` loads the paged allocator: ``_loader``, the Triton
kernels under Triton's interpreter before 0.5.22, the torch path from 0.5.22), on torch CPU
tensors, at page size ``block_size`` > 1: two ``PagedTokenToKVPoolAllocator`` s, the
full-attention pool (``device``) and the sliding-window pool (``swa``), both of
``num_blocks`` pages, joined by ``full_to_swa_index_mapping`` (full slot -> SWA slot, 0 for
none). ``host_blocks`` is ignored: there is no host pool.

The adapter is the caller (the scheduler without a radix tree), keeping each request's
``req_to_token`` row itself as ``sglang.py`` does:

``allocate(seq, tokens)``
    ``alloc_extend(prefix_lens=[0], seq_lens=[n], last_loc=[-1], n)``: full pages, then SWA
    pages, the mapping written for every token. ``None`` -> ``OutOfBlocks``.
``append(seq, token)``
    ``alloc_decode(seq_lens=[L+1], last_loc=[row[L-1]])`` (the SWA side's ``last_loc`` is
    the allocator's own translation through the mapping), behind the scheduler's decode
    memory check: a decode at a page boundary with no free page in either pool is refused
    before the allocator is called (``OutOfBlocks``), as SGLang's scheduler retracts a
    request rather than call ``alloc_decode`` without room (``alloc_paged_token_slots_decode``
    raises "Decode out of memory" when it returns None; its failure path is never a state
    the engine goes on from).
``slide(seq, upto)``
    the window moves past the first ``upto`` tokens: ``free_swa(row[done:upto])``, the
    tokens since the last slide, as ``free_swa_out_of_window_slots`` calls it
    (``req.swa_evicted_seqlen`` is ``done``). SGLang's own caller rounds ``upto`` down to a
    page; kvcheck's does not, so the page the window's edge cuts is freed in part: the
    caller sglang PR #27779 made ``free_swa`` safe for (it expands the slots to whole pages
    from 0.5.14).
``free(seq)``
    ``free(row)``: ``free_swa`` then the full pool (0.5.22 on; 0.5.13 the other way), for
    the whole row. (From 0.5.17 the scheduler frees page-aligned row segments,
    ``free_kv_row_segments``, which assert that the eviction cursor does not cut a page;
    ``free``, documented for an arbitrary slot set, has no such assertion.)

Observation. A block of either pool is its page minus one (page 0 is the padding page).
``table(seq)`` is the row's full pages (``sglang.row_pages``); ``mapped(seq)`` the SWA page
each of those pages' tokens map to: None where every token of the page maps to 0 (released),
else the one SWA page they name (a token whose mapping was cleared while another token of
its page still names a page does not release it: that page is still reached). Tokens of one
full page that name two SWA pages, or a slot not at its offset, read as ``MISALIGNED``
(-2, no block), which ``valid_block_ids`` reports. SGLang keeps no refcounts: a page's count
is the number of requests naming it (vacuous, as for ``sglang-paged``); the free lists are
each allocator's own (``free_pages`` + ``release_pages``, or ``get_all_free_pages()``).

Stand-ins (named here, once; every other ``sglang.*`` import raises):

``sglang.srt.utils``, ``sglang.srt.utils.common``
    the real functions the allocator files import (``get_num_new_pages``, ``is_npu``,
    ``get_bool_env_var``, ``is_hip``, ``next_power_of_2``, ``ceil_div``) compiled from the
    release's ``utils/common.py`` (``sglang.real_functions``); ``async_h2d`` (0.5.23,
    called only by ``alloc_extend_swa_tail``, the P/D decode path) raises if called. The
    package's ``__init__`` imports the engine.
``sglang.srt.platforms``
    ``current_platform``: no Triton (``supports_triton`` False: the torch path from
    0.5.22, as ``platforms/cpu.py`` declares) and no platform allocator class
    (``get_paged_allocator_cls()`` None: the stock ``PagedTokenToKVPoolAllocator``).
``sglang.kernels.ops.memory.allocator`` (0.5.22 on)
    the Triton kernels ``paged.py`` and ``swa.py`` import, used only on CUDA tensors;
    they raise if called. (Before 0.5.22 the release's kernel file itself is executed
    under Triton's interpreter, as for ``sglang-paged``.)
``sglang.srt.mem_cache.base_swa_memory_pool``
    ``BaseSWAKVPool``: the allocator asserts its KV pool is one and calls
    ``register_mapping`` and ``translate_loc_from_full_to_swa``; the stand-in pool holds
    no KV (``full_kv_pool`` / ``swa_kv_pool`` None, as the paged allocator accepts) and
    both methods are ``SWAKVPool``'s own two lines (keep the mapping; index it).
    ``swa_req_ring_size`` is None (no per-request ring, the default).
``sglang.srt.utils.invariants`` (0.5.21 on)
    ``expect`` at SGLang's default level, ``SGLANG_INVARIANT_CHECK`` off: no detection,
    the value returned as is (the data layer; these invariants have no ``recover``).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from kvcheck.spec.tiers import CONTRACTS

from ..errors import MisuseError, OutOfBlocks
from . import _loader
from . import sglang as S
from ._loader import Loaded

ENGINE_KEY = "sglang-swa"  # install.ENGINES row: sglang-swa@VERSION
SWA_MODULE = f"{S.ALLOCATOR}.swa"
FILES = (*S.FILES, SWA_MODULE)
UTILS_FUNCTIONS = ("ceil_div", "get_num_new_pages", "get_bool_env_var", "is_hip",
                   "next_power_of_2", "is_npu")
DEVICE, SWA = "device", "swa"
VACUOUS = {**S.VACUOUS,
           "refcount_conservation": "SGLang keeps no refcounts: a page's count in either pool "
                                    "is the number of requests naming it, derived from the rows "
                                    "and the mapping"}


def _stub_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    import functools
    import logging
    import os
    from typing import Optional

    import torch

    rel = "sglang/srt/utils/common.py"
    text = (loaded.root / rel).read_text()
    names = [n for n in UTILS_FUNCTIONS if f"\ndef {n}(" in text]
    S.real_functions(mod, loaded, rel, names, {
        "torch": torch, "os": os, "lru_cache": functools.lru_cache, "Optional": Optional,
        "logger": logging.getLogger("kvcheck.thirdparty.sglang_swa.utils"),
        "_warned_bool_env_var_keys": set(),
    })

    def async_h2d(*_a, **_k):
        raise RuntimeError("async_h2d: alloc_extend_swa_tail's path, which kvcheck does not "
                           "drive")

    mod.async_h2d = async_h2d


def _stub_platforms(mod: types.ModuleType, _: Loaded) -> None:
    mod.current_platform = types.SimpleNamespace(
        capabilities=types.SimpleNamespace(supports_triton=False),
        get_paged_allocator_cls=lambda: None)


def _stub_kernels(mod: types.ModuleType, loaded: Loaded) -> None:
    S.STUBS["sglang.kernels.ops.memory.allocator"](mod, loaded)

    def get_and_clear_swa_pages(*_a, **_k):
        raise RuntimeError("get_and_clear_swa_pages is the CUDA path; kvcheck runs the CPU one")

    mod.get_and_clear_swa_pages = get_and_clear_swa_pages


def _stub_swa_pool(mod: types.ModuleType, _: Loaded) -> None:
    class BaseSWAKVPool:
        full_kv_pool = None
        swa_kv_pool = None
        swa_req_ring_size = None
        full_to_swa_index_mapping = None

        def register_mapping(self, full_to_swa_index_mapping):
            self.full_to_swa_index_mapping = full_to_swa_index_mapping

        def translate_loc_from_full_to_swa(self, kv_indices):
            assert self.full_to_swa_index_mapping is not None
            return self.full_to_swa_index_mapping[kv_indices]

    mod.BaseSWAKVPool = BaseSWAKVPool


def _stub_invariants(mod: types.ModuleType, _: Loaded) -> None:
    class Bucket:
        FATAL_UNCONTAINABLE = "fatal_uncontainable"
        GUARD = "guard"
        SOFTEN = "soften"

    class IsTrue:
        name = "is_true"

    class Invariant:
        def __init__(self, name, bucket, prop, *, recover=None):
            self.name, self.bucket, self.prop, self.recover = name, bucket, prop, recover

    def expect(inv, value, *, msg=""):
        return inv.recover(value) if inv.recover is not None and value is not None else value

    mod.Bucket, mod.IsTrue, mod.Invariant, mod.expect = Bucket, IsTrue, Invariant, expect


STUBS = {"sglang.srt.utils": _stub_utils, "sglang.srt.utils.common": _stub_utils,
         "sglang.srt.platforms": _stub_platforms,
         "sglang.kernels.ops.memory.allocator": _stub_kernels,
         "sglang.srt.mem_cache.base_swa_memory_pool": _stub_swa_pool,
         "sglang.srt.utils.invariants": _stub_invariants}


def load(version: str | None = None) -> Loaded:
    """The release's allocator package with ``swa.py`` (``install.select``: default the
    pinned 0.5.23); ``ThirdPartyMissing`` if not installed."""
    from . import install

    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    if S.single_file(root):
        raise MisuseError(f"SGLang {dist.version}: the allocators are one module "
                          "(mem_cache/allocator.py); sglang-swa loads the allocator/ package "
                          "(0.5.13 on)")
    return S.load_dist(dist, FILES, STUBS, FILES)


class SglangSWATarget:
    """Tiers target over the release's ``SWATokenToKVPoolAllocator`` (module docstring)."""

    capabilities = frozenset({"allocate", "append", "free", "slide"})
    operations = tuple(CONTRACTS)  # the tiers model's (the verdict's vacuity line)
    vacuous = VACUOUS

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0,
                 version: str | None = None):
        import torch

        if num_blocks < 1:
            raise MisuseError("num_blocks must be positive")
        if block_size < 2:
            raise MisuseError(f"sglang-swa runs the paged SWA allocator: page size > 1, not "
                              f"{block_size} (--block-size 2 or more)")
        self.torch, self.n, self.B = torch, num_blocks, block_size
        loaded = load(version)
        self.version = loaded.dist.version
        swa = loaded[SWA_MODULE]
        size = num_blocks * block_size
        pool = loaded["sglang.srt.mem_cache.base_swa_memory_pool"].BaseSWAKVPool()
        self.alloc = swa.SWATokenToKVPoolAllocator(size, size, block_size, torch.float16, "cpu",
                                                   pool, False)
        self.rows: dict[int, Any] = {}  # seq -> req_to_token row (int64 full slots)
        self.slid: dict[int, int] = {}  # seq -> swa_evicted_seqlen

    def _t(self, values):
        return self.torch.tensor(values, dtype=self.torch.int64)

    # -- operations -------------------------------------------------------------------
    def allocate(self, seq: int, tokens) -> None:
        if seq in self.rows:
            raise MisuseError(f"sequence {seq!r} already exists")
        n = len(tokens)
        if n < 1:
            raise MisuseError("a request has at least one token")
        out = S.alloc_extend(self.alloc, self._t([0]), self._t([n]), self._t([-1]), n)
        if out is None:
            raise OutOfBlocks(f"SGLang's SWA alloc_extend for {n} tokens returned None")
        self.rows[seq] = out.clone()
        self.slid[seq] = 0

    def append(self, seq: int, token) -> tuple[int, int]:
        row = self._live(seq)
        n = len(row)
        if n % self.B == 0 and min(self.alloc.full_available_size(),
                                   self.alloc.swa_available_size()) < self.B:
            raise OutOfBlocks("no free page for the decode in both pools: the scheduler "
                              "retracts the request before alloc_decode")
        out = S.alloc_decode(self.alloc, self._t([n + 1]), row[n - 1 : n].clone())
        if out is None:
            raise OutOfBlocks("SGLang's SWA alloc_decode returned None")
        self.rows[seq] = self.torch.cat((row, out))
        slot = int(out[0])
        return slot // self.B - 1, slot % self.B

    def slide(self, seq: int, upto: int) -> None:
        row = self._live(seq)
        done = self.slid[seq]
        if not done <= upto <= len(row):
            raise MisuseError(f"slide({seq}, {upto}): the window is past {done} of {len(row)}")
        if upto > done:
            self.alloc.free_swa(row[done:upto].clone())
        self.slid[seq] = upto

    def free(self, seq: int) -> None:
        row = self._live(seq)
        self.alloc.free(row.clone())
        del self.rows[seq], self.slid[seq]

    def _live(self, seq: int):
        row = self.rows.get(seq)
        if row is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return row

    # -- observation ----------------------------------------------------------------------
    def pools(self) -> dict:
        return {DEVICE: self.n, SWA: self.n}

    def table(self, seq: int):
        row = self.rows.get(seq)
        return None if row is None else (DEVICE, S.row_pages(row.tolist(), self.B))

    def mapped(self, seq: int) -> dict:
        row = self.rows[seq].tolist()
        swa = self.alloc.full_to_swa_index_mapping[self.rows[seq]].tolist()
        return {SWA: mapped_pages(row, swa, self.B)}

    def refcount(self, pool: str, b: int) -> int:
        if pool == DEVICE:
            return sum(b in self.table(q)[1] for q in self.rows)
        return sum(b in self.mapped(q)[SWA] for q in self.rows)

    def free_blocks(self, pool: str) -> list[int]:
        alloc = self.alloc.full_attn_allocator if pool == DEVICE else self.alloc.swa_attn_allocator
        return [p - 1 for p in S.free_pages_of(alloc)]

    def live_seqs(self) -> list[int]:
        return list(self.rows)

    def pending_jobs(self) -> dict:
        return {}

    def cache_entries(self, pool: str) -> list:
        return []

    def evictable_blocks(self, pool: str) -> list:
        return []

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


def mapped_pages(row: Sequence[int], swa: Sequence[int], page_size: int) -> list:
    """Per full page of the row, the SWA block its tokens map to: None when every token's
    mapping is 0 (released); else the one SWA page the mapped tokens name, each at its own
    offset (minus one: page 0 is the padding page); ``MisalignedRow`` when they name two
    pages or a slot off its offset."""
    out: list = []
    for i in range(0, len(row), page_size):
        named = [(k, s) for k, s in enumerate(swa[i : i + page_size]) if s != 0]
        if not named:
            out.append(None)
            continue
        page = named[0][1] // page_size
        offsets = [row[i + k] % page_size for k, _ in named]
        if any(s // page_size != page or s % page_size != o
               for (_, s), o in zip(named, offsets, strict=True)):
            out.append(S.MisalignedRow(page, [s for _, s in named]))
        else:
            out.append(page - 1)
    return out


def make(num_blocks: int, block_size: int, host_blocks: int = 0,
         version: str | None = None) -> SglangSWATarget:
    """``SWATokenToKVPoolAllocator`` at page size ``block_size``, both pools ``num_blocks``
    pages."""
    return SglangSWATarget(num_blocks, block_size, host_blocks, version=version)
