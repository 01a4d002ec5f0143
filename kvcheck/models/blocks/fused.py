"""The fast mode's fused steps: one generated function per operation kind and outcome
that observes what the operation touched, checks it, plays the caller and commits the
verified state, in one pass over plain locals.

``Oracle._step_fast`` goes through layers: it builds an ``After`` (dictionaries of what
was observed), hands it to the compiled step check (``compiled.step_for``, which reads
those dictionaries back), records the caller's writes, reads the shadow back and commits
the ``After`` into the ``Ghost``. For the operations of one sequence (``SINGLE``) this
module generates, per kind and outcome, one function doing all of that:

* observing: the sequence's table (``read_table``), own length, table identity, the
  refcounts of every pool block its table names before or after and of the blocks the
  operation returned, exactly the reads ``After`` makes, in the same order, through the
  same readers (``kvcheck.targets.observe``);
* checking: the operation's contract and every invariant not needing free-list
  membership, traced from the spec's own text (``kvcheck.compile``) exactly as
  ``compiled.step_for`` traces them, with one difference: the sequence invariants over
  the touched sequences that are live afterwards are stated for the operation's own
  sequence under a branch on its liveness (what the ``live`` domain holds for one
  sequence), so every post-state term of it reads a local (``POST``'s templates);
* on success: the caller's part (``_record``'s shadow writes and bookkeeping for the
  kind), the read-back of what changed, and the ghost commit (``Ghost.commit`` for one
  sequence).

A failing check returns what it observed, untouched otherwise: the oracle then checks
the operation the general way on those very observations (``After(..., seen=...)``),
so the spec itself names the clause, and must agree it is broken. Every clause and
invariant name stays in ``spec/``; nothing here states a rule. To read the code:

    python3 -c "from kvcheck.models.blocks import fused; print(fused.source('append_slot', 'ok'))"
"""

from __future__ import annotations

from functools import cache

from kvcheck.compile.emit import Emitter, simple
from kvcheck.compile.terms import Term
from kvcheck.compile.tracer import TL, TDomain, TState, Untraceable, trace
from kvcheck.models.blocks import compiled as compiled_checks
from kvcheck.models.blocks.ghost import Ghost, _count_change
from kvcheck.models.blocks.inline import FOR
from kvcheck.spec import contracts
from kvcheck.spec.contracts import OK, Domain
from kvcheck.spec.logic import PY
from kvcheck.targets.observe import read_identity, read_len, read_num_free, read_ref, read_refs_of, read_table

# The kinds fused: one sequence each (``op.seq``), with what ``_record`` does for them.
# (fork and rebase touch two sequences, rollback and the window drop read the verified
# state while recording: they keep the general path.)
SINGLE = ("allocate", "append_slot", "append_slots", "free_seq", "preempt")


class Unfusable(Exception):
    """The traced step reads something the fused function does not hold in a local."""


def _ref_outside(target, refs: dict, b, n: int) -> int:
    """``After.ref`` of a block the operation did not touch (read on demand, kept)."""
    if not (type(b) is int and 0 <= b < n):
        return 0
    r = refs[b] = read_ref(target, b)
    return r


def _entry(table: tuple, i) -> int:
    return table[i] if 0 <= i < len(table) else -1


def _q(q: str) -> None:
    if q != "s_seq":
        raise Unfusable(f"a post-state term of {q}, not the operation's sequence")


def _post(method):
    def template(role, q, *args):
        _q(q)
        return method(*args), {}
    return template


