"""vLLM v1's eager ``SimpleCPUOffloadConnector`` (scheduler side) over the release's own
``KVCacheManager``, full attention + a sliding window (``vllm-v1-simple-offload@VERSION``,
``aphrodite-simple-offload@VERSION``, the tiers model): #42571 caught on vLLM 0.20.2 and on
aphrodite 0.21.0, gone on 0.24.0 and 0.22.0 (the releases scripts/test.sh installs)."""

from __future__ import annotations

import pytest

from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty.vllm_v1_offload import make
from kvcheck.models.tiers.model import MODEL, TierScope
from kvcheck.verify import replay_trace, verify

SCOPE = TierScope(8, 1, 4)  # the catalogue's: 8 device + 4 host blocks of 1 slot
PAIRS = {"vllm-v1-simple-offload": ("vllm-v1", "0.20.2", "0.24.0"),
         "aphrodite-simple-offload": ("aphrodite", "0.21.0", "0.22.0")}
RELEASES = [(key, v) for key, buggy, fixed in PAIRS.values() for v in (buggy, fixed)]
missing = [f"{key}=={v}" for key, v in RELEASES + [("vllm-v1", "0.33.0")]
           if not _loader.is_installed(install.select(key, v))]
needs = pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)} "
                           f"(kvcheck install ENGINE==VERSION)")


def run(target, ops, seed=0):
    return verify(target, SCOPE.num_blocks, SCOPE.block_size, ops, seed, model="tiers",
                  scope=SCOPE)


@needs
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_42571_is_caught_on_the_buggy_release_and_gone_on_the_fixed_one(name):
    """Seed 0: the full-attention group takes back the block its window just dropped, the
    eager store scan lists it at both positions, the request ends, and the store's
    completion frees it twice: 0.20.2's (aphrodite 0.21.0's) free_blocks queues it twice,
    the GPU free queue loses a block. Shrunk to 8 operations; the fixed release passes,
    and so does the counterexample replayed on it."""
    _, buggy, fixed = PAIRS[name]
    bug = run(f"{name}@{buggy}", 300)
    assert bug.verdict == "fail", bug.verdict
    assert (bug.violation.kind, bug.violation.name) == ("invariant", "device: free_list")
    ops = [MODEL.describe(op) for op in bug.trace.ops]
    assert len(ops) == 8, ops
    store = next(o for o in ops if "job 0.1" in o and o.startswith("store"))
    assert store == "store(seq=0) -> job 0.1", ops
    assert ops[-2:] == ["free(seq=0)", "complete(seq=0, job=1, ok=True)"], ops
    again = replay_trace(bug.trace, f"{name}@{fixed}")
    assert again.violation is None, again.violation
    ok = run(f"{name}@{fixed}", 300)
    assert ok.ok, ok.violation
    st = ok.state.stats
    assert st["store"] > 20 and st["complete"] > 10 and st["free"] and st["oob"], st


@needs
def test_the_scan_lists_the_block_twice_on_both_releases_and_only_0_20_2_double_queues():
    """The adapter's view of the reported sequence, on the release's own objects: a request
    of 3 tokens decodes, is stored, decodes into the block its window just dropped, is
    stored again (the job lists that block twice: its full-attention position and the
    window's stale one), ends, and the store completes. 0.20.2 counts the block free twice
    (get_num_free_blocks ahead of its free queue); 0.24.0 once."""
    for version, ahead in (("0.20.2", True), ("0.24.0", False)):
        t = make(8, 1, 4, version=version)
        t.allocate(0, [0, 1, 0])
        t.append(0, 0)
        t.complete(t.store(0), True)
        block, _ = t.append(0, 0)
        assert t.window(0)[1][:2] == [None, None], t.window(0)  # behind the window: null
        job = t.store(0)
        assert t.pending_jobs()[job]["src"] == ("device", [block, block])
        assert t.refcount("device", block) == 3  # the table and the job's two touches
        t.free(0)
        t.complete(job, True)
        listed = list(t.free_blocks("device"))
        assert (t.num_free("device") > len(listed)) is ahead, (version, listed,
                                                               t.num_free("device"))


@needs
def test_a_store_completion_never_fails():
    """The connector has no failed-store report (``failures`` is empty): with the driver
    drawing a failure for every completion (``fail=1``), each is still delivered as done
    (the adapter refuses ``ok=False``: a failure reaching it would be a crash verdict)."""
    assert make(8, 1, 4, version="0.24.0").failures == frozenset()
    r = verify("vllm-v1-simple-offload@0.24.0", 8, 1, 200, 3, model="tiers", scope=SCOPE,
               extra={"weights": {"fail": 1.0}})
    assert r.ok, r.violation
    assert r.state.stats["complete"] > 5, r.state.stats


@needs
def test_0_33_0_passes_with_its_final_flush():
    """The pinned release (0.33.0, scripts/test.sh's vllm-v1): no alarm, and its final
    flush on finish (a store of the finished request's confirmed blocks, sent with the next
    step's metadata) leaves nothing held at quiescence and fills the host cache."""
    t = make(8, 1, 4, version="0.33.0")
    t.allocate(0, [0, 1, 0])
    t.free(0)  # never stored by a store step: the final flush stores its blocks
    assert not t.pending_jobs() and not t.pins("device") and not t.pins("host")
    assert len(t.cache_entries("host")) >= 2, t.cache_entries("host")
    assert sorted(t.free_blocks("device")) == list(range(8))
    r = run("vllm-v1-simple-offload@0.33.0", 400)
    assert r.ok, r.violation
    st = r.state.stats
    assert st["store"] > 20 and st["complete"] > 10 and st["free"] and st["oob"], st


def test_0_34_0_passes_eager_and_lazy_and_keeps_42571_fixed():
    """vLLM 0.34.0, the newest release (scripts/test.sh installs it): its connector reads
    ``num_hash_lookahead_tokens`` (0 in the stand-in settings: no EAGLE drafting) and the
    request's ``prefix_cache_hit_limit`` instead of ``skip_reading_prefix_cache`` (the
    stand-in request sets the limit 0 with the flag: the re-admitted prompt below finds no
    GPU hit although its blocks are cached there), and its lazy store walks the free queue
    from its head (no cursor). The eager and lazy runs pass; #42571's sequence counts each
    block once (as 0.24.0); the final flush on finish leaves nothing held."""
    install.ensure(install.ENGINES["vllm-v1"], "0.34.0")
    t = make(8, 1, 4, version="0.34.0")
    assert t.version == "0.34.0"
    t.allocate(0, [0, 1, 0])
    t.append(0, 0)
    t.complete(t.store(0), True)
    block, _ = t.append(0, 0)
    job = t.store(0)
    assert t.pending_jobs()[job]["src"] == ("device", [block, block])
    t.free(0)
    t.complete(job, True)
    assert t.num_free("device") == len(list(t.free_blocks("device"))) == 8
    assert not t.pending_jobs() and not t.pins("device") and not t.pins("host")
    assert len(t.cache_entries("host")) >= 2, t.cache_entries("host")
    t.allocate(1, [0, 1, 0])  # (a GPU hit here would be refused as a MisuseError)
    assert t.manager.prefix_cache_lookup_enabled(t.requests[1]) is False
    for name in ("vllm-v1-simple-offload", "vllm-v1-simple-offload-lazy"):
        r = run(f"{name}@0.34.0", 300)
        assert r.ok, (name, r.violation)
        st = r.state.stats
        assert st["store"] > 20 and st["complete"] > 10 and st["free"] and st["oob"], st
