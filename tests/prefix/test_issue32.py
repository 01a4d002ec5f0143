"""Issue 32, section 4: the prefix oracle judges by what the engine did, not by what it
saw first.

* a cache key means the chained prefix the engine hashes for it (the target's own
  ``prefix_key``, applied to the token ids its sequences were given), so a block
  published under the wrong key is caught at the first check;
* a block the engine writes (past the cached-token count an allocation reports) is the
  sequence's alone, whatever the cache map says;
* ``append_slot`` on a sequence holding reserved slots is legal, driven and checked;
* ``verify-prefix --allow`` takes every clause name ``verify-prefix`` prints.
"""

import sys
from pathlib import Path

import pytest

from kvcheck.cli import main
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.report.text import render
from kvcheck.spec import prefix as P
from kvcheck.verify import verify

sys.path.insert(0, str(Path(__file__).parent))
import buggy_prefix  # noqa: E402

HERE = Path(__file__).parent


def verify_prefix(target, num_blocks, block_size, ops, seed, mode="full", **kw):
    return verify(target, num_blocks, block_size, ops, seed, mode=mode, model="prefix", **kw)


# -- 4. --allow takes the prefix model's own clause names -------------------------------------
def test_allow_takes_every_clause_name_verify_prefix_prints(capsys):
    """Each clause of the prefix model's contracts (allocate with hits, the cache hits, the
    cached-token count, commit, a failed call's cache), by its full name and alone, is a
    name ``--allow`` takes (it said 'no clause or invariant of the spec has that name')."""
    for name in ("allocate: cache hit returns a block holding the requested prefix",
                 "allocate: every block the prefill writes was free: the sequence's alone",
                 "a prompt fully in the cache leaves at least one token to compute"):
        assert main(["verify-prefix", "prefix", "--ops", "30", "--allow", name],
                    isolate=False) == 0, capsys.readouterr().err
    names = P.clause_names()
    assert "allocate: cache hit returns a block holding the requested prefix" in names
    assert "commit: a key appears only on a block of the committed sequence" in names
    argv = ["verify-prefix", "prefix", "--ops", "30"]
    for name in names:
        argv += ["--allow", name, "--allow", name.split(": ", 1)[1]]
    assert main(argv, isolate=False) == 0, capsys.readouterr().err
    assert main(["verify-prefix", "prefix", "--allow", "bogus", "--ops", "10"],
                isolate=False) == 2
    assert "no clause or invariant of the spec has that name" in capsys.readouterr().err


def test_an_allowed_cache_clause_is_counted_and_checked_past():
    """An allowed clause of the cache's own contracts is a counted deviation the run
    goes on from (the run state resynchronises), as with the block manager's clauses."""
    clause = "allocate: every block the cached tokens skip holds the requested prefix"
    bug = buggy_prefix.EvictorKeepsComputed
    r = verify_prefix(bug, 8, 2, 2000, 0, do_shrink=False)
    assert not r.ok and r.violation.name == clause
    r = verify_prefix(bug, 8, 2, 2000, 0, do_shrink=False, allow=frozenset({clause}))
    assert r.deviations and {d.clause for d in r.deviations} == {clause}
    assert r.ok or r.violation.name != clause


def replay(factory, num_blocks, block_size, ops):
    """``ops`` on a fresh target under the prefix model, in full mode: (violation, ops run)."""
    from kvcheck.check.model import Options
    from kvcheck.check.run import replay as run_replay
    from kvcheck.models.blocks import BlockScope
    from kvcheck.models.prefix import MODEL

    r = run_replay(MODEL, factory, BlockScope(num_blocks, block_size), ops, Options())
    return r.violation, r.ops


def _op(kind, seq, tokens=(), child=0, n=None):
    from kvcheck.models.prefix.oracle import PrefixOp

    return PrefixOp(kind, seq=seq, child=child, n_tokens=len(tokens) if n is None else n,
                    tokens=tuple(tokens))


