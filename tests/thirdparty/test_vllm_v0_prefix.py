"""``kvcheck verify-prefix`` on vLLM v0's prefix-caching allocator (vllm 0.8.5).

The prefix oracle reads v0's cache through the adapter's public observation methods
(``cache_entries`` / ``evictable_blocks`` / ``free_list_blocks``: its ``_cached_blocks``
map, its evictor, its hashless free deque). What it shows besides the core
findings: F5, block de-duplication on completion. A sequence that fills its
last block with content already cached is moved onto the cached block, so the
slot append_slot returns lies in a block another sequence holds (the spec: the
sole holder of a partial block writes in place). Deliberate in v0
(``promote_to_immutable_block``), recorded as deviation D8.

And a lesson for adapters: v0's engine marks every running sequence's blocks
accessed each scheduler step; its LRU evictor depends on that to discard stale
entries. The adapter does the same once per operation (a logical clock).
"""

from __future__ import annotations

import pytest

from kvcheck.check.model import Options
from kvcheck.check.run import replay as run_replay
from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import vllm_v0
from kvcheck.models.blocks import BlockScope
from kvcheck.models.prefix import MODEL
from kvcheck.models.prefix.oracle import PrefixOp, view_for
from kvcheck.targets.loading import TargetError

GUARDED = vllm_v0.make_prefix_guarded


def replay(factory, num_blocks, block_size, ops):
    """``ops`` on a fresh target under the prefix model, in full mode: (violation, ops run)."""
    r = run_replay(MODEL, factory, BlockScope(num_blocks, block_size), ops, Options())
    return r.violation, r.ops


def _op(kind, seq, tokens=(), child=0):
    return PrefixOp(kind, seq=seq, child=child, n_tokens=len(tokens), tokens=tuple(tokens))


def test_the_view_reads_v0s_cache():
    t = vllm_v0.make_prefix(4, 2)
    t.allocate(0, 4, token_ids=[5, 6, 7, 8])
    view = view_for(t)
    blocks = t.block_table(0)
    assert sorted(b for _, b in view.entries()) == sorted(blocks)
    assert view.evictable() == [] and sorted(view.free_list()) == [b for b in range(4)
                                                                    if b not in blocks]
    t.free_seq(0)
    assert sorted(view.evictable()) == sorted(blocks) and view.evictable_len() == 2
    assert view.free_list_len() == 2


def test_the_naive_allocator_has_no_cache_to_read():
    with pytest.raises(TargetError, match="does not expose a prefix cache"):
        view_for(vllm_v0.make(4, 2))


def test_verify_prefix_drives_vllm_v0_prefix():
    """It used to exit 2 (cache not observed); now it runs and finds a violation."""
    assert kvcheck(["verify-prefix", "vllm-v0-prefix", "--blocks", "8", "--block-size", "2",
                    "--ops", "2000", "--seed", "1"]) == 1


def test_f5_a_full_block_is_swapped_for_the_cached_copy():
    ops = [_op("allocate", 0, [197]), _op("append_slot", 0, [2]), _op("append_slot", 0, [1]),
           _op("fork", 0, child=1), _op("append_slot", 1, [1]), _op("append_slot", 0, [1])]
    v, ran = replay(GUARDED, 3, 4, ops)
    assert v is not None and v.name == "append_slot: the sole holder of a partial block writes in place"
    cow, last = ran[4], ran[5]
    assert cow.cow_src == 0 and cow.block == 1  # seq 1 copied block 0 to block 1 and filled it
    assert last.block == 1 and last.cow_src is None  # seq 0 filled block 0 with the same content:
    assert ran[5].seq == 0  # v0 moved it onto block 1, which seq 1 holds


def test_a_guard_refusal_is_checked_and_the_run_goes_on():
    """The engine guard's conservative refusal (an in-place write refused with no block
    free) is the outcome ``refused`` under the prefix model too: checked to change nothing,
    the cache included, and the operations after it are checked."""
    ops = [_op("allocate", 0, [5]), _op("append_slot", 0, [6]), _op("free_seq", 0),
           _op("allocate", 1, [5, 6])]
    v, ran = replay(GUARDED, 1, 2, ops)
    assert v is None, v
    assert [o.outcome for o in ran] == ["ok", "refused", "ok", "ok"]
    v, ran = replay(vllm_v0.make_prefix, 1, 2, ops)  # unguarded: written in place
    assert v is None and [o.outcome for o in ran] == ["ok"] * 4


