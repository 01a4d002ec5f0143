"""Argument types and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr, ``PROGRAM: error: ...``, exit 2 (also
    from a subcommand's parser: PROGRAM is the first word of its ``prog``)."""

    def error(self, message):
        self.exit(2, f"{self.prog.split()[0]}: error: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def block_size(text: str) -> int:
    """A block size kvcheck runs: 1 .. ``kvcheck.trace.MAX_BLOCK_SIZE`` (the largest a
    trace can record, far beyond any engine's blocks)."""
    from kvcheck.trace import MAX_BLOCK_SIZE

    value = positive_int(text)
    if value > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_BLOCK_SIZE} tokens per block (the largest block a trace records), "
            f"got {value}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def emit_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


class Progress:
    """A one-line progress bar on stderr, only when it is a terminal."""

    def __init__(self, total: int, label: str):
        self.total, self.label = total, label
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        if not self.enabled or not self.total:
            return
        width = 30
        filled = width * done // self.total
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()
