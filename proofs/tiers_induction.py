"""1-induction of every per-block tier invariant over the tiers' block steps, and the
outcome classes' witnesses, for Z3.

The state is one pool's blocks (``kvcheck.spec.tier_steps.TierPoolSymState``: holder
counts by kind, refcount, free-list place, evictable, pending store / load, backs a device
key, content and key meaning per block); a step is a rule of ``spec.tier_steps.STEPS``
on one block, the rest framed. The invariants are the spec's own text, evaluated on that
state: ``spec.tiers.TIER_BLOCK_INVARIANTS`` (``pending_not_findable``,
``one_key_per_block``, ``evictable_only_cached``, ``key_content``) and the block-manager
per-block invariants of ``spec.invariants`` through ``pool_view`` (``refcount_conservation``:
the refcount is the sum of every holder's references; ``free_list``: on the free list
exactly when nothing holds it, at most once). The model adds the initial pool, the scope
bounds and four lemmas the induction needs, proved alongside (``pending_held``: a job
holds every destination it is still writing; ``keyed_content``: a keyed block holds what
its key names even while a load still writes it, the ghost following the copy from its
start; ``one_transfer``: a block is not both a
store's and a load's pending destination; ``backs_keyed``: only a cached block backs a
device key).

Rows, as ``kvcheck.proofs.prefix_induction``'s (the same two-case symmetry argument:
no rule, invariant, initial state or bound names a block, so a per-block invariant is
shown at block 0 of s2 for a step on block 0, "same", or block 1, "another block"):

  * base case: the initial pool (every block once on the free list, nothing held, no key)
    satisfies every per-block invariant and lemma;
  * well-formedness (counts and ids within the scope) is preserved by every step;
  * one row per invariant and lemma: preserved by every step rule;
  * ``evict never takes a block another holder holds``: from any state satisfying every
    invariant, the eviction step's requires fails for a block a job, a sequence or a pin
    holds (a load's hit pinned while the host evicts is refused);
  * witnesses (bounded search from the initial pool, any rule on any block at each step;
    ``witness_depth`` steps): a store before and after its completion (pending and not
    findable, then findable under its prefix), a load's host hit pinned while the cache
    would evict (and the eviction's requires false there), a request freed with a job in
    flight (its block still held, released at the job's completion), a prefetch's page it
    does not keep (passed to the release queue, then free once).

Each query is tried in bit-vectors, then integers (``kvcheck.proofs.induction``'s
portfolio, bounded in Z3's resource units: an exhausted allowance is "unknown", never a
verdict). Limits: per block, one pool at a time (what an operation does in two pools is
a step in each, and the cross-pool clauses, e.g. a load's hit holding the prefix it is
loaded for, are the steps' requires), within the scope (blocks, holders per kind, prefix
ids); ``holds_its_tokens``, ``in_one_pool`` (per sequence), ``quiescent_nothing_held`` and
``unheld_sources_kept`` (global), the block manager's per-sequence and global invariants and
the operations' contracts are evaluated concretely only (``kvcheck.models.tiers.oracle``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import Z3Logic
from kvcheck.spec.tier_steps import STEPS, TierPoolSymState
from kvcheck.spec.tiers import HOST, TIER_BLOCK_INVARIANTS

from . import effort
from .induction import Proof, _portfolio, _proof, _verdict

ENGINE = "z3 k-induction (tiers)"
FOCUS, OTHER = 0, 1
POOL_INVARIANTS = [i for i in INVARIANTS if i.domain == "block"]  # refcount, free list


@dataclass(frozen=True)
class TierModelScope:
    num_blocks: int = 3
    holders: int = 3  # the most references one holder kind has to one block
    prefixes: int | None = None  # prefix ids in [0, prefixes): default 2 * num_blocks

    @property
    def ids(self) -> int:
        return self.prefixes or 2 * self.num_blocks

    @property
    def width(self) -> int:
        return (8 * max(self.holders, self.ids, self.num_blocks) + 8).bit_length() + 3

    def describe(self) -> str:
        return (f"one pool of {self.num_blocks} blocks, <= {self.holders} references per "
                f"holder kind per block, {self.ids} prefix ids")


def pending_held(L, s, p, b):
    """(Model lemma) a job holds every destination it is still writing."""
    return L.implies(s.is_pending(p, b), s.held(p, b, "job") >= 1)


def one_transfer(L, s, p, b):
    """(Model lemma) a block is not both a pending store's and a pending load's
    destination."""
    return L.not_(L.and_(s.storing(b), s.loading(b)))


def backs_keyed(L, s, p, b):
    """(Model lemma) only a cached block backs a device key."""
    return L.implies(s.backs_another(p, b), s.keys_naming(p, b) >= 1)


def keyed_content(L, s, p, b):
    """(Model lemma) a keyed block holds what its key names, even while a load still
    writes it (the ghost content follows a copy from its start: a load's destination
    published at once is keyed under the prefix the copy writes)."""
    return L.implies(s.keys_naming(p, b) >= 1, s.content(p, b) == s.meaning(b))


LEMMAS = [("pending_held (model lemma)", pending_held),
          ("keyed_content (model lemma)", keyed_content),
          ("one_transfer (model lemma)", one_transfer),
          ("backs_keyed (model lemma)", backs_keyed)]


def per_block(invariants=None, lemmas=None) -> list[tuple[str, object]]:
    """Every per-block invariant as ``(name, fn(L, s, b))`` on a ``TierPoolSymState``:
    the block-manager ones through ``pool_view``, the tier ones and the lemmas as the
    spec writes them, for the pool ``s.pool``."""
    out = [(i.name, (lambda L, s, b, i=i: i.holds_for(L, s.pool_view(s.pool), b)))
           for i in POOL_INVARIANTS]
    tiers = TIER_BLOCK_INVARIANTS if invariants is None else invariants
    out += [(name, (lambda L, s, b, fn=fn: fn(L, s, s.pool, b)))
            for name, fn in [*tiers, *(LEMMAS if lemmas is None else lemmas)]]
    return out


class TierModel:
    def __init__(self, scope: TierModelScope, steps=None, invariants=None, encoding="bv"):
        if encoding not in ("int", "bv"):
            raise ValueError(f"encoding must be 'int' or 'bv', not {encoding!r}")
        self.scope, self.encoding = scope, encoding
        self.L = Z3Logic(None if encoding == "int" else scope.width)
        self.steps = dict(steps or STEPS)
        self.invariants = per_block(invariants)

    def state(self, name: str) -> TierPoolSymState:
        return TierPoolSymState(self.L, self.scope.num_blocks, name, HOST)

    def init(self, s):
        """Every block once on the free list: nothing holds it, no key, nothing written."""
        L = self.L
        return L.and_(*[L.and_(*[s.get(t, b) == 0 for t in ("seq", "job", "pin", "cache",
                                                            "ref")],
                               s.on_free(b) == 1, s.content(b) == -1, s.meaning(b) == -1,
                               *[L.not_(s.get(t, b)) for t in s.BOOLS]) for b in s.blocks()])

    def well_formed(self, s, blocks=None):
        """The encoding's domain and the scope: each holder kind's references and the
        free-list place within ``holders``, ids below ``ids``."""
        L, sc = self.L, self.scope
        blocks = s.blocks() if blocks is None else blocks
        return L.and_(s.domain(), *[L.and_(*[s.get(t, b) <= sc.holders for t in
                                             ("seq", "job", "pin", "cache", "on_free")],
                                           s.ref(b) <= 4 * sc.holders,
                                           s.content(b) < sc.ids, s.meaning(b) < sc.ids)
                                    for b in blocks])

    def step(self, kind: str, s, s2, block: int, tag: str):
        """The block step ``kind`` on ``block``: its rule, plus the scope's limits."""
        L, sc = self.L, self.scope
        arg = L.var(f"{tag}.{kind}.arg")
        parts = [f for _, _, f in self.steps[kind](L, s, s2, block, arg)]
        parts += [arg >= -1, arg < sc.ids]
        for k in ("seq", "job", "pin", "cache"):  # (a step beyond the scope is not taken)
            parts.append(s2.get(k, block) <= sc.holders)
        return L.and_(*parts), arg

    def requires(self, kind: str, s, s2, block: int, arg=None):
        L = self.L
        arg = L.val(0) if arg is None else arg
        return L.and_(*[f for c, _, f in self.steps[kind](L, s, s2, block, arg)
                        if c == "requires"])


