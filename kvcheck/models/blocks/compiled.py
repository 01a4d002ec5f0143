"""The oracle's compiled checks, built from ``kvcheck.spec`` (once per process,
cached; ``kvcheck.oracle`` builds its own at import). The class arguments
name the state classes the functions will be given, for their inline code:

    precondition(kind, Pre)(pre, op)          spec.contracts.precondition
    step(kind, Pre, Post)(pre, post, op, blocks, live)
    step_for(kind, outcome, Pre, Post)      the same, for operations of that outcome only
                                              spec.contracts.CONTRACTS[kind] on the fast-mode
                                              domain (``blocks`` the touched blocks, the op's own
                                              sequences), then every state invariant not needing
                                              free-list membership over ``blocks`` and ``live``
    step_with(contract, kind, outcome, extra, Pre, Post)(pre, post, op, blocks, live, *extra)
                                              the same with a model's own contract for ``kind``
    contract_for(kind, outcome, Pre, Post)(pre, post, op, blocks)
                                              spec.contracts.CONTRACTS[kind] alone, for operations
                                              of that outcome, over ``blocks`` and the op's own
                                              sequences (the full mode's, over every block)
    state_invariants(State)(s)                every state invariant over the whole of ``s``

Each returns True iff every clause holds. To read the generated code:

    python3 -c "from kvcheck.models.blocks import compiled as c; from kvcheck.models.blocks.ghost import Ghost, After; \
                print(c.step_source('append_slot', c.inline_for(Ghost, After)))"
"""

from __future__ import annotations

import dataclasses
from functools import cache

from kvcheck.check.model import NEW_SEQ, SEQ
from kvcheck.compile.codecache import define
from kvcheck.compile.emit import function_source
from kvcheck.compile.terms import Term
from kvcheck.compile.tracer import TL, TDomain, TState, trace
from kvcheck.spec import contracts
from kvcheck.spec.contracts import Domain
from kvcheck.spec.invariants import INVARIANTS

# Where each traced input comes from in the compiled function.
SYMS = {  # every field of an operation, and the names the emitted code binds
    **{f.name: f"op.{f.name}" for f in dataclasses.fields(contracts.Op) if f.name != "kind"},
    "blocks": "blocks", "live": "live", "pre": "pre", "post": "post",
    "all_blocks": "range(post.num_blocks)", "all_seqs": "post.seqs()",
}

FAST_INVARIANTS = [i for i in INVARIANTS if "free_list" not in i.needs]


class _TOp:
    """A symbolic operation of a known kind (and, if given, a known outcome: then the
    spec's branches on the outcome are decided while tracing). Without a cyclic window
    (``cycle`` 0): the oracle checks an operation under one from the spec itself
    (``Oracle._step_fast``), as it does every check the tracer cannot represent."""

    def __init__(self, kind: str, outcome: str | None = None):
        self.kind = kind
        for f in dataclasses.fields(contracts.Op):
            if f.name != "kind":
                setattr(self, f.name, Term("sym", f.name))
        self.cycle = 0
        if outcome is not None:
            self.outcome = outcome


def _op_seqs(op: _TOp) -> tuple:
    """The sequences an operation touches (its sequence arguments in the op table): the
    fast mode's frame domain."""
    from kvcheck.models.blocks.model import OPS

    return tuple(getattr(op, a.name) for a in OPS[op.kind].args if a.role in (SEQ, NEW_SEQ))


def _sizes(state_param: str) -> dict[str, str]:
    return {"B": f"{state_param}.block_size", "N": f"{state_param}.num_blocks"}


def precondition_source(kind: str, inline: dict) -> str:
    op = _TOp(kind)
    pre = TState("pre")
    tree = trace(lambda: [contracts.precondition(TL, pre, op)])
    return function_source(f"precondition_{kind}", ["pre", "op"], tree,
                           {**SYMS, **_sizes("pre")}, inline)


def _invariant_clauses(post: TState, every: bool):
    """The invariants' formulas over the domains ``blocks``/``live`` (the touched
    ones) or, with ``every``, ``all_blocks``/``all_seqs`` (the whole state)."""
    blocks, seqs = ("all_blocks", "all_seqs") if every else ("blocks", "live")
    for inv in INVARIANTS if every else FAST_INVARIANTS:
        if inv.domain == "global":
            yield inv.predicate(TL, post)
            continue
        for x in TDomain(Term("sym", blocks if inv.domain == "block" else seqs)):
            yield inv.predicate(TL, post, x)


def state_invariants_source(inline: dict) -> str:
    """Every invariant over the whole state (``post.blocks()``, ``post.seqs()``):
    the sweep's audit."""
    post = TState("post")
    return function_source("invariants", ["post"], trace(lambda: _invariant_clauses(post, True)),
                           {**SYMS, **_sizes("post")}, inline)


