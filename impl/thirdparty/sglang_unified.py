"""Adapter: SGLang's ``UnifiedRadixCache`` with its HiCache host tier as a tiers target
(docs/tiers.md; ``kvcheck verify-tiers
kvcheck.impl.thirdparty.sglang_unified:make_write_back@VERSION``, 0.5.14 pinned, 0.5.12 ..
0.5.16: ``kvcheck install sglang==VERSION``).

SGLang builds this cache instead of ``HiRadixCache`` when ``SGLANG_ENABLE_UNIFIED_RADIX_TREE``
is set (``Scheduler.init_cache_with_memory_pool``: ``UnifiedRadixCache(params)`` with the
tree components ``(FULL,)`` for a plain model, then ``init_hicache(server_args, params)`` when
the hierarchical cache is on). The host tier first ships in 0.5.12 (0.5.11's
``unified_radix_cache.py`` has none); 0.5.17 moves the tree into the ``unified_cache/``
package (``cache_action`` & co.), not loaded here. Only the write_back policy is offered
(``make_write_back``): what the sglang_unified catalogue entries need.

What runs, from the installed wheel: ``mem_cache/unified_radix_cache.py``
(``UnifiedRadixCache``, ``UnifiedTreeNode``: ``match_prefix``, insert, node splits,
``cache_unfinished_req`` / ``cache_finished_req``, ``inc_lock_ref`` / ``dec_lock_ref``,
``evict`` -> ``FullComponent.drive_eviction`` -> ``_evict_device_leaf`` (under write_back:
``write_backup(node, write_back=True)`` then ``_evict_to_host``), ``evict_host``,
``init_load_back`` / ``load_back``, ``writing_check`` / ``loading_check``,
``check_hicache_events``), ``mem_cache/unified_cache_components/`` (the FULL component; the
SWA and Mamba ones are loaded, never built), ``session/streaming_session.py`` (no streaming
session is opened: its hooks pass through), ``mem_cache/hybrid_cache/hybrid_pool_assembler.py``
(``attach_hybrid_pool_to_unified_cache`` -> ``build_kv_only_stack``: the host pool, its
``HostPoolGroup`` and ``PoolEntry``), ``mem_cache/hybrid_cache/hybrid_cache_controller.py``
(``HybridCacheController.write`` / ``start_writing`` / ``load`` / ``start_loading``) over
``managers/cache_controller.py`` (``HiCacheController``, ``HiCacheAck``,
``LayerDoneCounter``), and everything ``sglang_hicache`` loads for these releases (the
allocator, the MHA host pool, ``ReqToTokenPool``, the base prefix cache's parameter classes,
the server's defaults).

Stand-ins: those of ``sglang_hicache`` (its module doc names each with its reason: the device
KV buffers, the controller's CUDA streams and events, the copy kernels, torch.distributed,
psutil, mmap, the storage backends, the runtime context), and here:

``memory_pool_host`` (and 0.5.16's ``pool_host/mha.py``): the other models' host pools
    the MHA host pool is compiled from the file as ``sglang_hicache`` compiles it, and
    ``HostPoolGroup`` and ``PoolEntry`` are the release's own, compiled the same way; every
    other class of the file (MLA, Mamba, NSA indexer, DeepSeek V4, logical host pools) is a
    name the assembler imports: a class that raises ``StandInGap`` if built (a plain MHA
    model builds none of them).
``swa_memory_pool.SWAKVPool``, ``memory_pool``'s hybrid pools
    the assembler asks whether the device pool is an SWA, hybrid linear, NSA or DeepSeek V4
    pool: the stand-in device pool (``sglang_hicache._DevicePool``) is none of them, so the
    release takes its KV-only branch, as for a plain MHA model.
``server_args.get_global_server_args``, ``mem_cache.common`` (0.5.14 on)
    read by the Mamba and SWA components only (never built here): they raise ``StandInGap``.
``utils.common``
    ``ceil_div`` / ``ceil_align`` (the streaming session's), compiled from the file.
``Req``
    ``sglang_hicache.ReqStandIn`` plus ``best_match_node``, ``swa_uuid_for_lock`` and ``session``
    (None: no streaming session).
the write-back's copy that 0.5.12 never waits for
    0.5.13 on, ``_evict_device_leaf`` waits for a write-back (``writing_check(write_back=True)``:
    the write's event synchronized, ``sglang_hicache._Event``), so its copy ends inside the
    operation that evicts, as the tiers model has it. 0.5.12 .. 0.5.12.post1 issue the write
    on the write stream and demote the node at once; the copy's event is taken to have ended
    by the scheduler's next prefill batch (``_prefill_step``: a few tokens' copy, issued a
    scheduler step earlier), where the release's own ``check_hicache_events`` reads it.

The caller is the scheduler as ``sglang_hicache`` drives it (its module doc), with the
unified tree's calls: ``match_prefix(MatchPrefixParams)``, ``init_load_back(
InitLoadBackParams(best_match_node, host_hit_length, req=req))``,
``evict(EvictParams(num_tokens=n))``, and ``check_hicache_events()`` at the start of each
prefill batch (``Scheduler._get_new_batch_prefill_raw``: before ``allocate`` and ``load``).
The tree is read through each node's FULL component data (``value``, ``host_value``,
``lock_ref``, ``host_lock_ref``): a device slot the tree holds is evictable when its node's
lock is 0, a host slot when its node is off the device and not host-locked.

What it finds: on 0.5.12 .. 0.5.12.post1 the first write-back eviction's ack, read by the
next ``check_hicache_events``, calls ``dec_lock_ref(node, None)`` on a node the write never
locked and whose device value the demotion dropped: ``FullComponent.release_component_lock``
asserts (sglang issue #24869, fixed by PR #24585 in 0.5.13; the catalogue's sglang-24585).
On 0.5.12 .. 0.5.13.post1 a load whose device allocation evicts writes a leaf back and, the
host being short, ``evict_host`` frees the host-only node being loaded; the commit reads
``len(None)`` (PR #27444: 0.5.14 host-locks the nodes it loads; sglang-27444).
PR #27108's ``written == 0`` check (0.5.13) guards a case a FULL-only tree without host
locks never reaches (the catalogue's sglang-27108 says why).
"""

