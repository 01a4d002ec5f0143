"""nano-vllm's engine core (``nano-vllm-engine``, ``nano-vllm-npu-engine``): the release's own
``Scheduler`` with its own ``BlockManager``, ``Sequence`` and ``SamplingParams``, driven step
by step by the engine model with a generated model output (issue 34 §1).

Both releases fail at the defaults on real nano-vllm bugs: #144 (a prompt wholly in the cache
is scheduled with no token to compute) in both; nano-vllm-fork 20260210's decode preemption
leaves the preempted sequence in ``running`` (the next step crashes in ``may_append``), also
shown on the release's own objects without kvcheck; nano-vllm-npu 0.0.2's freed blocks keep their
keys (#163). The modelling is checked by the upstream scheduler with #163's fix and #144's
zero-token schedules masked: it passes with preemptions and cache hits. A manager that does
not free is caught; what nano-vllm has not is refused in one line; a copy steps as the
original.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import _loader, install
from kvcheck.impl.thirdparty import nano_vllm_engine as ne
from kvcheck.impl.thirdparty.nano_vllm_engine import NanoEngineTarget, _Recorder
from kvcheck.models.engine.model import EngineScope
from kvcheck.models.engine.oracle import COMPUTES, QUEUES
from kvcheck.verify import verify

TRACE = (Path(__file__).resolve().parents[2] / "docs" / "traces" / "nano-vllm-engine"
         / "nano-vllm-engine-20260210-preempted-in-running.json")


def _npu():
    install.ensure(install.ENGINES["nano-vllm-npu"], "0.0.2")


def _run(factory, seed=0, blocks=8, block_size=4, budget=16, max_seqs=8, requests=30):
    scope = EngineScope(blocks, block_size, budget=budget, max_seqs=max_seqs)
    return verify(factory, blocks, block_size, 2000, seed, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": requests})


class Masked144(NanoEngineTarget):
    """The release with #144's zero-token schedules reported as one token (so the runs go on
    past #144 to what else they reach)."""

    def step(self, gen):
        r = super().step(gen)
        r.scheduled = {q: max(k, 1) for q, k in r.scheduled.items()}
        return r


class Fixed163(Masked144):
    """nano-vllm-npu's scheduler and block manager with #163's fix (nano-vllm-fork's
    ``deallocate``: a freed block's entry is dropped): the engine model's control."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        base = type(self.manager)

        def deallocate(mgr, seq):
            for b in seq.block_table:
                blk = mgr.blocks[b]
                if blk.ref_count == 1 and mgr.hash_to_block_id.get(blk.hash) == b:
                    del mgr.hash_to_block_id[blk.hash]
            base.deallocate(mgr, seq)

        self.manager.__class__ = type("FixedBlockManager", (base,), {"deallocate": deallocate})
        self.manager.deallocate = _Recorder(self, self.manager, "deallocate")


class Leaky(Fixed163):
    """A negative control: ``deallocate`` drops the table without releasing a block."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)

        def deallocate(mgr, seq):
            seq.num_cached_tokens = 0
            seq.block_table.clear()

        self.manager.__class__ = type("LeakyBlockManager", (type(self.manager),),
                                      {"deallocate": deallocate})
        self.manager.deallocate = _Recorder(self, self.manager, "deallocate")


def _factory(cls, key):
    def make(nb, bs, budget=16, max_seqs=8, policy="fcfs", caching=True, spec=0,
             max_model_len=0, version=None):
        return cls(nb, bs, budget, max_seqs, policy, caching, spec, max_model_len or 0, key,
                   version)
    return make


def test_both_releases_fail_on_144_a_prompt_wholly_cached_computes_nothing():
    """nano-vllm #144 (catalogue nano-vllm-144) through the engine: ``allocate`` counts every
    full hit, the last block included, so the step schedules the request with no token."""
    _npu()
    for target in ("nano-vllm-engine", "nano-vllm-npu-engine@0.0.2"):
        r = _run(target, seed=0)
        assert r.verdict == "fail" and r.violation.name == COMPUTES, (target, r.violation)


def test_the_fork_leaves_a_preempted_sequence_in_running():
    """Past #144, default runs on nano-vllm-fork 20260210 fail where the release's decode loop
    preempts through ``preempt``, which leaves the sequence in ``running`` as it joins
    ``waiting`` (the next step appends a slot to its empty table and crashes, or schedules
    it twice); upstream's scheduler passes the same rule (the control below)."""
    for seed in (0, 1):
        r = _run(_factory(Masked144, "nano-vllm"), seed=seed)
        v = r.violation
        assert v is not None and v.name == QUEUES, v
        assert "waiting) is in running" in v.witness, v.witness


