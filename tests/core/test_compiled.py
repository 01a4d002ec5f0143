"""The compiled spec (``kvcheck.compile``) means exactly what the spec says.

Three layers: the tracer records the spec faithfully (branches, quantifiers,
aggregates); every inline template equals the vocabulary method it stands
for; and, end to end, an oracle checking with the compiled spec reports the
very same violations as one evaluating the spec directly, on randomly faulty
allocators and on the corpus.
"""

from __future__ import annotations

import collections
import random

import pytest
from core.states import corrupt, reachable

from kvcheck.compile.terms import Term
from kvcheck.compile.tracer import TL, TDomain, TState, Untraceable, trace
from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.blocks import compiled as checks
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.ghost import After, Ghost
from kvcheck.models.blocks.inline import FOR
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import CONTRACTS, OK, OOB, REFUSED, Op
from kvcheck.spec.state import Snapshot
from kvcheck.targets.loading import build

from corpus.buggy import CORPUS


# -- the tracer ----------------------------------------------------------------------
def _run(source: str, name: str, *args):
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - compiled test source
    return namespace[name](*args)


def test_branches_become_if_else():
    """A Python ``if`` on a traced value explores both answers."""
    from kvcheck.compile.emit import function_source

    s = TState("pre")

    def spec():
        if s.length(1) > 3:
            yield s.ref(0) == 1
        else:
            yield s.ref(0) == 2

    src = function_source("f", ["pre"], trace(spec), {"pre": "pre"}, {})

    class St:
        def __init__(self, n, r):
            self.n, self.r = n, r

        def length(self, q):
            return self.n

        def ref(self, b):
            return self.r

    assert _run(src, "f", St(5, 1)) and not _run(src, "f", St(5, 2))
    assert _run(src, "f", St(1, 2)) and not _run(src, "f", St(1, 1))


def test_a_list_built_in_a_loop_is_counted_over_the_loop():
    """free_seq's ``released`` list: appended per block, counted after the loop."""
    s = TState("pre")
    dom = TDomain(Term("sym", "blocks"))

    def spec():
        released = []
        for b in dom:
            released.append(s.ref(b) == 0)
            yield s.ref(b) >= 0
        yield TL.count(released) == s.num_free()

    tree = trace(spec)
    kinds = [c.kind for c in tree.clauses]
    assert kinds == ["agg", "cmp"]
    assert tree.clauses[1].args[1].kind == "agg" and tree.clauses[1].args[1].args[0] == "count"


def test_a_branch_on_a_bound_variable_is_refused():
    s = TState("pre")
    dom = TDomain(Term("sym", "blocks"))

    def spec():
        for b in dom:
            if s.ref(b) > 0:
                yield s.holders(b) > 0

    with pytest.raises(Untraceable):
        trace(spec)


def test_every_contract_and_invariant_compiles():
    for kind in CONTRACTS:
        assert checks.step(kind, Ghost, After)
        for outcome in ("ok", "oob", "refused"):
            assert checks.step_for(kind, outcome, Ghost, After)
        assert checks.precondition(kind, Ghost)
    assert checks.state_invariants(Snapshot)


# -- inline templates vs methods -------------------------------------------------------
def _template_value(template, state, texts, values):
    """``template``'s code for argument texts ``texts``, run with ``values`` bound
    to those names: ``(result,)``, or None where the template declines."""
    emitted = template("st", *texts)
    if emitted is None:
        return None
    code, binds = emitted
    env = {"st": state, **values}
    for local, source in binds.items():
        env[local] = eval(source, {}, env)  # noqa: S307 - a template's own source
    return (eval(code, {}, env),)  # noqa: S307


def _arguments(method, state, seqs, rng):
    n = state.num_blocks
    blocks = list(range(-2, n + 2))
    if method in ("ref", "free_count", "holders"):
        return [(b,) for b in blocks]
    if method in ("num_free", "free_entries", "zero_refs"):
        return [()]
    if method == "table":
        return [(q, i) for q in seqs for i in range(-1, state.nblocks(q) + 2)]
    if method == "occurrences":
        return [(q, b) for q in seqs for b in rng.sample(blocks, min(6, len(blocks)))]
    if method == "same_table":
        return [(q, "PRE", r, upto) for q in seqs for r in seqs for upto in (None, 0, 1, 2)]
    return [(q,) for q in seqs]


