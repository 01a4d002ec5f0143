"""Adapters: SGLang's token and paged KV allocators as ``Target`` s (0.5.23 pinned;
``sglang-token@VERSION`` / ``sglang-paged@VERSION`` for any release 0.4.8 .. 0.5.23).

What runs is the wheel's own ``sglang/srt/mem_cache/allocator/{__init__,base,token,
paged}.py`` (see ``_loader``), unchanged, on torch CPU tensors: the free list is
``free_pages`` (+ ``release_pages`` / ``staged_pages`` under ``need_sort``), a
torch ``int64`` tensor, as on the GPU. Install: ``kvcheck install sglang[==VERSION]``
(optional: not in the default set).

The range. What differs between releases is read from each release's files, not its
version string:

* layout: the allocators are one module, ``mem_cache/allocator.py``, from 0.4.8 (where
  ``PagedTokenToKVPoolAllocator`` moved there) to 0.5.12, with their Triton kernels
  defined in it; the package ``mem_cache/allocator/`` from 0.5.13, the kernels in
  ``mem_cache/triton_ops/allocator.py`` (to 0.5.15) or ``sglang/kernels/ops/memory/
  allocator.py`` (0.5.16 on). ``allocator.py`` imports ``SWAKVPool`` from the 260 KB
  ``memory_pool.py`` for the SWA allocator's ``isinstance`` check only: a stand-in class
  no pool here is an instance of.
* kernels: ``paged.py`` takes a torch path on a platform without Triton from 0.5.22
  (``current_platform``); before, the paged allocator always launches the Triton kernels
  ``alloc_extend_kernel`` / ``alloc_decode_kernel``, and the adapter executes the file
  that defines them, unchanged, under Triton's interpreter (``TRITON_INTERPRET=1`` while
  the file is executed, so its ``@triton.jit`` kernels run on CPU tensors: the release's
  own kernels, not a rewrite).
* calls: ``alloc_extend`` / ``alloc_decode`` take the lengths' CPU copies where the
  release's signature has them (``prefix_lens_cpu``, ``seq_lens_cpu``); the constructors
  take ``need_sort`` from 0.5.1; a row is freed with ``free_segments`` from 0.5.17,
  ``free`` before (what the release's ``release_kv_cache`` calls); the free list is
  ``get_all_free_pages()`` where the release has it (0.5.21 on), else its ``free_pages``
  + ``release_pages``.

Stand-ins (every other ``sglang.*`` import raises, see ``_loader``):

``sglang.srt.utils``
    the package's ``__init__`` star-imports ``utils/common.py``, which imports
    triton, psutil, PIL, starlette, requests and the engine. The stand-in holds the
    *real* functions ``paged.py`` imports -- ``get_num_new_pages``,
    ``get_bool_env_var``, ``is_hip``, ``next_power_of_2`` (and ``ceil_div``, which
    one of them calls) -- compiled from the installed ``utils/common.py`` itself
    (each function's own source, taken with ``ast``; nothing rewritten).
``sglang.srt.platforms``
    ``current_platform``: only ``capabilities.supports_triton`` is read (by
    ``PagedTokenToKVPoolAllocator.__init__``); the stand-in says ``False``, as
    ``platforms/cpu.py`` declares, so the allocator takes its torch path
    (``alloc_extend_naive`` / ``alloc_decode_naive``, the real functions of
    ``paged.py``). The Triton kernels are the CUDA path; not run here.
``sglang.kernels.ops.memory.allocator``
    ``alloc_extend_kernel`` / ``alloc_decode_kernel``: imported by ``paged.py``,
    called only when ``supports_triton``; the stand-ins raise if ever called.

Not loaded: ``ReqToTokenPool`` (``memory_pool.py``: 260 KB importing triton and the
kernel packages). Its state is one ``req_to_token`` row per request (the slots of
the request's tokens, in order) plus a free row index; the adapter keeps that row
itself (``rows``), written exactly where the scheduler writes it, and derives every
view below from it. So the adapter is the *caller*: it plays
``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode`` (``alloc_for_extend``
/ ``alloc_for_decode``) and ``release_kv_cache`` without a radix tree (the
``ChunkCache`` path, ``--disable-radix-cache``).

Operations:

``allocate(seq, n)``
    a prefill of ``n`` new tokens with no cached prefix: token allocator
    ``alloc(n)``; paged allocator ``alloc_extend(prefix_lens=[0], seq_lens=[n],
    last_loc=[-1], extend_num_tokens=n)`` (``last_loc`` -1 is what
    ``get_last_loc`` gives a request without prefix). ``None`` -> ``OutOfBlocks``.
``append_slot(seq)``
    one decode token: token ``alloc(1)``; paged ``alloc_decode(seq_lens=[L+1],
    last_loc=[row[L-1]])`` (``seq_lens`` already counts the new token, as
    ``prepare_for_decode`` passes it). The slot ``s`` is ``(page(s), s % page_size)``.
    ``cow_src`` is ``None``: SGLang never copies.
``free_seq(seq)``
    ``release_kv_cache`` without a tree: ``free_kv_row`` of the row's
    ``[0, len)``, i.e. ``allocator.free_segments([(row[:len], 0)])`` (what
    ``free_kv_row_segments`` calls with no sliding window), then the row is
    dropped (``ReqToTokenPool.free``).
``fork``, ``append_slots``, ``rollback``, ``rebase``, ``preempt``
    not offered: SGLang has no fork and no copy-on-write (sharing is the radix
    tree's, under tree locks); retraction frees through ``release_kv_cache`` as
    ``free_seq`` does.

Block ids. SGLang reserves page 0 (slot 0 is the padding slot, ``free_pages`` is
``arange(1, num_pages + 1)``); kvcheck's block ``b`` is SGLang's page ``b + 1``. The
token allocator is the paged view at page size 1 (a slot is a page), so
``sglang-token`` takes ``block_size == 1`` only.

Observation, and what it makes vacuous (``vacuous`` below, printed with the
verdict): SGLang keeps **no refcounts**; a page is held by the request rows naming
it. ``refcount(b)`` is the number of live rows naming page ``b``, so
*refcount conservation* holds by construction (vacuous), while the free-list rules
compare those holders with the allocator's own free list: *a held page is never on
the free list and never handed out again*, and *free list + held pages partition
the pool*, each checked. ``free_blocks`` = ``get_all_free_pages()`` (free plus
staged), ``num_free`` = ``available_size() // page_size``. The table and length
views are the adapter's row (``ReqToTokenPool``'s stand-in), so *no aliasing* and
*length agrees* are vacuous too.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MisuseError, OutOfBlocks
from . import _loader, install
from ._loader import Dist, Loaded, takes

ENGINE_KEY = "sglang"  # install.ENGINES row: sglang-token@VERSION, sglang-paged@VERSION
SGLANG = Dist("sglang", "sglang", "0.5.23", "sglang")

ALLOCATOR = "sglang.srt.mem_cache.allocator"
FILES = (ALLOCATOR, f"{ALLOCATOR}.base", f"{ALLOCATOR}.token", f"{ALLOCATOR}.paged")
KERNELS = ("sglang.kernels.ops.memory.allocator", "sglang.srt.mem_cache.triton_ops.allocator")
UTILS_FUNCTIONS = ("ceil_div", "get_num_new_pages", "get_bool_env_var", "is_hip",
                   "next_power_of_2")

# What this target's verdict cannot have checked (``kvcheck.targets.vacuity``).
VACUOUS = {
    "refcount_conservation": "SGLang keeps no refcounts: a page's count is the number of "
                             "request rows naming it, derived from those rows",
    "no_aliasing": "the tables are req_to_token rows kept by the adapter (ReqToTokenPool's "
                   "stand-in), one per request",
    "length_agrees": "the token count is the adapter's (the request's seqlen)",
}


def real_functions(mod: types.ModuleType, loaded: Loaded, rel: str,
                   names: Sequence[str], env: dict) -> None:
    """Compile the top-level functions or classes ``names`` of the installed file ``rel``
    into ``mod``: each one's own source text, as the file has it (decorators included)."""
    ns = mod.__dict__
    ns.update(env)
    found = _loader.exec_definitions(loaded.root / rel, ns, names)
    missing = [n for n in names if n not in found]
    if missing:
        raise ImportError(f"{rel} of {loaded.dist.dist} {loaded.dist.version} has no "
                          f"{', '.join(missing)}")


