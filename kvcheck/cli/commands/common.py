"""Argument types and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvcheck.defaults import SEED


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
    from kvcheck.check.trace import MAX_BLOCK_SIZE

    value = positive_int(text)
    if value > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_BLOCK_SIZE} tokens per block (the largest block a trace records), "
            f"got {value}")
    return value


def num_blocks(text: str) -> int:
    """A pool size kvcheck runs: 1 .. ``kvcheck.check.trace.MAX_BLOCKS`` (the largest pool a
    trace can record), refused up front rather than found unrecordable after the run."""
    from kvcheck.check.trace import MAX_BLOCKS

    value = positive_int(text)
    if value > MAX_BLOCKS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_BLOCKS} blocks (the largest pool a trace records), got {value}")
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


def mix_weights(text: str) -> dict:
    """``allocate=2,fork=0.5,max_prompt=12``: the driver's operation mix (names checked by
    the command against its driver's): non-negative numbers, ``max_prompt`` a positive
    integer."""
    import re

    out: dict = {}
    for part in text.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or not re.fullmatch(r"[a-z_]{1,32}", name):
            raise argparse.ArgumentTypeError(f"expected NAME=NUMBER pairs separated by commas, "
                                             f"got {part.strip()!r}")
        if name in out:
            raise argparse.ArgumentTypeError(f"{name} given twice")
        if name == "max_prompt":
            out[name] = positive_int(value)
            continue
        try:
            out[name] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a number, got {value!r}") from None
        if not 0.0 <= out[name] < float("inf"):
            raise argparse.ArgumentTypeError(f"{name}: expected a non-negative number, got {value}")
    return out


# -- flags shared by several commands: one name, one help text per concept ----------------------
def add_target(p, default: str, what: str = "allocator") -> None:
    p.add_argument("target", nargs="?", default=default,
                   help=f"the {what} to check: a registered name, module:attr or file.py:attr "
                        f"(default: %(default)s)")


def add_pool(p, blocks: int, block_size: int, blocks_help: str = "pool size") -> None:
    p.add_argument("--blocks", type=num_blocks, default=blocks, metavar="N",
                   help=f"{blocks_help}, in blocks, at most 1048576 (the largest pool a trace "
                        f"records) (default: %(default)s)")
    p.add_argument("--block-size", type=globals()["block_size"], default=block_size,
                   metavar="TOKENS", help="tokens per block, at most 65536 (the largest block "
                                          "a trace records) (default: %(default)s)")


def add_seed(p) -> None:
    p.add_argument("--seed", type=nonneg_int, default=SEED, metavar="N",
                   help="random seed, an integer: the same seed gives the same run "
                        "(default: %(default)s)")


def add_timeout(p, what: str = "operation") -> None:
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help=f"seconds one {what} may take before it counts as a hang "
                        f"(default: %(default)g)")


def add_json(p) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text (default: off)")


def add_trace_out(p, what: str = "the counterexample as a JSON trace") -> None:
    p.add_argument("--trace-out", metavar="FILE",
                   help=f"write {what} to FILE (default: not written)")


def add_junit(p) -> None:
    p.add_argument("--junit", metavar="FILE",
                   help="write JUnit XML to FILE: one test case per run, failed with the "
                        "counterexample when a violation was found (default: not written)")


def junit_run(command: str, target: str, scope: str, seconds: float, violation=None,
              text: str = "", skipped: str | None = None) -> str:
    """JUnit XML for one checked run: one suite, one case, failed with ``text`` (the rendered
    counterexample) when ``violation`` is set, skipped (``skipped``: why) when what it was to
    check did not run."""
    from kvcheck.report.junit import Case, Suite, junit_xml

    case = Case(f"kvcheck.{command.replace('-', '_')}", f"{target} [{scope}]", seconds, text=text,
                skipped=skipped if violation is None else None)
    if violation is not None:
        case.failure = f"{violation.kind}: {violation.name}"
        case.failure_type = violation.kind
    return junit_xml([Suite(f"kvcheck {command}: {target}", [case])], f"kvcheck {command}")


def add_out_of_blocks(p) -> None:
    p.add_argument("--out-of-blocks", metavar="module:Name",
                   help="the exception class the target raises when it is out of blocks "
                        "(default: any exception class named OutOfBlocks)")


def nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def add_shrink_seconds(p) -> None:
    """``--shrink-budget`` (operations replayed: the same trace on any machine) and
    ``--shrink-seconds`` (a wall-clock cap), the same defaults for every command that
    shrinks (``kvcheck.defaults``)."""
    from kvcheck.defaults import SHRINK_SECONDS, SHRINK_STEPS

    p.add_argument("--shrink-budget", type=nonneg_int, default=SHRINK_STEPS, metavar="OPS",
                   help="what shrinking a counterexample may spend, in operations replayed: "
                        "counted in work, not time, so the same command prints the same trace "
                        "on an idle and a loaded machine; when it runs out the trace says so "
                        "and how long it still is (default: %(default)s)")
    p.add_argument("--shrink-seconds", type=nonneg_float, default=SHRINK_SECONDS,
                   metavar="SECONDS",
                   help="a wall-clock cap on shrinking, in seconds, an outer limit only: when it "
                        "cuts, the "
                        "trace says so (it is still a counterexample, perhaps a longer one) "
                        "(default: %(default)g)")


def shrink_budget(args):
    """The ``kvcheck.check.shrink.Budget`` the shrink flags give."""
    from kvcheck.check.shrink import Budget

    return Budget(args.shrink_budget, args.shrink_seconds)


def stopped_note(minimality: str) -> str:
    """`` (shrinking stopped at its 5 s wall-clock cap, not proven 1-minimal)`` for a verdict
    line, when the shrinking budget ran out ('' otherwise)."""
    if not minimality.startswith("shrinking stopped at its "):
        return ""
    return f" ({minimality.split(':')[0]}, not proven 1-minimal)"


def check_outputs(*outputs: tuple[str | None, str]) -> None:
    """Before a run: every ``(path, flag)`` given can be written, and no two are the same file;
    else ``UsageError`` (one line, exit 2) before any time is spent."""
    from kvcheck.errors import UsageError

    seen: dict[str, str] = {}
    for path, flag in outputs:
        if not path:
            continue
        problem = _unwritable(path)
        if problem:
            raise UsageError(f"{flag} {path}: {problem}")
        key = os.path.realpath(path)
        if key in seen and not _is_device(path):
            raise UsageError(f"{flag} and {seen[key]} name the same file {path}")
        seen[key] = flag


def _is_device(path: str) -> bool:
    try:
        return Path(path).exists() and not Path(path).is_file()
    except (OSError, ValueError):
        return False


def _unwritable(path: str) -> str:
    """Why ``path`` cannot be written ('' when it can, as far as can be told beforehand)."""
    try:
        p = Path(path)
        if p.is_dir():
            return "is a directory"
        parent = p.parent
        if not parent.exists():
            return f"directory {parent} does not exist"
        if not parent.is_dir():
            return f"{parent} is not a directory"
        if p.exists():
            return "" if os.access(p, os.W_OK) else "not writable"
        return "" if os.access(parent, os.W_OK | os.X_OK) else f"cannot create files in {parent}"
    except ValueError as exc:  # e.g. a NUL in the name
        return str(exc)
    except OSError as exc:
        return exc.strerror or str(exc)


def write_output(path: str, text: str, flag: str) -> bool:
    """After a run: write ``text`` to ``path``. On failure say so in one line on stderr and
    return False; the run's result is still printed and its verdict stands."""
    try:
        Path(path).write_text(text, encoding="utf-8")
        return True
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        print(f"kvcheck: error: cannot write {flag} {path}: {reason}", file=sys.stderr)
        return False


