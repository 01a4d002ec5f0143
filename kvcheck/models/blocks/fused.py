"""The fast mode's fused steps: one generated function per operation kind that observes
what a successful operation touched, checks it, plays the caller and commits the
verified state, in one pass over plain locals.

``Oracle._step_fast`` goes through layers: it builds an ``After`` (dictionaries of what
was observed), hands it to the compiled step check (``compiled.step_for``, which reads
those dictionaries back), records the caller's writes, reads the shadow back and commits
the ``After`` into the ``Ghost``. For the kinds in ``KINDS`` (the operations of one
sequence, and fork), when they succeed, this module generates one function doing all of
that:

* observing: each of the operation's sequences' table (``read_table``), own length and
  table identity, then the refcounts of every pool block their tables name before or
  after and of the blocks the operation returned: the reads ``After`` makes, in its
  order, through the same readers (``kvcheck.targets.observe``);
* checking: the operation's contract and every invariant not needing free-list
  membership, traced from the spec's own text (``kvcheck.compile``) as
  ``compiled.step_for`` traces them, with one difference: the sequence invariants over
  the touched sequences live afterwards are stated for each of the operation's
  sequences under a branch on its liveness (what the ``live`` domain holds), so every
  post-state term reads a local (``_post_templates``; a variable ranging over the
  touched blocks or a touched table's positions reads its value directly,
  ``_in_domain_templates``);
* on success: the caller's part (``_record``'s shadow writes and bookkeeping for the
  kind), the read-back of what changed, and the ghost commit (``Ghost.commit``).

A failing check changes nothing and returns what it observed: the oracle then checks
the operation the layered way on those very observations (``After(..., seen=...)``), so
the spec itself names the clause, and must find it broken. Every clause and invariant
stays in ``spec/``; nothing here states or names a rule (the text around the check is
the model's bookkeeping). ``tests/core/test_fused.py`` holds both paths to the same
verdicts and the same state. To read one:

    python3 -c "from kvcheck.models.blocks import fused; print(fused.source('append_slot'))"
"""

from __future__ import annotations

from functools import cache

from kvcheck.compile.codecache import define
from kvcheck.compile.emit import Emitter, simple
from kvcheck.compile.terms import Term
from kvcheck.compile.tracer import TL, Branch, TDomain, TState, Untraceable, trace
from kvcheck.models.blocks import compiled as compiled_checks
from kvcheck.models.blocks.ghost import Ghost, _count_change
from kvcheck.models.blocks.inline import FOR
from kvcheck.spec import contracts
from kvcheck.spec.contracts import OK, Domain
from kvcheck.spec.logic import PY
from kvcheck.targets.observe import read_identity, read_len, read_num_free, read_ref, read_refs_of, read_table

# The kinds fused (``_SEQS``, ``_RECORD``: what ``length_delta`` and ``_record`` do for
# them). The others keep the general path: rebase (its child may be live before),
# rollback and the window drop (recording them reads the verified state).
KINDS = ("allocate", "append_slot", "append_slots", "free_seq", "preempt", "fork")


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


