"""Emit a traced decision tree as the source of one Python function.

The function returns True when every clause holds and False at the first
that does not. Code shape:

* branches become ``if``/``else``; a leaf's top-level conjunctions become
  one ``if not (...): return False`` each, and its top-level ``all``
  quantifiers become ``for`` loops;
* common subexpressions are computed once per scope: a term used twice, or a
  loop-invariant term used inside a loop, is assigned to a local first;
* vocabulary terms use the state class's inline template when it has one
  (``kvcheck.models.blocks.inline``), else a call of the state's bound method. A
  template must mean exactly what the method does.
"""

from __future__ import annotations

from collections import Counter

from kvcheck.compile.terms import Term, free_vars
from kvcheck.compile.tracer import Branch, Leaf


def _height(t) -> int:
    """Depth of a term tree (subterms are assigned before the terms using them)."""
    if not isinstance(t, Term):
        return 0
    return 1 + max((_height(a) for a in t.args), default=0)


class Emitter:
    """Writes one function's body line by line (``lines``), naming shared terms."""

    def __init__(self, syms: dict[str, str], inline: dict):
        """``syms``: input name -> the expression that reads it (e.g. "op.seq");
        ``inline``: state -> method -> template; ``template(state, *arg_texts)``
        is ``(code, binds)`` (or None: call the method), the code using the
        locals ``binds`` maps to their source."""
        self.syms = syms
        self.inline = inline
        self.lines: list[str] = []
        self.names: dict = {}  # term key -> local name
        self.used_syms: set[str] = set()
        self.used_methods: set[tuple[str, str]] = set()
        self.binds: dict[str, str] = {}  # local -> source, needed by inline templates
        self._n = 0

    # -- expressions ---------------------------------------------------------
    def expr(self, t) -> str:
        if not isinstance(t, Term):
            return repr(t)
        name = self.names.get(t.key)
        if name is not None:
            return name
        k, a = t.kind, t.args
        if k == "sym":
            self.used_syms.add(a[0])
            return f"s_{a[0]}"
        if k == "var":
            return a[0]
        if k == "call":
            state, method, *args = a
            template = self.inline.get(state, {}).get(method)
            if template is not None:
                emitted = template(state, *[self.expr(x) for x in args])
                if emitted is not None:
                    text, binds = emitted
                    self.binds.update(binds)
                    return text
            self.used_methods.add((state, method))
            return f"{state}_{method}({', '.join(self.expr(x) for x in args)})"
        if k == "arith":
            return f"({self.expr(a[1])} {a[0]} {self.expr(a[2])})"
        if k == "neg":
            return f"(-{self.expr(a[0])})"
        if k == "cmp":
            return f"({self.value(a[1])} {a[0]} {self.value(a[2])})"
        if k == "and":
            return "(" + " and ".join(self.expr(x) for x in a) + ")"
        if k == "or":
            return "(" + " or ".join(self.expr(x) for x in a) + ")"
        if k == "not":
            return f"(not {self.expr(a[0])})"
        if k == "implies":
            return f"(not {self.expr(a[0])} or {self.expr(a[1])})"
        if k == "ite":
            return f"({self.value(a[1])} if {self.expr(a[0])} else {self.value(a[2])})"
        if k == "ceildiv":
            return f"(-(-{self.expr(a[0])} // {self.expr(a[1])}))"
        if k == "mod":
            return f"({self.expr(a[0])} % {self.expr(a[1])})"
        if k == "agg":
            how, var, domain, body = a
            loop = f"for {var.args[0]} in {self.domain(domain)}"
            if how == "count":
                return f"sum(1 {loop} if {self.expr(body)})"
            return f"{how}({self.expr(body)} {loop})"
        raise ValueError(f"cannot emit {t!r}")

    def value(self, t) -> str:
        """``t`` where its value (not just its truth) matters: a connective over operands
        that are not all booleans is made one (``x and y`` is ``y`` when ``x`` holds)."""
        if isinstance(t, Term) and t.kind in ("and", "or", "implies") and t.key not in self.names \
                and not _boolean(t):
            return f"bool({self.expr(t)})"
        return self.expr(t)

    def domain(self, d: Term) -> str:
        return self.expr(d) if d.kind == "sym" else f"range({self.expr(d)})"

    # -- statements ----------------------------------------------------------
    def _fresh(self) -> str:
        self._n += 1
        return f"t{self._n}"

    def _bind_common(self, clauses, bound: set[str], indent: str) -> list:
        """Assign to locals the subterms worth sharing in this scope; returns the keys."""
        uses: Counter = Counter()
        inner: set = set()
        terms = {}

        def walk(t, in_loop):
            if not isinstance(t, Term) or t.key in self.names:
                return
            if t.kind not in ("sym", "var") and free_vars(t) <= bound:
                uses[t.key] += 1
                terms[t.key] = t
                if in_loop:
                    inner.add(t.key)
            if t.kind == "agg":
                walk(t.args[2], in_loop)
                walk(t.args[3], True)
            else:
                for x in t.args:
                    walk(x, in_loop)

        for c in clauses:
            walk(c, False)
        pick = [terms[k] for k in terms if (uses[k] > 1 or k in inner) and terms[k].kind != "agg"]
        pick.sort(key=_height)
        for t in pick:
            text = self.value(t) if t.kind in ("and", "or", "implies") else self.expr(t)
            name = self._fresh()
            self.lines.append(f"{indent}{name} = {text}")
            self.names[t.key] = name
        return [t.key for t in pick]

    def clauses(self, clauses, bound: set[str], indent: str) -> None:
        flat = []
        for c in clauses:
            flat.extend(_conjuncts(c))
        if any(c is False for c in flat):
            self.lines.append(f"{indent}return False")
            return
        flat = _fuse(flat)
        added = self._bind_common(flat, bound, indent)
        for c in flat:
            if isinstance(c, Term) and c.kind == "agg" and c.args[0] == "all":
                _, var, domain, body = c.args
                self.lines.append(f"{indent}for {var.args[0]} in {self.domain(domain)}:")
                self.clauses([body], bound | {var.args[0]}, indent + "    ")
            else:
                self.lines.append(f"{indent}if not {self.expr(c)}:")
                self.lines.append(f"{indent}    return False")
        for k in added:
            del self.names[k]

    def tree(self, node, indent: str) -> None:
        if isinstance(node, Leaf):
            self.clauses(node.clauses, set(), indent)
            return
        assert isinstance(node, Branch)
        self.lines.append(f"{indent}if {self.expr(node.cond)}:")
        start = len(self.lines)
        self.tree(node.then, indent + "    ")
        if len(self.lines) == start:
            self.lines.append(f"{indent}    pass")
        self.lines.append(f"{indent}else:")
        start = len(self.lines)
        self.tree(node.orelse, indent + "    ")
        if len(self.lines) == start:
            self.lines.append(f"{indent}    pass")


