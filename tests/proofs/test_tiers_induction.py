"""Z3 side of the tiers spec (issue 33): every per-block tier invariant (and the
block-manager per-block ones, through pool_view) proved by 1-induction over the tiers'
block steps, the outcome classes' witnesses found, and weakened steps refuted."""

import z3

from kvcheck.proofs.tiers_induction import (
    ENGINE,
    LEMMAS,
    WEAKENED,
    WITNESSES,
    TierModel,
    TierModelScope,
    per_block,
    prove_tier_invariants,
)
from kvcheck.spec import tier_steps
from kvcheck.spec.tiers import TIER_BLOCK_INVARIANTS

SMALL = TierModelScope(num_blocks=2, holders=2)
EVICT_ROW = ("tiers: evict never takes a block a job, a sequence or a pin holds (a load's "
             "pinned hit is not evictable)")


def _rows(**kw):
    return {r.property: r for r in prove_tier_invariants(SMALL, **kw)}


def test_every_row_is_proved_and_every_witness_found():
    """Through ``kvcheck prove --model tiers`` (PASS, exit 0): every row holds."""
    code, out = _prove("--depth", "4")
    assert code == 0 and out["verdict"] == "pass", out["summary"]
    assert out["spec"]["rows"] == out["spec"]["holds"] == len(out["rows"])
    assert out["target"]["checked"] is False and out["target"]["rows"] == 0
    assert out["summary"].startswith(f"spec {len(out['rows'])}/{len(out['rows'])} proved; "
                                     "target not checked (")
    rows = {r["property"]: r for r in out["rows"]}
    assert {r["engine"] for r in rows.values()} == {ENGINE}
    wanted = {f"tiers: {n}" for n, _ in TIER_BLOCK_INVARIANTS}
    wanted |= {"tiers: refcount_conservation", "tiers: free_list", EVICT_ROW}
    wanted |= {f"tiers: {n}" for n, _ in LEMMAS}
    wanted |= {f"tiers reachable: {w}" for w in WITNESSES}
    assert wanted <= set(rows), wanted - set(rows)
    assert any("base case" in n for n in rows)
    every = ", ".join(tier_steps.STEPS)
    assert rows["tiers: key_content"]["detail"] == f"preserved by {every}"
    store = rows[f"tiers reachable: {WITNESSES[0]}"]["detail"]
    assert "start_store@0" in store and "publish@0" in store, store
    freed = rows[f"tiers reachable: {WITNESSES[2]}"]["detail"]
    assert "hold[job]@0" in freed and "drop[seq]@0 -> block 0 job1 ref 1" in freed, freed
    assert "(free) ref 0" in freed.rsplit(";", 1)[1], freed
    assert "start_prefetch" in every and "release" in every, every  # (#13501's steps)
    queued = rows[f"tiers reachable: {WITNESSES[3]}"]["detail"]
    assert "start_prefetch@0" in queued and "release@0 -> block 0 pin1" in queued, queued
    assert "drop[pin]@0 -> block 0 unheld(free) ref 0" in queued, queued


def test_integers_alone_prove_the_same_rows():
    rows = prove_tier_invariants(TierModelScope(num_blocks=2, holders=1), encoding="int",
                                 witnesses=False)
    assert all(r.result == "proved" for r in rows), [(r.property, r.detail) for r in rows]


def test_a_drop_that_frees_a_block_a_job_still_holds_is_refuted():
    rows = _rows(steps=WEAKENED["drop[seq] frees a block a job still holds"], witnesses=False)
    r = rows["tiers: free_list"]
    assert r.result == "violated" and r.detail.startswith("not preserved by drop[seq];"), r.detail
    assert "counterexample (drop[seq]): block 0 before:" in r.detail
    assert rows["tiers: refcount_conservation"].result == "proved"


