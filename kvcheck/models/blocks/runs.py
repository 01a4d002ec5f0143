"""The checker's runs for the block-manager model, in its own terms (pool and block size).

Thin conveniences over ``kvcheck.check`` (``run.replay``, ``shrink.shrink``,
``explore.explore``) with the block manager's model and scopes filled in;
their signatures are the ones kvcheck has always had.
"""

from __future__ import annotations

from kvcheck.check import explore as _explore
from kvcheck.check import run as _run
from kvcheck.check import shrink as _shrink
from kvcheck.check.model import Options
from kvcheck.models.blocks.model import MODEL, BlockScope, ExploreScope

Scope = ExploreScope  # the exploration scope under its first name
Replay = _run.Replay


def _options(out_of_blocks=None, timeout: float | None = 10.0) -> Options:
    return Options(mode="full", timeout=timeout, out_of_blocks=out_of_blocks)


def replay(factory, num_blocks: int, block_size: int, ops, out_of_blocks=None,
           timeout: float | None = 10.0, record: bool = False) -> Replay:
    """Run the requests ``ops`` on a fresh target in full mode (see ``kvcheck.check.run``)."""
    return _run.replay(MODEL, factory, BlockScope(num_blocks, block_size), ops,
                       _options(out_of_blocks, timeout), record)


def shrink(factory, num_blocks: int, block_size: int, ops: list, key: tuple, out_of_blocks=None,
           timeout: float | None = 10.0, budget=None, progress=None):
    """The smallest trace failing with the same ``key`` (see ``kvcheck.check.shrink``)."""
    return _shrink.shrink(MODEL, factory, BlockScope(num_blocks, block_size), ops, key,
                          _options(out_of_blocks, timeout), budget, progress)


def explore(factory, scope: ExploreScope, out_of_blocks=None, timeout: float | None = 10.0,
            budget: float | None = None, key: tuple | None = None, dedup: bool = True,
            progress=None):
    """Breadth-first exploration within ``scope`` (see ``kvcheck.check.explore``)."""
    return _explore.explore(MODEL, factory, scope, _options(out_of_blocks, timeout), budget, key,
                            dedup, progress)


def state_json(snap) -> dict:
    """A snapshot as a trace records it."""
    return {
        "tables": {str(q): list(t) for q, t in snap.tables.items()},
        "lens": {str(q): snap.length(q) for q in snap.tables},
        "refs": list(snap.refs),
        "free": sorted(snap.free.elements()),
    }
