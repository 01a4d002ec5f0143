"""Z3 side of the prefix-cache spec: induction proves every prefix invariant over
the block steps, each step is enabled on a reachable path, and mutated steps fail."""

import z3

from kvcheck.proofs.prefix_induction import ENGINE, prove_prefix_invariants
from kvcheck.proofs.prefix_model import PrefixModel, PrefixModelScope
from kvcheck.spec import prefix_steps
from kvcheck.spec.prefix import PREFIX_INVARIANTS, PrefixScope

SMALL = PrefixScope(num_blocks=4, block_size=2)


def _evict_keeps_key(L, pre, post, a, arg=None):
    """vLLM's bug: an evictable block is reused for new content, its key left in the cache."""
    for clause, name, f in prefix_steps.take_evictable(L, pre, post, a, arg):
        if name == "its key leaves the cache":
            f = L.and_(post.cache_entries(a) == pre.cache_entries(a), post.meaning(a) == pre.meaning(a))
        elif name == "the block's other terms unchanged":
            continue  # re-added without cache_entries / meaning
        yield clause, name, f
    yield "ensures", "lists unchanged otherwise", prefix_steps.same(L, pre, post, a, "on_free")


def _unchained_key(L, pre, post, a, arg=None):
    """A key computed from the block's own tokens only: it may name another prefix."""
    for clause, name, f in prefix_steps.register(L, pre, post, a, arg):
        if name != "the key names its prefix":
            yield clause, name, f


def test_every_prefix_invariant_is_proved():
    rows = prove_prefix_invariants(SMALL)
    assert all(r.engine == ENGINE for r in rows)
    names = {r.property for r in rows}
    assert {i.name for i in PREFIX_INVARIANTS} <= names
    assert any("base case" in n for n in names) and any("cache hit" in n for n in names)
    assert all(r.result == "proved" for r in rows), [(r.property, r.result, r.detail) for r in rows]


def test_int_and_bv_encodings_agree():
    for enc in ("bv", "int"):
        rows = prove_prefix_invariants(PrefixScope(3, 1), encoding=enc)
        assert all(r.result == "proved" for r in rows), (enc, [(r.property, r.detail) for r in rows])


def test_evictable_reuse_without_removing_the_key_is_caught():
    steps = {**prefix_steps.STEPS, "take_evictable": _evict_keeps_key}
    rows = {r.property: r for r in prove_prefix_invariants(SMALL, steps=steps)}
    for name in ("key_after_write", "cache_content", "no_partial_cached"):
        assert rows[name].result == "violated", rows[name]
        assert rows[name].detail == "not preserved by take_evictable", rows[name].detail
    assert rows["free_unkeyed"].result == "proved"


def test_unchained_key_is_caught():
    steps = {**prefix_steps.STEPS, "register": _unchained_key}
    rows = {r.property: r for r in prove_prefix_invariants(SMALL, steps=steps)}
    assert rows["cache_content"].result == "violated"
    assert "register" in rows["cache_content"].detail
    assert rows["cache hit returns a cached block holding the requested prefix"].result == "proved"


def _register_unwritten(L, pre, post, a, arg=None):
    """Publish before write: a key registered for a block whose slots are not all written."""
    for clause, name, f in prefix_steps.register(L, pre, post, a, arg):
        if name != "every slot written":
            yield clause, name, f


def test_publish_after_write_rows_are_proved():
    rows = {r.property: r for r in prove_prefix_invariants(SMALL)}
    for name in ("publish after write: a cache hit never returns a block whose content is not "
                 "written", "publish after write: a block freed before its write is not findable"):
        assert rows[name].result == "proved", rows[name]


def test_publish_before_write_is_caught():
    steps = {**prefix_steps.STEPS, "register": _register_unwritten}
    rows = {r.property: r for r in prove_prefix_invariants(SMALL, steps=steps)}
    assert rows["key_after_write"].result == "violated"
    assert rows["key_after_write"].detail == "not preserved by register", rows["key_after_write"]


def test_every_step_is_enabled_on_a_reachable_path():
    """Not vacuous: from the initial pool, a path through every rule exists (block 0)."""
    path = ["take_free", "write", "write", "register", "fork", "release", "release", "hit",
            "release", "take_evictable", "write", "write", "register", "unregister", "truncate",
            "release"]
    assert set(path) == set(prefix_steps.STEPS)
    m = PrefixModel(PrefixModelScope(2, 2))
    states = [m.state(f"p{i}") for i in range(len(path) + 1)]
    solver = z3.Solver()
    solver.add(m.init(states[0]))
    for i, kind in enumerate(path):
        body, _ = m.step(kind, states[i], states[i + 1], 0, tag=f"p{i}")
        solver.add(body)
    assert solver.check() == z3.sat
    end = states[-1]
    model = solver.model()
    assert model.eval(end.free_list_len()).as_long() == 2  # block 0 back on the plain free list