class _Encoding:
    def __init__(self, scope, steps, invariants, encoding):
        self.model = m = TierModel(scope, steps, invariants, encoding)
        self.L = m.L
        self.s, self.s2 = s, s2 = m.state("s"), m.state("s2")
        self.kinds = list(m.steps)
        self.cases = [FOCUS] + ([OTHER] if scope.num_blocks > 1 else [])
        self.steps = {(k, a): m.step(k, s, s2, a, f"t.{k}.{a}")[0]
                      for k in self.kinds for a in self.cases}

    def hyp(self, acted: int):
        L, s = self.L, self.s
        return [self.model.well_formed(s),
                *[fn(L, s, b) for _, fn in self.model.invariants for b in sorted({FOCUS, acted})]]


def prove_tier_invariants(scope: TierModelScope | None = None, steps=None, invariants=None,
                          timeout_ms: int | None = 60_000, encoding: str = "auto",
                          witness_depth: int = 4, witnesses: bool = True,
                          induction: bool = True) -> list[Proof]:
    """Every per-block tier invariant, per block step; the eviction of a held block
    refused; the witnesses (``induction=False``: only those; ``witnesses=False``: none).
    ``steps``: rule name -> rule (default the spec's); ``invariants``: (name, fn) tier
    invariants (default ``TIER_BLOCK_INVARIANTS``); ``encoding``: "bv", "int" or "auto"
    (portfolio, bit-vectors first)."""
    sc = scope or TierModelScope()
    names = ("bv", "int") if encoding == "auto" else (encoding,)
    encs = [_Encoding(sc, steps, invariants, e) for e in names]
    first = encs[0]
    where = sc.describe()
    out: list[Proof] = []

    if not induction:
        return find_witnesses(encs, sc, witness_depth, timeout_ms) if witnesses else out
    t0 = time.perf_counter()
    base = _portfolio(encs, lambda e: [e.model.init(e.s), z3.Not(z3.And(
        e.model.well_formed(e.s),
        *[fn(e.L, e.s, b) for _, fn in e.model.invariants for b in e.s.blocks()]))],
        timeout_ms)
    out.append(_proof("tiers base case: the initial pool satisfies every per-block invariant",
                      where, _verdict(base), time.perf_counter() - t0, "", [base], ENGINE))

    def per_step(name, goal, cases):
        t0 = time.perf_counter()
        failing, unknown, undecided, shown = [], [], [], ""
        for kind in first.kinds:
            for a in cases:
                r = _portfolio(encs, lambda e, k=kind, a=a: [*e.hyp(a), e.steps[k, a],
                                                             z3.Not(goal(e))],
                               timeout_ms, key=f"tiers.{kind}")
                label = kind if a == FOCUS else f"{kind} (another block)"
                if r == effort.SAT:
                    if not failing:
                        shown = _counterexample(encs, [*first.hyp(a), first.steps[kind, a],
                                                       z3.Not(goal(first))], first, a)
                    failing.append(label)
                elif r != effort.UNSAT:
                    unknown.append(label)
                    undecided.append(r)
        result = "violated" if failing else ("unknown" if unknown else "proved")
        detail = (f"not preserved by {', '.join(failing)}; counterexample ({failing[0]}): "
                  f"{shown}" if failing else
                  f"undecided for {', '.join(unknown)}" if unknown else
                  f"preserved by {', '.join(first.kinds)}")
        out.append(_proof(name, where, result, time.perf_counter() - t0, detail, undecided,
                          ENGINE))

    per_step("tiers model well-formed (counts, ids in scope)",
             lambda e: e.model.well_formed(e.s2), [FOCUS])
    for i, (name, _) in enumerate(first.model.invariants):
        per_step(f"tiers: {name}",
                 lambda e, i=i: e.model.invariants[i][1](e.L, e.s2, FOCUS), first.cases)

    if "evict" in first.kinds:
        t0 = time.perf_counter()

        def held_evicted(e):  # a block a job, a sequence or a pin holds, evicted
            s = e.s
            others = e.L.or_(*[s.count(k, FOCUS) >= 1 for k in ("seq", "job", "pin")])
            return [*e.hyp(FOCUS), others, e.model.requires("evict", s, e.s2, FOCUS)]

        r = _portfolio(encs, held_evicted, timeout_ms, key="tiers.evict")
        detail = ("the eviction step's requires fails for every held block, in every state "
                  "satisfying the invariants")
        if r == effort.SAT:
            detail = ("a held block meets the eviction step's requires: "
                      + _counterexample(encs, held_evicted(first), first, FOCUS, after=False))
        out.append(_proof("tiers: evict never takes a block a job, a sequence or a pin holds "
                          "(a load's pinned hit is not evictable)", where, _verdict(r),
                          time.perf_counter() - t0, detail, [r], ENGINE))
    if witnesses:
        out += find_witnesses(encs, sc, witness_depth, timeout_ms)
    return out


