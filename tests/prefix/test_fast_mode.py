"""The prefix oracle's fast mode (incremental: the cache read and checked where each step
touched it, full checks in sweeps and at the end) gives the full mode's verdicts: every
corpus bug caught with the same clause and the same shrunk trace length, every faulty
cache judged alike, and it really runs incrementally on the bundled reference."""

import sys
from pathlib import Path

import pytest

from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.models.prefix.incremental import Mirror
from kvcheck.report.text import render
from kvcheck.verify import verify

sys.path.insert(0, str(Path(__file__).parent))
from buggy_prefix import CORPUS  # noqa: E402
from faulty_prefix import FAULTS, faulty  # noqa: E402


def run(target, mode, seed, ops=2000, **kw):
    return verify(target, 8, 2, ops, seed, mode=mode, model="prefix", **kw)


def first_caught(target, mode, **kw):
    for seed in range(4):
        r = run(target, mode, seed, **kw)
        if not r.ok:
            return seed, r
    return None, r


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_same_verdict_clause_and_trace_length_in_fast_and_full(name):
    cls, names, longest = CORPUS[name]
    seed_full, full = first_caught(cls, "full", shrink_budget=10.0)
    seed_fast, fast = first_caught(cls, "fast", shrink_budget=10.0)
    assert not full.ok and not fast.ok, f"{name}: full {full.ok}, fast {fast.ok}"
    assert seed_fast == seed_full
    assert fast.violation.name == full.violation.name, render(fast.trace)
    assert fast.violation.name in names
    assert len(fast.trace.ops) == len(full.trace.ops) <= longest, render(fast.trace)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_found_by_fast_mode_itself(name):
    """Unshrunk: the fast run fails on the same seed, at the same step, on the same clause
    (every corpus bug touches the blocks it breaks, or breaks the sizes)."""
    cls = CORPUS[name][0]
    for seed in range(4):
        full = run(cls, "full", seed, do_shrink=False)
        fast = run(cls, "fast", seed, do_shrink=False)
        assert fast.ok == full.ok, (name, seed)
        if not full.ok:
            assert (fast.violation.step, fast.violation.name) == (full.violation.step,
                                                                   full.violation.name)
            break


@pytest.mark.parametrize("seed", range(8))
def test_faulty_caches_same_verdict(seed):
    full = run(faulty(seed), "full", seed, 600, do_shrink=False)
    fast = run(faulty(seed), "fast", seed, 600, do_shrink=False)
    assert fast.ok == full.ok
    if not full.ok:  # (a fault off the touched blocks may be found later, never earlier)
        assert fast.violation.step >= full.violation.step


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_found_at_the_same_step_on_a_larger_pool(fault):
    """One kind of fault at a time, rarely, on 32 blocks over 3,000 operations (long runs
    of the incremental path between faults): the same step and clause as the full mode."""
    assert faulty(0)(8, 2).cache_changes() is not None  # read block by block in fast mode
    for seed in range(2):
        full = verify(faulty(seed, rate=0.005, faults=(fault,)), 32, 4, 3000, seed, mode="full",
                      model="prefix", do_shrink=False)
        fast = verify(faulty(seed, rate=0.005, faults=(fault,)), 32, 4, 3000, seed, mode="fast",
                      model="prefix", do_shrink=False)
        assert not full.ok, (fault, seed)
        assert (fast.violation.step, fast.violation.name) == (full.violation.step,
                                                               full.violation.name), (fault, seed)


def test_fast_mode_is_incremental_on_the_reference():
    r = verify(PrefixCachingBlockManager, 64, 4, 1500, 0, mode="fast", model="prefix")
    assert r.ok, render(r.trace)
    assert r.state.fast and isinstance(r.state.mirror, Mirror)
    st = r.state.stats
    assert st.hit_allocations and st.revived and st.evicted and st.oob and st.orphans


