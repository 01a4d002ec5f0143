"""Hybrid pools (issue 15 section 3): the reference passes at several shapes, every buggy
pool of the corpus is caught with its rule and a short shrunk trace, the legal variants
pass, and a hybrid trace replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcheck.check.trace import Trace
from kvcheck.cli import main
from kvcheck.verify import replay_trace, verify

from corpus.hybrid import HYBRID_CORPUS, HYBRID_LEGAL


@pytest.mark.parametrize("bs", [1, 2, 4])
def test_reference_passes_and_reaches_every_class(bs):
    r = verify("reference-hybrid", 12, bs, 1500, 3, model="hybrid")
    assert r.ok, r.violation
    st = r.state.stats
    assert st["hits"] > 0 and st["dropped"] > 0 and st["oob"] > 0 and st["free_seq"] > 0
    assert st["append_tokens"] > 0


@pytest.mark.parametrize("name", sorted(HYBRID_CORPUS))
def test_buggy_pool_caught_minimal(name):
    cls, clause, bound = HYBRID_CORPUS[name]
    r = verify(cls, 8, 2, 3000, 0, model="hybrid", shrink_budget=30)
    assert not r.ok
    assert r.violation.name == clause
    assert len(r.trace.ops) <= bound
    assert r.trace.minimality.startswith(("1-minimal", "shortest")), r.trace.minimality


@pytest.mark.parametrize("name", sorted(HYBRID_LEGAL))
@pytest.mark.parametrize("bs", [1, 3])
def test_legal_variant_passes(name, bs):
    r = verify(HYBRID_LEGAL[name], 10, bs, 1500, 1, model="hybrid")
    assert r.ok, r.violation
    if name == "drops-before-oob":  # the allowance was exercised, not just permitted
        assert r.state.stats["oob_dropping"] > 0
    else:
        assert r.state.stats["oob_dropping"] == 0


def test_trace_round_trip_and_replay(tmp_path):
    cls = HYBRID_CORPUS["hits-per-group"][0]
    r = verify(cls, 8, 2, 3000, 0, model="hybrid")
    text = r.trace.dumps()
    back = Trace.loads(text)
    assert back.model == "hybrid" and len(back.ops) == len(r.trace.ops)
    assert replay_trace(back, target=cls).violation.name == r.violation.name
    assert replay_trace(back, target="reference-hybrid").violation is None


def test_cli_verify_hybrid(tmp_path, capsys):
    assert main(["verify-hybrid", "--ops", "300", "--json"], isolate=False) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "pass" and out["windows"] == [0, 4]
    assert main(["verify-hybrid", "no_such_module:X"], isolate=False) == 2
    assert main(["verify-hybrid", "reference"], isolate=False) == 2  # not a hybrid target


def test_state_machine_drives_hybrid_pools():
    import unittest

    from hypothesis import settings

    from kvcheck.verify import make_state_machine

    def run(target):
        m = make_state_machine(target, 8, 2, model="hybrid")
        m.TestCase.settings = settings(m.TestCase.settings, max_examples=25,
                                       stateful_step_count=15, derandomize=True, database=None)
        return unittest.TextTestRunner(verbosity=0, stream=open("/dev/null", "w")).run(
            m.TestCase("runTest"))

    ok = run("reference-hybrid")
    assert not ok.failures and not ok.errors
    bad = run(HYBRID_CORPUS["window-drop-in-full"][0])
    assert len(bad.failures) == 1 and "window_nulls" in bad.failures[0][1]


# -- a misbehaving hybrid target is reported, never a traceback ---------------------
from kvcheck.impl.hybrid_manager import HybridBlockManager  # noqa: E402


class GarbageResult(HybridBlockManager):
    def allocate(self, seq, tokens):
        super().allocate(seq, tokens)
        return "lots"


class RaisingTable(HybridBlockManager):
    def block_table(self, seq, group):
        if group == 1 and len(self.tables) > 1:
            raise RuntimeError("boom")
        return super().block_table(seq, group)


class CrashingAppend(HybridBlockManager):
    def append_slot(self, seq, token):
        raise ValueError("no")


class NoWindows(HybridBlockManager):
    windows = ()

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.windows = ()


@pytest.mark.parametrize("cls,kind,name", [(GarbageResult, "malformed", "allocate result"),
                                           (RaisingTable, "malformed", "observation"),
                                           (CrashingAppend, "crash", "append_slot")])
def test_misbehaving_target_is_a_violation(cls, kind, name):
    r = verify(cls, 8, 2, 500, 0, model="hybrid", shrink_budget=10)
    assert not r.ok and (r.violation.kind, r.violation.name) == (kind, name)
    assert r.violation.witness


class WindowOfOne(HybridBlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, windows=(0, 1))


@pytest.mark.parametrize("name,says", [("NoWindows", "windows must list"),
                                       ("WindowOfOne", "window of 1 token")])
def test_bad_hybrid_target_is_bad_input(capsys, name, says):
    assert main(["verify-hybrid", f"{__file__}:{name}"], isolate=False) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_hybrid_trace_loading_is_strict():
    from kvcheck.check.trace import TraceError

    r = verify(HYBRID_CORPUS["free-one-group"][0], 8, 2, 3000, 0, model="hybrid")
    data = json.loads(r.trace.dumps())
    data["ops"][0]["tokens"] = []
    with pytest.raises(TraceError, match="at least one token"):
        Trace.loads(json.dumps(data))


@pytest.mark.parametrize("argv,says", [
    (["verify-hybrid", "nope"], "unknown hybrid target 'nope': use module:attr, file.py:attr or "
                                "one of: reference-hybrid, vllm-v1-hybrid"),
    (["verify-hybrid", "reference-hybrid@0.20.2"], "target 'reference-hybrid@0.20.2': the factory "
                                                   "takes no version"),
    (["verify", "reference-hybrid"], "is a hybrid pool (several KV-cache groups): check it with "
                                     "kvcheck verify-hybrid reference-hybrid"),
    (["verify-prefix", "vllm-v1-hybrid"], "kvcheck verify-hybrid vllm-v1-hybrid"),
    (["prove", "reference-hybrid"], "kvcheck verify-hybrid reference-hybrid"),
])
def test_hybrid_names_under_the_wrong_command_say_which(capsys, argv, says):
    assert main(argv, isolate=False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("command", ["verify", "verify-prefix", "prove"])
def test_a_hybrid_pool_file_under_a_block_command_is_bad_input(capsys, command):
    """Not a FAIL (the block model's allocate crashing on the hybrid result): exit 2."""
    target = f"{Path(__file__).resolve().parent.parent / 'corpus' / 'hybrid.py'}:FreeOneGroup"
    assert main([command, target], isolate=False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a hybrid pool" in err and "verify-hybrid" in err, err


def test_mix_multiplies_the_drivers_chances_as_the_other_models_do():
    """``--mix allocate=W`` multiplies the driver's chance of an allocation (as a campaign
    run draws it, and as ``verify --mix`` does): it never replaces the weight."""
    from kvcheck.models.blocks.model import BlockScope
    from kvcheck.models.hybrid.driver import WEIGHTS, HybridDriver

    d = HybridDriver(0, BlockScope(8, 2), HybridBlockManager(8, 2), {"allocate": 0.5})
    assert d.w == {"allocate": WEIGHTS["allocate"] * 0.5, "free_seq": WEIGHTS["free_seq"]}
    counts = {}
    for weight in (0.25, 4.0):
        r = verify("reference-hybrid", 32, 2, 600, 1, model="hybrid",
                   extra={"weights": {"allocate": weight}})
        assert r.ok
        counts[weight] = r.state.stats["allocate"]
    assert counts[0.25] < counts[4.0], counts
