"""kvcheck: a model-checked specification and test oracle for paged KV-cache
block managers.

Public API::

    from kvcheck import verify, Oracle, SeedAdapter, Target
    result = verify("mypkg.alloc:MyAllocator", num_blocks=32, block_size=4)
"""

__version__ = "0.1.0"
