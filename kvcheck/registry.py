"""Registered TARGET names for ``kvcheck verify`` / ``kvcheck prove``.

Each entry maps a short name to ``module:attr`` of a factory called as
``factory(num_blocks, block_size)``; the module is imported only when used.
"""

TARGETS: dict[str, tuple[str, str]] = {
    # name: ("module:attr", one-line description)
    "reference": ("kvcheck.impl.block_manager:BlockManager", "the bundled reference block manager"),
}
