"""Adapter: aphrodite-engine 0.24.1's v1 ``KVCacheManager`` (a vLLM v1 fork) as a ``Target``.

aphrodite-engine 0.24.1 (the newest on PyPI) carries vLLM v1's KV-cache manager under
``aphrodite/v1/core/`` (``kv_cache_manager.py``, ``kv_cache_coordinator.py``,
``block_pool.py``, ``kv_cache_utils.py``, ``single_type_kv_cache_manager.py``): the same
classes and the same ``KVCacheManager`` API the vLLM v1 adapter drives
(``get_computed_blocks``, ``allocate_slots(request, num_new_tokens,
num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens, ...)``, ``free``,
``cache_blocks``), with fork-local edits (e.g. a 1,200-line diff in
``single_type_kv_cache_manager.py`` against vLLM 0.33.0). So the adapter *is* ``vllm_v1.VllmV1Target``: the
same operations, mapped to the same calls (docs/ADAPTERS.md, vLLM v1), on aphrodite's
own module files, loaded from ``aphrodite-engine-0.24.1/`` (``bash
scripts/install_thirdparty.sh aphrodite``; optional, not in the default set).

Stand-ins: those of the vLLM v1 adapter, under ``aphrodite.*`` (each documented in
``vllm_v1``: logger, envs, config, platforms, kv_events, multimodal / v1 utils,
metrics stats, the ``Request`` with the fields the manager reads -- aphrodite's
manager reads the same ones -- torch's dtypes, ``get_dtype_size``, the Mamba backend
enum, cbor2), plus ``aphrodite.utils.mem_utils`` (``format_gib``, a log message of
``kv_cache_utils``; the real module imports psutil and probes the platform). Older
aphrodite releases on PyPI (0.6.x and before, 0.10.0 - 0.23.0 not examined) are not
covered; 0.24.1 is the pinned one.
"""

from __future__ import annotations

import types

from . import _loader, vllm_v1
from ._loader import Dist, Loaded

APHRODITE = Dist("aphrodite", "aphrodite-engine", "0.24.1", "aphrodite")


def _rename(name: str) -> str:
    return "aphrodite" + name[len("vllm"):] if name.startswith("vllm") else name


def _stub_mem_utils(mod: types.ModuleType, _: Loaded) -> None:
    mod.format_gib = lambda b: f"{b / (1 << 30):.2f}"


def _stub_config(mod: types.ModuleType, _: Loaded) -> None:
    class AphroditeConfig:  # annotation only
        pass

    mod.AphroditeConfig = AphroditeConfig
    mod.get_current_aphrodite_config_or_none = lambda: None


FILES = tuple(_rename(f) for f in vllm_v1.FILES)
STUBS = {**{_rename(k): v for k, v in vllm_v1.STUBS.items()},
         "aphrodite.config": _stub_config,
         "aphrodite.utils.mem_utils": _stub_mem_utils}
ENTRY = ("aphrodite.v1.core.kv_cache_manager",)


def load() -> Loaded:
    """aphrodite's v1 KV-cache modules (``ThirdPartyMissing`` if not installed)."""
    return _loader.load(APHRODITE, FILES, STUBS, entry=ENTRY)


def build_manager(num_blocks: int, block_size: int, enable_caching: bool = True):
    """A real aphrodite ``KVCacheManager`` with ``num_blocks`` usable blocks (plus the null
    block), and aphrodite's request block hasher with ``hashing.sha256``
    (``CacheConfig.prefix_caching_hash_algo`` defaults to ``"sha256"``)."""
    mods = load()
    iface = mods["aphrodite.v1.kv_cache_interface"]
    utils = mods["aphrodite.v1.core.kv_cache_utils"]
    hashing = mods["aphrodite.utils.hashing"]
    torch = mods["torch"]
    spec = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=torch.float16)
    config = iface.KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                                 kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)])
    utils.init_none_hash(hashing.sha256)
    manager = mods["aphrodite.v1.core.kv_cache_manager"].KVCacheManager(
        config, max_model_len=1 << 40, scheduler_block_size=block_size,
        hash_block_size=block_size, enable_caching=enable_caching)
    hasher = utils.get_request_block_hasher(block_size, hashing.sha256) if enable_caching else None
    return manager, hasher


class AphroditeTarget(vllm_v1.VllmV1Target):
    """``vllm_v1.VllmV1Target`` on aphrodite's own ``KVCacheManager``."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        from ..errors import MisuseError

        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.version = APHRODITE.version  # the release loaded (as vllm_v1's targets say)
        self.manager, self._hasher = build_manager(num_blocks, block_size, enable_caching)
        self.pool = self.manager.block_pool
        self.requests = {}
        self.preempted = {}
        self.drafts = {}
        import itertools

        self._tokens = itertools.count(1)


def make(num_blocks: int, block_size: int) -> AphroditeTarget:
    """aphrodite v1 with prefix caching (its default)."""
    return AphroditeTarget(num_blocks, block_size, enable_caching=True)


def make_no_cache(num_blocks: int, block_size: int) -> AphroditeTarget:
    """aphrodite v1 with prefix caching disabled."""
    return AphroditeTarget(num_blocks, block_size, enable_caching=False)