def _stub_utils(mod: types.ModuleType, loaded: Loaded) -> None:
    import functools
    import logging
    import os
    from typing import Optional

    import torch

    rel = "sglang/srt/utils/common.py"
    if not (loaded.root / rel).is_file():  # older releases: one module, sglang/srt/utils.py
        rel = "sglang/srt/utils.py"
    text = (loaded.root / rel).read_text()
    names = [n for n in UTILS_FUNCTIONS if f"\ndef {n}(" in text]  # what the release has;
    real_functions(mod, loaded, rel, names, {  # an import of one it lacks fails there
        "torch": torch, "os": os, "lru_cache": functools.lru_cache, "Optional": Optional,
        "logger": logging.getLogger("kvcheck.thirdparty.sglang.utils"),
        "_warned_bool_env_var_keys": set(),
    })


def _stub_platforms(mod: types.ModuleType, _: Loaded) -> None:
    mod.current_platform = types.SimpleNamespace(
        capabilities=types.SimpleNamespace(supports_triton=False))


def _stub_kernels(mod: types.ModuleType, _: Loaded) -> None:
    def _never(name):
        def kernel(*_a, **_k):
            raise RuntimeError(f"{name} is the Triton path; kvcheck runs the torch one")

        class Launcher:
            def __getitem__(self, _grid):
                return kernel
        return Launcher()

    mod.alloc_extend_kernel = _never("alloc_extend_kernel")
    mod.alloc_decode_kernel = _never("alloc_decode_kernel")