def _check_templates(state, templates, seqs, rng, pre=None):
    for method, template in templates.items():
        for args in _arguments(method, state, seqs, rng):
            if method == "same_table":  # After's: against the Ghost it was observed from
                q, _, r, upto = args
                texts = ["a0", "s_pre", "a2", "None" if upto is None else "a3"]
                got = _template_value(template, state, texts,
                                      {"a0": q, "s_pre": pre, "a2": r, "a3": upto})
                args = (q, pre, r, upto)
            else:
                texts = [f"a{i}" for i in range(len(args))]
                got = _template_value(template, state, texts, dict(zip(texts, args, strict=True)))
            if got is None:
                continue
            want = getattr(state, method)(*args)
            assert got[0] == want, (type(state).__name__, method, args, got[0], want)


@pytest.mark.parametrize("seed", range(6))
def test_snapshot_and_ghost_templates_mean_their_methods(seed):
    rng = random.Random(seed)
    for _ in range(8):
        snap = reachable(rng, rng.randint(2, 10), rng.randint(1, 4), 30, 16)
        if rng.random() < 0.5:
            snap = corrupt(rng, snap)
        seqs = [*snap.tables, 99]
        _check_templates(snap, FOR[Snapshot], seqs, rng)
        _check_templates(Ghost.from_snapshot(snap), FOR[Ghost], seqs, rng)


@pytest.mark.parametrize("seed", range(6))
def test_after_templates_mean_their_methods(seed):
    """After's templates, on the touched sequences, after real (and faulty) operations."""
    rng = random.Random(seed)
    oracle = Oracle(build(Faulty.factory(seed, 0.0), 10, 2), mode="fast", timeout=None)
    driver = RandomDriver(seed, 10, 2, oracle.target.capabilities)
    for _ in range(150):
        op = driver.next_op(oracle.live_seqs(), oracle.ghost.num_free())
        if not oracle.valid(op):
            continue
        pre = oracle.ghost
        probe = oracle.clone()
        if probe._invoke(op, None) is not None:
            continue
        delta = probe._length_delta(op)
        extra = (op.block, op.cow_src) if op.kind == "append_slot" else ()
        post = After(probe.target, probe.ghost, tuple(delta),
                     {q: m for q, m in delta.items() if m is not None}, extra)
        _check_templates(post, FOR[After], list(delta), rng, pre=pre)
        if oracle.step(op) is not None:
            break


# -- end to end: compiled and interpreted oracles agree ------------------------------------
class Faulty(BlockManager):
    """The reference with random faults after an operation: a refcount, the free list,
    a table entry, a length, a table shared between sequences, a wrong result."""

    def __init__(self, num_blocks, block_size, seed=0, rate=0.05):
        super().__init__(num_blocks, block_size)
        self._rng = random.Random(seed)
        self._rate = rate

    @classmethod
    def factory(cls, seed, rate):
        return lambda nb, bs: cls(nb, bs, seed, rate)

    def _fault(self):
        rng = self._rng
        if rng.random() >= self._rate:
            return None
        n, live = len(self.ref), list(self.tables)
        kind = rng.randrange(8)
        if kind == 0:
            self.ref[rng.randrange(n)] += rng.choice((-1, 1))
        elif kind == 1 and self.free:
            self.free.pop(rng.randrange(len(self.free)))
        elif kind == 2:
            self.free.append(rng.randrange(n))
        elif kind == 3 and live:
            t = self.tables[rng.choice(live)]
            if t:
                t[rng.randrange(len(t))] = rng.randrange(-1, n + 1)
        elif kind == 4 and live:
            q = rng.choice(live)
            self.lens[q] += rng.choice((-1, 1))
        elif kind == 5 and len(live) >= 2:
            a, b = rng.sample(live, 2)
            self.tables[a] = self.tables[b]
        elif kind == 6 and live:
            t = self.tables[rng.choice(live)]
            if t:
                t.pop()
        return kind

    def allocate(self, seq, n_tokens):
        super().allocate(seq, n_tokens)
        self._fault()

    def fork(self, parent, child):
        super().fork(parent, child)
        self._fault()

    def free_seq(self, seq):
        super().free_seq(seq)
        self._fault()

    def append_slot(self, seq):
        block, offset, cow = super().append_slot(seq)
        if self._fault() == 7:
            return block, offset + self._rng.choice((-1, 1)), cow
        return block, offset, cow


