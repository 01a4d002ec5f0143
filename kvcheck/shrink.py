"""``replay`` under its first name, for pytest reproducers written by earlier kvcheck versions
(``from kvcheck.shrink import replay``). New code: ``kvcheck.models.blocks.runs``."""

from kvcheck.models.blocks.runs import replay

__all__ = ["replay"]