def _boolean(t) -> bool:
    """Whether ``t``'s emitted value is always a bool (a comparison, a negation, a bool, or
    a connective of those: ``a and b``, ``a or b`` and ``not a or b`` then give one of
    their operands' values, or ``not a``'s)."""
    if type(t) is bool:
        return True
    if not isinstance(t, Term):
        return False
    if t.kind in ("cmp", "not"):
        return True
    if t.kind in ("and", "or"):
        return all(_boolean(x) for x in t.args)
    if t.kind == "implies":
        return _boolean(t.args[1])
    return False


def _fuse(clauses):
    """One loop per domain: ``all`` clauses over the same domain share a variable
    (the clauses are a pure conjunction, so their order does not matter)."""
    out, loops = [], {}
    for c in clauses:
        if isinstance(c, Term) and c.kind == "agg" and c.args[0] == "all":
            _, var, domain, body = c.args
            first = loops.get(domain.key)
            if first is None:
                loops[domain.key] = len(out)
                out.append(c)
                continue
            keep = out[first].args[1]
            moved = substitute(body, var.args[0], keep)
            old = out[first].args[3]
            out[first] = Term("agg", "all", keep, domain, Term("and", *_conjuncts(old), moved))
        else:
            out.append(c)
    return out


def substitute(t, name: str, by: Term):
    """``t`` with the free variable ``name`` replaced by ``by``."""
    if not isinstance(t, Term):
        return t
    if t.kind == "var":
        return by if t.args[0] == name else t
    if t.kind == "agg" and t.args[1].args[0] == name:
        return Term("agg", t.args[0], t.args[1], substitute(t.args[2], name, by), t.args[3])
    return Term(t.kind, *(substitute(a, name, by) for a in t.args))


def _conjuncts(c):
    if isinstance(c, Term) and c.kind == "and":
        out = []
        for x in c.args:
            out.extend(_conjuncts(x))
        return out
    return [c]


def simple(text: str) -> bool:
    """Whether emitted ``text`` is a name or a number (safe to repeat in a template)."""
    return text.isidentifier() or text.lstrip("-").isdigit()


def function_source(name: str, params: list[str], tree, syms: dict[str, str],
                    inline: dict) -> str:
    """Python source of ``def name(*params)`` checking ``tree``."""
    e = Emitter(syms, inline)
    e.tree(tree, "    ")
    body = e.lines + ["    return True"]
    head = [f"def {name}({', '.join(params)}):"]
    for s in sorted(e.used_syms):
        head.append(f"    s_{s} = {syms[s]}")
    for local, source in sorted(e.binds.items()):
        head.append(f"    {local} = {source}")
    for state, method in sorted(e.used_methods):
        head.append(f"    {state}_{method} = {state}.{method}")
    return "\n".join(head + body) + "\n"