def _post_templates(index: dict[str, int]) -> dict:
    """The post state's vocabulary on the operation's sequences (their emitted names,
    ``s_seq`` / ``s_child``, to their index ``i``) as the fused function's locals:
    ``f_new{i}`` (the table, None: gone), ``f_tab{i}`` (``f_new{i} or ()``), ``f_len{i}``
    (the length), ``f_impl{i}`` (its own length, resolved), ``f_res{i}`` (reserved),
    ``f_shr{i}`` (sharers); shared: ``f_refs`` (refcounts observed), ``f_hd`` (holder
    changes), ``f_gh`` (the ghost's holder counts), ``f_nf`` / ``f_zero`` (the free count,
    the refcount-0 blocks). Each means what ``After``'s method does."""

    def at(q: str) -> int:
        i = index.get(q)
        if i is None:
            raise Unfusable(f"a post-state term of {q}, not one of the operation's sequences")
        return i

    def per_seq(code):
        def template(role, q, *args):
            return code(at(q), *args), {}
        return template

    def table(i, k):
        return (f"(f_tab{i}[{k}] if 0 <= {k} < len(f_tab{i}) else -1)" if simple(k)
                else f"_entry(f_tab{i}, {k})")

    def same_table(role, q, other, p, upto):
        i = at(q)
        if other != "s_pre":
            raise Unfusable("same_table against a state other than the verified one")
        if upto == "None":
            return f"(f_tab{i} == s_pre.tables.get({p}, ()))", {}
        return f"(f_tab{i}[:{upto}] == s_pre.tables.get({p}, ())[:{upto}])", {}

    return {
        "live": per_seq(lambda i: f"(f_new{i} is not None)"),
        "length": per_seq(lambda i: f"f_len{i}"),
        "nblocks": per_seq(lambda i: f"len(f_tab{i})"),
        "tail": per_seq(lambda i: f"(f_new{i} or (-1,))[-1]"),
        "table": per_seq(table),
        "occurrences": per_seq(lambda i, b: f"f_tab{i}.count({b})"),
        "impl_length": per_seq(lambda i: f"f_impl{i}"),
        "reserved": per_seq(lambda i: f"f_res{i}"),
        "sharers": per_seq(lambda i: f"f_shr{i}"),
        "same_table": same_table,
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


def _domains(tree) -> dict[str, tuple]:
    """Each bound variable of ``tree`` that ranges over one domain wherever it occurs
    (the tracer names them per path), with that domain's key."""
    domains: dict[str, set] = {}

    def walk(t):
        if isinstance(t, Term):
            if t.kind == "agg":
                domains.setdefault(t.args[1].args[0], set()).add(t.args[2].key)
            for a in t.args:
                walk(a)

    def nodes(node):
        if isinstance(node, Branch):
            walk(node.cond)
            nodes(node.then)
            nodes(node.orelse)
        else:
            for c in node.clauses:
                walk(c)

    nodes(tree)
    return {v: next(iter(ds)) for v, ds in domains.items() if len(ds) == 1}


def _in_domain_templates(domains: dict[str, tuple], names: list[str], pre: dict,
                         post: dict) -> tuple[dict, dict]:
    """``pre``'s and ``post``'s templates, where an argument is a variable ranging over
    ``blocks`` (the touched blocks: in the pool, every one observed, its refcount in
    ``f_refs``) or over the positions of a touched sequence's post table: the refcount
    or the entry read directly, which is what the method returns for such an argument."""
    blocks = Term("sym", "blocks").key
    pool = {v for v, d in domains.items() if d == blocks}
    positions = {v: names.index(f"s_{d[3][1][1]}") for v, d in domains.items()
                 if d[:3] == ("call", ("=", "post"), ("=", "nblocks")) and len(d) == 4
                 and d[3][0] == "sym" and f"s_{d[3][1][1]}" in names}

    def pick(pooled, other):
        return lambda role, b: pooled(b) if b in pool else other(role, b)

    entry = post["table"]

    def table(role, q, k):
        i = positions.get(k)
        if i is not None and q == names[i]:
            return f"f_tab{i}[{k}]", {}
        return entry(role, q, k)

    pre = {**pre,
           "ref": pick(lambda b: (f"pre_refs[{b}]", {"pre_refs": "pre.refs"}), pre["ref"]),
           "free_count": pick(lambda b: (f"(1 if pre_refs[{b}] == 0 else 0)",
                                         {"pre_refs": "pre.refs"}), pre["free_count"])}
    post = {**post, "table": table,
            "ref": pick(lambda b: (f"f_refs[{b}]", {}), post["ref"]),
            "free_count": pick(lambda b: (f"(1 if f_refs[{b}] == 0 else 0)", {}),
                               post["free_count"])}
    return pre, post


def _clauses(kind: str, outcome: str, contract=None, extra: tuple = ()):
    """``compiled.step_source``'s clauses for ``kind`` ending with ``outcome``: the
    contract on the fast-mode domain (``contract(L, pre, post, op, dom, *extra)`` where a
    model has its own, as ``step_source`` takes it), then the fast invariants, the sequence
    ones on each of the operation's sequences that is live afterwards."""
    op = compiled_checks._TOp(kind, outcome)
    pre, post = TState("pre"), TState("post")
    seqs = compiled_checks._op_seqs(op)
    dom = Domain(TDomain(Term("sym", "blocks")), seqs)
    args = [Term("sym", x) for x in extra]

    def clauses():
        rule = contracts.clauses(TL, pre, post, op, dom) if contract is None else \
            contract(TL, pre, post, op, dom, *args)
        yield from (f for _, _, f in rule)
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
_START = """\
    f_target = o.target
    pre = o.ghost
    lengths = o.lengths
    blocks = {extra}
    f_delta = {{}}
"""

# ``After.__init__``'s reads of one sequence, ``q{i}``, in its order.
_OBSERVE_SEQ = """\
    q{i} = {q}
    f_len{i} = {length}
    f_old{i} = pre.tables.get(q{i})
    f_new{i} = read_table(f_target, q{i}, f_old{i})
    if f_old{i}:
        blocks.update(f_old{i})
    if f_new{i} is None:
        f_ident{i} = f_raw{i} = None
        f_impl{i} = f_len{i}
        if f_old{i}:
            _count_change(f_old{i}, (), f_delta)
        f_tab{i} = ()
    else:
        if f_new{i} is not f_old{i}:
            blocks.update(f_new{i})
            _count_change(f_old{i} or (), f_new{i}, f_delta)
        f_raw{i} = read_len(f_target, q{i})
        f_was{i} = pre.identities.get(q{i})
        f_ident{i} = read_identity(f_target, q{i}, f_was{i})
        f_impl{i} = f_len{i} if f_raw{i} is None else f_raw{i}
        f_tab{i} = f_new{i}
    f_res{i} = pre.reservations.get(q{i}, 0)
"""

# ``After``'s sharer count of one sequence of one (``_SHARERS_ONE``) or more touched.
_SHARERS_ONE = """\
    if f_ident0 is None:
        f_shr0 = 1
    elif f_ident0 is f_was0:  # (the same table as before: as many sharers as before)
        f_shr0 = pre.ident_count.get(f_ident0, 0)
    else:
        f_shr0 = pre.ident_count.get(f_ident0, 0) + (f_ident0 == f_ident0) - (pre.identities.get(q0) == f_ident0)
"""
_SHARERS = """\
    if f_ident{i} is None:
        f_shr{i} = 1
    else:
        f_shr{i} = pre.ident_count.get(f_ident{i}, 0) + {terms}
"""

_BLOCKS = """\
    f_hd = {b: d for b, d in f_delta.items() if d} if f_delta else {}
    s_N = pre.num_blocks
    if blocks and (min(blocks) < 0 or max(blocks) >= s_N):
        blocks = {b for b in blocks if 0 <= b < s_N}
    f_refs = read_refs_of(f_target, blocks)
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
    o.shadow.append(q0, op.block, op.offset, op.cow_src)
    lengths[q0] = f_len0
    if f_res0:
        o.reserved[q0] = f_res0
    elif q0 in o.reserved:
        del o.reserved[q0]
    if o.shadow.mismatch(q0, f_new0, f_len0 - 1) is not None:
        f_bad = o._check_data({q0: f_new0}, lengths, o.steps, f_len0 - 1)
""",
    "allocate": """\
    o.shadow.allocate(q0, op.n_tokens, f_tab0)
    if f_res0:
        o.reserved[q0] = f_res0
    else:
        o.reserved.pop(q0, None)
    if q0 not in lengths:
        o._pos[q0] = len(o._order)
        o._order.append(q0)
    lengths[q0] = f_len0
    if f_new0 is not None and o.shadow.mismatch(q0, f_new0) is not None:
        f_bad = o._check_data({q0: f_new0}, lengths, o.steps)
""",
    "append_slots": """\
    f_first = lengths[q0]
    sh = o.shadow
    for src, dst in op.copies or ():
        sh.copy(src, dst)
    sh.extend(q0, op.n_tokens, f_tab0)
    if f_res0:
        o.reserved[q0] = f_res0
    else:
        o.reserved.pop(q0, None)
    lengths[q0] = f_len0
    if f_first:
        if sh.mismatch(q0, f_new0, f_first) is not None:
            f_bad = o._check_data({q0: f_new0}, lengths, o.steps, f_first)
    elif f_new0 is not None and sh.mismatch(q0, f_new0) is not None:
        f_bad = o._check_data({q0: f_new0}, lengths, o.steps)
""",
    "free_seq": """\
    o.shadow.free(q0)
    o.reserved.pop(q0, None)
    if lengths.pop(q0, None) is not None:
        order, pos = o._order, o._pos
        i = pos.pop(q0)
        last = order.pop()
        if last != q0:
            order[i] = last
            pos[last] = i
    if f_new0 is not None and o.shadow.mismatch(q0, f_new0) is not None:
        f_bad = o._check_data({q0: f_new0}, lengths, o.steps)
""",
    "fork": """\
    sh = o.shadow
    for src, dst in op.copies or ():
        sh.copy(src, dst)
    sh.free(q1)
    sh.fork(q0, q1)
    for q, r in ((q0, f_res0), (q1, f_res1)):
        if r:
            o.reserved[q] = r
        else:
            o.reserved.pop(q, None)
    lengths[q0] = f_len0
    if q1 not in lengths:
        o._pos[q1] = len(o._order)
        o._order.append(q1)
    lengths[q1] = f_len1
    f_live = [(q, t) for q, t in ((q0, f_new0), (q1, f_new1)) if t is not None]
    for q, t in f_live:
        if sh.mismatch(q, t) is not None:
            f_bad = o._check_data(dict(f_live), lengths, o.steps)
            break
""",
}
_RECORD["preempt"] = _RECORD["free_seq"]