def test_verify_prefix_on_the_guarded_target_gets_past_refusals_to_f5(tmp_path):
    """Before refusals were declared, verify-prefix stopped at the guard's first
    conservative refusal (D5); now the first violation is v0's own F5."""
    from kvcheck.check.trace import Trace

    out = tmp_path / "t.json"
    assert kvcheck(["verify-prefix", "kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded",
                    "--ops", "3000", "--seed", "0", "--trace-out", str(out)]) == 1
    trace = Trace.loads(out.read_text())
    assert trace.violation.name == ("append_slot: the sole holder of a partial block writes "
                                    "in place")


# Without the engine's per-step access marks (the adapter makes them, see
# ``VllmV0Target._engine_step``) v0's LRU evictor cannot tell stale heap entries
# from live ones and trips its own assertion: an adapter must not skip them.
STALE_OPS = [("allocate", 0, [132, 1]), ("allocate", 1, [172, 0, 0]), ("free_seq", 1, []),
             ("allocate", 2, [172]), ("append_slot", 2, [0]), ("append_slot", 2, [0]),
             ("free_seq", 2, []), ("allocate", 3, [1]), ("allocate", 4, [132]),
             ("append_slot", 3, [0]), ("free_seq", 3, []), ("append_slot", 4, [2])]


def _run(t, ops):
    for kind, seq, tokens in ops:
        if kind == "allocate":
            t.allocate(seq, len(tokens), token_ids=tokens)
        elif kind == "append_slot":
            t.append_slot(seq, tokens[0])
        else:
            t.free_seq(seq)


def test_without_the_engines_access_marks_eviction_asserts():
    t = GUARDED(6, 1)
    t._engine_step = lambda: None  # what the adapter did before: no per-step bookkeeping
    with pytest.raises(AssertionError) as info:
        _run(t, STALE_OPS)
    assert info.traceback[-1].name == "_maybe_allocate_evicted_block_id"


@pytest.mark.parametrize("factory", [GUARDED, vllm_v0.make_prefix])
def test_with_them_the_same_operations_run_clean(factory):
    _run(factory(6, 1), STALE_OPS)
    v, _ = replay(factory, 6, 1, [_op(k, q, toks) for k, q, toks in STALE_OPS])
    assert v is None


# -- the engine's cached-token count (issue 15: spec.prefix.cached_tokens) -------------------
def test_allocate_reports_the_engines_cached_token_count():
    """With prefix caching, allocate returns v0's skip-prefill count: the scheduler's
    ``ComputedBlocksTracker.get_num_cached_tokens`` (cached and computed leading blocks),
    all but the last token on a full hit (the model runner's rule); blocks revived from
    the evictor count (they are computed), and the oracle checks each count."""
    ops = [_op("allocate", 0, [1, 2, 3, 4, 5]), _op("allocate", 1, [1, 2, 3, 4, 9]),
           _op("free_seq", 0), _op("free_seq", 1), _op("allocate", 2, [1, 2, 3, 4]),
           _op("allocate", 3, [1, 2, 7])]
    for factory in (vllm_v0.make_prefix, GUARDED):
        v, ran = replay(factory, 8, 2, ops)
        assert v is None, v
        got = [(o.hits, o.cached_tokens) for o in ran if o.kind == "allocate"]
        assert got == [(0, 0), (2, 4), (2, 3), (1, 2)], got
    assert vllm_v0.make(8, 2).allocate(0, 3, [1, 2, 3]) is None  # naive: nothing to report


def test_a_count_without_the_runners_full_hit_rule_is_caught(monkeypatch):
    """Teeth: were the count the tracker's alone on a full hit (nothing left to compute,
    vLLM PR #11186's shape), the check fires on v0's own path, in two operations."""
    monkeypatch.setattr(vllm_v0, "runner_skips", lambda blocks, n, bs: blocks * bs)
    ops = [_op("allocate", 0, [1, 2]), _op("allocate", 1, [1, 2])]
    v, _ = replay(vllm_v0.make_prefix, 8, 2, ops)
    assert v is not None and v.name == ("allocate: a prompt fully in the cache leaves at least "
                                        "one token to compute")


@pytest.mark.parametrize("factory", ["vllm-v0-prefix",
                                     "kvcheck.impl.thirdparty.vllm_v0:make_prefix_guarded"])
def test_no_cached_token_clause_fires_on_v0(factory):
    """What kvcheck says of v0's count: across seeds (forks off, so runs get past F5 more
    often), every allocation's count holds until the run stops at one of v0's known
    structural findings, never at a cached-token clause."""
    from kvcheck.verify import verify

    checked = 0
    for seed in range(6):
        r = verify(factory, 16, 4, 3000, seed, model="prefix", extra={"weights": {"fork": 0.0}},
                   do_shrink=False)
        st = r.state.stats if r.state is not None else None
        checked += st.hit_allocations if st is not None else 0
        if not r.ok:
            assert "cached tokens" not in r.violation.name and "prompt fully in the cache" \
                not in r.violation.name, r.violation.name
    assert checked > 0
