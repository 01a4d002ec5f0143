"""``--shrink-budget`` (operations replayed) and ``--shrink-seconds`` (a wall-clock cap) on
every command that shrinks: one default each for all of them; when either runs out, the
trace and the printed result say which and how long the counterexample still is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcheck.cli import build_parser, main
from kvcheck.defaults import SHRINK_SECONDS, SHRINK_STEPS

TESTS = Path(__file__).resolve().parents[1]
BY = {
    "--shrink-budget": ("shrinking stopped at its budget of 0 replayed operations",
                        re.compile(r"shrinking stopped at its budget of 0 replayed operations: "
                                   r"(\d+) (operation|request)s?, not proven 1-minimal")),
    "--shrink-seconds": ("shrinking stopped at its 0 s wall-clock cap (--shrink-seconds)",
                         re.compile(r"shrinking stopped at its 0 s wall-clock cap "
                                    r"\(--shrink-seconds\): (\d+) (operation|request)s?, "
                                    r"not proven 1-minimal")),
}

# command, argv, where the minimality is in the written file
SHRINKERS = [
    ("verify", [f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", "--ops", "3000"],
     lambda d: d["minimality"]),
    ("verify-prefix", [f"{TESTS}/prefix/buggy_prefix.py:UnchainedKeys", "--ops", "3000"],
     lambda d: d["minimality"]),
    ("verify-scheduler", [f"{TESTS}/scheduler/buggy.py:PreemptCurrent"],
     lambda d: d["minimality"]),
    ("prove", [f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", "--blocks", "3", "--seqs", "2",
               "--depth", "4", "--no-pairs", "--target-only"], lambda d: d["minimality"]),
]


def _subparser(name):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


@pytest.mark.parametrize("flag", sorted(BY))
@pytest.mark.parametrize("command,argv,minimality", SHRINKERS, ids=[s[0] for s in SHRINKERS])
def test_budget_exhausted_is_said(tmp_path, capsys, command, argv, minimality, flag):
    assert _subparser(command).get_default("shrink_seconds") == SHRINK_SECONDS
    assert _subparser(command).get_default("shrink_budget") == SHRINK_STEPS
    head, pattern = BY[flag]
    out = tmp_path / "t.json"
    assert main([command, *argv, flag, "0", "--trace-out", str(out)]) == 1
    printed = capsys.readouterr().out
    said = minimality(json.loads(out.read_text()))
    m = pattern.fullmatch(said)
    assert m, said
    assert f"minimal: {said}" in printed
    if command != "prove":  # prove's verdict line is the report's; the trace says it above
        assert f"shrunk to {m[1]} ({head}, not proven 1-minimal):" in printed
    if flag == "--shrink-budget":
        # with the default budget the same counterexample is shrunk to a 1-minimal one
        assert main([command, *argv, "--trace-out", str(out)]) == 1
        capsys.readouterr()
        assert minimality(json.loads(out.read_text())).startswith("1-minimal")


def test_the_campaign_takes_the_same_defaults():
    """A campaign's runs shrink as the model's checking command does unless --shrink-budget
    says otherwise (verify-engine's budget is its own: kvcheck.defaults.RUN["engine"])."""
    from kvcheck.campaign.plan import shrink_budget
    from kvcheck.defaults import RUN

    assert _subparser("campaign").get_default("shrink_seconds") == SHRINK_SECONDS
    assert _subparser("campaign").get_default("shrink_budget") is None  # the model's
    for model in ("blocks", "prefix", "scheduler", "device", "hybrid", "tiers"):
        assert shrink_budget(model) == SHRINK_STEPS, model
    assert shrink_budget("engine") == RUN["engine"]["shrink_steps"] != SHRINK_STEPS


def test_a_negative_budget_is_bad_input(capsys):
    with pytest.raises(SystemExit) as e:
        main(["verify", "--shrink-seconds", "-1"])
    assert e.value.code == 2 and "non-negative number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["verify", "--shrink-budget", "-1"])
    assert e.value.code == 2 and "non-negative" in capsys.readouterr().err