# ``Ghost.commit`` of an ``After``: each touched sequence ``q{i}`` in turn, then the blocks.
_COMMIT_SEQ = """\
    if f_new{i} is None or f_ident{i} is not f_was{i}:  # (the same table object: as it was)
        f_was = pre.identities.pop(q{i}, None)
        if f_was is not None:
            k = f_ic[f_was] - 1
            if k:
                f_ic[f_was] = k
            else:
                del f_ic[f_was]
        if f_ident{i} is not None:
            f_ic[f_ident{i}] = f_ic.get(f_ident{i}, 0) + 1
    if f_new{i} is None:
        pre.tables.pop(q{i}, None)
        pre.lengths.pop(q{i}, None)
        pre.impl_lengths.pop(q{i}, None)
        pre.reservations.pop(q{i}, None)
    else:
        pre.tables[q{i}] = f_new{i}
        pre.lengths[q{i}] = f_len{i}
        if f_res{i}:
            pre.reservations[q{i}] = f_res{i}
        else:
            pre.reservations.pop(q{i}, None)
        pre.impl_lengths[q{i}] = f_raw{i}
        pre.identities[q{i}] = f_ident{i}
"""
_COMMIT_BLOCKS = """\
    for b, d in f_hd.items():
        f_gh[b] = f_gh.get(b, 0) + d
    pre.zero = f_zero
    f_grefs = pre.refs
    for b, r in f_refs.items():
        f_grefs[b] = r
    pre.free_len = f_nf
    return f_bad
"""