# -- witnesses: bounded search from the initial pool ---------------------------------------
WITNESSES = ("a store before and after its completion",
             "a load's host hit pinned while the cache evicts: the eviction refused",
             "a request freed with a job in flight: held by the job, freed at its completion",
             "a prefetch's page it does not keep: the release queue's, then free once")


def _path(e: _Encoding, depth: int, tag: str):
    """States s0..s_depth from the initial pool, each step any rule on any block (one
    selector per rule and block, exactly one taken)."""
    m = e.model
    states = [m.state(f"{tag}.s{i}") for i in range(depth + 1)]
    facts = [m.init(states[0])]
    sels = []
    for i in range(depth):
        s, s2 = states[i], states[i + 1]
        here = []
        for kind in m.steps:
            for b in s.blocks():
                sel = z3.Bool(f"{tag}.{i}.{kind}.{b}")
                body, _ = m.step(kind, s, s2, b, f"{tag}.{i}.{b}")
                facts.append(z3.Implies(sel, body))
                here.append((sel, kind, b))
        facts.append(z3.PbEq([(x[0], 1) for x in here], 1))
        facts.append(m.well_formed(s2))
        sels.append(here)
    return states, facts, sels


def _goal(e: _Encoding, which: int, states, sels):
    L, m = e.L, e.model
    a = FOCUS
    last = len(states) - 1
    if which == 0:  # a store started (not a prefetch: storing covers both), pending and
        # not findable at t; its completion (publish) at u: findable
        return L.or_(*[L.and_(start, states[t].storing(a), states[t].keys_naming(None, a) == 0,
                              done, states[u + 1].keys_naming(None, a) >= 1,
                              L.not_(states[u + 1].pending(a)),
                              states[u + 1].meaning(a) == states[u + 1].content(a))
                       for t in range(last + 1) for u in range(t, last)
                       for s0 in range(t) for start in _taken(sels[s0], "start_store", a)
                       for done in _taken(sels[u], "publish", a)])
    if which == 1:  # a completed store's block, then a load's hit on it: evict refused
        s = states[last]
        return L.and_(
            L.or_(*[L.and_(p, h) for t in range(last) for u in range(t + 1, last)
                    for p in _taken(sels[t], "publish", a) for h in _taken(sels[u], "hold[job]", a)]),
            s.keys_naming(None, a) >= 1, s.count("job", a) >= 1,
            L.not_(m.requires("evict", s, s, a)))
    if which == 3:  # a prefetch's destination, released (not kept), then drained: free
        return L.or_(*[L.and_(start, rel, states[last].on_free(a) == 1,
                              states[last].count("pin", a) == 0)
                       for t in range(last) for u in range(t + 1, last)
                       for start in _taken(sels[t], "start_prefetch", a)
                       for rel in _taken(sels[u], "release", a)])
    # a job pins the request's block (a store's source), the request drops it while the
    # job is in flight: still held; free at the end (the job's completion)
    return L.or_(*[L.and_(pin, states[t0].count("seq", a) >= 1, sel,
                          states[t].count("job", a) >= 1, states[t + 1].on_free(a) == 0,
                          states[last].on_free(a) == 1)
                   for t in range(last) for sel in _taken(sels[t], "drop[seq]", a)
                   for t0 in range(t) for pin in _taken(sels[t0], "hold[job]", a)])