def step_source(kind: str, inline: dict, outcome: str | None = None, contract=None,
                extra: tuple = (), name: str | None = None) -> str:
    """The contract of ``kind`` and the fast invariants after it, in one function
    (one prelude, subterms shared between the two). With ``outcome``: for operations
    of that outcome only (the spec's branches on it taken while tracing, so the
    function reads only what that outcome's clauses read).

    ``contract(L, pre, post, op, dom, *extra)``: another spec contract standing in for
    ``kind``'s (a model's own, e.g. ``spec.prefix.allocate_with_hits``); ``extra``
    names its further inputs, which become parameters of the function after ``live``."""
    op = _TOp(kind, outcome)
    pre, post = TState("pre"), TState("post")
    dom = Domain(TDomain(Term("sym", "blocks")), _op_seqs(op))
    args = [Term("sym", x) for x in extra]

    def clauses():  # (a refusal's contract too: ``clauses`` branches on the outcome)
        rule = contracts.clauses(TL, pre, post, op, dom) if contract is None else \
            contract(TL, pre, post, op, dom, *args)
        yield from (f for _, _, f in rule)
        yield from _invariant_clauses(post, every=False)

    name = name or (f"step_{kind}" if outcome is None else f"step_{kind}_{outcome}")
    return function_source(name, ["pre", "post", "op", "blocks", "live", *extra],
                           trace(clauses), {**SYMS, **{x: x for x in extra}, **_sizes("pre")},
                           inline)


def contract_source(kind: str, inline: dict, outcome: str) -> str:
    """``kind``'s contract alone, for operations that ended with ``outcome``, over the blocks
    ``blocks`` and the operation's own sequences (no invariant: the full mode checks them
    on the whole state after). ``Oracle._check_op`` gives it every block of the pool and
    evaluates the spec itself over every other sequence."""
    op = _TOp(kind, outcome)
    pre, post = TState("pre"), TState("post")
    dom = Domain(TDomain(Term("sym", "blocks")), _op_seqs(op))
    return function_source(f"contract_{kind}_{outcome}", ["pre", "post", "op", "blocks"],
                           trace(lambda: [f for _, _, f in contracts.clauses(TL, pre, post, op, dom)]),
                           {**SYMS, **_sizes("pre")}, inline)


def _compile(source: str, name: str):
    return define(source, f"<kvcheck compiled {name}>", name)


def inline_for(pre=None, post=None) -> dict:
    """The inline templates for states of class ``pre`` / ``post``."""
    from kvcheck.models.blocks.inline import FOR

    return {role: FOR.get(cls, {}) for role, cls in (("pre", pre), ("post", post)) if cls}


@cache
def precondition(kind: str, pre: type | None = None):
    """``pre``: the class of the states it will get (for their inline templates)."""
    return _compile(precondition_source(kind, inline_for(pre)), f"precondition_{kind}")


def _step_inline(pre: type | None, post: type | None) -> dict:
    from kvcheck.models.blocks.ghost import After, Ghost

    assert post is not After or pre is Ghost, "After's same_table template reads a Ghost"
    return inline_for(pre, post)


@cache
def step(kind: str, pre: type | None = None, post: type | None = None):
    """``f(pre, post, op, blocks, live)``: the contract and the fast invariants."""
    return _compile(step_source(kind, _step_inline(pre, post)), f"step_{kind}")


@cache
def step_for(kind: str, outcome: str, pre: type | None = None, post: type | None = None):
    """``step(kind, pre, post)`` for operations that ended with ``outcome`` only."""
    return _compile(step_source(kind, _step_inline(pre, post), outcome), f"step_{kind}_{outcome}")


def step_with(contract, kind: str, outcome: str, extra: tuple, pre: type | None = None,
              post: type | None = None):
    """``f(pre, post, op, blocks, live, *extra)``: ``contract`` (see ``step_source``) for
    operations of ``kind`` that ended with ``outcome``, and the fast invariants."""
    name = f"step_{contract.__name__}_{outcome}"
    return _compile(step_source(kind, _step_inline(pre, post), outcome, contract, extra, name),
                    name)


@cache
def contract_for(kind: str, outcome: str, pre: type | None = None, post: type | None = None):
    """``f(pre, post, op, blocks)``: ``kind``'s contract for operations that ended with
    ``outcome`` (see ``contract_source``)."""
    return _compile(contract_source(kind, inline_for(pre, post), outcome),
                    f"contract_{kind}_{outcome}")


@cache
def state_invariants(state: type | None = None):
    """``f(s)``: every invariant on a whole state of class ``state`` (the sweep)."""
    return _compile(state_invariants_source(inline_for(post=state)), "invariants")