def test_the_fork_preemption_bug_on_the_release_own_objects():
    """The raw replay: nano-vllm-fork's ``Scheduler``, ``BlockManager`` and ``Sequence``, no
    kvcheck oracle: three 4-token prompts in a 3-block pool, one decode step later the
    preempted sequence is both waiting and in ``running``, and the next ``schedule()``
    raises in ``may_append``."""
    mods = ne.load()
    Sequence = mods["nanovllm.engine.sequence"].Sequence
    Params = mods["nanovllm.sampling_params"].SamplingParams
    config = mods["nanovllm.config"].Config(16, 8, -1, 4, 3, 16)
    sched = mods["nanovllm.engine.scheduler"].Scheduler(config)
    seqs = [Sequence([1 + 4 * i, 2 + 4 * i, 3 + 4 * i, 4 + 4 * i], Params(max_tokens=8))
            for i in range(3)]
    for s in seqs:
        s.block_size = 4
        sched.add(s)
    got, prefill = sched.schedule()
    assert prefill and got == seqs
    sched.postprocess(got, [20] * 3)  # each 5 tokens long: its next decode needs a block
    got, prefill = sched.schedule()
    assert not prefill and got == [seqs[0]]
    stale = [s for s in sched.running if s in sched.waiting]
    assert stale == [seqs[1]] and seqs[1].status.name == "WAITING" and not seqs[1].block_table
    sched.postprocess(got, [21])
    try:
        sched.schedule()
    except IndexError:
        pass
    else:
        raise AssertionError("the stale running entry was scheduled without an error")


def test_the_documented_trace_reproduces(capsys):
    """docs/findings.md E3's trace: two 1-token prompts in 2 blocks of 4 slots; nano-vllm-fork
    leaves the preempted one in running."""
    assert kvcheck(["replay", str(TRACE)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("REPRODUCED on nano-vllm-engine: step 7 (invariant) " + QUEUES), out


def test_the_upstream_scheduler_with_163_fixed_passes_with_preemptions_and_hits():
    """The control: upstream nano-vllm's scheduler (nano-vllm-npu's) over its block manager
    with #163's fix, #144 masked: no violation, and the runs preempt, hit the cache and
    finish every request."""
    _npu()
    make = _factory(Fixed163, "nano-vllm-npu")
    for seed in range(4):
        r = _run(make, seed=seed)
        assert r.verdict == "pass", (seed, r.violation)
        st = r.state.stats
        assert st["finished"] == st["requests"] == 30, st
        assert st["preemptions"] > 0 and st["hits"] > 0, st


def test_163_stale_keys_are_caught_on_nano_vllm_npu():
    """nano-vllm #163 (catalogue nano-vllm-163): nano-vllm-npu 0.0.2's freed block keeps its
    key; reused for new content, a prefix-cache invariant breaks (the control above, the
    same release with the fix, passes these seeds)."""
    _npu()
    names = {_run(_factory(Masked144, "nano-vllm-npu"), seed=s).violation.name for s in range(4)}
    assert names and names <= {"no_partial_cached", "one_key_per_block", "cache_content",
                               "key_after_write", "free_unkeyed", "evictable_keyed",
                               "get_computed_blocks: every block a cache hit returns holds "
                               "the requested prefix"}, names


def test_a_manager_that_does_not_free_is_caught():
    _npu()
    r = _run(_factory(Leaky, "nano-vllm-npu"), seed=0)
    assert r.verdict == "fail" and r.violation.kind in ("invariant", "contract"), r.violation


def test_what_nano_vllm_has_not_is_refused_in_one_line(capsys):
    for flags, word in ((["--no-prefix-caching"], "always caches"),
                        (["--policy", "priority"], "priority"),
                        (["--spec-tokens", "2"], "speculative"),
                        (["--max-model-len", "32"], "max_num_batched_tokens"),
                        (["--block-size", "1"], "block_size")):
        assert kvcheck(["verify-engine", "nano-vllm-engine", *flags]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0] and "Traceback" not in err[0], err


def test_a_copy_steps_as_the_original():
    """Exploration and shrinking clone the engine: ``Sequence``'s IPC ``__getstate__`` is
    bypassed, so a deep copy holds whole sequences and steps exactly as the original."""
    _npu()
    a = Fixed163(6, 2, 8, 4, key="nano-vllm-npu")
    rng = random.Random(0)
    for q in range(5):
        a.add(q, [rng.randint(2, 4) for _ in range(rng.randint(1, 5))], rng.randint(1, 3))
    a.step(1)
    b = copy.deepcopy(a)
    for gen in range(2, 12):
        if a.running() or a.waiting():
            ra, rb = a.step(gen), b.step(gen)
            assert (ra.scheduled, ra.sampled) == (rb.scheduled, rb.sampled)
            assert [c.name for c in ra.calls] == [c.name for c in rb.calls]
    for q in range(5):
        assert (a.status(q), a.blocks(q), a.token_ids(q)) == (b.status(q), b.blocks(q),
                                                                b.token_ids(q))
    assert b.manager.deallocate.target is b and a.free_blocks() == b.free_blocks()


def test_the_fork_is_the_pinned_install():
    assert _loader.is_installed(install.select("nano-vllm"))
    assert ne.make(4, 2).version == "20260210"