def _taken(here, kind: str, block: int) -> list:
    return [sel for sel, k, b in here if k == kind and b == block]


def find_witnesses(encs, sc: TierModelScope, depth: int, timeout_ms) -> list[Proof]:
    out = []
    for which, name in enumerate(WITNESSES):
        t0 = time.perf_counter()
        found = None
        for e in encs:
            states, facts, sels = _path(e, depth, f"w{which}.{e.model.encoding}")
            solver = z3.Solver()
            effort.limit(solver, effort.units(effort.QUERY_UNITS), timeout_ms)
            solver.add(*facts, _goal(e, which, states, sels))
            r = effort.check(solver)
            if effort.decided(r):
                found = (r, _describe(solver.model(), states, sels) if r == effort.SAT else "")
                break
        if found is None:
            result, detail, answers = "unknown", "no witness found", [r]
        elif found[0] == effort.SAT:
            result, detail, answers = "proved", f"witness: {found[1]}", []
        else:  # (a coverage warning, as prove's: a deeper search may find it)
            result, detail, answers = "unreachable", (f"warning: no run of {depth} steps from "
                                                      "the initial pool shows it"), []
        out.append(_proof(f"tiers reachable: {name}", f"{sc.describe()}, depth {depth}", result,
                          time.perf_counter() - t0, detail, answers, ENGINE))
    return out


