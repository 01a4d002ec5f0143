"""Errors that mean "bad input": the CLI prints them as one line and exits 2."""


class UsageError(Exception):
    """Bad input detected while running a command (exit 2, one-line message)."""