def exit_code(verdict: int, written: bool) -> int:
    """The verdict's exit code; a pass whose requested output could not be written is 2."""
    return verdict if written or verdict != 0 else 2


def emit_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


class Progress:
    """One line of progress on stderr, only when stderr is a terminal (nothing otherwise, and
    commands pass none with ``--json``): a bar (``progress(done)`` of ``total``), a status
    line (``progress.say("stage: detail")``) and ``progress.shrinking(attempts, length)``.

    Frequent updates are drawn at most ten times a second; a new stage (the text before the
    first colon) is always drawn at once. Drawn or not (``show``), it keeps how far the run
    got, for ``interrupted``."""

    def __init__(self, total: int = 0, label: str = "", unit: str = "", show: bool = True):
        self.total, self.label, self.unit = total, label, unit
        try:
            self.enabled = show and bool(sys.stderr.isatty())
        except (AttributeError, OSError, ValueError):  # no stderr, or a closed one
            self.enabled = False
        self._stage, self._drawn, self._width = None, 0.0, 0
        self.done = 0  # the last count told
        self.shrunk: tuple[int, int, str] | None = None  # (attempts, length, unit) once shrinking

    def __call__(self, done: int) -> None:
        self.done = done
        if not self.enabled or not self.total:
            return
        width = 30
        filled = width * min(done, self.total) // self.total
        unit = f" {self.unit}" if self.unit else ""
        self._draw(f"{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                   f"{done}/{self.total}{unit}", stage=f"{self.label} [")

    def say(self, text: str) -> None:
        if self.enabled:
            self._draw(text, stage=text.split(":")[0])

    def shrinking(self, attempts: int, length: int, unit: str = "operations") -> None:
        """A shrinker's callback: candidates tried so far, and the current counterexample."""
        self.shrunk = (attempts, length, unit)
        self.say(f"{self.label}: shrinking: {attempts} attempts, counterexample of {length} "
                 f"{unit}")

    def _draw(self, text: str, stage: str) -> None:
        import time

        now = time.monotonic()
        if stage == self._stage and now - self._drawn < 0.1:
            return
        self._stage, self._drawn = stage, now
        try:
            columns = os.get_terminal_size(sys.stderr.fileno()).columns or 80
        except (AttributeError, OSError, ValueError):
            columns = 80
        text = text[: max(20, columns - 1)]
        sys.stderr.write("\r" + text + " " * max(0, self._width - len(text)))
        sys.stderr.flush()
        self._width = len(text)

    def interrupted(self, seed=None) -> str:
        """On Ctrl-C: end the progress line where it stands (a final newline: it stays on the
        terminal, the ``^C`` after it), and how far the run got, in words."""
        if self.enabled and self._width:
            try:
                sys.stderr.write("\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            self._width = 0
        where = "" if seed is None else f" (seed {seed})"
        if self.shrunk is not None:
            attempts, length, unit = self.shrunk
            return (f"while shrinking{where}: a violation was found, and its counterexample was "
                    f"down to {length:,} {unit} after {attempts:,} attempts; nothing printed (run "
                    f"it again to the end to see it)")
        of = f" of {self.total:,}" if self.total else ""
        return (f"after {self.done:,}{of} {self.unit or 'steps'}{where}: no violation so far, "
                f"no verdict")

    def close(self) -> None:
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
            self._width = 0
