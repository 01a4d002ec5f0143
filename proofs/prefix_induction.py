"""1-induction of every prefix-cache invariant over the prefix manager's block steps.

Base case: the initial pool (every block once on the plain free list, no key)
satisfies every invariant of ``kvcheck.spec.prefix.PREFIX_INVARIANTS``.
Preservation, per (invariant, block step of ``kvcheck.spec.prefix_steps``): if
every invariant holds in s (and s is well formed: counts non-negative, fill
within a block, prefix ids and holders within the scope) and s -> s2 is that
step, the invariant holds in s2. Well-formedness is itself proved preserved
(its own row), and so is the model's one auxiliary lemma (``content_complete``,
in the hypotheses like an invariant), so together these prove every invariant
of every state reachable by block steps, at any depth, within the scope.

Symmetry (why two cases and two blocks suffice). No step rule, invariant,
initial state or scope bound names a particular block: each quantifies over
``s.blocks()`` alike or speaks of "the block acted on" / "block b". So a
renaming of blocks maps states to states, steps to steps and invariant
instances to instances. Hence:

  * a per-block invariant I need only be shown at block 0 of s2: for any block
    b and step on block a, rename b to 0 and, if a != b, a to 1. The step acts
    on block 0 (case "same") or block 1 (case "other"), never anything else;
  * the hypotheses keep every global invariant whole and the per-block
    invariants of blocks 0 and the acted block only (a subset of what holds
    in s, so assuming them is sound); the other blocks are unconstrained
    beyond well-formedness and are framed by the step;
  * a global invariant (``pool_sizes``) and well-formedness are shown for the
    whole of s2, the step acting on block 0, assuming the per-block invariants
    of block 0.

Every prefix per-block invariant speaks of its own block only, which is why
block 0's hypotheses (plus the acted block's) carry the induction. Each query
is tried in bit-vectors, then integers (the ``kvcheck.proofs.induction``
portfolio), so it runs in seconds at 8 blocks and barely grows with the pool.

Besides the invariants, the cache-hit contract (``spec.prefix.cache_hits``:
a hit returns a cached block holding exactly the requested prefix) is proved
as a consequence of the invariants and the ``hit`` rule, and so is publish
after write, twice: a hit never returns a block whose slots are not all
written, and a block whose last holder lets go before it was written (freed
or preempted before its commit) is not cached afterwards (vLLM PR #43569).

And the cached-token count (``spec.prefix.cached_tokens``): an allocation that
reports the tokens of the blocks its lookup served (each taken by the ``hit``
rule for the prefix the prompt asks there, the lookup walking only the blocks
wholly within the prompt's first n - 1 tokens, as the reference does) satisfies
every clause of it, for every prompt length the scope holds: each block the count
skips holds the requested prefix, the count stops at the hits, and a prompt fully
in the cache leaves a token to compute. ``lookup`` / ``counted`` replace the
counting rule (how many blocks the lookup may walk, the count reported), to show
a weakened one refuted (vLLM PR #11186 and #5364 shapes).
"""

from __future__ import annotations

import time

import z3

from kvcheck.spec.prefix import cache_hits, cached_tokens

from . import effort
from .induction import Proof, _portfolio, _proof, _verdict
from .prefix_model import PrefixModel, _scope

ENGINE = "z3 k-induction (prefix cache)"
FOCUS, OTHER = 0, 1


class _Encoding:
    def __init__(self, scope, steps, invariants, encoding):
        self.model = m = PrefixModel(scope, steps, invariants, encoding)
        self.L = m.L
        self.s, self.s2 = s, s2 = m.state("s"), m.state("s2")
        self.blocks = [i for i in [*m.invariants, *m.lemmas] if i.domain == "block"]
        self.globals = [i for i in m.invariants if i.domain == "global"]
        self.kinds = list(m.steps)
        cases = [FOCUS] + ([OTHER] if m.scope.num_blocks > 1 else [])
        self.steps = {(k, a): m.step(k, s, s2, a, f"t.{k}.{a}") for k in self.kinds for a in cases}
        self.cases = cases

    def hyp(self, acted: int):
        L, s = self.L, self.s
        near = sorted({FOCUS, acted})
        return [self.model.well_formed(s), *[g.formula(L, s) for g in self.globals],
                *[i.holds_for(L, s, b) for i in self.blocks for b in near]]