# -- 1. a key means the prefix the engine hashes to it ----------------------------------------
def test_a_key_means_the_prefix_the_engine_hashes_to_it():
    """A block published under a key that is not the engine's key of the prefix it holds
    (``prefix_key``, the target's own hash, over the token ids the sequence was given) is
    caught in the step that publishes it, though nothing ever looks that key up (the
    oracle bound a key to whatever its block held when first seen, so this passed)."""
    # keys not chained to their parent: [0, 1]'s second block goes in under the key of [1]
    v, _ = replay(buggy_prefix.UnchainedKeys, 2, 1, [_op("allocate", 0, [0, 1])])
    assert v is not None and (v.name, v.step, v.element) == ("cache_content", 1, 1), v
    assert "the engine's key of no prefix" in v.witness
    # keys counted from the first block after a hit: [0, 1, 2]'s third block under [0, 1]'s key
    v, _ = replay(buggy_prefix.KeysFromFirstBlock, 3, 1,
                  [_op("allocate", 0, [0]), _op("allocate", 1, [0, 1, 2])])
    assert v is not None and (v.name, v.step) == ("cache_content", 2), v
    assert "naming prefix [0, 1]" in v.witness and "holding prefix [0, 1, 2]" in v.witness
    # the reference's keys, the same operations: nothing to report
    for ops in ([_op("allocate", 0, [0, 1])],
                [_op("allocate", 0, [0]), _op("allocate", 1, [0, 1, 2])]):
        assert replay(PrefixCachingBlockManager, 3, 1, ops)[0] is None


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("name,length", [("unchained-keys", 1), ("keys-from-first-block", 2)])
def test_a_wrong_key_is_caught_at_its_first_check(name, length, mode):
    """Found by ``verify-prefix`` in both modes and shrunk to the operations that publish
    the wrong key, nothing after (before: a later hit on the key had to contradict it)."""
    cls = buggy_prefix.CORPUS[name][0]
    for seed in range(3):
        r = verify_prefix(cls, 8, 2, 2000, seed, mode=mode, shrink_budget=10.0)
        assert not r.ok and r.violation.name == "cache_content", render(r.trace)
        assert len(r.trace.ops) == length, render(r.trace)
        assert r.trace.violation.step == length


def test_a_target_without_prefix_key_binds_a_key_to_its_block_when_first_seen():
    """A cache whose keys kvcheck cannot compute (no ``prefix_key``: the third-party
    views) keeps the old binding, so no false alarm comes from not knowing its hash."""
    from kvcheck.models.prefix.oracle import key_function

    class NoKeyFunction(PrefixCachingBlockManager):
        prefix_key = None

    assert key_function(NoKeyFunction(4, 2)) is None
    assert key_function(PrefixCachingBlockManager(4, 2)) is not None
    r = verify_prefix(NoKeyFunction, 8, 2, 1500, 0)
    assert r.ok, render(r.trace)


# -- 2. a block the prefill writes is the sequence's alone -----------------------------------
WRITES_SHARED = "allocate: every block the prefill writes was free: the sequence's alone"


def test_a_block_the_prefill_writes_is_the_sequences_alone():
    """Past the cached-token count an allocation reports, the engine writes: a block there
    that another sequence holds is a violation though the cache map served it (a full hit
    whose last token the engine computes into the shared last block; a count one block
    short of the blocks served). Before, the oracle let every block the map served be
    shared."""
    v, ran = replay(buggy_prefix.SharesLastBlock, 8, 2,
                    [_op("allocate", 0, [0, 1]), _op("allocate", 1, [0, 1])])
    assert v is not None and (v.name, v.step) == (WRITES_SHARED, 2), v
    assert (ran[-1].hits, ran[-1].cached_tokens) == (1, 1)
    assert "which the prefill writes, had refcount 1" in v.witness
    v, ran = replay(buggy_prefix.RecomputesASharedBlock, 8, 2,
                    [_op("allocate", 0, [0, 1, 2]), _op("allocate", 1, [0, 1, 3])])
    assert v is not None and (v.name, v.step) == (WRITES_SHARED, 2), v
    assert (ran[-1].hits, ran[-1].cached_tokens) == (1, 0)


def test_a_served_block_the_prefill_writes_alone_is_legal():
    """The same counts where the block the prefill writes was revived from the evictable
    list (no one else holds it): legal, the engine rewrites its own block."""
    from legal_prefix import ReportsFewer, SharesLastBlockHeldByNoOne

    for cls, ops, counts in [
            (SharesLastBlockHeldByNoOne, [_op("allocate", 0, [0, 1]), _op("free_seq", 0),
                                          _op("allocate", 1, [0, 1])], (1, 1)),
            (ReportsFewer, [_op("allocate", 0, [0, 1, 2]), _op("free_seq", 0),
                            _op("allocate", 1, [0, 1, 3])], (1, 0))]:
        v, ran = replay(cls, 8, 2, ops)
        assert v is None, v
        assert (ran[-1].hits, ran[-1].cached_tokens) == counts
    # held by another sequence, the legal variants do not serve or short-count it
    v, ran = replay(SharesLastBlockHeldByNoOne, 8, 2,
                    [_op("allocate", 0, [0, 1]), _op("allocate", 1, [0, 1])])
    assert v is None and (ran[-1].hits, ran[-1].cached_tokens) == (0, 0)


def test_unwritten_is_the_served_blocks_the_count_skips_whole():
    assert P.unwritten(3, None, 4) == 3  # no count: the blocks served
    assert P.unwritten(3, 12, 4) == 3
    assert P.unwritten(3, 11, 4) == 2  # the prefill computes token 11: block 2 is written
    assert P.unwritten(3, 4, 4) == 1 and P.unwritten(1, 0, 4) == 0
    assert P.unwritten(3, 4, 4, twins=True) == 3  # a declared cached twin: served, not written