from __future__ import annotations

import contextlib
import types

from ..errors import MisuseError, StandInGap
from . import _loader, install, sglang
from . import sglang_hicache as hc
from ._loader import Loaded

MEM = hc.MEM
UNIFIED = f"{MEM}.unified_radix_cache"
COMPONENTS = f"{MEM}.unified_cache_components"
ASSEMBLER = f"{MEM}.hybrid_cache.hybrid_pool_assembler"
HYBRID_CONTROLLER = f"{MEM}.hybrid_cache.hybrid_cache_controller"
ENGINE_KEY = "sglang-unified"
FILES = (UNIFIED, COMPONENTS, *(f"{COMPONENTS}.{m}" for m in (
    "tree_component", "full_component", "swa_component", "mamba_component")),
    ASSEMBLER, HYBRID_CONTROLLER, "sglang.srt.session.streaming_session")
HOST_POOL_CLASSES = ("PoolEntry", "HostPoolGroup")
FULL = 0  # ComponentType.FULL


def _stub_host_pool(mod: types.ModuleType, loaded: Loaded) -> None:
    """``memory_pool_host``: the MHA host pool as ``sglang_hicache`` compiles it, the host
    pool group and its entries (the release's own), the other models' host pools as names."""
    hc.stub_memory_pool(mod, loaded)
    rel = f"{mod.__kvcheck_real_name__.replace('.', '/')}.py"
    import dataclasses
    from collections.abc import Callable
    from typing import Any, Optional

    mod.__dict__.update(dataclass=dataclasses.dataclass, Any=Any, Callable=Callable,
                        Optional=Optional)
    mod.__dict__.setdefault("PoolName", loaded.get(f"{MEM}.hicache_storage").PoolName)
    text = (loaded.root / rel).read_text()
    sglang.real_functions(mod, loaded, rel, [n for n in HOST_POOL_CLASSES
                                             if f"\nclass {n}" in text], {})
    import ast

    for node in ast.parse(text).body:  # (the other models' host
        if isinstance(node, ast.ClassDef) and not hasattr(mod, node.name):  # pools: names)
            setattr(mod, node.name, _never(node.name))


def _never(name: str) -> type:
    def __init__(self, *_a, **_k):
        raise StandInGap(f"{name} is not built here: no model's pool of that kind "
                         f"(sglang_unified)")

    return type(name, (), {"__init__": __init__})


def _stub_server_args(mod: types.ModuleType, _: Loaded) -> None:
    def get_global_server_args():  # (read by the Mamba component only: never built here)
        raise StandInGap("the server's global arguments are not set here (sglang_unified)")

    mod.get_global_server_args = get_global_server_args