# Each fused kind's sequences' token counts after success, in the order of its
# sequence arguments (``length_delta``; 0: gone).
_SEQS = {
    "append_slot": ("lengths[q0] + 1",),
    "allocate": ("op.n_tokens",),
    "append_slots": ("lengths[q0] + op.n_tokens",),
    "free_seq": ("0",),
    "preempt": ("0",),
    "fork": ("lengths[q0]", "lengths[q0]"),
}


def _extra(kind: str) -> str:
    """The blocks the operation returned (``_step_fast``'s ``extra``), a set."""
    if kind == "append_slot":  # (op.block is an int: ``decode_append``)
        return "{op.block} if op.cow_src is None else {op.block, op.cow_src}"
    if kind in ("append_slots", "fork"):
        return "{b for pair in op.copies or () for b in pair} - {None}"
    return "set()"


def _reserve(kind: str) -> str:
    """The new reservation after a successful ``kind`` (``reserve_after``; a single-slot
    append on a sequence reserving nothing reserves nothing: the oracle's ``_SINGLE``)."""
    if kind == "append_slot":
        return "    if f_res0:\n        f_res0 = reserved_after(PY, pre, op, len(f_tab0))\n"
    if kind in ("free_seq", "preempt"):
        return "    f_res0 = 0\n"
    if kind == "fork":  # (the child's)
        return "    f_res1 = reserved_after(PY, pre, op, len(f_tab1))\n"
    return "    f_res0 = reserved_after(PY, pre, op, len(f_tab0))\n"


# A model's own contract with further inputs (``source``'s ``extra``): asked of the oracle,
# on the operation's sequence's table as observed, before the check. None: a check of the
# model's own failed (the general path names it).
_INPUTS = """\
    f_inputs = o.fused_inputs(op, f_tab0)
    if f_inputs is None:
        return {seen}
    {names}, = f_inputs
"""


