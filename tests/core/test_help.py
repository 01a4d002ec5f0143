"""``--help`` says what kvcheck is, and for every option of every command its default and its
unit; one name per concept across commands."""

from __future__ import annotations

import argparse

import pytest

from kvcheck.cli import COMMANDS, build_parser, main
from kvcheck.cli.commands import common
from kvcheck.cli.commands.plan import block_sizes
from kvcheck.cli.commands.simulate import _watermarks

NUMERIC = {common.positive_int, common.nonneg_int, common.positive_float, common.nonneg_float,
           block_sizes, _watermarks}
UNITS = ("blocks", "tokens", "seconds", "operations", "sequences", "requests", "workloads",
         "steps", "bytes", "GiB", "GB/s", "milliseconds", "fraction", "GPUs", "layers", "heads",
         "elements", "seed", "runs", "processes")


def _subparsers():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _options():
    for name, parser in _subparsers().items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            yield name, action, formatter._expand_help(action) if action.help else ""


OPTIONS = list(_options())
IDS = [f"{name} {(a.option_strings or [a.dest])[-1]}" for name, a, _ in OPTIONS]


def test_every_command_is_walked():
    assert set(_subparsers()) == set(COMMANDS)
    assert len(OPTIONS) > 60


@pytest.mark.parametrize("command,action,text", OPTIONS, ids=IDS)
def test_every_option_says_its_default(command, action, text):
    required = action.required or (not action.option_strings and action.nargs is None)
    assert ("(required)" if required else "default") in text, text


@pytest.mark.parametrize("command,action,text", OPTIONS, ids=IDS)
def test_every_number_says_its_unit(command, action, text):
    if action.type not in NUMERIC:
        return
    assert any(unit in text for unit in UNITS), text


def test_a_block_is_sized_in_tokens_everywhere():
    for command, action, text in OPTIONS:
        assert "slots per block" not in text, (command, text)
        if "--block-size" in action.option_strings:
            assert "tokens per block" in text, (command, text)


def test_seqs_means_one_thing():
    """``prove --seqs`` is sequence slots; ``plan``'s running batch is ``--running-seqs``, its
    old spelling ``--seqs`` still accepted but no longer shown."""
    shown = {c for c, a, _ in OPTIONS if "--seqs" in a.option_strings}
    assert shown == {"prove"}
    plan = _subparsers()["plan"]
    assert plan.parse_args(["--seqs", "7"]).running_seqs == 7
    assert plan.parse_args(["--running-seqs", "9"]).running_seqs == 9
    assert plan.parse_args([]).running_seqs == 256
    assert "--seqs" not in plan.format_help()


def test_top_level_help_says_what_kvcheck_is(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and "kvcheck.commands" not in text
    assert "block manager" in text and "KV cache" in text and "counterexample" in text
