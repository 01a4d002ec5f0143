"""Implementations under test: the reference allocators and adapters."""

from .block_manager import BlockManager
from .errors import MisuseError, OutOfBlocks

__all__ = ["BlockManager", "MisuseError", "OutOfBlocks"]
