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


def test_one_minimal(corpus_name):
    trace = found_trace(corpus_name)
    cls = CORPUS[corpus_name][0]
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


def test_ids_renumbered_from_zero(corpus_name):
    seen: list[int] = []
    for op in found_trace(corpus_name).ops:
        for q in (op.seq, op.child) if op.kind == "fork" else (op.seq,):
            if q not in seen:
                seen.append(q)
    assert seen == list(range(len(seen)))