def test_a_publish_before_its_copy_landed_is_refuted():
    """Findable before the copy: a store's destination keyed at its start."""
    def start_keyed(L, pre, post, a, arg=None):
        for c, name, f in tier_steps.STEPS["start_store"](L, pre, post, a, arg):
            if name == "the block's other terms unchanged":
                f = tier_steps.same(L, pre, post, a, *[
                    t for t in tier_steps.BLOCK_TERMS
                    if t not in ("storing", "content", "cache", "ref", "meaning")])
            yield c, name, f
        yield "ensures", "keyed at once", L.and_(post.count("cache", a) == 1,
                                                 post.ref(a) == pre.ref(a) + 1,
                                                 post.meaning(a) == arg)

    rows = _rows(steps={**tier_steps.STEPS, "start_store": start_keyed}, witnesses=False)
    assert rows["tiers: pending_not_findable"].result == "violated"
    assert "start_store" in rows["tiers: pending_not_findable"].detail


def test_the_invariants_are_the_spec_s_own_text_on_both_states():
    """The same functions evaluate on a symbolic pool (a Z3 formula) and a concrete one."""
    m = TierModel(SMALL)
    s = m.state("x")
    for name, fn in per_block():
        assert z3.is_bool(fn(m.L, s, 0)), name
    names = [n for n, _ in per_block()]
    assert names[:2] == ["refcount_conservation", "free_list"]
    assert [n for n, _ in TIER_BLOCK_INVARIANTS] == names[2:2 + len(TIER_BLOCK_INVARIANTS)]


def test_a_witness_the_steps_cannot_reach_is_not_found():
    """With no publish, no store completes: the store witness is not found (the search
    can fail)."""
    steps = {k: v for k, v in tier_steps.STEPS.items() if k != "publish"}
    rows = _rows(steps=steps, induction=False)
    assert rows[f"tiers reachable: {WITNESSES[0]}"].result == "unreachable"
    assert rows[f"tiers reachable: {WITNESSES[2]}"].result == "proved"


def _prove(*args):
    import contextlib
    import io
    import json

    from kvcheck.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["prove", "--model", "tiers", "--blocks", "2", "--seqs", "2", *args, "--json"],
                     isolate=False)
    return code, json.loads(out.getvalue())


def test_kvcheck_prove_model_tiers_exit_codes(monkeypatch):
    """FAIL (1) with a weakened step (an eviction of a block others hold: refuted with a
    counterexample); INCONCLUSIVE (4) when the budget cuts the queries,
    never PASS or FAIL; a TARGET with --model tiers is bad input (2)."""
    import kvcheck.proofs.tiers_induction as TI
    from kvcheck.cli import main

    assert main(["prove", "--model", "tiers", "reference-tiers"], isolate=False) == 2

    code, out = _prove("--depth", "2", "--budget", "0.001")
    assert code == 4 and out["verdict"] == "inconclusive", out["summary"]
    assert not [r for r in out["rows"] if r["result"] == "violated"]
    monkeypatch.setattr(TI, "STEPS", WEAKENED["evict takes any cached block"])
    code, out = _prove("--depth", "2")
    assert code == 1 and out["verdict"] == "fail", out["summary"]
    rows = {r["property"]: r for r in out["rows"]}
    failed = {name for name, r in rows.items() if r["result"] == "violated"}
    assert {"tiers: refcount_conservation", EVICT_ROW} <= failed, failed
    assert "not preserved by evict; counterexample (evict): block 0 before:" in rows[
        "tiers: refcount_conservation"]["detail"]
    assert rows[EVICT_ROW]["detail"].startswith("a held block meets the eviction step's "
                                                "requires: block 0 before: ")


def test_a_release_queue_taking_a_page_the_job_still_holds_is_refuted():
    """SGLang #13501's shape in the block steps: the release queue takes a second reference
    (the job's stays), so the page is released by two owners: refcount conservation fails,
    at the release step only."""
    rows = _rows(steps=WEAKENED["release queues a page the job still holds"], witnesses=False)
    r = rows["tiers: refcount_conservation"]
    assert r.result == "violated" and r.detail.startswith("not preserved by release;"), r.detail
    assert rows["tiers: free_list"].result == "proved"