STUBS = {"sglang.srt.utils": _stub_utils, "sglang.srt.platforms": _stub_platforms,
         "sglang.kernels.ops.memory.allocator": _stub_kernels}


def single_file(root) -> bool:
    """Whether the release's allocators are one module, ``mem_cache/allocator.py`` (0.4.8 ..
    0.5.12), its Triton kernels defined in it, rather than the package of 0.5.13 on."""
    from pathlib import Path

    return (Path(root) / "sglang/srt/mem_cache/allocator.py").is_file()


def stub_swa_pool(mod: types.ModuleType, _: Loaded) -> None:
    class SWAKVPool:  # no pool the adapters build is one (the SWA allocator asserts it)
        pass

    mod.SWAKVPool = SWAKVPool


def torch_path(root) -> bool:
    """Whether the release's ``paged.py`` has the torch path for a platform without Triton
    (0.5.22 on); before, it launches the Triton kernels whatever the device."""
    from pathlib import Path

    return "use_triton_kernels" in (Path(root) / "sglang/srt/mem_cache/allocator/paged.py") \
        .read_text()


def kernel_module(root) -> str:
    """The module ``paged.py`` imports its Triton kernels from, in this release."""
    from pathlib import Path

    text = (Path(root) / "sglang/srt/mem_cache/allocator/paged.py").read_text()
    for name in KERNELS:
        if f"from {name} import" in text:
            return name
    raise ImportError("sglang/srt/mem_cache/allocator/paged.py imports no allocator kernels "
                      f"from {' or '.join(KERNELS)}")


