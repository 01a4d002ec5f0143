"""kvcheck: a model-checked specification and test oracle for paged KV-cache
block managers.

Public API::

    from kvcheck.verify import verify
    from kvcheck import Oracle, SeedAdapter, Target, make_state_machine
    result = verify("mypkg.alloc:MyAllocator", num_blocks=32, block_size=4)
    TestMine = make_state_machine(MyAllocator).TestCase   # in a pytest file
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names below, as a type checker sees them
    from kvcheck.models.blocks.oracle import Oracle
    from kvcheck.targets.protocol import SeedAdapter, Target
    from kvcheck.verify import make_state_machine

__version__ = "0.1.0"

__all__ = ["Oracle", "SeedAdapter", "Target", "make_state_machine"]

# Imported on first use, so that ``kvcheck --version`` stays fast.
_LAZY = {
    "Oracle": ("kvcheck.models.blocks.oracle", "Oracle"),
    "SeedAdapter": ("kvcheck.targets.protocol", "SeedAdapter"),
    "Target": ("kvcheck.targets.protocol", "Target"),
    "make_state_machine": ("kvcheck.verify", "make_state_machine"),
}


def _lazy(name: str) -> Any:
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = _lazy(name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvcheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
