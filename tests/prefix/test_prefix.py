"""The reference prefix cache passes both oracles; every buggy allocator in the
corpus is caught with a short, shrunk trace; the CLI's exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.cli import main
from kvcheck.impl.errors import MisuseError, OutOfBlocks
from kvcheck.impl.prefix_cache import PrefixCachingBlockManager
from kvcheck.report.text import render
from kvcheck.verify import verify

sys.path.insert(0, str(Path(__file__).parent))
from buggy_prefix import CORPUS  # noqa: E402

HERE = Path(__file__).parent
ENTRY = "import sys; from kvcheck.cli import main; sys.exit(main())"


def verify_prefix(target, num_blocks, block_size, ops, seed, mode="full", **kw):
    """``kvcheck verify-prefix``'s check (full mode, as these tests always ran it)."""
    return verify(target, num_blocks, block_size, ops, seed, mode=mode, model="prefix", **kw)


def test_hits_share_blocks_and_evictable_is_revived():
    m = PrefixCachingBlockManager(4, 2)
    assert m.allocate(0, 5, [1, 2, 3, 4, 5]) == 0
    # fully in the cache: the last block is recomputed (its last token must be computed)
    assert m.allocate(1, 4, [1, 2, 3, 4]) == 2
    assert m.tables[1][0] == m.tables[0][0] and m.ref[m.tables[0][0]] == 2
    assert m.tables[1][1] != m.tables[0][1]
    m.free_seq(0)
    m.free_seq(1)
    assert len(m.free) == 4 and m.num_evictable() == 2
    assert m.allocate(2, 3, [1, 2, 9]) == 2  # revived from the evictable list
    assert m.num_evictable() == 1


def test_taking_an_evictable_block_drops_its_key_first():
    m = PrefixCachingBlockManager(1, 2)
    m.allocate(0, 2, [1, 2])
    m.free_seq(0)
    assert m.num_evictable() == 1 and len(m.cache) == 1
    assert m.allocate(1, 2, [7, 8]) == 0
    assert [b for _, b in m.cache_entries()] == [0] and m.evictable_blocks() == []
    with pytest.raises(OutOfBlocks):
        m.allocate(2, 2, [1, 2])
    with pytest.raises(MisuseError):
        m.allocate(3, 2, [1])


@pytest.mark.parametrize("nb,bs,seed", [(16, 4, 0), (8, 2, 1), (5, 1, 2), (12, 3, 3)])
def test_reference_passes_prefix_oracle(nb, bs, seed):
    r = verify_prefix("prefix", nb, bs, 1500, seed)
    assert r.ok, render(r.trace)
    st = r.state.stats
    assert st.hit_allocations and st.revived and st.evicted and st.oob


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("target", ["prefix", "prefix-engine"])
def test_reference_passes_structural_oracle(seed, target):
    r = verify(target, 8, 2, 3000, seed)
    assert r.ok, render(r.trace)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_bug_is_caught_with_a_minimal_trace(name):
    cls, names, longest = CORPUS[name]
    for seed in range(4):
        r = verify_prefix(cls, 8, 2, 2000, seed, shrink_budget=10.0)
        if not r.ok:
            break
    assert not r.ok, f"{name} not caught"
    assert r.violation.name in names, render(r.trace)
    assert len(r.trace.ops) <= longest, render(r.trace)


