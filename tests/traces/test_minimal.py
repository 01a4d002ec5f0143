"""Shrunk traces are minimal: never longer than the shortest one bounded BFS finds, 1-minimal,
and with sequence ids renumbered from 0."""

from __future__ import annotations

import pytest
from traces_helpers import CORPUS, found_trace

from kvcheck.models.blocks import MODEL
from kvcheck.models.blocks.runs import Scope, explore, replay

from corpus.cyclic import BEYOND_BFS, BFS_MAX_TOKENS, CYCLIC

SMALL = Scope(num_blocks=4, block_size=2, seqs=3, max_tokens=4, depth=4)


def test_never_longer_than_bfs_shortest(corpus_name):
    if corpus_name in BEYOND_BFS:
        pytest.skip(f"{corpus_name}: {BEYOND_BFS[corpus_name]}, beyond this BFS's depth")
    trace = found_trace(corpus_name)
    cls, _, longest = CORPUS[corpus_name]
    scope = SMALL if corpus_name not in CYCLIC else Scope(
        num_blocks=4, block_size=2, seqs=3, max_tokens=BFS_MAX_TOKENS, depth=4)
    found = explore(cls, scope, timeout=2.0, key=trace.violation.key)
    assert found.violation is not None, f"BFS found no {trace.violation.key} within {scope}"
    assert len(trace.ops) <= len(found.ops), (trace.ops, found.ops)
    assert len(trace.ops) <= longest
    assert trace.violation.step == len(trace.ops)


def _assert_one_minimal(cls, trace):
    """No single deletion, and neither a pool nor a block one smaller, still fails so."""
    key = trace.violation.key
    for i in range(len(trace.ops)):
        fewer = [MODEL.request(o) for j, o in enumerate(trace.ops) if j != i]
        r = replay(cls, trace.num_blocks, trace.block_size, fewer, timeout=2.0)
        assert r.violation is None or r.violation.key != key, f"still fails without op {i}"
    smaller = ((trace.num_blocks - 1, trace.block_size), (trace.num_blocks, trace.block_size - 1))
    for nb, bs in smaller:
        if nb >= 1 and bs >= 1:
            r = replay(cls, nb, bs, trace.ops, timeout=2.0)
            assert r.violation is None or r.violation.key != key, (nb, bs)


def test_one_minimal(corpus_name):
    _assert_one_minimal(CORPUS[corpus_name][0], found_trace(corpus_name))


def test_ids_renumbered_from_zero(corpus_name):
    seen: list[int] = []
    for op in found_trace(corpus_name).ops:
        for q in (op.seq, op.child) if op.kind == "fork" else (op.seq,):
            if q not in seen:
                seen.append(q)
    assert seen == list(range(len(seen)))


def _replayed_scopes(monkeypatch, name: str, num_blocks: int):
    """The pool sizes shrinking replays at, in order, for ``name`` found at ``num_blocks``."""
    import kvcheck.check.shrink as shrink
    from kvcheck.verify import verify

    seen, original = [], shrink.replay

    def replay(model, factory, sc, ops, options, **kw):
        seen.append(sc.num_blocks)
        return original(model, factory, sc, ops, options, **kw)

    monkeypatch.setattr(shrink, "replay", replay)
    r = verify(CORPUS[name][0], num_blocks, 4, 3000, 0, shrink_budget=60)
    assert not r.ok
    return r, seen


def test_a_large_pool_is_halved_before_the_greedy_passes(monkeypatch):
    """Found at 1,024 blocks: the run is replayed at 512 first (and halved on while it
    fails the same way), never at 1,024, and the result is as minimal as ever: 1-minimal,
    its pool no larger than it needs."""
    from kvcheck.check.shrink import HALVE_ABOVE

    name = "no-copy-on-write"
    r, seen = _replayed_scopes(monkeypatch, name, 1024)
    assert seen[0] == 512 and max(seen) == 512, seen[:5]
    assert r.trace.num_blocks <= HALVE_ABOVE and len(r.trace.ops) <= CORPUS[name][2]
    _assert_one_minimal(CORPUS[name][0], r.trace)


def test_a_pool_up_to_the_threshold_is_shrunk_at_its_own_size_first(monkeypatch):
    """At most ``HALVE_ABOVE`` blocks (``kvcheck verify``'s 32 included) shrinking starts
    at the run's own pool, as it always did: the run replayed there, then the greedy
    passes' first candidate."""
    from kvcheck.check.shrink import HALVE_ABOVE

    _, seen = _replayed_scopes(monkeypatch, "no-copy-on-write", HALVE_ABOVE)
    assert seen[:2] == [HALVE_ABOVE, HALVE_ABOVE], seen[:5]