def source(kind: str, outcome: str = OK, contract=None, extra: tuple = (),
           name: str | None = None) -> str:
    """The fused step of ``kind`` ending with ``outcome``, as Python source. Raises
    ``Unfusable`` (or ``Untraceable``) where it cannot be generated. A passed step leaves
    ``o.touched``: the pool blocks it touched (``After.blocks``) and its sequences, as a
    tuple (their tables and lengths are the ghost's once committed), for a model checking
    more on top of the block manager (the prefix oracle reads the cache there).

    ``contract``, ``extra``: a model's own contract for ``kind`` standing in for the block
    manager's (``compiled.step_source``'s), for a one-sequence kind; its further inputs
    ``extra`` come from ``o.fused_inputs(op, table)``, called with the sequence's table
    as observed once the step is observed: a tuple of their values, or None when a check
    of the model's own fails (the step then fails, as a failed clause does)."""
    if kind not in KINDS or outcome != OK:
        raise Unfusable(f"{kind} ending {outcome} is not fused")
    op = compiled_checks._TOp(kind, outcome)
    names = [f"s_{t.args[0]}" for t in compiled_checks._op_seqs(op)]
    if len(names) != len(_SEQS[kind]):
        raise Unfusable(f"{kind}'s sequences are not {len(_SEQS[kind])}")
    if extra and len(names) != 1:
        raise Unfusable(f"a contract's further inputs on {kind}: one sequence only")
    tree = _clauses(kind, outcome, contract, extra)
    syms = {**compiled_checks.SYMS, "B": "pre.block_size", "N": "pre.num_blocks",
            **{x: f"f_{x}" for x in extra}}
    pre, post = _in_domain_templates(_domains(tree), names, FOR[Ghost],
                                     _post_templates({n: i for i, n in enumerate(names)}))
    e = Emitter(syms, {"pre": pre, "post": post})
    e.tree(tree, "    ")
    if any(state != "pre" for state, _ in e.used_methods) or "post" in e.used_syms \
            or "live" in e.used_syms:
        raise Unfusable(f"the step of {kind} reads the post state other than through locals")
    body = "\n".join(e.lines)
    n = len(names)
    name = name or f"fused_{kind}_{outcome}"
    out = [f"def {name}(o, op):\n", _START.format(extra=_extra(kind))]
    for i, length in enumerate(_SEQS[kind]):
        out.append(_OBSERVE_SEQ.format(i=i, q=syms[names[i][2:]], length=length))
    if n == 1:
        out.append(_SHARERS_ONE)
    else:
        for i in range(n):
            terms = " + ".join(f"((f_ident{j} == f_ident{i}) - (pre.identities.get(q{j}) == "
                               f"f_ident{i}))" for j in range(n))
            out.append(_SHARERS.format(i=i, terms=terms))
    out.append(_BLOCKS)
    out.append(_reserve(kind))
    uses_nf, uses_zero = "f_nf" in body, "f_zero" in body
    if uses_nf:
        out.append(_NUM_FREE)
    if uses_zero:
        out.append(_ZERO)
    observed = "{" + ", ".join(f"q{i}: (f_new{i}, f_raw{i}, f_ident{i})" for i in range(n)) + "}"
    seen = f"({observed}, f_refs, {'f_nf' if uses_nf else 'None'})"
    if extra:
        out.append(_INPUTS.format(seen=seen, names=", ".join(f"f_{x}" for x in extra)))
    for s in sorted(e.used_syms):
        if s != "N":  # (s_N: bound while observing)
            out.append(f"    s_{s} = {syms[s]}\n")
    for local, src in sorted(e.binds.items()):
        out.append(f"    {local} = {src}\n")
    for state, method in sorted(e.used_methods):
        out.append(f"    {state}_{method} = {state}.{method}\n")
    for line in e.lines:
        out.append((line.replace("return False", f"return {seen}")
                    if line.strip() == "return False" else line) + "\n")
    out.append(f"    o.touched = (blocks, {', '.join(f'q{i}' for i in range(n))})\n")
    out.append("    f_bad = None\n")
    out.append(_RECORD[kind])
    if not uses_nf:
        out.append(_NUM_FREE)
    if not uses_zero:
        out.append(_ZERO)
    out.append("    if pre._occ:\n        pre._occ.clear()\n    f_ic = pre.ident_count\n")
    for i in range(n):
        out.append(_COMMIT_SEQ.format(i=i))
    out.append(_COMMIT_BLOCKS)
    return "".join(out)


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
    committed), or, when the check failed, what it observed, ``({seq: (table, own
    length, identity)}, refcounts, free count or None)`` (``After``'s ``seen``), with
    nothing changed (``o.touched``: see ``source``)."""
    return step_with(None, kind, (), outcome)


@cache
def step_with(contract, kind: str, extra: tuple, outcome: str = OK):
    """``step`` with a model's own contract for ``kind`` (None: the block manager's) and its
    further inputs ``extra`` (see ``source``): e.g. ``spec.prefix.allocate_with_hits`` and
    its ``hits``."""
    name = f"fused_{kind if contract is None else contract.__name__}_{outcome}"
    return define(source(kind, outcome, contract, extra, name), f"<kvcheck fused {name}>", name,
                  dict(_NAMESPACE))


def steps() -> dict:
    """Every fused step that can be generated, by ``(kind, outcome)``."""
    out = {}
    for kind in KINDS:
        try:
            out[kind, OK] = step(kind, OK)
        except (Unfusable, Untraceable):
            pass
    return out