def test_cli_pass_fail_and_bad_input(tmp_path, capsys):
    assert main(["verify-prefix", "--ops", "300"]) == 0
    out = tmp_path / "t.json"
    target = f"{HERE / 'buggy_prefix.py'}:PartialBlockCached"
    assert main(["verify-prefix", target, "--ops", "300", "--trace-out", str(out)]) == 1
    trace = json.loads(out.read_text())
    assert (trace["format"], trace["model"]) == ("kvcheck.trace", "prefix")
    assert trace["violation"]["name"] == "no_partial_cached"
    capsys.readouterr()
    assert main(["verify-prefix", "--ops", "200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "pass"
    assert main(["verify-prefix", "no-such-target"]) == 2
    assert main(["verify-prefix", "reference"]) == 2  # no prefix cache to observe
    assert main(["verify-prefix", "--trace-out", str(tmp_path)]) == 2


def test_cli_bad_input_is_one_line_exit_2():
    for argv in (["--blocks", "0"], ["--block-size", "-3"], ["no-such-target"]):
        p = subprocess.run([sys.executable, "-c", ENTRY, "verify-prefix", *argv],
                           capture_output=True, text=True)
        assert p.returncode == 2
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


from legal_prefix import LEGAL  # noqa: E402


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("name", sorted(LEGAL))
def test_legal_variants_pass(name, mode):
    """Eviction order, dropping keys on free, never caching, recomputing or sharing the
    last block on a full hit, reporting no or a short count: no rule may fire."""
    for nb, bs, seed in [(8, 2, 0), (6, 1, 1), (12, 3, 2)]:
        r = verify_prefix(LEGAL[name], nb, bs, 1200, seed, mode=mode)
        assert r.ok, render(r.trace)


def test_nano_vllm_full_hit_leaves_no_token_is_reported():
    """nano-vllm #144, still in the wheel kvcheck checks: a prompt wholly in the cache is
    reported as all cached (``num_cached_tokens == len(seq)``), so its model runner would
    compute nothing for it."""
    pytest.importorskip("xxhash")
    try:
        r = verify_prefix("nano-vllm", 16, 4, 5000, 0)
    except Exception as exc:  # noqa: BLE001 - the wheel is not installed here
        pytest.skip(f"nano-vllm not available: {exc}")
    assert not r.ok
    assert r.violation.name == "allocate: a prompt fully in the cache leaves at least one token to compute"
    assert len(r.trace.ops) == 2


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("nb,bs,seed", [(16, 4, 0), (8, 2, 1), (5, 1, 2)])
def test_reference_with_commit_passes(nb, bs, seed, mode):
    """Publish after write: the reference that defers the prompt's write to commit(seq)
    passes, with commits and sequences freed before their commit both exercised."""
    r = verify_prefix("prefix-commit", nb, bs, 1500, seed, mode=mode)
    assert r.ok, render(r.trace)
    st = r.state.stats
    assert st.commits and st.freed_uncommitted and st.hit_allocations and st.revived


@pytest.mark.parametrize("nb,bs", [(1, 1), (3, 2), (16, 4)])
def test_a_committing_target_passes_the_block_model(nb, bs):
    """``kvcheck verify prefix-commit``: the block model has no commit operation, its
    allocate writes the prompt, so the oracle commits after each allocate; an append
    before the commit was reported as a crash (MisuseError) -- a false alarm."""
    r = verify("prefix-commit", nb, bs, 1500, seed=0)
    assert r.ok, render(r.trace)
    assert r.ops == 1500 and r.state.target.impl.pending == {}  # no allocation uncommitted


def test_commit_is_published_after_write():
    from kvcheck.impl.prefix_cache import CommittingPrefixCachingBlockManager as C

    m = C(4, 2)
    assert m.allocate(0, 3, [1, 2, 3]) == 0 and m.cache == {}  # scheduled, not written
    assert m.allocate(1, 3, [1, 2, 4]) == 0  # no hit on an unwritten block
    with pytest.raises(MisuseError):
        m.append_slot(0, 5)
    m.free_seq(1)  # freed before its write: nothing published
    assert m.cache == {} and m.num_evictable() == 0
    m.commit(0)
    assert len(m.cache) == 1
    assert m.allocate(2, 3, [1, 2, 9]) == 2


@pytest.mark.parametrize("target", ["prefix", "prefix-commit", "prefix-engine"])
def test_every_cache_class_occurs_at_defaults(target, capsys):
    """At default settings the driver reaches every cache state: hit, partial hit,
    revival, eviction, a key cached after its parent's key is gone, identical prompts
    back to back, out of blocks; ``--json`` prints each class's count."""
    assert main(["verify-prefix", target, "--json"]) == 0
    cov = json.loads(capsys.readouterr().out)["coverage"]
    assert cov["missed"] == []
    assert set(cov["counts"]) == {"hit", "partial_hit", "revived", "evicted", "orphan", "repeat",
                                  "out_of_blocks"}
    assert all(n > 0 for n in cov["counts"].values()), cov["counts"]


# -- the cache through rollback, rebase and preemption (issue 15: the keys themselves) ------
def test_engine_reference_keeps_its_keys_true():
    """The reference with the engine's operations: a rollback into a cached full block
    drops its key (the next write lands in it in place); a rebase shares the source's
    blocks and continues its key chain; a preemption is a free (written keys stay)."""
    from kvcheck.impl.prefix_cache import EnginePrefixCachingBlockManager as E

    m = E(6, 2)
    m.allocate(0, 5, [1, 2, 3, 4, 5])
    a, b, _ = m.tables[0]
    assert set(m.cache.values()) == {a, b}
    m.rollback(0, 2)  # 3 tokens left: block b is partial now
    assert set(m.cache.values()) == {a} and m.tables[0] == [a, b, m.tables[0][2]]
    assert m.append_slots(0, 2, token_ids=[7, 8]) == [] and m.lens[0] == 5
    assert set(m.cache.values()) == {a, b}  # b full again, keyed by [1, 2, 3, 7]
    assert m.allocate(1, 5, [1, 2, 3, 7, 9]) == 4
    m.allocate(2, 3, [5, 6, 1])
    m.rebase(0, 2)
    assert m.tables[2] == m.tables[0] and m.tokens[2] == m.tokens[0] and m.keys[2] == m.keys[0]
    m.preempt(2)
    assert 2 not in m.tables and set(m.cache.values()) >= {a, b}


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("nb,bs,seed", [(16, 4, 0), (8, 2, 1), (5, 1, 2)])
def test_engine_reference_passes_with_every_operation(nb, bs, seed, mode):
    """The prefix model drives rollback (into cached blocks too), rebase, preemption and
    append_slots where a target offers them; the reference that keeps its keys true
    through each passes, with every cache class still reached."""
    r = verify_prefix("prefix-engine", nb, bs, 1500, seed, mode=mode)
    assert r.ok, render(r.trace)
    st = r.state.stats
    assert st.rollbacks and st.rollbacks_into_cached and st.rebases and st.preempts
    assert st.append_slots and st.hit_allocations and st.revived and st.evicted


def test_seed_only_target_sees_the_stream_it_always_did():
    """The operations beyond the seed's four are drawn only for a target offering them:
    with the seed's capabilities the driver draws the same stream with or without the
    run state it reads them from; offering them changes the stream."""
    from types import SimpleNamespace

    from kvcheck.models.prefix.driver import PrefixDriver

    state = SimpleNamespace(reserved={1: 1}, lengths={0: 5, 1: 3, 2: 4},
                            tokens_of=lambda q: [1, 2, 3])

    def stream(caps, with_state):
        d = PrefixDriver(0, 8, 2, frozenset(caps))
        return [repr(d.next_op([0, 1, 2], 3, state=state if with_state else None))
                for _ in range(400)]

    seed_ops = {"allocate", "append_slot", "fork", "free_seq"}
    assert stream(seed_ops, True) == stream(seed_ops, False)
    engine = stream(seed_ops | {"rollback", "rebase", "preempt", "append_slots"}, True)
    assert engine != stream(seed_ops, False)
    assert {"rollback", "rebase", "preempt", "append_slots"} <= {o.split("'")[1] for o in engine}


def test_nano_vllm_reports_cached_tokens_through_preemption():
    """nano-vllm through the lifecycle: a preempted sequence re-admitted with the tokens
    it had is the engine's own kept ``Sequence`` (as its scheduler re-queues it), and
    allocate reports that Sequence's ``num_cached_tokens``: 0 here, since nano-vllm drops
    a block's hash when its last holder lets go; a live holder's blocks are hit."""
    pytest.importorskip("xxhash")
    from kvcheck.impl.thirdparty import nano_vllm

    try:
        t = nano_vllm.make(8, 2)
    except Exception as exc:  # noqa: BLE001 - the wheel is not installed here
        pytest.skip(f"nano-vllm not available: {exc}")
    assert t.allocate(0, 5, [1, 2, 3, 4, 5]) == 0
    kept = t.seqs[0]
    t.preempt(0)
    assert t.allocate(0, 5, [1, 2, 3, 4, 5]) == 0 and t.seqs[0] is kept
    assert t.allocate(1, 5, [1, 2, 3, 4, 9]) == 4  # seq 0's two full blocks, still held
    r = verify_prefix("nano-vllm", 16, 4, 3000, 1)
    assert r.state.stats.preempts  # the prefix model drives nano-vllm's preemptions now