class Interpreted:
    """The release's kernel file executed with ``TRITON_INTERPRET=1`` (its ``@triton.jit``
    decorators then build Triton's CPU interpreter functions), the variable restored after."""

    def __init__(self, loaded: Loaded, name: str):
        self.loaded, self.name = loaded, name

    def load(self) -> types.ModuleType:
        import importlib.util
        import os
        import sys

        where = f"{self.loaded.dist.dist} {self.loaded.dist.version}'s paged allocator " \
                "launches Triton kernels (no torch path before 0.5.22)"
        if importlib.util.find_spec("triton") is None:
            raise _loader.ThirdPartyMissing(f"{where}: install triton to run them under its "
                                            "interpreter")
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            fresh = "triton" not in sys.modules
            import triton.language.standard as standard  # decorated now if first imported

            with contextlib.suppress(ImportError):  # what a launch imports lazily (its
                import triton.experimental.gluon  # noqa: F401 - jit helpers, decorated now)

            if not fresh and not type(standard.sum).__name__.startswith("Interpreted"):
                # tl.sum & co. are @triton.jit functions of Triton itself: decorated for
                # the GPU when triton was imported first, they refuse the interpreter
                raise _loader.ThirdPartyMissing(
                    f"{where}, run here under Triton's interpreter, but triton was already "
                    "imported in this process without TRITON_INTERPRET=1: set "
                    "TRITON_INTERPRET=1 in the environment, or run this target in a "
                    "process of its own")
            return self.loaded.get(self.name)
        finally:
            if old is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = old


def files_and_stubs(root, files=FILES, stubs=STUBS) -> tuple[tuple, dict, tuple]:
    """(files, stubs, kernel modules to execute first) for the release in ``root``: the
    kernel stand-in where ``paged.py`` has its torch path, else the kernel file itself."""
    if single_file(root):  # the module holds the kernels: all of it under the interpreter
        files = (ALLOCATOR, *(f for f in files if not f.startswith(ALLOCATOR)))
        stubs = {k: v for k, v in stubs.items() if k not in KERNELS}
        stubs.setdefault("sglang.srt.mem_cache.memory_pool", stub_swa_pool)
        return files, stubs, (ALLOCATOR,)
    if torch_path(root):
        return tuple(files), dict(stubs), ()
    kernels = kernel_module(root)
    stubs = {k: v for k, v in stubs.items() if k not in KERNELS}
    return (*files, kernels), stubs, (kernels,)


def load(version: str | None = None) -> Loaded:
    """SGLang's allocator modules at ``version`` (``install.select``: default the SGLang
    installed in this environment if in range, else 0.5.23); ``ThirdPartyMissing`` if not
    installed."""
    return load_dist(install.select(ENGINE_KEY, version), FILES, STUBS, FILES)


def load_dist(dist: Dist, files, stubs, entry) -> Loaded:
    """``_loader.load`` of ``dist`` with the release's kernels (``files_and_stubs``)
    executed first, under the interpreter where ``paged.py`` needs them."""
    root = _loader.require(dist)
    files, stubs, kernels = files_and_stubs(root, files, stubs)
    entry = [e for e in entry if e in files or e in stubs]  # allocator.base & co.: a package's
    key = (dist, tuple(sorted(files)), tuple(entry), str(root))
    with _lock:
        loaded = _loaded.get(key)
        if loaded is None:
            loaded = Loaded(dist, root, files, stubs)
            for name in kernels:
                Interpreted(loaded, name).load()
            for name in entry:
                loaded.get(name)
            _loaded[key] = loaded
    return loaded


_lock = threading.Lock()
_loaded: dict[tuple, Loaded] = {}


def allocators(version: str | None = None) -> types.ModuleType:
    return load(version)[ALLOCATOR]


def free_pages_of(alloc) -> list[int]:
    """The allocator's free pages: ``get_all_free_pages()`` where the release has it
    (0.5.21 on), else its own ``free_pages`` + ``release_pages`` (what that method returns)."""
    import torch

    if hasattr(alloc, "get_all_free_pages"):
        return alloc.get_all_free_pages().tolist()
    parts = [alloc.free_pages] + ([alloc.release_pages] if getattr(
        alloc, "release_pages", None) is not None else [])
    return torch.cat(parts).tolist()


def alloc_extend(alloc, prefix_lens, seq_lens, last_loc, extend_num_tokens: int):
    """``alloc_extend`` as the release's scheduler calls it: with the CPU copies of the
    lengths (``prefix_lens_cpu``, ``seq_lens_cpu``) from 0.5.2, without before."""
    if takes(type(alloc).alloc_extend, "prefix_lens_cpu"):  # the class: not a wrapper
        return alloc.alloc_extend(prefix_lens, prefix_lens.clone(), seq_lens, seq_lens.clone(),
                                  last_loc, extend_num_tokens)
    return alloc.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)