def _run_lockstep(factory, nb, bs, ops, seed, mode="fast"):
    """Run the same operations under a compiled and an interpreted oracle."""
    compiled = Oracle(build(factory, nb, bs), mode=mode, timeout=None, sweep_every=50)
    plain = Oracle(build(factory, nb, bs), mode=mode, timeout=None, sweep_every=50,
                   compiled=False)
    assert compiled.compiled and not plain.compiled
    driver = RandomDriver(seed, nb, bs, compiled.target.capabilities)
    for _ in range(ops):
        op = driver.next_op(compiled.live_seqs(), compiled._state().num_free(), compiled)
        if not compiled.valid(op):
            assert not plain.valid(op)
            continue
        twin = Op(op.kind, op.seq, op.child, op.n_tokens, lookahead=op.lookahead)
        a, b = compiled.step(op), plain.step(twin)
        assert (a is None) == (b is None), (a, b)
        if a is not None:
            assert (a.step, a.kind, a.name, a.element) == (b.step, b.kind, b.name, b.element)
            return a
    return None


@pytest.mark.parametrize("seed", range(20))
def test_per_outcome_steps_agree_with_the_whole_contract(seed, monkeypatch):
    """The oracle's step checks, each traced for one outcome, give what the check of the
    whole contract (every outcome's branch) gives, on every operation of faulty runs."""
    import kvcheck.models.blocks.oracle as oracle_mod

    calls, outcomes = [0], set()

    def paired(kind, outcome, own):
        whole = checks.step(kind, Ghost, After)

        def check(pre, post, op, blocks, live):
            got = own(pre, post, op, blocks, live)
            assert op.outcome == outcome
            assert got == whole(pre, post, op, blocks, live), (kind, outcome, op)
            calls[0] += 1
            outcomes.add(outcome)
            return got
        return check

    for kind, by_outcome in list(oracle_mod._STEPS.items()):
        monkeypatch.setitem(oracle_mod._STEPS, kind,
                            {o: paired(kind, o, f) for o, f in by_outcome.items()})
    # (the layered path's checks: the fused steps, which stand in for them on one-sequence
    # operations, are compared with that path in test_fused.py)
    monkeypatch.setattr(oracle_mod, "_FUSED", {})
    _run_lockstep(Faulty.factory(seed, 0.02), 6, 2, 400, seed)
    assert calls[0] > 0 and "ok" in outcomes


@pytest.mark.parametrize("seed", range(300))
def test_compiled_and_interpreted_agree_on_faulty_allocators(seed):
    nb, bs = [(3, 1), (6, 1), (10, 2), (16, 4), (24, 3), (40, 5)][seed % 6]
    rate = (0.01, 0.03, 0.1)[seed % 3]
    _run_lockstep(Faulty.factory(seed, rate), nb, bs, 600, seed)


def test_faults_are_found():
    """The differential test above is not vacuous: most faulty runs do fail."""
    found = sum(_run_lockstep(Faulty.factory(s, 0.03), 10, 2, 400, s) is not None
                for s in range(20))
    assert found >= 15


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_compiled_and_interpreted_agree_on_the_corpus(name):
    for seed in range(3):
        assert _run_lockstep(CORPUS[name][0], 12, 3, 3000, seed) is not None


# -- the full mode: the contract compiled over every block, the spec over the other sequences
@pytest.mark.parametrize("seed", range(60))
def test_full_mode_compiled_and_interpreted_agree_on_faulty_allocators(seed):
    """``Oracle._passes_compiled`` (the contract compiled over every block and the
    operation's own sequences, the spec itself over the others) finds what the spec
    evaluated clause by clause over the whole state finds, at the same step, with the same
    clause and element, on allocators that break tables, lengths and refcounts of
    sequences the operation does not name."""
    nb, bs = [(3, 1), (6, 1), (10, 2), (16, 4), (24, 3)][seed % 5]
    rate = (0.01, 0.03, 0.1)[seed % 3]
    _run_lockstep(Faulty.factory(seed, rate), nb, bs, 300, seed, mode="full")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_full_mode_compiled_and_interpreted_agree_on_the_corpus(name):
    for seed in range(3):
        assert _run_lockstep(CORPUS[name][0], 12, 3, 3000, seed, mode="full") is not None


