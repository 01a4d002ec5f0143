"""Errors raised by the reference implementations.

``OutOfBlocks`` is the one *expected* failure of an allocator: the pool cannot
serve the request right now. Its contract (see ``kvcheck.spec.contracts``) is
that nothing observable changed. ``Refused`` is a deliberate refusal under a
policy the allocator declares (a watermark, a caller's capacity heuristic): it
may come although blocks are free, and like out-of-blocks it changes nothing
(``kvcheck.spec.contracts.refused``; ``SeedAdapter`` recognises any exception
class named ``Refused``). ``MisuseError`` is a caller bug (unknown or
duplicate sequence id, bad size); it is raised before any state is touched.
``StandInGap`` is none of the engine's doing: the release asked one of kvcheck's stand-ins
(a settings object, a stand-in class standing for a worker or a tokenizer) for something it
does not give, so kvcheck cannot run that release as it is. It is never judged as the
target's exception, even wrapped in one of the engine's (``kvcheck.errors.what_it_did``
raises it on): the command says so in one line and exits 2, no verdict.
"""


class OutOfBlocks(Exception):
    """The pool has too few free blocks for this operation; nothing changed."""


class Refused(Exception):
    """Declined under the allocator's declared policy (not out of blocks); nothing changed."""


class MisuseError(ValueError):
    """The caller broke an operation's precondition; nothing changed."""


class StandInGap(Exception):
    """A release read something a kvcheck stand-in does not give (kvcheck's gap, not the
    engine's fault). Found anywhere in the chain of the exception a target raised (the
    engine may wrap it in one of its own), it ends the run without a verdict."""


class StandInMissing(StandInGap, AttributeError):
    """A stand-in asked for an attribute it does not have (a setting, a method of a stand-in
    worker): an ``AttributeError`` too, so a release's ``getattr(obj, name, default)`` still
    gets its default."""


def stand_in_gap(exc: BaseException | None) -> StandInGap | None:
    """The ``StandInGap`` in ``exc``'s chain (itself, its cause or context), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, StandInGap):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
