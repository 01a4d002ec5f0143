"""The prefix-cache model: the block manager plus the cache map, its lifecycle and cache hits
checked at the data level.

``model`` (operations with their token ids, recorded states, shrink moves; registers
``prefix``), ``oracle`` (a run's observation and checks: the block manager's oracle for the
structure, the cache read through a view of the target, ghost contents per block, fast and
full modes), ``compiled`` (the prefix invariants compiled from the spec's text), ``driver``
(the seeded shared-prefix workload).
"""

from kvcheck.models.prefix.model import MODEL, PrefixModel

__all__ = ["MODEL", "PrefixModel"]
