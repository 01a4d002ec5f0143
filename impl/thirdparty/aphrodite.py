"""Adapter: aphrodite-engine's v1 ``KVCacheManager`` (0.20.0 .. 0.24.1, a vLLM v1 fork) as a ``Target``.

aphrodite-engine 0.20.0 .. 0.24.1 (0.24.1 the newest on PyPI, the pin) carry vLLM v1's
KV-cache manager under ``aphrodite/v1/core/`` (``kv_cache_manager.py``,
``kv_cache_coordinator.py``, ``block_pool.py``, ``kv_cache_utils.py``,
``single_type_kv_cache_manager.py``): the same classes and the same ``KVCacheManager``
API the vLLM v1 adapter drives (``get_computed_blocks``, ``allocate_slots(request,
num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
...)``, ``free``, ``cache_blocks``), with fork-local edits (e.g. a 1,200-line diff in
``single_type_kv_cache_manager.py`` against vLLM 0.33.0). 0.20.0 and 0.21.0 read as
vLLM 0.20's files (reformatted), 0.22.0 .. 0.24.1 as vLLM 0.26 .. 0.29's. So the adapter
*is* ``vllm_v1.VllmV1Target``: the same operations, mapped to the same calls
(docs/ADAPTERS.md, vLLM v1), on aphrodite's own module files, loaded from
``aphrodite-engine-VERSION/`` (``kvcheck install aphrodite-engine==VERSION``; optional, not
in the default set); ``aphrodite@VERSION`` picks the release (``ENGINE_KEY``).
aphrodite 0.6.x carried vLLM v0's block manager v2 instead: ``aphrodite_v0``.

Stand-ins: those of the vLLM v1 adapter, under ``aphrodite.*`` (each documented in
``vllm_v1``: logger, envs -- its ``VLLM_*`` settings also as ``APHRODITE_*`` --, config,
platforms, kv_events, multimodal / v1 utils, metrics stats, the ``Request`` with the
fields the manager reads -- aphrodite's manager reads the same ones -- torch's dtypes,
``get_dtype_size``, the Mamba backend enum, cbor2), plus ``aphrodite.utils.mem_utils``
(``format_gib``, a log message of ``kv_cache_utils``; the real module imports psutil and
probes the platform). 0.10.0 (vLLM 0.11's manager with aphrodite's ``dynamic_kv``) is not
covered.
"""

from __future__ import annotations

import types

from . import _loader, install, vllm_v1
from ._loader import Dist, Loaded

APHRODITE = Dist("aphrodite", "aphrodite-engine", "0.24.1", "aphrodite")


def _rename(name: str) -> str:
    return "aphrodite" + name[len("vllm"):] if name.startswith("vllm") else name


def _stub_mem_utils(mod: types.ModuleType, _: Loaded) -> None:
    """``format_gib`` (a log message of ``kv_cache_utils``); the real module imports psutil
    and probes the platform."""
    mod.format_gib = lambda b: f"{b / (1 << 30):.2f}"


def _stub_config(mod: types.ModuleType, _: Loaded) -> None:
    class AphroditeConfig:  # annotation only
        pass

    mod.AphroditeConfig = AphroditeConfig
    mod.get_current_aphrodite_config_or_none = lambda: None


def _stub_envs(mod: types.ModuleType, loaded: Loaded) -> None:
    """``vllm_v1``'s ``envs`` stand-in under aphrodite's names: every ``VLLM_*`` setting
    it holds also as ``APHRODITE_*`` (the coordinator of 0.22.0 / 0.23.0 reads
    ``APHRODITE_PREFIX_CACHE_RETENTION_INTERVAL``: unset, None)."""
    vllm_v1.STUBS["vllm.envs"](mod, loaded)
    for name in [n for n in vars(mod) if n.startswith("VLLM_")]:
        setattr(mod, "APHRODITE_" + name[len("VLLM_"):], getattr(mod, name))


FILES = tuple(_rename(f) for f in vllm_v1.FILES)
STUBS = {**{_rename(k): v for k, v in vllm_v1.STUBS.items()},
         "aphrodite.config": _stub_config,
         "aphrodite.envs": _stub_envs,
         "aphrodite.utils.mem_utils": _stub_mem_utils}
ENTRY = ("aphrodite.v1.core.kv_cache_manager",)


ENGINE_KEY = "aphrodite"  # its row in install.ENGINES: the releases this adapter loads


def load(version: str | None = None) -> Loaded:
    """aphrodite's v1 KV-cache modules at ``version`` (0.20.0 .. 0.24.1, default 0.24.1;
    ``ThirdPartyMissing`` if not installed). Files a release does not have (0.20.x /
    0.21.0 have no ``kv_cache_spec_registry`` nor ``kv_cache_layout``, 0.22.x / 0.23.0 no
    ``kv_cache_layout``, and import none of them) are left out, as ``vllm_v1.load`` does."""
    dist = install.select(ENGINE_KEY, version)
    root = _loader.require(dist)
    files = tuple(f for f in FILES if (root / (f.replace(".", "/") + ".py")).is_file())
    return _loader.load(dist, files, STUBS, entry=ENTRY)


def build_manager(num_blocks: int, block_size: int, enable_caching: bool = True,
                  version: str | None = None):
    """A real aphrodite ``KVCacheManager`` with ``num_blocks`` usable blocks (plus the null
    block), and aphrodite's request block hasher with ``hashing.sha256``
    (``CacheConfig.prefix_caching_hash_algo`` defaults to ``"sha256"``)."""
    mods = load(version)
    iface = mods["aphrodite.v1.kv_cache_interface"]
    utils = mods["aphrodite.v1.core.kv_cache_utils"]
    hashing = mods["aphrodite.utils.hashing"]
    torch = mods["torch"]
    spec = iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                   dtype=torch.float16)
    config = iface.KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                                 kv_cache_groups=[iface.KVCacheGroupSpec(["layer.0"], spec)])
    utils.init_none_hash(hashing.sha256)
    cls = mods["aphrodite.v1.core.kv_cache_manager"].KVCacheManager
    kwargs = {"max_model_len": 1 << 40, "scheduler_block_size": block_size,
              "hash_block_size": block_size, "enable_caching": enable_caching}
    import inspect

    params = inspect.signature(cls.__init__).parameters  # as vllm_v1.build_manager
    manager = cls(config, **{k: v for k, v in kwargs.items() if k in params})
    hasher = utils.get_request_block_hasher(block_size, hashing.sha256) if enable_caching else None
    return manager, hasher


class AphroditeTarget(vllm_v1.VllmV1Target):
    """``vllm_v1.VllmV1Target`` on aphrodite's own ``KVCacheManager``."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 version: str | None = None):
        from ..errors import MisuseError

        if num_blocks < 1 or block_size < 1:
            raise MisuseError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.version = load(version).dist.version  # the release loaded (as vllm_v1's say)
        self.manager, self._hasher = build_manager(num_blocks, block_size, enable_caching,
                                                   version)
        self.pool = self.manager.block_pool
        self.requests = {}
        self.preempted = {}
        self.drafts = {}
        import itertools

        self._tokens = itertools.count(1)


def make(num_blocks: int, block_size: int, version: str | None = None) -> AphroditeTarget:
    """aphrodite v1 with prefix caching (its default); ``aphrodite@VERSION`` another release."""
    return AphroditeTarget(num_blocks, block_size, enable_caching=True, version=version)


def make_no_cache(num_blocks: int, block_size: int,
                  version: str | None = None) -> AphroditeTarget:
    """aphrodite v1 with prefix caching disabled."""
    return AphroditeTarget(num_blocks, block_size, enable_caching=False, version=version)