def alloc_decode(alloc, seq_lens, last_loc):
    """``alloc_decode``, with ``seq_lens_cpu`` where the release takes it."""
    if takes(type(alloc).alloc_decode, "seq_lens_cpu"):  # the class: not a wrapper
        return alloc.alloc_decode(seq_lens, seq_lens.clone(), last_loc)
    return alloc.alloc_decode(seq_lens, last_loc)


def free_row(alloc, row) -> None:
    """``release_kv_cache`` without a tree frees the request's row: ``free_segments([(row,
    0)])`` from 0.5.17, ``free(row)`` before."""
    if hasattr(alloc, "free_segments"):
        alloc.free_segments([(row, 0)])
    else:
        alloc.free(row)


class SglangAllocatorTarget:
    """``Target`` over a real SGLang token or paged allocator (see module docstring)."""

    capabilities = frozenset({"allocate", "append_slot", "free_seq"})
    vacuous = VACUOUS

    def __init__(self, num_blocks: int, block_size: int, paged: bool, need_sort: bool = False,
                 version: str | None = None, admit_first: bool = False):
        import torch

        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        if not paged and block_size != 1:
            raise MisuseError(f"SGLang's TokenToKVPoolAllocator has page size 1, not "
                              f"{block_size}: use --block-size 1 (or sglang-paged)")
        self.torch = torch
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.paged = paged
        loaded = load(version)
        self.version = loaded.dist.version
        mods = loaded[ALLOCATOR]
        size = num_blocks * block_size
        cls = mods.PagedTokenToKVPoolAllocator if paged else mods.TokenToKVPoolAllocator
        args = (size, block_size) if paged else (size,)
        if takes(cls.__init__, "need_sort"):
            self.alloc = cls(*args, torch.float16, "cpu", None, need_sort)
        elif need_sort:
            raise MisuseError(f"SGLang {self.version}'s {cls.__name__} has no need_sort "
                              "(added in 0.5.1)")
        else:
            self.alloc = cls(*args, torch.float16, "cpu", None)
        self.rows: dict[int, Any] = {}  # seq -> req_to_token row (int64 slots)
        self.admit_first = admit_first

    def _t(self, values):
        return self.torch.tensor(values, dtype=self.torch.int64)

    # -- operations -----------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int) -> None:
        if seq in self.rows:
            raise MisuseError(f"sequence {seq!r} already exists")
        if n_tokens < 1:
            raise MisuseError(f"n_tokens must be positive, got {n_tokens!r}")
        self._admit(-(-n_tokens // self.block_size))
        if self.paged:
            out = alloc_extend(self.alloc, self._t([0]), self._t([n_tokens]), self._t([-1]),
                               n_tokens)
        else:
            out = self.alloc.alloc(n_tokens)
        if out is None:
            raise OutOfBlocks(f"SGLang alloc for {n_tokens} tokens returned None")
        self.rows[seq] = out.clone()

    def append_slot(self, seq: int) -> tuple[int, int, int | None]:
        row = self._live(seq)
        length = len(row)
        self._admit(1 if length % self.block_size == 0 else 0)
        if self.paged:
            out = alloc_decode(self.alloc, self._t([length + 1]),
                               row[length - 1 : length].clone())
        else:
            out = self.alloc.alloc(1)
        if out is None:
            raise OutOfBlocks("SGLang decode alloc returned None")
        self.rows[seq] = self.torch.cat((row, out))
        slot = int(out[0])
        return slot // self.block_size - 1, slot % self.block_size, None

    def free_seq(self, seq: int) -> None:
        row = self._live(seq)
        free_row(self.alloc, row)
        del self.rows[seq]

    def _admit(self, pages: int) -> None:
        """With ``admit_first``: the scheduler's admission before the allocator is called
        (``PrefillBudget`` for a prefill, the decode memory check before a decode step):
        ``pages`` new pages that the pool lacks are refused, nothing called."""
        free = int(self.alloc.available_size()) // self.block_size
        if self.admit_first and pages > free:
            raise OutOfBlocks(f"SGLang's scheduler admits {pages} new page(s) only with as "
                              f"many free ({free})")

    def _live(self, seq: int):
        row = self.rows.get(seq)
        if row is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return row

    # -- observation ------------------------------------------------------------
    def block_table(self, seq: int) -> Sequence[int]:
        """The row's pages in order: page ``i`` is the page of slot ``row[i * B]`` (every
        slot of a page's span must lie in it at its offset; ``row_pages`` checks)."""
        return row_pages(self.rows[seq].tolist(), self.block_size)

    def refcount(self, block: int) -> int:
        return sum(block in self.block_table(s) for s in self.rows)

    def refcounts(self) -> Sequence[int]:
        counts = [0] * self.num_blocks
        for s in self.rows:
            for b in self.block_table(s):
                if isinstance(b, int) and 0 <= b < self.num_blocks:
                    counts[b] += 1
        return counts

    def free_blocks(self) -> Iterable[int]:
        return [p - 1 for p in free_pages_of(self.alloc)]

    def num_free(self) -> int:
        return int(self.alloc.available_size()) // self.block_size

    def table_identity(self, seq: int) -> object | None:
        return None

    def seq_len(self, seq: int) -> int | None:
        return len(self.rows[seq])

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return isinstance(exc, OutOfBlocks)


MISALIGNED = -2  # no pool block, and not the null placeholder (spec.state.NULL, -1)


class MisalignedRow(int):
    """A table entry for a page whose slots are not one page's consecutive slots."""

    def __new__(cls, page: int, slots: Sequence[int]):
        obj = super().__new__(cls, MISALIGNED)
        obj.slots = list(slots)
        obj.page = page
        return obj

    def __repr__(self) -> str:
        return f"<slots {self.slots} not one page's consecutive slots>"


def row_pages(row: Sequence[int], page_size: int) -> list[int]:
    """kvcheck block ids of a ``req_to_token`` row: the page of each ``page_size`` span,
    minus one (SGLang's page 0 is the padding page). A span whose slots are not that
    page's slots at their offsets reads as ``MISALIGNED`` (-2, no pool block), so the
    oracle reports it."""
    out: list[int] = []
    for i in range(0, len(row), page_size):
        span = row[i : i + page_size]
        page = span[0] // page_size
        if any(s != page * page_size + k for k, s in enumerate(span)):
            out.append(MisalignedRow(page, span))
        else:
            out.append(page - 1)
    return out


def make_token(num_blocks: int, block_size: int,
               version: str | None = None) -> SglangAllocatorTarget:
    """``TokenToKVPoolAllocator`` (page size 1: a block is a slot)."""
    return SglangAllocatorTarget(num_blocks, block_size, paged=False, version=version)


def make_paged(num_blocks: int, block_size: int,
               version: str | None = None) -> SglangAllocatorTarget:
    """``PagedTokenToKVPoolAllocator`` with ``page_size = block_size``."""
    return SglangAllocatorTarget(num_blocks, block_size, paged=True, version=version)


def make_paged_admitted(num_blocks: int, block_size: int,
                        version: str | None = None) -> SglangAllocatorTarget:
    """``make_paged`` behind the scheduler's admission: an allocation that needs more pages
    than are free is refused before the allocator is called, as SGLang's scheduler admits
    (so the allocator's own out-of-blocks path, where sglang #34399 launches its kernel on
    an exhausted pool before 0.5.22, is never reached)."""
    return SglangAllocatorTarget(num_blocks, block_size, paged=True, version=version,
                                 admit_first=True)


def make_token_sorted(num_blocks: int, block_size: int,
                      version: str | None = None) -> SglangAllocatorTarget:
    """The token allocator with ``need_sort`` (frees staged in ``release_pages``)."""
    return SglangAllocatorTarget(num_blocks, block_size, paged=False, need_sort=True,
                                 version=version)


def make_paged_sorted(num_blocks: int, block_size: int,
                      version: str | None = None) -> SglangAllocatorTarget:
    """The paged allocator with ``need_sort`` (frees staged in ``staged_pages``)."""
    return SglangAllocatorTarget(num_blocks, block_size, paged=True, need_sort=True,
                                 version=version)
