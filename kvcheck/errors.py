"""Errors that mean "bad input": the CLI prints them as one line and exits 2; the exit
codes every command shares."""

# Exit codes, the same for every command (README "Exit codes").
PASS = 0  # everything checked holds
FAIL = 1  # a counterexample or a disproved property, shown
BAD_INPUT = 2  # one line on stderr
INTERNAL = 3  # a bug in kvcheck itself
INCONCLUSIVE = 4  # a budget or timeout cut the work short: nothing failed, not everything decided
INTERRUPTED = 130  # the user's Ctrl-C


class UsageError(Exception):
    """Bad input detected while running a command (exit 2, one-line message)."""


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` for an exception a target raised, whatever it does.

    Its ``__str__`` may itself raise or return megabytes: the text is cut to
    ``limit`` characters, and an unprintable message is said to be one."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a target's __str__ may raise anything
        text = "<its message could not be printed: __str__ raised>"
    if not isinstance(text, str):
        text = "<its message is not text>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    text = " ".join(text.split())
    return f"{name}: {text}" if text else name


def what_it_did(exc: BaseException) -> str:
    """A target's exception as a verb phrase: ``raised Type: message``, or
    ``called sys.exit(0)`` / ``called os._exit(0)`` for a target that tried to end the process.

    A ``StandInGap`` in the exception's chain (``kvcheck.impl.errors``: a release read
    something one of kvcheck's stand-ins does not give) is not the target's to be judged
    for: every place that words a target's exception as its crash comes here, so it is
    raised on from here, to end the run with one line and exit 2 (``kvcheck.cli.dispatch``),
    never a FAIL."""
    from kvcheck.impl.errors import stand_in_gap

    gap = stand_in_gap(exc)
    if gap is not None:
        raise gap
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})" if exc.code is not None else "called sys.exit()"
    if type(exc).__name__ == "TargetExit":
        return f"called os._exit({getattr(exc, 'code', '?')!r})"
    return f"raised {describe_exception(exc)}"
