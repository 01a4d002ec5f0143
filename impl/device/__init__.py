"""A paged KV cache on a torch device (CUDA when present, else CPU), with Triton
kernels (block copy, slot write, paged gather) and plain-torch fallbacks.

See ``docs/device.md``.
"""

from .manager import DeviceBlockManager, make
from .store import PagedKVStore

__all__ = ["DeviceBlockManager", "PagedKVStore", "make"]
