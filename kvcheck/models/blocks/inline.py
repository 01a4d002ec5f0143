"""Inline code for the vocabulary of the oracle's state classes.

The compiled checks (``kvcheck.models.blocks.compiled``) would otherwise call a
vocabulary method per term; for the hot ones a state class can give the
code instead. ``FOR[cls][method](role, *args)`` returns ``(code, binds)``:
the expression, over the emitted argument texts, and the locals it reads
(``role_field`` -> ``role.field``), or None to call the method. Each template
must mean exactly what its method does; ``tests/core/test_compiled.py``
checks them against the methods on random states.

A template that repeats an argument asks for a ``simple`` one (a name or a
number), so nothing is evaluated twice.
"""

from __future__ import annotations

from kvcheck.compile.emit import simple
from kvcheck.models.blocks.ghost import After, Ghost
from kvcheck.spec.state import Snapshot


def _binds(role: str, *fields: str) -> dict[str, str]:
    return {f"{role}_{f}": f"{role}.{f}" for f in fields}


def _guarded_ref(r, b):
    if not simple(b):
        return None
    return f"({r}_refs[{b}] if 0 <= {b} < {r}_num_blocks else 0)", _binds(r, "refs", "num_blocks")


def _table_entry(table: str, i: str) -> str:
    return f"({table}[{i}] if 0 <= {i} < len({table}) else -1)"


# Ghost and Snapshot: every table in ``tables`` (q -> tuple), refcounts in ``refs``.
_TABLES = {
    "ref": _guarded_ref,
    "live": lambda r, q: (f"({q} in {r}_tables)", _binds(r, "tables")),
    "length": lambda r, q: (f"{r}_lengths.get({q}, 0)", _binds(r, "lengths")),
    "nblocks": lambda r, q: (f"len({r}_tables.get({q}, ()))", _binds(r, "tables")),
    "tail": lambda r, q: (f"({r}_tables.get({q}) or (-1,))[-1]", _binds(r, "tables")),
    "table": lambda r, q, i: (_table_entry(f"{r}_tables.get({q}, ())", i), _binds(r, "tables"))
    if simple(q) and simple(i) else None,
    "occurrences": lambda r, q, b: (f"{r}_tables.get({q}, ()).count({b})", _binds(r, "tables")),
}

GHOST = {
    **_TABLES,
    "free_count": lambda r, b: (
        f"(1 if 0 <= {b} < {r}_num_blocks and {r}_refs[{b}] == 0 else 0)",
        _binds(r, "refs", "num_blocks")) if simple(b) else None,
    "num_free": lambda r: (f"{r}_free_len", _binds(r, "free_len")),
    "free_entries": lambda r: (f"{r}_zero", _binds(r, "zero")),
    "zero_refs": lambda r: (f"{r}_zero", _binds(r, "zero")),
    "holders": lambda r, b: (f"{r}_holders_count.get({b}, 0)", _binds(r, "holders_count")),
}

SNAPSHOT = {
    **_TABLES,
    "free_count": lambda r, b: (f"{r}_free.get({b}, 0)", _binds(r, "free")),
    "num_free": lambda r: (f"{r}__num_free", _binds(r, "_num_free")),
    "free_entries": lambda r: (f"{r}__free_entries", _binds(r, "_free_entries")),
    "zero_refs": lambda r: (f"{r}__zero", _binds(r, "_zero")),
    "holders": lambda r, b: (f"{r}__holders.get({b}, 0)", _binds(r, "_holders")),
}


def _post_table(r: str, q: str) -> str:
    return f"({r}_tables[{q}] or ())"


# After: only touched sequences are asked about (the compiled checks' domain is
# the operation's own sequences), so ``tables[q]`` is read directly (None: gone);
# a block not observed yet goes through the method.
AFTER = {
    "live": lambda r, q: (f"({r}_tables[{q}] is not None)", _binds(r, "tables")),
    "length": lambda r, q: (f"{r}_lengths.get({q}, 0)", _binds(r, "lengths")),
    "nblocks": lambda r, q: (f"len({_post_table(r, q)})", _binds(r, "tables")),
    "tail": lambda r, q: (f"({r}_tables[{q}] or (-1,))[-1]", _binds(r, "tables")),
    "table": lambda r, q, i: (_table_entry(_post_table(r, q), i), _binds(r, "tables"))
    if simple(q) and simple(i) else None,
    "ref": lambda r, b: (f"({r}_refs[{b}] if {b} in {r}_refs else {r}_ref({b}))",
                         _binds(r, "refs", "ref")) if simple(b) else None,
    "free_count": lambda r, b: (
        f"((1 if {r}_refs[{b}] == 0 else 0) if {b} in {r}_refs else {r}_free_count({b}))",
        _binds(r, "refs", "free_count")) if simple(b) else None,
    "holders": lambda r, b: (f"({r}_gholders.get({b}, 0) + {r}_holder_delta.get({b}, 0))",
                             {**_binds(r, "holder_delta"), f"{r}_gholders": f"{r}.ghost.holders_count"}),
    "occurrences": lambda r, q, b: (f"{_post_table(r, q)}.count({b})", _binds(r, "tables")),
    "impl_length": lambda r, q: (f"{r}_impl_lengths[{q}]", _binds(r, "impl_lengths")),
    "reserved": lambda r, q: (f"{r}_reservations.get({q}, 0)", _binds(r, "reservations")),
    "sharers": lambda r, q: (f"{r}_sharer_counts[{q}]", _binds(r, "sharer_counts")),
    # ``other`` must be the Ghost bound to ``pre`` (the contracts' only use).
    "same_table": lambda r, q, other, p, upto: (
        (f"({_post_table(r, q)} == {other}.tables.get({p}, ()))" if upto == "None" else
         f"({_post_table(r, q)}[:{upto}] == {other}.tables.get({p}, ())[:{upto}])"),
        _binds(r, "tables")) if other == "s_pre" else None,
}

FOR = {Ghost: GHOST, Snapshot: SNAPSHOT, After: AFTER}
