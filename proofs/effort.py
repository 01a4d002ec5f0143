"""Solver work counted in Z3's resource units: what bounds a proof, never the clock.

Z3 counts the work of a query in resource units (its ``rlimit``): for the same query,
asked in the same order, the count is the same on an idle and on a loaded machine (its
search is deterministic for a seed). So every query kvcheck asks is bounded in those
units (``limit``), and whether a query is decided never depends on the load: a query
that uses its units up reads ``EFFORT`` (a larger ``--effort`` decides it), the same
everywhere.

The wall clock (``kvcheck prove --budget``) is only an outer limit: a query it stops
reads ``TIME``, and whatever it stops makes the verdict INCONCLUSIVE, never PASS or
FAIL. Each solver also gets the time left as its Z3 ``timeout`` so that the outer limit
holds within a query.

An idle core of this project's 2-core machine does about 6 million units a second.
"""

from __future__ import annotations

import contextlib

import z3

QUERY_UNITS = 120_000_000
"""One query's units at ``--effort 1`` (about 20 s of an idle core)."""

SAT, UNSAT = "sat", "unsat"
TIME = "unknown: the time budget ran out"  # stopped by the wall clock (--budget)
EFFORT = "unknown: its effort ran out"  # stopped by its resource units (--effort)

_SCALE = [1.0]  # the run's --effort: every allowance is multiplied by it


@contextlib.contextmanager
def scaled(effort: float):
    """Within the block, every allowance is ``effort`` times its default."""
    _SCALE.append(float(effort))
    try:
        yield
    finally:
        _SCALE.pop()


def scale() -> float:
    return _SCALE[-1]


def units(base: int) -> int:
    """``base`` resource units at the run's effort (at least 1)."""
    return max(1, int(base * _SCALE[-1]))


def used() -> int:
    """Resource units Z3 has counted in this process so far (its context's count)."""
    stats = z3.Solver().statistics()
    return int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() else 0


def limit(solver, rlimit: int, timeout_ms: int | None = None) -> None:
    """Bound ``solver``'s next check: ``rlimit`` units (0: none) and, as the outer limit,
    ``timeout_ms`` of wall-clock time (None: none)."""
    solver.set("rlimit", max(0, int(rlimit)))
    solver.set("timeout", 4_294_967_295 if timeout_ms is None else max(1, int(timeout_ms)))


def check(solver) -> str:
    """``solver.check()`` as ``SAT``, ``UNSAT``, ``TIME`` or ``EFFORT``."""
    r = solver.check()
    if r == z3.sat:
        return SAT
    if r == z3.unsat:
        return UNSAT
    return TIME if solver.reason_unknown() == "timeout" else EFFORT


def decided(answer) -> bool:
    return str(answer) in (SAT, UNSAT)


def undecided_by(answers) -> str:
    """Which limit left ``answers`` undecided: ``TIME`` if the clock stopped any, else
    ``EFFORT`` ('' when every one is decided)."""
    answers = [str(a) for a in answers]
    if TIME in answers:
        return TIME
    return EFFORT if any(a not in (SAT, UNSAT) for a in answers) else ""


def hint(why: str) -> str:
    """What decides a query left undecided by ``why``."""
    if why == TIME:
        return "cut by the time budget: a larger --budget decides it"
    return "the solver's effort ran out: a larger --effort decides it"