# The post state's vocabulary on the operation's sequence (``s_seq``) as the fused
# function's locals: f_new (its table, None: gone), f_tab (f_new or ()), f_len (its
# length), f_impl (its own length, resolved), f_res (reserved), f_shr (sharers), f_refs
# (refcounts observed), f_hd (holder changes), f_gh (the ghost's holder counts), f_nf /
# f_zero (the free count and refcount-0 blocks). Each means what ``After``'s method does.
POST = {
    "live": _post(lambda: "(f_new is not None)"),
    "length": _post(lambda: "f_len"),
    "nblocks": _post(lambda: "len(f_tab)"),
    "tail": _post(lambda: "(f_new or (-1,))[-1]"),
    "table": _post(lambda i: f"(f_tab[{i}] if 0 <= {i} < len(f_tab) else -1)" if simple(i)
                   else f"_entry(f_tab, {i})"),
    "occurrences": _post(lambda b: f"f_tab.count({b})"),
    "impl_length": _post(lambda: "f_impl"),
    "reserved": _post(lambda: "f_res"),
    "sharers": _post(lambda: "f_shr"),
    "same_table": lambda role, q, other, p, upto: (_q(q), _same_table(other, p, upto))[1],
    "ref": lambda role, b: (
        f"(f_refs[{b}] if {b} in f_refs else _ref_outside(f_target, f_refs, {b}, s_N))", {})
    if simple(b) else None,
    "free_count": lambda role, b: (
        f"((1 if f_refs[{b}] == 0 else 0) if {b} in f_refs else "
        f"(1 if 0 <= {b} < s_N and _ref_outside(f_target, f_refs, {b}, s_N) == 0 else 0))",
        {}) if simple(b) else None,
    "holders": lambda role, b: (f"(f_gh.get({b}, 0) + f_hd.get({b}, 0))", {}),
    "num_free": lambda role: ("f_nf", {}),
    "zero_refs": lambda role: ("f_zero", {}),
    "free_entries": lambda role: ("f_zero", {}),
}


def _same_table(other: str, p: str, upto: str):
    if other != "s_pre":
        raise Unfusable("same_table against a state other than the verified one")
    if upto == "None":
        return f"(f_tab == s_pre.tables.get({p}, ()))", {}
    return f"(f_tab[:{upto}] == s_pre.tables.get({p}, ())[:{upto}])", {}


def _clauses(kind: str, outcome: str):
    """``compiled.step_source``'s clauses for ``kind`` ending with ``outcome``: the
    contract on the fast-mode domain, then the fast invariants, the sequence ones on the
    operation's sequence when it is live afterwards."""
    op = compiled_checks._TOp(kind, outcome)
    pre, post = TState("pre"), TState("post")
    seqs = compiled_checks._op_seqs(op)
    dom = Domain(TDomain(Term("sym", "blocks")), seqs)

    def clauses():
        yield from (f for _, _, f in contracts.clauses(TL, pre, post, op, dom))
        for inv in compiled_checks.FAST_INVARIANTS:
            if inv.domain == "global":
                yield inv.predicate(TL, post)
            elif inv.domain == "block":
                for b in TDomain(Term("sym", "blocks")):
                    yield inv.predicate(TL, post, b)
        for q in seqs:
            if post.live(q):  # (``live``: the touched sequences live afterwards)
                for inv in compiled_checks.FAST_INVARIANTS:
                    if inv.domain == "seq":
                        yield inv.predicate(TL, post, q)

    return trace(clauses)


# -- the parts around the check (the model's bookkeeping, as text) ------------------------
_OBSERVE = """\
    f_target = o.target
    pre = o.ghost
    q = op.seq
    lengths = o.lengths
    f_len = {length}
    f_old = pre.tables.get(q)
    f_new = read_table(f_target, q, f_old)
    blocks = {extra}
    if f_old:
        blocks.update(f_old)
    f_delta = {{}}
    if f_new is None:
        f_impl = f_ident = f_raw = None
        if f_old:
            _count_change(f_old, (), f_delta)
        f_tab = ()
    else:
        if f_new is not f_old:
            blocks.update(f_new)
            _count_change(f_old or (), f_new, f_delta)
        f_raw = read_len(f_target, q)
        f_was = pre.identities.get(q)
        f_ident = read_identity(f_target, q, f_was)
        f_impl = f_len if f_raw is None else f_raw
        f_tab = f_new
    f_hd = {{b: d for b, d in f_delta.items() if d}} if f_delta else {{}}
    if f_ident is None:
        f_shr = 1
    elif f_ident is f_was:  # (the same table as before: as many sharers as before)
        f_shr = pre.ident_count.get(f_ident, 0)
    else:
        f_shr = pre.ident_count.get(f_ident, 0) + (f_ident == f_ident) - (pre.identities.get(q) == f_ident)
    s_N = pre.num_blocks
    if blocks and (min(blocks) < 0 or max(blocks) >= s_N):
        blocks = {{b for b in blocks if 0 <= b < s_N}}
    f_refs = read_refs_of(f_target, blocks)
    f_res = {reserved}
    f_gh = pre.holders_count
"""

