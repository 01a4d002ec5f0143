"""vLLM v0's engine core (``vllm-v0-engine``, ``vllm-v0-engine-chunked``): the release's own
``Scheduler`` with its own ``SelfAttnBlockSpaceManager``, ``Sequence`` and ``SequenceGroup``,
driven step by step by the engine model with a generated model output (issue 34 §1).

0.8.5 fails at the defaults on vLLM #18957 (a waiting group's cached-token count, taken
before ``can_allocate`` refused it, is kept while the cache changes: the step that admits it
skips a block allocated fresh), shown here on the release's own objects too; 0.9.2 (the fix)
passes, with preemptions and cache hits, chunked prefill on and off. With chunked prefill and
prefix caching, v0 marks a prompt's blocks computed before the chunks write them: a request
aborted mid-prefill leaves unwritten blocks a later identical prompt skips (0.8.5 and 0.9.2).

The range between (0.6.0 .. 0.8.4) runs on the release's own files; three of it are tested
here (``RANGE``, installed by scripts/test.sh): 0.6.3.post1 and 0.6.4.post1 (the inputs and
config stand-ins those releases need; before #18957's cached-token count, they pass) and
0.7.3 (#18957 through its scheduler, as on 0.8.5); 0.5.3.post1 (before 0.5.4: the scheduler's
own policy.py) with #7380. The releases before 0.5.1 (0.4.2, 0.4.3, 0.5.0.post1: block manager
v2 opt-in there) fail on their own prefix-caching bugs, #4761 and #5364; block manager v1 (the
scheduler's default to 0.6.2, ``vllm-v0-engine-v1``) passes without prefix caching (with it:
test_vllm_v0_engine_v1_prefix.py).
"""

from __future__ import annotations

import copy

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.engines import MisuseError
from kvcheck.impl.thirdparty import install
from kvcheck.impl.thirdparty import vllm_v0_engine as ve
from kvcheck.impl.thirdparty import vllm_v0_engine_v1 as v1
from kvcheck.models.engine.model import EngineScope
from kvcheck.models.engine.oracle import HITS
from kvcheck.verify import verify


def _fixed():
    install.ensure(install.ENGINES["vllm-v0"], "0.9.2")