def test_step_rules_evaluate_concretely():
    """The rules are spec text: PY evaluates them on snapshots (as the oracle could)."""
    from kvcheck.spec.logic import PY
    from kvcheck.spec.prefix import PrefixSnapshot

    pre = PrefixSnapshot(2, 2, [0, 1], free_list=[], evictable=[0], entries=[("k", 0)],
                         meanings={"k": 5}, filled={0: 2, 1: 1}, content={0: 5}, partial=[1])
    good = PrefixSnapshot(2, 2, [1, 1], free_list=[], evictable=[], entries=[], meanings={},
                          filled={0: 0, 1: 1}, content={}, partial=[0, 1])
    stale = PrefixSnapshot(2, 2, [1, 1], free_list=[], evictable=[], entries=[("k", 0)],
                           meanings={"k": 5}, filled={0: 0, 1: 1}, content={}, partial=[0, 1])
    assert all(f for _, _, f in prefix_steps.take_evictable(PY, pre, good, 0))
    failed = {n for _, n, f in prefix_steps.take_evictable(PY, pre, stale, 0) if not f}
    assert failed == {"its key leaves the cache"}


CACHED_TOKENS = ("cached tokens: the count an allocation reports skips only blocks holding the "
                 "requested prefix and leaves a token to compute")


def test_cached_token_count_row_is_proved():
    rows = {r.property: r for r in prove_prefix_invariants(SMALL)}
    assert rows[CACHED_TOKENS].result == "proved", rows[CACHED_TOKENS]
    assert "every prompt of 1..8 tokens" in rows[CACHED_TOKENS].detail


def _hit_any_cached(L, pre, post, a, arg=None):
    """A lookup that takes any cached block, whatever prefix its key names."""
    for clause, name, f in prefix_steps.hit(L, pre, post, a, arg):
        if name == "cached under the requested prefix's key":
            f = pre.cached(a)
        yield clause, name, f


def test_weakened_cached_token_rules_are_caught():
    """A lookup walking the prompt's last block too (vLLM PR #11186: a prompt fully in the
    cache computes nothing), a count past the blocks served (PR #5364: a block reused from
    the evictor counted as computed), a hit on a block under another prefix's key: each
    refutes the row, with the prompt length that breaks it."""
    weak = {"lookup": dict(lookup=lambda n, bs: n // bs),
            "count": dict(count=lambda L, hits, n, bs: (hits + 1) * bs),
            "hit": dict(steps={**prefix_steps.STEPS, "hit": _hit_any_cached})}
    for what, kw in weak.items():
        row = {r.property: r for r in prove_prefix_invariants(SMALL, **kw)}[CACHED_TOKENS]
        assert row.result == "violated", (what, row)
        assert row.detail.startswith("refuted for a prompt of"), (what, row.detail)
    row = {r.property: r for r in prove_prefix_invariants(SMALL, **weak["lookup"])}[CACHED_TOKENS]
    assert row.detail == "refuted for a prompt of 2 token(s)"  # 2 tokens = 1 full block, all hit


def _truncate_keeps_key(L, pre, post, a, arg=None):
    """A rollback that cuts into a cached block and keeps its key."""
    for clause, name, f in prefix_steps.truncate(L, pre, post, a, arg):
        if name != "no key (unregistered first)":
            yield clause, name, f


def test_rollback_keeping_its_key_is_caught():
    """The rollback steps (unregister, then truncate) preserve every invariant; a
    truncate of a block that keeps its key (the corpus' rollback-keeps-key) is refuted."""
    rows = {r.property: r for r in prove_prefix_invariants(SMALL)}
    assert "unregister, truncate" in rows["no_partial_cached"].detail
    steps = {**prefix_steps.STEPS, "truncate": _truncate_keeps_key}
    rows = {r.property: r for r in prove_prefix_invariants(SMALL, steps=steps)}
    assert rows["no_partial_cached"].result == "violated"
    assert rows["no_partial_cached"].detail == "not preserved by truncate", rows["no_partial_cached"]