_NUM_FREE = "    f_nf = read_num_free(f_target)\n"
_ZERO = """\
    f_zero, f_grefs = pre.zero, pre.refs
    for b, r in f_refs.items():
        f_zero += (r == 0) - (f_grefs[b] == 0)
"""

# What each kind's caller does once the check passed (``Oracle._record`` for it), and
# the read-back of what changed (``Oracle._step_fast``'s).
_RECORD = {
    "append_slot": """\
    o.shadow.append(q, op.block, op.offset, op.cow_src)
    lengths[q] = f_len
    if o.shadow.mismatch(q, f_new, f_len - 1) is not None:
        f_bad = o._check_data({q: f_new}, lengths, o.steps, f_len - 1)
""",
    "allocate": """\
    o.shadow.allocate(q, op.n_tokens, f_tab)
    if f_res:
        o.reserved[q] = f_res
    else:
        o.reserved.pop(q, None)
    if q not in lengths:
        o._pos[q] = len(o._order)
        o._order.append(q)
    lengths[q] = f_len
    if f_new is not None and o.shadow.mismatch(q, f_new) is not None:
        f_bad = o._check_data({q: f_new}, lengths, o.steps)
""",
    "append_slots": """\
    f_first = lengths[q]
    sh = o.shadow
    for src, dst in op.copies or ():
        sh.copy(src, dst)
    sh.extend(q, op.n_tokens, f_tab)
    if f_res:
        o.reserved[q] = f_res
    else:
        o.reserved.pop(q, None)
    lengths[q] = f_len
    if f_first:
        if sh.mismatch(q, f_new, f_first) is not None:
            f_bad = o._check_data({q: f_new}, lengths, o.steps, f_first)
    elif f_new is not None and sh.mismatch(q, f_new) is not None:
        f_bad = o._check_data({q: f_new}, lengths, o.steps)
""",
    "free_seq": """\
    o.shadow.free(q)
    o.reserved.pop(q, None)
    if lengths.pop(q, None) is not None:
        order, pos = o._order, o._pos
        i = pos.pop(q)
        last = order.pop()
        if last != q:
            order[i] = last
            pos[last] = i
    if f_new is not None and o.shadow.mismatch(q, f_new) is not None:
        f_bad = o._check_data({q: f_new}, lengths, o.steps)
""",
}
_RECORD["preempt"] = _RECORD["free_seq"]

# ``Ghost.commit`` of an ``After`` touching the one sequence ``q``.
_COMMIT = """\
    if pre._occ:
        pre._occ.clear()
    f_ic = pre.ident_count
    f_was = pre.identities.pop(q, None)
    if f_was is not None:
        k = f_ic[f_was] - 1
        if k:
            f_ic[f_was] = k
        else:
            del f_ic[f_was]
    if f_new is None:
        pre.tables.pop(q, None)
        pre.lengths.pop(q, None)
        pre.impl_lengths.pop(q, None)
        pre.reservations.pop(q, None)
    else:
        pre.tables[q] = f_new
        pre.lengths[q] = f_len
        if f_res:
            pre.reservations[q] = f_res
        else:
            pre.reservations.pop(q, None)
        pre.impl_lengths[q] = f_raw
        pre.identities[q] = f_ident
        if f_ident is not None:
            f_ic[f_ident] = f_ic.get(f_ident, 0) + 1
    for b, d in f_hd.items():
        f_gh[b] = f_gh.get(b, 0) + d
    pre.zero = f_zero
    f_grefs = pre.refs
    for b, r in f_refs.items():
        f_grefs[b] = r
    pre.free_len = f_nf
    return f_bad
"""


def _length(kind: str) -> str:
    """The sequence's token count after a successful ``kind`` (``length_delta``; 0: gone)."""
    return {"append_slot": "lengths[q] + 1", "allocate": "op.n_tokens",
            "append_slots": "lengths[q] + op.n_tokens"}.get(kind, "0")


