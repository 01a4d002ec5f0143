"""The ``Target`` protocol and ``SeedAdapter`` under their first public name (they live in
``kvcheck.targets.protocol``); kept so that adapters written against it keep working."""

from kvcheck.models.blocks.model import call
from kvcheck.targets.protocol import *  # noqa: F403
from kvcheck.targets.protocol import OPERATIONS, SeedAdapter, Target, is_target, named_out_of_blocks

__all__ = ["OPERATIONS", "SeedAdapter", "Target", "call", "is_target", "named_out_of_blocks"]
