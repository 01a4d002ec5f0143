"""Evidence for a broken clause: the spec's own terms, with their values before and after.

When a check fails, the checker re-evaluates the spec function that names the
failing clause with its states wrapped in recorders (``Recorder``): every
vocabulary term the spec reads (``ref(3)``, ``holders(3)``, ``length(0)``,
``same_table(1, pre, 0)`` ...) is logged with its value. The clause's
evidence is what it read since the previous clause, plus what the function
read before its first clause (the quantities its clauses share), each term
valued in both states where there are two. Which kind of element a clause is
about (a block, a sequence) is seen the same way: the domains and the
operation's arguments are handed over as tagged integers (``BlockId``,
``SeqId``), so the element a clause names says what it is.

Nothing here knows any clause by name: renaming or adding a clause in the
spec changes the reports by itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kvcheck.check.watchdog import CONTROL
from kvcheck.spec.state import BLOCK_ARGS, NULL

MAX_TERMS = 16


class BlockId(int):
    """A block id, as the spec sees it when evidence is gathered."""

    subject = "block"


class SeqId(int):
    """A sequence id, likewise."""

    subject = "seq"


TAGS = {"block": BlockId, "seq": SeqId}


def tag(kind: str | None, value):
    """``value`` tagged as an id of ``kind`` ("block" / "seq"), if it is an int."""
    cls = TAGS.get(kind)
    if cls is None or type(value) is not int:
        return value
    return cls(value)


def subject_of(element) -> str | None:
    return getattr(element, "subject", None)


def tagged_domain(dom):
    """A copy of a spec ``Domain`` (``blocks``, ``seqs``) whose elements come tagged."""
    import copy as _copy

    t = _copy.copy(dom)
    t.blocks = [tag("block", b) for b in dom.blocks]
    t.seqs = [tag("seq", q) for q in dom.seqs]
    return t


@dataclass
class Reading:
    """One term read by the spec: ``state.method(*args) = value``."""

    state: str
    method: str
    args: tuple
    value: object

    def key(self) -> tuple:
        return (self.method, self.args)


class Recorder:
    """A state that logs every term read through it (scalars only: domains are not terms)."""

    def __init__(self, state, label: str, log: list):
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        attr = getattr(self._state, name)
        if name.startswith("_") or not callable(attr):
            return attr
        if name in ("blocks", "seqs", "positions"):
            return lambda *args: _tagged_domain(name, attr(*_unwrap(args)))
        log, label = self._log, self._label

        def read(*args):
            plain = _unwrap(args)
            value = attr(*plain)
            if isinstance(value, (bool, int, str)) or value is None:
                log.append(Reading(label, name, tuple(_show_arg(a) for a in args), value))
            return value

        return read


def _unwrap(args) -> tuple:
    return tuple(a._state if isinstance(a, Recorder) else a for a in args)


def _show_arg(a):
    if isinstance(a, Recorder):
        return a._label
    return int(a) if isinstance(a, int) and not isinstance(a, bool) else a


def _tagged_domain(name: str, values):
    kind = {"blocks": "block", "seqs": "seq"}.get(name)
    return [tag(kind, v) for v in values] if kind else values


def tagged_op(op, spec):
    """A copy of ``op`` whose sequence and block arguments and results are tagged."""
    t = copy.copy(op)
    for a in (*spec.args, *spec.results):
        kind = {"seq": "seq", "new_seq": "seq", "block": "block"}.get(a.role)
        if kind is not None:
            setattr(t, a.name, tag(kind, getattr(op, a.name, None)))
    return t


@dataclass
class Evidence:
    """Why a clause failed: its name, element (with what kind of thing it is) and terms."""

    name: str
    element: object
    subject: str | None
    terms: list[dict]


def for_clauses(clauses, states: dict, log: list) -> Evidence | None:
    """Run a spec generator ``clauses`` (built over ``Recorder`` s writing to ``log``) to
    its first failing clause; its evidence, terms valued in every state of ``states``
    (label -> the plain state). None if every clause holds."""
    prelude: list[Reading] | None = None
    for name, element, holds in clauses:
        own = list(log)
        del log[:]
        if prelude is None:  # read before the first clause: what every clause shares
            prelude = own
        if not holds:
            readings = own + [r for r in prelude if r not in own]
            return Evidence(name, _plain(element), subject_of(element), values(readings, states))
    return None


def for_invariant(inv, L, s, x) -> Evidence:
    """A state invariant's evidence at element ``x`` (its domain says what ``x`` is)."""
    log: list = []
    kind = {"block": "block", "seq": "seq"}.get(inv.domain)
    inv.holds_for(L, Recorder(s, "state", log), tag(kind, x) if x is not None else None)
    return Evidence(inv.name, x, kind, values(log, {"state": s}))


def values(readings: list[Reading], states: dict) -> list[dict]:
    """Each distinct term once, valued in every state that has it (before / after)."""
    out, seen = [], set()
    for r in readings:
        if r.key() in seen:
            continue
        seen.add(r.key())
        row = {"term": _term_text(r)}
        for label, state in states.items():
            row[label] = _value_in(state, r, states)
        out.append(row)
        if len(out) >= MAX_TERMS:
            break
    return out


def _term_text(r: Reading) -> str:
    blocks = BLOCK_ARGS.get(r.method, ())
    args = ", ".join("null" if i in blocks and a == NULL else str(a)
                     for i, a in enumerate(r.args) if a is not None)
    return f"{r.method}({args})"


def _value_in(state, r: Reading, states: dict):
    args = tuple(states[a] if isinstance(a, str) and a in states else a for a in r.args)
    try:
        value = getattr(state, r.method)(*args)
    except CONTROL:
        raise
    except BaseException:  # noqa: BLE001 - a term a partial view cannot give: unknown
        return None
    return value if isinstance(value, (bool, int, str)) or value is None else None


def _plain(element):
    return int(element) if isinstance(element, int) and not isinstance(element, bool) else element
