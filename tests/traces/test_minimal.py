"""Shrunk traces are minimal: never longer than the shortest one bounded BFS finds, 1-minimal,
and with sequence ids renumbered from 0."""

from __future__ import annotations

import pytest
from traces_helpers import CORPUS, found_trace

from kvcheck.models.blocks import MODEL
from kvcheck.models.blocks.runs import Scope, explore, replay

from corpus.cyclic import BEYOND_BFS, BFS_MAX_TOKENS, CYCLIC

SMALL = Scope(num_blocks=4, block_size=2, seqs=3, max_tokens=4, depth=4)


@pytest.mark.parametrize("corpus_name", sorted(set(CORPUS) - set(BEYOND_BFS)))
def test_never_longer_than_bfs_shortest(corpus_name):
    trace = found_trace(corpus_name)
    cls, _, longest = CORPUS[corpus_name]
    scope = SMALL if corpus_name not in CYCLIC else Scope(
        num_blocks=4, block_size=2, seqs=3, max_tokens=BFS_MAX_TOKENS, depth=4)
    found = explore(cls, scope, timeout=2.0, key=trace.violation.key)
    assert found.violation is not None, f"BFS found no {trace.violation.key} within {scope}"
    assert len(trace.ops) <= len(found.ops), (trace.ops, found.ops)
    assert len(trace.ops) <= longest
    assert trace.violation.step == len(trace.ops)


@pytest.mark.parametrize("corpus_name", sorted(BEYOND_BFS))
def test_beyond_the_bfs_never_longer_than_the_known_shortest(corpus_name):
    """A bug whose shortest trace is beyond the BFS's depth (BEYOND_BFS): the shrunk trace is
    no longer than the shortest one known, and ends at its violation (not skipped)."""
    trace = found_trace(corpus_name)
    _, _, longest = CORPUS[corpus_name]
    assert len(trace.ops) <= longest, trace.ops
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


def _replays(monkeypatch, name: str, num_blocks: int, ops: int = 3000):
    """``name`` found at ``num_blocks`` within ``ops`` operations and shrunk: the result,
    and each replay shrinking ran, in order, as (its pool size, its operations)."""
    import kvcheck.check.shrink as shrink
    from kvcheck.verify import verify

    seen, original = [], shrink.replay

    def replay(model, factory, sc, cand, options, **kw):
        seen.append((sc.num_blocks, len(cand)))
        return original(model, factory, sc, cand, options, **kw)

    monkeypatch.setattr(shrink, "replay", replay)
    r = verify(CORPUS[name][0], num_blocks, 4, ops, 0, shrink_budget=60)
    assert not r.ok
    return r, seen


def _replayed_scopes(monkeypatch, name: str, num_blocks: int):
    """The pool sizes shrinking replays at, in order, for ``name`` found at ``num_blocks``."""
    r, seen = _replays(monkeypatch, name, num_blocks)
    return r, [pool for pool, _ in seen]


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


def test_focus_keeps_the_failing_sequences_and_those_sharing_blocks_with_them():
    """``BlocksModel.focus``: the last operation's sequences, joined by fork and rebase;
    a sequence id freed and allocated again is another sequence; None when nothing is
    cut."""
    from kvcheck.spec.contracts import Op

    ops = [Op("allocate", seq=0, n_tokens=3), Op("allocate", seq=1, n_tokens=2),
           Op("fork", seq=0, child=2), Op("append_slot", seq=1), Op("free_seq", seq=0),
           Op("allocate", seq=0, n_tokens=5), Op("allocate", seq=3, n_tokens=1),
           Op("rebase", seq=3, child=1), Op("append_slot", seq=2)]
    kept = MODEL.focus(ops)
    assert [(o.kind, o.seq) for o in kept] == [
        ("allocate", 0), ("fork", 0), ("free_seq", 0), ("append_slot", 2)]
    # the first sequence 0's life ends at its free: the later allocate of 0 is another's
    ops[-1] = Op("append_slot", seq=1)  # now the last step's family is 1 and 3 (rebase)
    assert [(o.kind, o.seq) for o in MODEL.focus(ops)] == [
        ("allocate", 1), ("append_slot", 1), ("allocate", 3), ("rebase", 3), ("append_slot", 1)]
    assert MODEL.focus(ops[:1]) is None


def test_a_long_run_is_focused_before_the_greedy_passes(monkeypatch):
    """A run of hundreds of operations whose failure needs only its own sequences
    (rebase-double-release: 628 operations, 4 of them in the failing family) is cut to
    those in one replay: the shrink replays far fewer operations in all, and the result
    is the same trace as without the focus."""
    from kvcheck.models.blocks.model import BlocksModel

    def shrunk(focus: bool):
        with monkeypatch.context() as m:
            if not focus:
                m.setattr(BlocksModel, "focus", lambda self, ops: None)
            r, seen = _replays(m, "rebase-double-release", 32, 10_000)
        assert r.original_length > 500
        return r.trace, [length for _, length in seen]

    with_focus, replayed = shrunk(True)
    without, replayed_without = shrunk(False)
    assert replayed[0] < 20 and replayed_without[0] > 500  # (the focus; the whole run)
    assert sum(replayed) * 3 < sum(replayed_without), (sum(replayed), sum(replayed_without))
    assert [MODEL.op_to_json(o) for o in with_focus.ops] == \
        [MODEL.op_to_json(o) for o in without.ops]
    assert with_focus.violation.key == without.violation.key
