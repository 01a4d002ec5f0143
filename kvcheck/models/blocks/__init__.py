"""The block-manager model: the seed's paged allocator and everything shaped like it.

``model`` (operations as data, exploration and shrink moves), ``oracle`` (a run's
observation and checks: fast and full modes, the compiled spec), ``ghost`` (the fast
mode's incremental state), ``shadow`` (which token each slot holds), ``driver`` (the
seeded workload), ``witness`` (what a block or a sequence looked like, in words).
"""

from kvcheck.models.blocks.model import MODEL, BlockScope, BlocksModel, ExploreScope

__all__ = ["MODEL", "BlockScope", "BlocksModel", "ExploreScope"]