def _stub_utils_common(mod: types.ModuleType, loaded: Loaded) -> None:
    """``sglang.srt.utils.common``: the two arithmetic helpers the streaming session
    imports, compiled from the file (the rest of it imports what cannot run here)."""
    sglang.real_functions(mod, loaded, "sglang/srt/utils/common.py", ("ceil_div", "ceil_align"),
                          {})


def _stub_mem_common(mod: types.ModuleType, _: Loaded) -> None:
    def free_swa_out_of_window_slots(*_a, **_k):  # (0.5.14 on: the SWA component's)
        raise StandInGap("no SWA component here (sglang_unified)")

    mod.free_swa_out_of_window_slots = free_swa_out_of_window_slots


STUBS = {f"{MEM}.memory_pool_host": _stub_host_pool,
         f"{MEM}.common": _stub_mem_common,
         f"{MEM}.pool_host.mha": _stub_host_pool,  # (0.5.16 on: the MHA host pool there)
         "sglang.srt.utils.common": _stub_utils_common,
         "sglang.srt.server_args": _stub_server_args,
         f"{MEM}.swa_memory_pool": sglang.stub_swa_pool}  # (the assembler's isinstance
# test: the device pool is no SWAKVPool)


def load(version: str | None = None) -> Loaded:
    """UnifiedRadixCache with its HiCache stack and what it imports, at ``version``."""
    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    files = hc.FILES + tuple(f for f in hc.OPTIONAL
                             if (root / f"{f.replace('.', '/')}.py").is_file()) + FILES
    if (root / "sglang/srt/mem_cache/pool_host/__init__.py").is_file():
        files += (f"{MEM}.pool_host",)
    stubs = {**sglang.STUBS, **hc.STUBS}
    for name in (ASSEMBLER, HYBRID_CONTROLLER):
        stubs.pop(name, None)
    stubs.update(STUBS)
    loaded = sglang.load_dist(dist, (*files, *sglang.FILES), stubs,
                              (sglang.ALLOCATOR, hc.HIRADIX, UNIFIED, ASSEMBLER))
    hc.patch_modules(loaded)
    ctl = loaded[HYBRID_CONTROLLER]
    if not getattr(ctl, "__kvcheck_patched__", False):
        ctl.device_module = hc.CudaStandIn  # (the copies' streams and events: sglang_hicache)
        ctl.torch = loaded[hc.CONTROLLER].torch
        ctl.__kvcheck_patched__ = True
    return loaded


class _Req(hc.ReqStandIn):
    """``sglang_hicache.ReqStandIn`` with the fields the unified tree reads besides."""

    def __init__(self, tokens, row):
        super().__init__(tokens, row)
        self.best_match_node = None  # (what init_load_back's params name: the match's)
        self.swa_uuid_for_lock = None  # (the SWA component's lock id: no SWA here)
        self.session = None  # (no streaming session: the session's hooks pass through)


def _where(exc: BaseException) -> str:
    """The release's frames an exception went through, innermost last, and the failing
    line: ``writing_check -> dec_lock_ref -> release_component_lock: assert ...``."""
    import linecache
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/sglang/" in f.filename]
    if not frames:
        return str(exc) or type(exc).__name__
    last = frames[-1]
    line = linecache.getline(last.filename, last.lineno).strip()
    tail = last.filename.split("/sglang/", 1)[1]
    return (" -> ".join(f.name for f in frames) + f": {line} (sglang/{tail}:{last.lineno})"
            + (f": {exc}" if str(exc) else ""))


@contextlib.contextmanager
def _located():
    """The release's own bare exceptions (an assert, a ``len(None)``) said with where they
    were raised (``_where``), same type, chained: what a developer reads first."""
    try:
        yield
    except (AssertionError, TypeError, AttributeError) as exc:
        where = _where(exc)
        if "(sglang/" not in where:  # (not the release's: as it is)
            raise
        raise type(exc)(where) from exc


def _full(node):
    """A node's FULL component data (``ComponentData``: value, host_value, lock_ref)."""
    return node.component_data[FULL]