def _val(model, x):
    v = model.eval(x, model_completion=True)
    if z3.is_bool(v):
        return z3.is_true(v)
    return v.as_signed_long() if hasattr(v, "as_signed_long") else v.as_long()


def _block(model, s, b) -> str:
    """Block ``b`` of ``s`` in ``model``: its holders, refcount, flags, ids."""
    def val(x):
        return _val(model, x)

    held = {k: val(s.count(k, b)) for k in ("seq", "job", "pin", "cache")}
    text = ",".join(f"{k}{n}" for k, n in held.items() if n) or "unheld"
    flags = [f for f in ("storing", "loading", "evictable", "backs") if val(s.get(f, b))]
    if val(s.on_free(b)):
        flags.append("free" if val(s.on_free(b)) == 1 else f"free x{val(s.on_free(b))}")
    text += f"{'(' + ','.join(flags) + ')' if flags else ''} ref {val(s.ref(b))}"
    ids = [f"{t} {val(s.get(t, b))}" for t in ("content", "meaning") if val(s.get(t, b)) >= 0]
    return text + (f" {' '.join(ids)}" if ids else "")


def _counterexample(encs, parts, e, acted: int, after: bool = True) -> str:
    """A model of ``parts`` (an induction query found sat), as block 0 before and after
    (and the block acted on, when another)."""
    solver = z3.Solver()
    effort.limit(solver, effort.units(effort.QUERY_UNITS), None)
    solver.add(*parts)
    if solver.check() != z3.sat:
        return "(not rebuilt)"
    m = solver.model()
    text = f"block 0 before: {_block(m, e.s, FOCUS)}"
    if after:
        text += f"; after: {_block(m, e.s2, FOCUS)}"
    if acted != FOCUS:
        text += f"; the block acted on before: {_block(m, e.s, acted)}"
    return text


def _describe(model, states, sels) -> str:
    def val(x):
        return _val(model, x)

    def block(s, b):
        return _block(model, s, b)

    steps = []
    for t, here in enumerate(sels):
        kind, b = next((k, b) for sel, k, b in here if val(sel))
        steps.append(f"{kind}@{b} -> block 0 {block(states[t + 1], FOCUS)}")
    return "; ".join(steps)


def weakened(step: str, clause: str, replacement=None):
    """``STEPS[step]`` with its clause ``clause`` dropped (``replacement(L, pre, post, a)``:
    put in its place): a rule weakened on purpose, to show the rows refute it."""
    rule = STEPS[step]

    def weak(L, pre, post, a, arg=None):
        for c, name, f in rule(L, pre, post, a, arg):
            if name != clause:
                yield c, name, f
            elif replacement is not None:
                yield c, name, replacement(L, pre, post, a)

    return weak


def _free_at_no_seq(L, pre, post, a):
    """The weakened drop: free once no sequence holds it, though a job still may."""
    return post.on_free(a) == pre.on_free(a) + L.ite(post.count("seq", a) == 0, 1, 0)


def _queued_again(L, pre, post, a):
    """The weakened release: the queue takes a reference the job keeps (a second owner)."""
    return L.and_(post.count("job", a) == pre.count("job", a),
                  post.count("pin", a) == pre.count("pin", a) + 1, post.ref(a) == pre.ref(a))


WEAKENED = {  # name -> the step rules with one weakened
    "drop[seq] frees a block a job still holds": {
        **STEPS, "drop[seq]": weakened("drop[seq]", "free at 0", _free_at_no_seq)},
    "evict takes any cached block": {
        **STEPS, "evict": weakened("evict", "held by the cache alone")},
    "release queues a page the job still holds": {
        **STEPS, "release": weakened("release", "the job's reference becomes the release "
                                     "queue's", _queued_again)},
}

