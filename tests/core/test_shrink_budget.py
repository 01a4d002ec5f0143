"""``--shrink-seconds`` on every command that shrinks: when the budget runs out, the trace and
the printed result say so and how long the counterexample still is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcheck.cli import build_parser, main

TESTS = Path(__file__).resolve().parents[1]
STOPPED = re.compile(r"shrinking stopped at its 0 s budget: (\d+) (operation|request)s?, "
                     r"not proven 1-minimal")

# command, argv, default budget, where the minimality is in the written file
SHRINKERS = [
    ("verify", [f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", "--ops", "3000"], 60.0,
     lambda d: d["minimality"]),
    ("verify-prefix", [f"{TESTS}/prefix/buggy_prefix.py:UnchainedKeys", "--ops", "3000"], 30.0,
     lambda d: d["minimality"]),
    ("verify-scheduler", [f"{TESTS}/scheduler/buggy.py:PreemptCurrent"], 30.0,
     lambda d: d["minimality"]),
    ("prove", [f"{TESTS}/corpus/buggy.py:NoCopyOnWrite", "--blocks", "3", "--seqs", "2",
               "--depth", "4", "--no-pairs", "--target-only"], 30.0, lambda d: d["minimality"]),
]


def _subparser(name):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


@pytest.mark.parametrize("command,argv,default,minimality", SHRINKERS, ids=[s[0] for s in SHRINKERS])
def test_budget_exhausted_is_said(tmp_path, capsys, command, argv, default, minimality):
    assert _subparser(command).get_default("shrink_seconds") == default
    out = tmp_path / "t.json"
    assert main([command, *argv, "--shrink-seconds", "0", "--trace-out", str(out)]) == 1
    printed = capsys.readouterr().out
    said = minimality(json.loads(out.read_text()))
    m = STOPPED.fullmatch(said)
    assert m, said
    assert f"minimal: {said}" in printed
    if command != "prove":  # prove's verdict line is the report's; the trace says it above
        assert f"shrunk to {m[1]} (shrinking stopped at its 0 s budget, not proven 1-minimal):" \
            in printed
    # with the default budget the same counterexample is shrunk to a 1-minimal one
    assert main([command, *argv, "--trace-out", str(out)]) == 1
    capsys.readouterr()
    assert minimality(json.loads(out.read_text())).startswith("1-minimal")


def test_a_negative_budget_is_bad_input(capsys):
    with pytest.raises(SystemExit) as e:
        main(["verify", "--shrink-seconds", "-1"])
    assert e.value.code == 2 and "non-negative number" in capsys.readouterr().err