class SglangUnifiedTarget(hc.SglangHiCacheTarget):
    """A tiers target over SGLang's UnifiedRadixCache with HiCache (see the module doc)."""

    Req = _Req
    engine_key = ENGINE_KEY

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int,
                 version: str | None = None, write_policy: str = "write_back"):
        if host_blocks <= num_blocks:  # (the release asserts it while building the pool)
            raise MisuseError(f"HiCache's host pool is larger than the device pool (the "
                              f"release's own assert): host_blocks {host_blocks} <= "
                              f"num_blocks {num_blocks}")
        super().__init__(num_blocks, block_size, host_blocks, version=version,
                         write_policy=write_policy)

    def _load(self, version):
        return load(version)

    def _build(self, _tree_module, host_slots: int, write_policy: str):
        """``Scheduler.init_cache_with_memory_pool`` with ``SGLANG_ENABLE_UNIFIED_RADIX_TREE``
        and the hierarchical cache on: ``UnifiedRadixCache(params)`` with the components
        ``(FULL,)`` (a plain model), then ``init_hicache(server_args, params)``."""
        ratio = host_slots / self.nb
        if int(self.nb * ratio) != host_slots:
            raise MisuseError(f"host_blocks {host_slots} is no ratio of {self.nb}")
        args = self._server_args(
            hicache_ratio=ratio, hicache_size=0, hicache_write_policy=write_policy,
            hicache_io_backend="direct", hicache_mem_layout="layer_first",
            hicache_storage_backend=None, disable_hicache_numa_detect=True)
        if not hasattr(args, "extra_metric_labels"):
            args.extra_metric_labels = None
        context = self.mods.modules.get("sglang.srt.runtime_context")
        if context is not None:
            context.current = args
        params = self._params()
        params.tree_components = (self.mods[COMPONENTS].ComponentType.FULL,)
        tree = self.mods[UNIFIED].UnifiedRadixCache(params)
        tree.init_hicache(args, params)
        return tree

    @staticmethod
    def _host_of(tree):
        return tree.full_kv_pool_host  # (the host pool group's KV entry)

    # -- the scheduler's step ---------------------------------------------------------------
    def _prefill_step(self) -> None:
        """What ``Scheduler._get_new_batch_prefill_raw`` does before it forms a prefill
        batch: ``tree_cache.check_hicache_events()`` (``writing_check`` / ``loading_check``).
        A write-back no one waited for (0.5.12: ``_evict_device_leaf`` issues the write and
        demotes the node without ``writing_check(write_back=True)``) has ended by then: its
        copy of a few tokens' KV, issued on the write stream a scheduler step earlier
        (``_Event``: ended here). Writes and loads the driver completes are its own jobs."""
        known = {id(rec.get("ack")) for rec in self.jobs.values()}
        for ack in self.ctl.ack_write_queue:
            if id(ack) not in known:
                ack.finish_event.done = True
        try:
            self.tree.check_hicache_events()
        except AssertionError as exc:  # (the release's own, bare: where it is, in words)
            raise AssertionError(f"check_hicache_events(): {_where(exc)}") from exc

    def allocate(self, seq: int, tokens) -> None:
        self._prefill_step()
        with _located():
            super().allocate(seq, tokens)

    def load(self, seq: int, tokens):
        self._prefill_step()
        with _located():
            return super().load(seq, tokens)

    # -- the tree, read through its FULL component -------------------------------------
    def _slots(self, pool: str):
        out = []
        writing = self._pending_host() if pool == hc.HOST else set()
        for node, path in self._nodes():
            cd = _full(node)
            values = cd.value if pool == hc.DEVICE else cd.host_value
            if values is None:
                continue
            values = values.tolist()
            start = len(path) - len(values)
            for i, v in enumerate(values):
                if pool == hc.DEVICE:
                    out.append((v - 1, path[: start + i + 1], node))
                elif v not in writing:
                    out.append((v, path[: start + i + 1], node))
        return out

    def _lock_pins(self) -> dict:
        pins = {}
        for job, rec in self._pending_ops():
            own = {int(x) for x in rec["op"].device_indices.tolist()}
            entry = (self.tree.ongoing_write_through if job[0] == "w"
                     else self.tree.ongoing_load_back).get(job[1])
            node = entry[0] if isinstance(entry, tuple) else entry
            held = []
            for n in self._path(node):
                if _full(n).value is not None:
                    held += [v - 1 for v in _full(n).value.tolist() if v not in own]
            if held:
                pins[f"lock of job {job[0]}{job[1]}"] = held
        return pins

    def evictable_blocks(self, pool: str) -> list[int]:
        if pool == hc.DEVICE:
            return [b for b, _k, node in self._slots(hc.DEVICE) if _full(node).lock_ref == 0]
        return [b for b, _k, node in self._slots(hc.HOST)
                if node.evicted and _full(node).host_lock_ref == 0]


def make_write_back(num_blocks: int, block_size: int, host_blocks: int,
                    version: str | None = None) -> SglangUnifiedTarget:
    """The write_back policy: nothing is backed up until the device evicts it; no ``store``."""
    return SglangUnifiedTarget(num_blocks, block_size, host_blocks, version=version,
                               write_policy="write_back")