def _run(factory, seed=0, caching=True, requests=30):
    scope = EngineScope(8, 4, budget=16, max_seqs=8, caching=caching)
    return verify(factory, 8, 4, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": requests})


def _at(version, chunked=False):
    make = ve.make_chunked if chunked else ve.make

    def factory(*a, **k):
        return make(*a, version=version, **k)
    return factory


# releases of the range 0.6.0 .. 0.8.4, with the verdict at the defaults (seed 0): 0.6.5 on
# count a waiting group's cached tokens before can_allocate (vLLM #18957, fixed in 0.9.2)
RANGE = {"0.6.3.post1": "pass", "0.6.4.post1": "pass", "0.7.3": HITS}


@pytest.mark.parametrize("version", sorted(RANGE))
def test_the_range_runs_on_the_release_code(version):
    """Each release runs its own scheduler, block manager and sequence files: at the
    defaults a release before #18957 passes with preemptions and hits, one with it fails
    on the hit rule, as the raw admissions on its objects show (request 4 re-admitted
    skipping a block the cache did not hold under its key); with chunked prefill and no
    prefix caching every one passes."""
    install.ensure(install.ENGINES["vllm-v0"], version)
    r = _run(_at(version))
    if RANGE[version] == "pass":
        assert r.verdict == "pass", r.violation
        st = r.state.stats
        assert st["preemptions"] > 0 and st["hits"] > 0 and st["finished"] > 10
    else:
        assert r.verdict == "fail" and r.violation.name == RANGE[version], r.violation
    stale = [s for s, cached in _admissions(version) if s != cached]
    assert bool(stale) == (RANGE[version] != "pass"), _admissions(version)
    r = _run(_at(version, chunked=True), caching=False)
    assert r.verdict == "pass", r.violation
    assert r.state.stats["preemptions"] > 0


def test_the_inputs_stand_ins_run_the_release_own_code():
    """0.6.3's ``is_encoder_decoder_inputs`` and 0.6.4 on's ``SingletonInputsAdapter``
    (through which ``Sequence`` reads its prompt) are the release's definitions, cut out of
    its ``vllm/inputs`` files, not written here."""
    cases = (("0.6.3.post1", "vllm.inputs.parse", "inputs/parse.py",
              lambda m: m.is_encoder_decoder_inputs.__code__),
             ("0.7.3", "vllm.inputs", "inputs/data.py",  # (a cached property's function)
              lambda m: m.SingletonInputsAdapter.prompt_token_ids.func.__code__))
    for version, module, path, code in cases:
        root = install.ensure(install.ENGINES["vllm-v0"], version)
        where = code(ve.load(version)[module]).co_filename
        assert where == str(root / "vllm" / path), where
        t = ve.make(8, 4, version=version)
        t.add(0, [2, 3, 4, 5, 6], 2)
        assert t.token_ids(0) == [2, 3, 4, 5, 6]
        assert list(t._seq(0).get_prompt_token_ids()) == [2, 3, 4, 5, 6]


def test_0_8_5_fails_on_18957_at_the_defaults():
    r = _run(_at("0.8.5"))
    assert r.verdict == "fail" and r.violation.name == HITS, r.violation


@pytest.mark.parametrize("chunked", [False, True])
def test_0_9_2_passes_with_preemptions_and_hits(chunked):
    _fixed()
    r = _run(_at("0.9.2", chunked))
    assert r.verdict == "pass", r.violation
    st = r.state.stats
    assert st["preemptions"] > 0 and st["hits"] > 0 and st["finished"] > 10


@pytest.mark.parametrize("chunked", [False, True])
def test_0_8_5_without_prefix_caching_passes(chunked):
    r = _run(_at("0.8.5", chunked), caching=False)
    assert r.verdict == "pass", r.violation
    assert r.state.stats["preemptions"] > 0


# vLLM #18957 on the release's own objects: request 4 is refused (LATER) after its cached
# tokens were counted; its second block's cached copy is evicted and reused meanwhile; the
# step that admits it allocates that block fresh, yet the runner is told to skip it.
OPS_18957 = [("add", 0, [6, 3, 4, 3, 2, 6, 4, 6], 8), ("step", 1390851128),
             ("add", 1, [6, 3, 4, 3], 6), ("add", 2, [5, 5, 2, 4, 6], 10),
             ("step", 1988601454), ("add", 3, [6], 9),
             ("add", 4, [5, 5, 2, 4, 6, 5, 5, 4], 2)] + [
    ("step", g) for g in (139951793, 1942955373, 973694259, 1988601454, 139951793,
                          1942955373, 139951793, 1942955373, 139951793, 1942955373)]


def _admissions(version):
    """Request 4's admissions: (the blocks the runner skips, those of them the cache held
    before the step under the key of request 4's block at that position) for each."""
    t = ve.make(8, 4, version=version)
    out = []
    for op in OPS_18957:
        if op[0] == "add":
            t.add(*op[1:])
            continue
        keyed = {b: h for h, b in t.cached_entries()}
        r = t.step(op[1])
        for c in r.calls:
            if c.name == "get_computed_blocks" and c.request_id == "4":
                skipped = [b.block_id for b in c.result[0]]
                want = t.block_hashes(4)
                out.append((skipped, [b for i, b in enumerate(skipped)
                                      if keyed.get(b) == want[i]]))
    return out


def test_18957_on_the_release_objects():
    first, again = _admissions("0.8.5")  # admitted, preempted, refused (LATER), admitted
    assert len(first[0]) == 1 and len(again[0]) == 2 and len(again[1]) == 1, (first, again)
    _fixed()
    admissions = _admissions("0.9.2")
    assert len(admissions) == 2 and all(s == c for s, c in admissions), admissions


@pytest.mark.parametrize("version", ["0.7.3", "0.8.5", "0.9.2"])
def test_chunked_abort_mid_prefill_leaves_blocks_a_later_prompt_skips(version):
    """The release's own objects: request 0's first chunk writes block 0 only, yet every
    full prompt block is marked computed (mark_blocks_as_computed after schedule); aborted,
    they go to the evictor as computed, and request 1 (the same prompt) skips all three."""
    install.ensure(install.ENGINES["vllm-v0"], version)
    t = ve.make_chunked(8, 4, budget=4, max_seqs=4, version=version)
    prompt = [2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6]
    t.add(0, prompt, 3)
    r = t.step(0)
    assert r.writes[0][:2] == (0, prompt[:4])  # only block 0 written
    t.abort(0)
    t.add(1, prompt + [7], 3)
    r = t.step(1)
    hits = [c for c in r.calls if c.name == "get_computed_blocks"]
    assert [len(c.result[0]) for c in hits] == [3]
    assert r.writes[1][:2] == (12, [7])  # blocks 1 and 2 are read, never written


def test_a_copy_steps_as_the_original():
    t = ve.make(8, 4, version="0.8.5")
    t.add(0, [2, 3, 4, 5, 6], 4)
    t.add(1, [2, 3, 4, 5, 7, 7], 4)
    t.step(0)
    c = copy.deepcopy(t)
    a, b = t.step(1), c.step(1)
    assert (a.scheduled, a.sampled, a.writes) == (b.scheduled, b.sampled, b.writes)
    assert t.blocks(0) == c.blocks(0) and c.manager.allocate.target is c


def test_what_v0_engine_drives_not_is_refused_in_one_line(capsys):
    assert kvcheck(["verify-engine", "vllm-v0-engine@0.8.5", "--spec-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "speculative" in err[0]


def test_7380_chunked_prefill_index_error_through_the_scheduler():
    """vLLM #7380: 0.5.4's scheduler calls append_slots after a later prefill chunk with no
    unseen tokens; at a full last block BlockTable.append_token_ids raises IndexError (the
    engine step dies). 0.5.5 (the fix) passes the same run. 0.5.3.post1 (its scheduler
    imports the release's vllm/core/policy.py) crashes the same way; without chunked prefill
    it passes with preemptions and hits."""
    for version in ("0.5.3.post1", "0.5.4", "0.5.5"):
        install.ensure(install.ENGINES["vllm-v0"], version)
    for version in ("0.5.3.post1", "0.5.4"):
        r = _run(_at(version, chunked=True), caching=False)
        assert r.verdict == "fail" and r.violation.kind == "crash", r.violation
        assert "IndexError" in r.violation.witness and "append_token_ids" in r.violation.witness
    r = _run(_at("0.5.3.post1"))
    assert r.verdict == "pass", r.violation
    assert r.state.stats["preemptions"] > 0 and r.state.stats["hits"] > 0
    r = _run(_at("0.5.5", chunked=True), caching=False)
    assert r.verdict == "pass", r.violation


def test_chunked_prefill_with_prefix_caching_is_refused_where_unverified():
    """0.5.x .. 0.6.4.post1 (and aphrodite 0.6.x): the allocator's computed blocks skip the
    last full block, and how a chunked step's skipped blocks are read there is not verified:
    refused in one line, not judged; without prefix caching, run. 0.6.5 on carry 0.8.5's
    block manager (no skip_last_block_id) and the same runner rule: modelled (E4)."""
    for version in ("0.5.5", "0.6.4.post1"):
        install.ensure(install.ENGINES["vllm-v0"], version)
        with pytest.raises(MisuseError,
                           match="chunked prefill with prefix caching is not modelled"):
            ve.make_chunked(8, 4, version=version)
        assert ve.make_chunked(8, 4, caching=False, version=version).version == version
    for version in ("0.7.3", "0.9.2"):
        install.ensure(install.ENGINES["vllm-v0"], version)
        assert ve.make_chunked(8, 4, version=version).version == version


def test_a_full_block_promoted_to_an_identical_cached_block_is_legal():
    """v0's prefix-caching allocator swaps a block a request has just filled for a cached
    block holding the same prefix (promote_to_immutable_block), and the step writes the
    same token's KV into it again: legal (spec.engine.APPENDS_DOC). A campaign drew this
    run; the engine oracle used to call it a broken allocate_slots."""
    _fixed()
    scope = EngineScope(32, 2, budget=4, max_seqs=1)
    r = verify(_at("0.9.2"), 32, 2, 2000, 1648115238, model="engine", scope=scope,
               do_shrink=False, extra={"requests": 20})
    assert r.verdict == "pass", r.violation
    assert r.state.stats["promoted"] >= 1, r.state.stats


# vLLM 0.4.2 .. 0.5.0.post1 through their own scheduler, with block manager v2 (opt-in then:
# use_v2_block_manager; v1 was the default): at the defaults each fails on its release's own
# prefix-caching bug -- 0.4.2 on PR #4761 (a block popped from the evictor for new content
# stays in _cached_blocks under its old key: a cached block holding no complete prefix),
# 0.4.3 and 0.5.0.post1 on PR #5364 (a block reused from the evictor keeps computed=True: the
# runner skips it though it holds another prefix); 0.5.1 (both fixed) passes the same run.
OLD = {"0.4.2": "no_partial_cached", "0.4.3": HITS, "0.5.0.post1": HITS}


@pytest.mark.parametrize("version", sorted(OLD))
def test_releases_before_0_5_1_fail_on_their_prefix_caching_bugs(version):
    install.ensure(install.ENGINES["vllm-v0"], version)
    r = _run(_at(version))
    assert r.verdict == "fail" and r.violation.name == OLD[version], r.violation
    gpu = ve.make(8, 4, version=version).gpu  # the release's own allocator ran
    assert type(gpu).__module__.endswith("vllm.core.block.prefix_caching_block")
    for chunked in (False, True):  # without prefix caching: passes, with preemptions
        r = _run(_at(version, chunked), caching=False)
        assert r.verdict == "pass", (chunked, r.violation)
        assert r.state.stats["preemptions"] > 0 and r.state.stats["finished"] > 10


def test_0_5_1_passes_where_0_5_0_post1_fails():
    install.ensure(install.ENGINES["vllm-v0"], "0.5.1")
    r = _run(_at("0.5.1"))
    assert r.verdict == "pass", r.violation
    assert r.state.stats["preemptions"] > 0 and r.state.stats["hits"] > 0


def test_4761_on_the_release_objects():
    """0.4.2's own objects, driven by its scheduler: request 0's full block goes to the
    evictor when it finishes; request 1's next block is popped from the evictor, and 0.4.2
    leaves the old key in ``_cached_blocks`` (PR #4761); 0.4.3 drops it."""
    ops = [("add", 0, [5, 5, 2], 2), ("add", 1, [6, 3, 4, 3, 2, 6], 5)]
    stale = {}
    for version in ("0.4.2", "0.4.3"):
        install.ensure(install.ENGINES["vllm-v0"], version)
        t = ve.make(3, 4, version=version)
        for op in ops:
            t.add(*op[1:])
        for gen in (1013818839, 1013818839, 242886303, 1022050301, 1013818839):
            t.step(gen)
        keyed = {b: h for h, b in t.gpu._cached_blocks.items()}
        # a block held by a running request and still keyed: its key must be its content's
        stale[version] = [b for b in t.blocks(1) if b in keyed
                          and keyed[b] not in t.block_hashes(1)]
    assert stale["0.4.2"] and not stale["0.4.3"], stale


def test_chunked_prefill_with_prefix_caching_is_refused_where_the_runner_refuses_it():
    """To 0.5.5 the release's model runner raises RuntimeError on a chunked prefill step
    that skips cached blocks; before 0.5.1 (no skip_last_block_id to detect) the adapter reads
    that refusal from the release's worker/model_runner.py: one line, exit 2."""
    for version in ("0.4.2", "0.5.0.post1"):
        install.ensure(install.ENGINES["vllm-v0"], version)
        with pytest.raises(MisuseError, match="model runner refuses it"):
            ve.make_chunked(8, 4, version=version)


def test_a_release_before_the_range_is_one_line(capsys):
    assert kvcheck(["verify-engine", "vllm-v0-engine@0.4.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0.4.2 .. 0.9.2" in err[0], err


# block manager v1: the scheduler's default to 0.6.2 (use_v2_block_manager=False); 0.4.0 and
# 0.4.1 come from the vllm-v0-legacy install row (scripts/test.sh installs them)


def _at_v1(version, chunked=False, lose_free=False):
    make = v1.make_chunked if chunked else v1.make

    def factory(*a, **k):
        t = make(*a, version=version, **k)
        if lose_free:  # a fault: the allocator's first free of a block forgets it
            real, lost = t.gpu.free, []

            def free(block):
                if not lost and block.ref_count == 1:
                    lost.append(block.block_number)
                    block.ref_count = 0
                    return None
                return real(block)
            t.gpu.free = free
        return t
    return factory


@pytest.mark.parametrize("version", ["0.4.0", "0.4.1", "0.4.2", "0.5.0.post1", "0.6.2"])
def test_block_manager_v1_runs_through_the_release_scheduler(version):
    """The release's Scheduler builds its own BlockSpaceManagerV1 (the default to 0.6.2):
    with prefix caching off every release passes, chunked prefill on and off, with
    preemptions; the same run with a free the allocator forgets fails (the oracle reads v1's
    own tables, refcounts and free list)."""
    install.ensure(install.ENGINES[v1.ENGINE_KEY], version)
    t = v1.make(8, 4, caching=False, version=version)
    assert type(t.manager).__name__ == "BlockSpaceManagerV1"
    assert type(t.manager).__module__.endswith("vllm.core.block_manager_v1")
    for chunked in (False, True) if version != "0.4.0" else (False,):  # (0.4.1 on: chunked)
        r = _run(_at_v1(version, chunked), caching=False)
        assert r.verdict == "pass", (chunked, r.violation)
        assert r.state.stats["preemptions"] > 0 and r.state.stats["finished"] > 10
    r = _run(_at_v1(version, lose_free=True), caching=False)
    assert r.verdict == "fail", r


def test_block_manager_v1_refusals_are_one_line(capsys):
    """Chunked prefill with prefix caching on v1 where the model runner refuses it (to
    0.5.5, in its words), a
    release without v1 (0.6.3 on), 0.3.3 (no BlockSpaceManager interface) and chunked
    prefill on 0.4.0 (none in its scheduler): one line, exit 2."""
    install.ensure(install.ENGINES[v1.ENGINE_KEY], "0.3.3")
    install.ensure(install.ENGINES[v1.ENGINE_KEY], "0.4.0")
    for args, words in ((["vllm-v0-engine-v1-chunked@0.5.5"],
                         "chunked prefill cannot be used with prefix caching"),
                        (["vllm-v0-engine-v1@0.6.3.post1", "--no-prefix-caching"],
                         "0.3.3 .. 0.6.2"),
                        (["vllm-v0-engine-v1@0.3.3", "--no-prefix-caching"],
                         "runs vLLM 0.4.0 .. 0.6.2"),
                        (["vllm-v0-engine-v1-chunked@0.4.0", "--no-prefix-caching"],
                         "no chunked prefill")):
        assert kvcheck(["verify-engine", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


# vLLM PR #5364 on the release's own objects (seed 0 on 0.5.0.post1, shrunk): request 8's
# second prompt block [6, 5, 5, 4] is a cache miss; allocate_mutable takes block 3 (request 1's,
# in the evictor) for it with computed=True, so get_common_computed_block_ids names it and the
# runner skips a block that, before the step, the cache held under another prefix.
OPS_5364 = [("add", 0, [3, 3], 3), ("add", 1, [6, 3, 4, 3, 2, 6, 4, 6, 6], 5),
            ("add", 2, [6, 3, 4, 3], 4), ("add", 3, [6], 11), ("step", 1097127993),
            ("step", 346043753), ("add", 4, [6, 3, 4, 3, 2, 6, 4, 6], 8), ("step", 1390851128),
            ("add", 5, [6, 3, 4, 3], 6), ("add", 6, [5, 5, 2, 4, 6], 10),
            ("add", 7, [5, 5, 2, 4], 11), ("step", 973694259),
            ("add", 8, [5, 5, 2, 4, 6, 5, 5, 4, 3], 1), ("step", 1988601454),
            ("add", 9, [6], 9)] + [("step", g) for g in (1112433019, 458825077, 897563738,
                                                        1942955373, 2038265566, 1112433019)]


def _skips(version):
    """Each lookup's (request, skipped blocks, those the cache did not hold under the
    request's prefix at that position before the step)."""
    t = ve.make(8, 4, version=version)
    out = []
    for op in OPS_5364:
        if op[0] == "add":
            t.add(*op[1:])
            continue
        keyed = {b: h for h, b in t.cached_entries()}
        for c in t.step(op[1]).calls:
            if c.name == "get_computed_blocks" and c.result[0]:
                want = t.block_hashes(int(c.request_id))
                skipped = [b.block_id for b in c.result[0]]
                out.append((int(c.request_id), skipped,
                            [b for i, b in enumerate(skipped) if keyed.get(b) != want[i]]))
    return out


def test_5364_on_the_release_objects():
    for version in ("0.4.3", "0.5.0.post1", "0.5.1"):
        install.ensure(install.ENGINES["vllm-v0"], version)
    for version in ("0.4.3", "0.5.0.post1"):
        stale = [s for s in _skips(version) if s[2]]
        assert [(q, bad) for q, _, bad in stale] == [(8, [3])], stale
    fixed = _skips("0.5.1")
    assert fixed and not [s for s in fixed if s[2]], fixed