def test_full_mode_contracts_are_compiled_and_used(monkeypatch):
    """Every operation's contract compiles for each outcome, and a full-mode run passes
    its steps through them (so the tests above compare two paths, not one)."""
    import kvcheck.models.blocks.oracle as oracle_mod

    assert set(oracle_mod._CONTRACTS) == {(k, o) for k in CONTRACTS for o in (OK, OOB, REFUSED)}
    used, last = collections.Counter(), {}

    def counted(key, f):
        def check(*args):
            got = last[key] = f(*args)
            used[(*key, got)] += 1
            return got
        return check

    for key, f in list(oracle_mod._CONTRACTS.items()):
        monkeypatch.setitem(oracle_mod._CONTRACTS, key, counted(key, f))
    assert _run_lockstep(BlockManager, 6, 2, 600, 0, mode="full") is None
    assert used["append_slot", OK, True] and used["fork", OK, True] and used["free_seq", OK, True]
    assert not any(got is False for (_, _, got) in used)  # (a legal allocator: all pass)
    # a table the operation does not name, rewritten: every block's clauses hold, so the
    # compiled part passes; the spec's part over the other sequences names it
    v = _run_lockstep(_ReversesOthers, 8, 2, 400, 0, mode="full")
    assert v is not None and v.name == "fork: other sequences untouched", v
    assert last["fork", OK] is True


class _ReversesOthers(BlockManager):
    """The reference, but a fork also reverses the table of another sequence holding two
    blocks or more (no refcount and no free list changes)."""

    def fork(self, parent, child):
        super().fork(parent, child)
        for q in sorted(self.tables):
            t = self.tables[q]
            if q not in (parent, child) and len(set(t)) >= 2:
                t.reverse()
                return


def test_spec_text_the_tracer_cannot_represent_is_checked_directly(monkeypatch):
    """A contract that branches on a quantified variable is refused by the tracer;
    the oracle then evaluates that operation's spec itself, and still catches bugs."""
    import kvcheck.models.blocks.oracle as oracle_mod
    from kvcheck.spec import contracts

    original = contracts.CONTRACTS["fork"]

    def fork(L, pre, post, op, dom):
        yield from original(L, pre, post, op, dom)
        for b in dom.blocks:
            if pre.ref(b) > 0:  # a Python branch on a quantified variable
                yield "held blocks stay held", b, post.ref(b) > 0

    monkeypatch.setitem(contracts.CONTRACTS, "fork", fork)
    assert oracle_mod._compiled(checks.step.__wrapped__, "fork", Ghost, After) is None
    monkeypatch.setitem(oracle_mod._STEPS, "fork", None)
    ok = _run_lockstep(BlockManager, 10, 2, 500, 0)
    assert ok is None
    assert _run_lockstep(CORPUS["fork-without-refcount"][0], 10, 2, 500, 0) is not None


def test_a_connective_of_booleans_is_its_value_others_are_made_bools():
    """``Emitter.value``: ``a and b`` over comparisons already is a bool (no ``bool()``
    call); over a value that may be any object (a symbol) it is made one. Either way the
    emitted value is exactly the connective's truth, a bool."""
    from kvcheck.compile.emit import Emitter

    x, y = Term("sym", "x"), Term("sym", "y")
    cases = [
        (Term("and", Term("cmp", ">", x, 0), Term("not", Term("cmp", "==", y, 1))), False),
        (Term("or", Term("cmp", ">", x, 0), Term("implies", Term("cmp", "==", y, 1), True)),
         False),
        (Term("and", Term("cmp", ">", x, 0), y), True),
        (Term("implies", Term("cmp", ">", x, 0), y), True),
    ]
    for t, wrapped in cases:
        text = Emitter({"x": "x", "y": "y"}, {}).value(t)
        assert text.startswith("bool(") == wrapped, text
        for xv in (-1, 0, 2):
            for yv in (0, 1, 5, [], [0]):
                got = eval(text, {"s_x": xv, "s_y": yv})  # noqa: S307 - our own emitted text
                truth = {"and": lambda a, b: a and b, "or": lambda a, b: a or b,
                         "implies": lambda a, b: (not a) or b}[t.kind]
                want = bool(truth(*[eval(Emitter({"x": "x", "y": "y"}, {}).expr(a),  # noqa: S307
                                         {"s_x": xv, "s_y": yv}) for a in t.args]))
                assert type(got) is bool and got == want, (text, xv, yv)