def lookup_limit(n_tokens: int, block_size: int) -> int:
    """The counting rule's lookup: only blocks wholly within the first n - 1 tokens (the
    last token is always computed; the reference's ``_lookup_limit``)."""
    return (n_tokens - 1) // block_size


def counted(L, hits, n_tokens: int, block_size: int):
    """The counting rule's report: the tokens of the blocks served from the cache."""
    return hits * block_size


def prove_prefix_invariants(scope, steps=None, invariants=None, timeout_ms: int | None = 60_000,
                            encoding: str = "auto", lookup=lookup_limit,
                            count=counted) -> list[Proof]:
    """Every prefix invariant, per block step. ``scope``: a ``PrefixScope`` or a
    ``PrefixModelScope``; ``steps``: rule name -> rule (default the spec's);
    ``encoding``: "bv", "int" or "auto" (portfolio, bit-vectors first); ``lookup`` and
    ``count``: the cached-token counting rule (default the reference's)."""
    sc = _scope(scope)
    names = ("bv", "int") if encoding == "auto" else (encoding,)
    encs = [_Encoding(sc, steps, invariants, e) for e in names]
    first = encs[0]
    where = sc.describe()
    out: list[Proof] = []

    t0 = time.perf_counter()
    base = _portfolio(encs, lambda e: [e.model.init(e.s), z3.Not(z3.And(
        e.model.well_formed(e.s),
        *[i.formula(e.L, e.s) for i in [*e.model.invariants, *e.model.lemmas]]))], timeout_ms)
    out.append(_proof("prefix base case: the initial pool satisfies every prefix invariant",
                      where, _verdict(base), time.perf_counter() - t0, "", [base], ENGINE))

    def per_step(name, goal, cases):
        t0 = time.perf_counter()
        failing, unknown, undecided = [], [], []
        for kind in first.kinds:
            for a in cases(first):
                r = _portfolio(encs, lambda e, k=kind, a=a: [*e.hyp(a), e.steps[k, a][0],
                                                             z3.Not(goal(e))],
                               timeout_ms, key=f"prefix.{kind}")
                label = kind if a == FOCUS else f"{kind} (another block)"
                if r == effort.SAT:
                    failing.append(label)
                elif r != effort.UNSAT:
                    unknown.append(label)
                    undecided.append(r)
        result = "violated" if failing else ("unknown" if unknown else "proved")
        detail = (f"not preserved by {', '.join(failing)}" if failing else
                  f"undecided for {', '.join(unknown)}" if unknown else
                  f"preserved by {', '.join(first.kinds)}")
        out.append(_proof(name, where, result, time.perf_counter() - t0, detail, undecided, ENGINE))

    per_step("prefix model well-formed (counts, fill, ids, holders in scope)",
             lambda e: e.model.well_formed(e.s2), lambda e: [FOCUS])
    for i, inv in enumerate(first.blocks):
        per_step(inv.name, lambda e, i=i: e.blocks[i].holds_for(e.L, e.s2, FOCUS),
                 lambda e: e.cases)
    for i, inv in enumerate(first.globals):
        per_step(inv.name, lambda e, i=i: e.globals[i].formula(e.L, e.s2), lambda e: [FOCUS])

    if "hit" in first.kinds:
        t0 = time.perf_counter()

        def hit_query(e):
            body, want = e.steps["hit", FOCUS]
            claims = [f for _, _, f in cache_hits(e.L, e.s, [FOCUS], [want])]
            return [*e.hyp(FOCUS), body, z3.Not(z3.And(*claims))]

        r = _portfolio(encs, hit_query, timeout_ms, key="prefix.hit")
        out.append(_proof("cache hit returns a cached block holding the requested prefix",
                          where, _verdict(r), time.perf_counter() - t0,
                          "implied by the hit rule and the invariants", [r], ENGINE))

        def unwritten_hit(e):  # publish after write, as the hit sees it
            body, _ = e.steps["hit", FOCUS]
            return [*e.hyp(FOCUS), body, z3.Not(e.s.filled(FOCUS) == e.s.block_size)]

        t0 = time.perf_counter()
        r = _portfolio(encs, unwritten_hit, timeout_ms, key="prefix.hit")
        out.append(_proof("publish after write: a cache hit never returns a block whose "
                          "content is not written", where, _verdict(r), time.perf_counter() - t0,
                          "implied by the hit rule and key_after_write", [r], ENGINE))
        t0 = time.perf_counter()
        B, N = sc.block_size, sc.num_blocks
        lengths = range(1, N * B + 1)
        failing, unknown, undecided = [], [], []
        for n in lengths:
            r = _portfolio(encs, lambda e, n=n: _cached_tokens_query(e, n, lookup, count),
                           timeout_ms, key="prefix.cached_tokens")
            if r == effort.SAT:
                failing.append(n)
            elif r != effort.UNSAT:
                unknown.append(n)
                undecided.append(r)
        result = "violated" if failing else ("unknown" if unknown else "proved")
        detail = (f"refuted for a prompt of {failing[0]} token(s)" if failing else
                  f"undecided for prompts of {unknown} tokens" if unknown else
                  f"every prompt of 1..{N * B} tokens; implied by the hit rule, the "
                  "invariants and the lookup stopping before the last token")
        out.append(_proof("cached tokens: the count an allocation reports skips only "
                          "blocks holding the requested prefix and leaves a token to compute",
                          where, result, time.perf_counter() - t0, detail, undecided, ENGINE))
    if "release" in first.kinds:
        def early_free(e):  # vLLM PR #43569: freed before its write, still findable
            body, _ = e.steps["release", FOCUS]
            return [*e.hyp(FOCUS), body, e.s.filled(FOCUS) < e.s.block_size,
                    e.s2.ref(FOCUS) == 0, e.s2.cached(FOCUS)]

        t0 = time.perf_counter()
        r = _portfolio(encs, early_free, timeout_ms, key="prefix.release")
        out.append(_proof("publish after write: a block freed before its write is not "
                          "findable", where, _verdict(r), time.perf_counter() - t0,
                          "implied by the release rule and key_after_write", [r], ENGINE))
    return out


