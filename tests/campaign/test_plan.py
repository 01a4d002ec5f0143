"""Swarm draws: reproducible from the campaign's seed, spread from tiny to large pools with
block size 1 among them, mixes a command line reads back to the same numbers; each run's
command re-runs exactly that run; durations; outcome classes counted on the touched domain
agree with the spec's classify on whole snapshots."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

import pytest

from kvcheck.campaign import coverage as cov
from kvcheck.campaign.plan import (
    BLOCK_SIZES,
    COMMANDS,
    ENGINE,
    MIX,
    MODELS,
    SMALL_BLOCK,
    SMALL_FIRST,
    SMALL_OPS,
    SMALL_POOL,
    RunSpec,
    Settings,
    draw,
    is_defaults,
    mix_text,
    parse_duration,
)
from kvcheck.campaign.worker import execute
from kvcheck.check.model import Options
from kvcheck.check.run import drive
from kvcheck.check.watchdog import Watchdog
from kvcheck.cli import build_parser
from kvcheck.cli.commands import checking
from kvcheck.cli.commands.common import mix_weights
from kvcheck.defaults import RUN
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.model import MODEL as BLOCKS
from kvcheck.models.blocks.model import BlockScope
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.prefix.driver import PrefixDriver
from kvcheck.spec.logic import PY
from kvcheck.spec.outcomes import classify
from kvcheck.targets.loading import build, resolve

BUGGY = Path(__file__).resolve().parents[1] / "corpus" / "buggy.py"


@pytest.mark.parametrize("model", MODELS)
def test_draws_are_reproducible_and_spread(model):
    s = Settings("reference", model, seed=7)
    specs = [draw(s, i) for i in range(300)]
    assert [x.to_json() for x in specs] == [draw(s, i).to_json() for i in range(300)]
    assert specs != [draw(Settings("reference", model, seed=8), i) for i in range(300)]
    pools = {x.scope["num_blocks"] for x in specs}
    sizes = {x.scope["block_size"] for x in specs}
    assert 1 in sizes and max(sizes) >= 16
    assert min(pools) <= 2 and max(pools) >= 32
    assert len({x.seed for x in specs}) == len(specs)
    if model == "engine":  # no mix: the engine's settings, each value drawn
        assert {x.scope["priority"] for x in specs} == {0, 1}
        assert {x.scope["caching"] for x in specs} == {0, 1}
        assert {x.scope["spec"] for x in specs} == set(ENGINE["spec"])
        assert {x.scope["budget"] for x in specs} == set(ENGINE["budget"])
        assert {x.scope["max_seqs"] for x in specs} == set(ENGINE["max_seqs"])
        assert 0.1 < sum(1 for x in specs if x.scope.get("max_model_len")) / len(specs) < 0.4
    elif model != "scheduler":
        mixes = [x.extra.get("weights", {}) for x in specs]
        assert any(m.get("fork") == 0.0 for m in mixes) or "fork" not in MIX[model]
        free = "free" if model == "tiers" else "free_seq"  # (the tiers model's name for it)
        assert any(m.get(free, 1.0) > 2 for m in mixes)
        assert any(m.get("allocate", 1.0) < 0.5 for m in mixes)
    else:
        assert {x.scope["watermark"] for x in specs} >= {0, 1, 2}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("seed", [0, 9])
def test_run_0_is_the_command_at_its_defaults(model, seed):
    """Run 0's command parses to the model's command given only the target and the seed
    (the campaign's shrink budget apart), and the swarm follows it: run n + 1 is the draw
    that was run n before run 0 was the defaults (plan 1), which a resumed old campaign
    keeps."""
    s = Settings("reference", model, seed=seed)
    spec = draw(s, 0)
    assert is_defaults(0) and not is_defaults(1) and not is_defaults(0, plan=1)
    ran = vars(build_parser().parse_args(shlex.split(spec.command())[1:]))
    bare = vars(build_parser().parse_args([COMMANDS[model], "reference", "--seed", str(seed)]))
    assert ran.pop("shrink_seconds") == s.shrink_seconds
    bare.pop("shrink_seconds")
    assert {k: v for k, v in ran.items() if k != "run"} == \
        {k: v for k, v in bare.items() if k != "run"}
    for n in range(20):
        old = draw(s, n, plan=1).to_json()
        assert draw(s, n + 1, plan=2).to_json() == {**old, "run": n + 1}
        assert old["run"] == n
        # plan 3: the small scopes, then plan 2's swarm
        late = draw(s, n + 1 + SMALL_FIRST).to_json()
        assert late == {**old, "run": n + 1 + SMALL_FIRST}


@pytest.mark.parametrize("model", MODELS)
def test_small_scopes_come_first(model):
    """Runs 1 to SMALL_FIRST draw small pools, block sizes and run lengths, each its own
    seed, shape and mix (reproducibly, differing by the campaign's seed); the full swarm
    follows. Across campaigns the small draws cover the small end's choices."""
    shapes = set()
    for seed in range(40):
        s = Settings("reference", model, seed=seed)
        small = [draw(s, n) for n in range(1, SMALL_FIRST + 1)]
        assert [x.to_json() for x in small] == [draw(s, n).to_json()
                                                for n in range(1, SMALL_FIRST + 1)]
        for x in small:
            assert x.scope["num_blocks"] <= max(SMALL_POOL, 2)  # the scheduler needs 2
            assert x.scope["block_size"] <= SMALL_BLOCK
            assert (x.extra["requests"] if model == "engine" else x.ops) in SMALL_OPS[model]
            shapes.add((x.scope["num_blocks"], x.scope["block_size"]))
        assert len({x.seed for x in small}) == SMALL_FIRST
        assert small != [draw(Settings("reference", model, seed=seed + 100), n)
                         for n in range(1, SMALL_FIRST + 1)]
        swarm = [draw(s, n) for n in range(SMALL_FIRST + 1, SMALL_FIRST + 60)]
        assert max(x.scope["num_blocks"] for x in swarm) > SMALL_POOL
    assert {b for _, b in shapes} == {b for b in BLOCK_SIZES[model] if b <= SMALL_BLOCK}
    assert {1, 2, 8} <= {n for n, _ in shapes} | ({1} if model == "scheduler" else set())


@pytest.mark.parametrize("entry", ["aliasing-fork", "no-copy-on-write", "release-before-allocate"])
def test_run_0_finds_what_verify_at_its_defaults_finds(entry):
    """The same run: the same operations until the same violation, shrunk alike."""
    from kvcheck.verify import verify

    from corpus.buggy import CORPUS

    target = f"{BUGGY}:{CORPUS[entry][0].__name__}"
    r = verify(target, shrink_budget=30.0)
    got = execute(draw(Settings(target), 0))
    assert not r.ok and got["verdict"] == "fail"
    assert (got["ops"], got["original_length"]) == (r.ops, r.original_length)
    assert got["violation"]["name"] == r.violation.name
    assert len(got["trace"]["ops"]) == len(r.trace.ops)
    assert sum(got["coverage"].values()) > 0


def test_mix_reads_back_exactly():
    for i in range(100):
        w = draw(Settings("reference"), i).extra.get("weights")
        if w:
            assert mix_weights(mix_text(w)) == w


def test_mix_keys_are_the_drivers():
    assert checking.BLOCK_MIX == RandomDriver.WEIGHTS
    assert checking.PREFIX_MIX == PrefixDriver.WEIGHTS


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1h", 3600),
                                          ("1h30m", 5400), ("2.5s", 2.5), ("45", 45)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "10x", "m", "-5", "1d", "inf", "nan"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("run", [0, 1, 2, 3, 5, 8])
def test_the_command_reruns_the_run(run):
    """The command a run records parses to the same run: same verdict, same operations."""
    from kvcheck.verify import verify

    spec = draw(Settings("reference", shrink_seconds=5.0), run)
    argv = shlex.split(spec.command())
    assert argv[:2] == ["kvcheck", "verify"]
    args = build_parser().parse_args(argv[1:])
    r = verify(args.target, args.blocks, args.block_size, args.ops, args.seed,
               extra={"weights": args.mix} if args.mix else None)
    got = execute(spec)
    assert got["verdict"] == ("pass" if r.ok else "fail")
    assert got["ops"] == r.ops


def test_scheduler_command_parses():
    spec = draw(Settings("reference", "scheduler"), 3)
    args = build_parser().parse_args(shlex.split(spec.command())[1:])
    assert (args.blocks, args.block_size, args.watermark, args.requests, args.workloads,
            args.seed) == (spec.scope["num_blocks"], spec.scope["block_size"],
                           spec.scope["watermark"], spec.ops, 1, spec.seed)


def test_weights_change_the_mix_and_none_is_the_default():
    caps = {"allocate", "append_slot", "fork", "free_seq"}

    def kinds(weights):
        d = RandomDriver(3, 8, 2, caps, weights)
        return Counter(d.next_op([0, 1, 2], 4).kind for _ in range(3000))

    assert kinds(None) == kinds({})
    assert kinds({"fork": 0.0})["fork"] == 0
    assert kinds({"fork": 4.0})["fork"] > 2 * kinds(None)["fork"]
    d = RandomDriver(3, 8, 2, caps, {"max_prompt": 1})
    assert all(d.next_op([], 8).n_tokens == 1 for _ in range(50))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pool", [(6, 2), (3, 1), (2, 4), (12, 3)])
def test_touched_domain_classes_agree_with_the_spec_on_snapshots(seed, pool):
    """The campaign's counts (fast mode, the step's touched domain) equal classify on the
    whole snapshots before and after every step of the same operations in full mode."""
    _, factory = resolve("reference")
    scope = BlockScope(*pool)
    counter = cov.Counter("blocks")
    run = drive(BLOCKS, factory, scope, Options(extra={"watch": counter.watch}), seed, 400)
    assert run.violation is None
    ops = run.history
    full = Counter()
    oracle = Oracle(build(factory, *pool), mode="full")
    with Watchdog(10.0) as wd:
        for req in ops:
            op = BLOCKS.request(req)
            pre = oracle.snap
            assert oracle.step(op, wd) is None
            name = classify(PY, pre, oracle.observed, op)
            if name is not None:
                full[name] += 1
    assert {k: v for k, v in counter.result().items() if v} == dict(full)
    assert sum(full.values()) == len(ops)  # every step of the reference has its class


@pytest.mark.parametrize("entry,cls", [("no-copy-on-write", "append/copy-on-write"),
                                       ("aliasing-fork", "fork/ok"),
                                       ("crash-on-fork", None)])
def test_the_counterexample_s_class_from_its_recorded_states(entry, cls):
    """The violating step's class, read from the states the trace recorded around it (the
    aliasing fork shared the tail, so it is no copy; a crash did not complete: no class)."""
    from kvcheck.verify import verify

    from corpus.buggy import CORPUS

    r = verify(f"{BUGGY}:{CORPUS[entry][0].__name__}", shrink_budget=30.0)
    counter = cov.Counter("blocks")
    counter.counterexample(r.trace)
    assert counter.violating == cls
    assert counter.notes()["counterexample"] == ([cls] if cls else [])


def test_models_without_classes_say_so():
    assert cov.Counter("scheduler").result() is None
    assert "no outcome classes" in cov.NO_CLASSES["scheduler"]
    assert cov.classes("prefix")[-len(cov.PREFIX_CLASSES):] == list(cov.PREFIX_CLASSES)


def test_spec_round_trips():
    spec = draw(Settings("reference", "device"), 4)
    assert RunSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("model,digest", [
    ("blocks", "febd52e55f6fd769"), ("prefix", "51f1c6bb0a720d33"),
    ("device", "91f12db4b1248e93"), ("scheduler", "df4ea151d187e1ae"),
    ("hybrid", "1a7147495929c448"), ("tiers", "ce2608686a06968c")])
def test_the_models_draws_stay_the_same(model, digest):
    """A resumed campaign keeps its sequence: the draws of every model that campaigns drew
    before the engine model was added (runs 0..59 of each plan, seed 5) are the ones they
    were (the digest taken before the engine model's tables)."""
    import hashlib
    import json

    s = Settings("reference", model, seed=5)
    text = json.dumps([[draw(s, i, p).to_json() for i in range(60)] for p in (1, 2, 3)],
                      sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest


NANO_LIKE = {"block_size": [2, 4, 8, 16], "budget": [2, 4, 8, 16, 32, 64],
             "max_seqs": [1, 2, 3, 4, 8, 16], "policy": ["fcfs"], "caching": [True],
             "spec": [0], "max_model_len": "within", "whole": True}
CHUNKED_OLD = {"block_size": [1, 2, 4, 8, 16], "budget": [4, 8, 16], "max_seqs": [1, 2, 4, 8],
               "policy": ["fcfs", "priority"], "caching": [False], "spec": [0, 2, 4],
               "max_model_len": "none", "whole": False}


@pytest.mark.parametrize("accepts", [None, NANO_LIKE, CHUNKED_OLD])
def test_engine_runs_draw_only_what_the_target_accepts(accepts):
    """Every engine run draws each setting from the values the target accepts, at most as
    many sequences as the budget, fewer drafts than the budget, a max_model_len within the
    budget where the target requires it, and a workload with a request in it; run 0 is
    verify-engine's defaults, prefix caching off only where the target refuses it on."""
    from kvcheck.campaign.plan import _first_request

    ok = accepts or {**{k: list(v) for k, v in ENGINE.items()}, "max_model_len": "any"}
    for seed in (0, 4):
        s = Settings("some-engine", "engine", seed=seed, accepts=accepts)
        assert draw(s, 0).scope["caching"] == (1 if True in ok["caching"] else 0)
        for n in range(1, 150):
            x = draw(s, n)
            sc = x.scope
            assert sc["block_size"] in ok["block_size"] and sc["budget"] in ok["budget"]
            assert sc["max_seqs"] in ok["max_seqs"] and sc["max_seqs"] <= sc["budget"]
            assert ("priority" if sc["priority"] else "fcfs") in ok["policy"]
            assert bool(sc["caching"]) in ok["caching"]
            assert sc["spec"] in ok["spec"] and sc["spec"] < sc["budget"]
            if ok["max_model_len"] == "none":
                assert "max_model_len" not in sc
            elif ok["max_model_len"] == "within":
                assert sc.get("max_model_len", 0) <= sc["budget"]
            assert _first_request(x.seed, sc, x.extra["requests"], ok.get("whole", False))
            assert x.ops == RUN["engine"]["ops"] and x.out_of_blocks is None
            assert x.shrink_steps == RUN["engine"]["shrink_steps"]


def test_an_engine_run_s_command_parses_to_the_run():
    """The command an engine run records sets every setting it drew (verify-engine's
    flags), so it re-runs exactly that run."""
    from kvcheck.models.engine.model import MODEL, EngineScope

    s = Settings("vllm-v1-engine@0.33.0", "engine", seed=3, shrink_seconds=7.0)
    seen = set()
    for n in range(40):
        x = draw(s, n)
        argv = shlex.split(x.command())
        assert argv[:3] == ["kvcheck", "verify-engine", "vllm-v1-engine@0.33.0"]
        a = build_parser().parse_args(argv[1:])
        scope = EngineScope(a.blocks, a.block_size, a.budget, a.max_seqs, a.policy,
                            not a.no_prefix_caching, a.spec_tokens, a.max_model_len or 0)
        assert scope == MODEL.scope_from_json(x.scope)
        assert (a.ops, a.requests, a.seed, a.shrink_budget, a.shrink_seconds, a.timeout) == \
            (x.ops, x.extra["requests"], x.seed, x.shrink_steps, 7.0, x.timeout)
        seen.add((scope.policy, scope.caching, bool(scope.spec), bool(scope.max_model_len)))
        assert RunSpec.from_json(x.to_json()) == x
        assert "requests" in x.describe()
    assert len(seen) > 6


def test_an_engine_run_keeps_sglang_s_other_policies():
    """A run whose scope holds one of SGLang's other policies (a trace's ``policy`` field:
    lpm, dfs-weight, lof, random) is described and re-run with that policy, not as fcfs."""
    from kvcheck.campaign.plan import _engine_scope
    from kvcheck.models.engine.model import MODEL, OTHER_POLICIES

    for policy in ("fcfs", "priority", *OTHER_POLICIES):
        scope = _engine_scope(8, 4, 16, 8, policy, True, 0, 0)
        x = RunSpec(1, "engine", "sglang-engine", 5, scope, 100, {"requests": 4})
        a = build_parser().parse_args(shlex.split(x.command())[1:])
        assert a.policy == policy == MODEL.scope_from_json(x.scope).policy
        assert f" seqs, {policy}, caching on" in x.describe()


def test_engine_coverage_counts_its_oracle_s_stats():
    """An engine run's classes are its verify-engine figures; abort is an operation its
    target may lack; cache hits are not applicable where the target accepts prefix caching
    only off, and a gap where it accepts it on."""
    from types import SimpleNamespace

    counter = cov.Counter("engine")
    state = SimpleNamespace(target=SimpleNamespace(aborts=False),
                            stats={"finished": 3, "aborted": 0, "preemptions": 2, "hits": 0})
    counter.watch(state)
    assert counter.capabilities == ["add", "step"]
    assert counter.result(state) == {"engine/finished": 3, "engine/aborted": 0,
                                     "engine/preempted": 2, "engine/cache-hit": 0}
    total, notes = {}, {}
    cov.merge(total, counter.result(state))
    cov.merge_notes(notes, counter.notes())
    off = {"caching": [False]}
    never, impossible, na = cov.warnings("engine", total, set(counter.capabilities), notes, off)
    assert impossible == ["engine/aborted"] and "engine/cache-hit" in na and never == []
    for accepts in ({"caching": [True, False]}, None):  # it could have hit: a gap
        never, _, na = cov.warnings("engine", total, set(counter.capabilities), notes, accepts)
        assert never == ["engine/cache-hit"] and na == {}
