"""Helpers for the trace tests: one shrunk counterexample per corpus bug, found once."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from corpus.buggy import CORPUS  # noqa: E402

BUGGY = TESTS / "corpus" / "buggy.py"


def target_of(name: str) -> str:
    """The corpus entry as a TARGET string that any process can resolve."""
    return f"{BUGGY}:{CORPUS[name][0].__name__}"


_cache: dict = {}


def found_trace(name: str):
    """The shrunk trace ``verify`` finds for a corpus bug (computed once per session)."""
    from kvcheck.verify import verify

    if name not in _cache:
        r = verify(target_of(name), num_blocks=8, block_size=2, ops=3000, seed=0, timeout=2.0,
                   shrink_budget=20.0)
        assert not r.ok, f"verify did not find the {name} bug"
        _cache[name] = r.trace
    return _cache[name]