def _cached_tokens_query(e, n: int, lookup, count):
    """A prompt of ``n`` tokens in blocks 0, 1, ... (distinct blocks; by symmetry any),
    its first ``hits`` full blocks served by the hit rule for the prefixes it asks, the
    count reported by the counting rule: some clause of ``spec.prefix.cached_tokens``
    fails (sat: refuted; unsat: proved for this length)."""
    L, s, m = e.L, e.s, e.model
    B, N = m.scope.block_size, m.scope.num_blocks
    table = list(range(min(-(-n // B), N)))
    full = min(n // B, len(table))
    tag = f"ct{n}"
    wants = [L.var(f"{tag}.want{i}") for i in range(full)]
    hits = L.var(f"{tag}.hits")
    facts = [hits >= 0, hits <= min(lookup(n, B), full)]
    for i, w in enumerate(wants):
        req = [f for c, _, f in m.steps["hit"](L, s, e.s2, i, w) if c == "requires"]
        facts += [w >= 0, w < m.scope.ids, L.implies(i < hits, L.and_(*req))]
    reported = count(L, hits, n, B)
    hyp = [m.well_formed(s), *[g.formula(L, s) for g in e.globals],
           *[i.holds_for(L, s, b) for i in e.blocks for b in table]]
    goal = [f for _, _, f in cached_tokens(L, s, table, wants, n, hits, reported)]
    return [*hyp, *facts, z3.Not(z3.And(*goal))]