@pytest.mark.parametrize("seed", range(3))
def test_the_fused_structural_steps_observe_what_the_layered_ones_do(seed):
    """The block manager's fused steps under the prefix oracle (allocate's with
    ``allocate_with_hits`` for its contract) leave in ``touched`` the blocks the layered
    step's ``After`` holds, and its sequences (their tables and lengths then the ghost's:
    ``After``'s), and the two oracles reach the same verdicts, states and cache hits, step
    by step."""
    from kvcheck.check.model import Options, model_named
    from kvcheck.models.blocks.model import BlockScope
    from kvcheck.models.prefix.oracle import PrefixOracle

    model, scope, options = model_named("prefix"), BlockScope(48, 2), Options()
    fused = PrefixOracle(model.build(PrefixCachingBlockManager, scope, options))
    layered = PrefixOracle(model.build(PrefixCachingBlockManager, scope, options), fused=False)
    assert set(k for k, _ in fused.s._fused) == {"allocate", "append_slot", "append_slots",
                                                  "free_seq", "preempt", "fork"}
    assert not layered.s._fused
    driver = model.driver(seed, scope, fused.target, options)
    kinds = set()
    for _ in range(3000):
        op = driver.next_op(fused)
        if op is None:
            break
        if not fused.valid(op):
            continue
        twin = model.request(op)
        assert layered.valid(twin)
        v1, v2 = fused.step(op), layered.step(twin)
        assert v1 is None and v2 is None, (v1, v2)
        if fused.s.touched is not None:
            kinds.add(op.kind)
            blocks, *seqs = fused.s.touched
            after, g = layered.s.after, fused.s.ghost
            assert fused.s.after is None and blocks == after.blocks, op
            assert {q: g.tables.get(q) for q in seqs} == after.tables, op
            assert {q: g.lengths[q] for q in seqs if q in g.tables} == \
                {q: after.lengths[q] for q, t in after.tables.items() if t is not None}, op
        assert fused.observed_json() == layered.observed_json(), op
        assert (fused.pending_hits, op.hits) == (layered.pending_hits, twin.hits), op
    assert kinds >= {"allocate", "append_slot", "free_seq", "fork"}, kinds
    assert fused.stats.hit_allocations and fused.stats.to_json() == layered.stats.to_json()


def _fused_against_layered(name, monkeypatch) -> list[bool]:
    """Corpus bug ``name``, fast mode, unshrunk, seeds 0.. until it is found: the same verdict,
    step, clause and element with the fused allocate as with the layered one. Per fused
    allocate run, whether its check failed (it then returns what it observed, a tuple)."""
    from kvcheck.models.prefix import oracle as prefix_oracle

    cls, key = CORPUS[name][0], ("allocate", "ok")
    step = prefix_oracle._FUSED_ALLOCATE[key]
    ran = []

    def counted(o, op):
        got = step(o, op)
        ran.append(type(got) is tuple)
        return got

    for seed in range(4):
        monkeypatch.setitem(prefix_oracle._FUSED_ALLOCATE, key, counted)
        fused = run(cls, "fast", seed, do_shrink=False)
        monkeypatch.delitem(prefix_oracle._FUSED_ALLOCATE, key)
        layered = run(cls, "fast", seed, do_shrink=False)
        assert fused.ok == layered.ok, (name, seed)
        if not fused.ok:
            v, w = fused.violation, layered.violation
            assert (v.step, v.kind, v.name, v.element) == (w.step, w.kind, w.name, w.element)
            break
    assert ran, f"{name}: the fused allocate never ran"
    return ran


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_same_step_and_clause_with_the_fused_allocate_and_without(name, monkeypatch):
    """The fused allocate (``allocate_with_hits`` for its contract) finds every corpus bug
    where the layered allocate does, on the same clause and element."""
    _fused_against_layered(name, monkeypatch)


@pytest.mark.parametrize("name", ["full-hit-no-token-left", "pinned-on-free-queue"])
def test_the_fused_allocate_fails_where_the_bug_is_in_allocate(name, monkeypatch):
    """A bug in the cached-token count (``fused_inputs``' hit check fails) and one in the
    free list (the compiled ``allocate_with_hits`` fails): the fused step's failing way
    runs, and the layered path names the same clause (above)."""
    assert any(_fused_against_layered(name, monkeypatch)), name