def test_a_declared_cached_twin_is_judged_by_the_cache_hit_contract():
    """An engine that declares ``writes_cached_twins`` (SGLang frees its prefilled pages
    for their cached twins; vLLM v0 recomputes a full hit's last token into the cached
    block) has a shared block at a written position held to the requested prefix only;
    the same allocator without the declaration is the violation."""

    class Declared(buggy_prefix.SharesLastBlock):
        writes_cached_twins = True

    ops = [_op("allocate", 0, [0, 1]), _op("allocate", 1, [0, 1])]
    assert replay(Declared, 8, 2, ops)[0] is None
    assert replay(buggy_prefix.SharesLastBlock, 8, 2, ops)[0].name == WRITES_SHARED


@pytest.mark.parametrize("name", ["shares-last-block", "recomputes-a-shared-block"])
def test_writing_a_shared_block_is_caught_by_verify_prefix(name):
    cls, names, longest = buggy_prefix.CORPUS[name]
    for mode in ("full", "fast"):
        r = verify_prefix(cls, 8, 2, 2000, 0, mode=mode, shrink_budget=10.0)
        assert not r.ok and r.violation.name in names, render(r.trace)
        assert len(r.trace.ops) <= longest, render(r.trace)


# -- 3. append_slot on a sequence holding reserved slots --------------------------------------
def test_append_slot_on_a_reservation_is_legal_and_its_contract_holds():
    """The spec states it: a single-slot append on a sequence holding reserved slots meets
    the precondition and uses the first reserved slot (the rest stay reserved); the
    bundled references do exactly that."""
    from kvcheck.impl.block_manager import EngineBlockManager
    from kvcheck.impl.prefix_cache import EnginePrefixCachingBlockManager
    from kvcheck.spec import contracts as C
    from kvcheck.spec.logic import PY
    from kvcheck.spec.state import Snapshot

    s = Snapshot(4, 2, {0: [0, 1]}, {0: 2}, [1, 1, 0, 0], [2, 3], reserved={0: 2})
    assert C.precondition(PY, s, C.Op("append_slot", seq=0))
    assert C.reserved_after(PY, s, C.Op("append_slot", seq=0), 2) == 1
    for m in (EngineBlockManager(4, 2), EnginePrefixCachingBlockManager(4, 2)):
        m.allocate(0, 3)
        m.rollback(0, 2)  # one token left, its two blocks kept: three slots reserved
        table = list(m.tables[0])
        assert m.append_slot(0)[:2] == (table[0], 1)
        assert m.append_slot(0)[:2] == (table[1], 0)  # the reserved block, not a new one
        assert m.tables[0] == table and m.lens[0] == 3


def test_the_drivers_issue_append_slot_on_a_reservation():
    from types import SimpleNamespace

    from kvcheck.models.blocks.driver import RandomDriver

    caps = frozenset({"allocate", "append_slot", "fork", "free_seq", "append_slots", "rollback"})
    d = RandomDriver(0, 64, 2, caps)
    ops = [d.next_op([0], 60, SimpleNamespace(reserved={0: 2}, lengths={0: 3 + i % 2}))
           for i in range(400)]
    kinds = {o.kind for o in ops if o.seq == 0 and o.kind in ("append_slot", "append_slots")}
    assert kinds == {"append_slot", "append_slots"}


@pytest.mark.parametrize("name", ["append-slot-past-reservation",
                                  "append-slot-into-shared-reservation"])
def test_a_bug_only_append_slot_on_a_reservation_reaches_is_caught(name):
    """A block manager whose single-slot append mishandles reserved slots (takes a fresh
    block past them; writes a reserved block a fork shares): before, the precondition
    kept every such call out of the run, so it passed."""
    sys.path.insert(0, str(HERE.parent))
    from corpus.engine import ENGINE

    cls, kind, longest = ENGINE[name]
    for seed in range(3):
        r = verify(cls, 16, 4, 3000, seed, timeout=5.0, shrink_budget=30)
        assert not r.ok and r.violation.kind == kind and r.violation.name.startswith(
            "append_slot: "), r.violation
        assert len(r.trace.ops) <= longest
        assert r.trace.ops[-1].kind == "append_slot"


def test_the_prefix_engines_old_append_slot_is_caught():
    """The bundled prefix engine's own single-slot append ignored reserved slots (it took
    a fresh block past a rollback's); the prefix model now drives append_slot there."""
    cls, names, longest = buggy_prefix.CORPUS["append-slot-past-reservation"]
    for mode in ("full", "fast"):
        r = verify_prefix(cls, 8, 2, 2000, 0, mode=mode, shrink_budget=10.0)
        assert not r.ok and r.violation.name in names, render(r.trace)
        assert len(r.trace.ops) <= longest, render(r.trace)
    v, _ = replay(cls, 3, 1, [_op("allocate", 0, [0, 1]), _op("rollback", 0, n=1),
                              _op("append_slot", 0, [2])])
    assert v is not None and v.step == 3 and v.name in names, v
