"""Errors raised by the reference implementations.

``OutOfBlocks`` is the one *expected* failure of an allocator: the pool cannot
serve the request right now. Its contract (see ``kvcheck.spec.contracts``) is
that nothing observable changed. ``Refused`` is a deliberate refusal under a
policy the allocator declares (a watermark, a caller's capacity heuristic): it
may come although blocks are free, and like out-of-blocks it changes nothing
(``kvcheck.spec.contracts.refused``; ``SeedAdapter`` recognises any exception
class named ``Refused``). ``MisuseError`` is a caller bug (unknown or
duplicate sequence id, bad size); it is raised before any state is touched.
"""


class OutOfBlocks(Exception):
    """The pool has too few free blocks for this operation; nothing changed."""


class Refused(Exception):
    """Declined under the allocator's declared policy (not out of blocks); nothing changed."""


class MisuseError(ValueError):
    """The caller broke an operation's precondition; nothing changed."""