def _extra(kind: str) -> str:
    """The blocks the operation returned (``_step_fast``'s ``extra``)."""
    if kind == "append_slot":
        return "{op.block, op.cow_src} - {None}"
    if kind == "append_slots":
        return "{b for pair in op.copies or () for b in pair} - {None}"
    return "set()"


def _reserved(kind: str) -> str:
    """The sequence's reservation after a successful ``kind`` (``reserve_after``; a
    single-slot append keeps what it had, the oracle's ``_SINGLE``)."""
    if kind == "append_slot":
        return "pre.reservations.get(q, 0)"
    if kind in ("free_seq", "preempt"):
        return "0"
    return "reserved_after(PY, pre, op, len(f_tab))"


def source(kind: str, outcome: str = OK) -> str:
    """The fused step of ``kind`` ending with ``outcome``, as Python source. Raises
    ``Unfusable`` (or ``Untraceable``) where it cannot be generated."""
    if kind not in SINGLE or outcome != OK:
        raise Unfusable(f"{kind} ending {outcome} is not fused")
    tree = _clauses(kind, outcome)
    syms = {**compiled_checks.SYMS, "B": "pre.block_size", "N": "pre.num_blocks"}
    e = Emitter(syms, {"pre": FOR[Ghost], "post": POST})
    e.tree(tree, "    ")
    if any(state != "pre" for state, _ in e.used_methods) or "post" in e.used_syms \
            or "live" in e.used_syms:
        raise Unfusable(f"the step of {kind} reads the post state other than through locals")
    body = "\n".join(e.lines)
    lines = [f"def fused_{kind}_{outcome}(o, op):",
             _OBSERVE.format(length=_length(kind), extra=_extra(kind),
                             reserved=_reserved(kind)).rstrip("\n")]
    uses_nf = "f_nf" in body
    uses_zero = "f_zero" in body
    if uses_nf:
        lines.append(_NUM_FREE.rstrip("\n"))
    if uses_zero:
        lines.append(_ZERO.rstrip("\n"))
    for s in sorted(e.used_syms):
        if s != "N":  # (s_N: bound while observing)
            lines.append(f"    s_{s} = {syms[s]}")
    for local, src in sorted(e.binds.items()):
        lines.append(f"    {local} = {src}")
    for state, method in sorted(e.used_methods):
        lines.append(f"    {state}_{method} = {state}.{method}")
    seen = "(f_new, f_raw, f_ident, f_refs, f_nf)" if uses_nf else \
        "(f_new, f_raw, f_ident, f_refs, None)"
    for line in e.lines:
        lines.append(line.replace("return False", f"return {seen}")
                     if line.strip() == "return False" else line)
    lines.append("    f_bad = None")
    lines.append(_RECORD[kind].rstrip("\n"))
    if not uses_nf:
        lines.append(_NUM_FREE.rstrip("\n"))
    if not uses_zero:
        lines.append(_ZERO.rstrip("\n"))
    lines.append(_COMMIT.rstrip("\n"))
    return "\n".join(lines) + "\n"


_NAMESPACE = {
    "read_table": read_table, "read_len": read_len, "read_identity": read_identity,
    "read_refs_of": read_refs_of, "read_num_free": read_num_free, "_count_change": _count_change,
    "_ref_outside": _ref_outside, "_entry": _entry, "reserved_after": contracts.reserved_after,
    "PY": PY,
}


@cache
def step(kind: str, outcome: str = OK):
    """``f(oracle, op)`` for ``op`` of ``kind`` that ended with ``outcome`` (the call
    made and judged, ``op`` filled in): None when it passed (everything recorded and
    committed), the read-back's ``Violation`` when the data came back wrong (recorded and
    committed), or, when the check failed, what it observed, ``(table, own length,
    identity, refcounts, free count or None)``, with nothing changed."""
    name = f"fused_{kind}_{outcome}"
    namespace = dict(_NAMESPACE)
    exec(compile(source(kind, outcome), f"<kvcheck fused {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def steps() -> dict:
    """Every fused step that can be generated, by ``(kind, outcome)``."""
    out = {}
    for kind in SINGLE:
        try:
            out[kind, OK] = step(kind, OK)
        except (Unfusable, Untraceable):
            pass
    return out
