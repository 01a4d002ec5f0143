"""Coverage: how often each outcome class of each operation occurred in a run.

The classes are the spec's (``kvcheck.spec.outcomes``: the ones ``kvcheck prove``
witnesses), and each step is classified by the spec's own ``classify``, evaluated on the
step's touched domain, as the fast mode checks it: the sequence the step named, its
table's blocks and their refcounts before the step, the refcounts after it. Only a
campaign counts: ``Counter.watch`` is handed to the checker as ``Options.extra["watch"]``
(``kvcheck.check.run.drive``) and wraps the block manager's oracle of that one run, so
``kvcheck verify`` and every replay run exactly as they do without it.

The block manager's classes apply wherever a model checks its structure through the
block manager's oracle (``blocks``; ``prefix``, whose cache adds the classes its
``verify-prefix`` reports: a hit, a revival, an eviction, out of blocks; ``device``, whose
decode steps reserve their slots as appends). The hybrid model's oracle reads the whole pool
itself: its runs count what its ``verify-hybrid`` reports (cache hits, sliding-window drops,
out of blocks, multi-token steps). The engine model's oracle reads the whole engine after
every step: its runs count what its ``verify-engine`` reports (requests finished, aborted,
preemptions, cache-hit blocks), and its target offers ``add`` and ``step``, and ``abort``
unless it declares none (``aborts = False``: nano-vllm). The scheduler model has no outcome
classes in the spec: its coverage says so instead of inventing any.

A class that never occurred is a warning, unless it is not applicable to the target
(``not_applicable``: a refusal's, where the target refused nothing, a refusal being a policy
a target may declare, never one it must have; an eager fork's or rebase's, where its forks
of a partial tail shared it, as a lazy one does) or it occurred as the violating step of a
run's counterexample (``Counter.counterexample``: classified from the states the trace
recorded around it).
"""

from __future__ import annotations

from collections import Counter as _Counts

from kvcheck.spec.contracts import OK, OOB, REFUSED
from kvcheck.spec.logic import PY
from kvcheck.spec.outcomes import OUTCOMES, _copied_tail, classify
from kvcheck.spec.state import NULL, Snapshot

# The cache behaviour the prefix model's runs count (its oracle's ``Stats``), by class.
PREFIX_CLASSES = {"cache/hit": "hit_allocations", "cache/revived": "revived",
                  "cache/evicted": "evicted", "cache/out-of-blocks": "oob",
                  "cache/partial-hit": "partial_hits", "cache/orphan": "orphans",
                  "cache/repeated-prompt": "repeats"}

# The hybrid model's runs (``verify-hybrid``: its oracle checks the whole pool itself, not
# through the block manager's oracle, so the block manager's classes are not counted there):
# the behaviour its oracle's ``stats`` count, by class.
HYBRID_CLASSES = {"hybrid/hit": "hits", "hybrid/window-drop": "dropped",
                  "hybrid/out-of-blocks": "oob", "hybrid/out-of-blocks-after-a-drop": "oob_dropping",
                  "hybrid/append-tokens": "append_tokens"}

# The engine model's runs (``verify-engine``: its oracle reads the whole engine, with no block
# manager's oracle): the behaviour its oracle's ``stats`` count, by class.
ENGINE_CLASSES = {"engine/finished": "finished", "engine/aborted": "aborted",
                  "engine/preempted": "preemptions", "engine/cache-hit": "hits"}
# The classes counted from a run's ``stats``, per model (no spec class per step there).
STATS_CLASSES = {"hybrid": HYBRID_CLASSES, "engine": ENGINE_CLASSES}

# The violations found at a step that completed (its outcome known, so it has a class).
COMPLETED = ("contract", "invariant", "data")
# The operations a lazy implementation of which shares a partial tail (an eager one copies it).
LAZY_EVIDENCE = ("fork", "rebase")

NO_CLASSES = {"scheduler": "the scheduler model has no outcome classes in the spec (its policy "
                           "clauses are checked at every step; nothing to count)"}


def classes(model: str) -> list[str]:
    """Every class a run of ``model`` can count, in the spec's order."""
    if model in NO_CLASSES:
        return []
    if model in STATS_CLASSES:
        return list(STATS_CLASSES[model])
    return list(OUTCOMES) + (list(PREFIX_CLASSES) if model == "prefix" else [])


def needs(name: str) -> set[str]:
    """The operations a target must offer for class ``name`` to be possible at all."""
    if name == "hybrid/append-tokens":
        return {"append_tokens"}
    if name.startswith("engine/"):
        return {"abort"} if name == "engine/aborted" else {"step"}
    if name.startswith(("cache/", "hybrid/")):
        return {"allocate"}
    kind = OUTCOMES[name][0]
    return {kind, "fork"} if "copy-on-write" in name else {kind}


class _Pre:
    """The state before an operation, as much as its outcome classes read: the lengths,
    reservations and tables of the sequences it names, and the refcounts of their
    blocks."""

    __slots__ = ("block_size", "seqs", "refs")

    def __init__(self, state, block_size, seqs):
        self.block_size = block_size
        self.seqs = {}
        for q in seqs:
            if q in state.lengths:
                self.seqs[q] = (state.length(q), state.reserved(q), tuple(state.table_tuple(q)))
        self.refs = {b: state.ref(b) for _, _, t in self.seqs.values() for b in t}

    def length(self, q):
        return self.seqs[q][0] if q in self.seqs else 0

    def reserved(self, q):
        return self.seqs[q][1] if q in self.seqs else 0

    def _table(self, q):
        return self.seqs[q][2] if q in self.seqs else ()

    def nblocks(self, q):
        return len(self._table(q))

    def positions(self, q):
        return range(len(self._table(q)))

    def table(self, q, i):
        t = self._table(q)
        return t[i] if 0 <= i < len(t) else -1

    def tail(self, q):
        t = self._table(q)
        return t[-1] if t else -1

    def ref(self, b):
        return self.refs.get(b, 0)

    def blocks(self):
        return self.refs.keys()  # the only blocks the sequences hold an occurrence of

    def occurrences(self, q, b):
        return self._table(q).count(b)


class Counter:
    """The outcome classes one run showed (``counts``), the operations its target offered
    (``capabilities``), and what says which classes it can show at all (``notes``): its
    forks and rebases of a partial tail that shared it (a lazy fork's), and the class of
    the step its violation was found at (that class occurred, wrongly)."""

    def __init__(self, model: str):
        self.model = model
        self.counts: _Counts = _Counts()
        self.capabilities: list[str] | None = None
        self.state = None
        self.shared_partial: _Counts = _Counts()  # kind -> forks/rebases sharing a partial tail
        self.violating: str | None = None

    def watch(self, state) -> None:
        """Told of the run state as the run starts: count every step of its block
        manager's oracle from now on."""
        from kvcheck.models.blocks.oracle import Oracle

        self.state = state
        oracle = state if isinstance(state, Oracle) else next(
            (v for v in vars(state).values() if isinstance(v, Oracle)), None)
        target = getattr(oracle if oracle is not None else state, "target", None)
        caps = getattr(target, "capabilities", None)
        if self.model == "engine":  # (the engine model's operations, abort where it has one)
            caps = ["add", "step"] + (["abort"] if getattr(target, "aborts", True) else [])
        if caps is not None:
            self.capabilities = sorted(str(c) for c in caps)
        if oracle is None:
            return
        step, counts, shared = oracle.step, self.counts, self.shared_partial

        def counting(op, watchdog=None):
            pre = None
            if op.kind != "allocate":  # (allocate's classes read nothing before it)
                pre = _Pre(oracle._state(), oracle.block_size, (op.seq, op.child))
            v = step(op, watchdog)
            if v is None:
                try:
                    name = classify(PY, pre, oracle._state(), op)
                except Exception:  # noqa: BLE001 - coverage is counted, never a run's end
                    name = None
                if name is not None:
                    counts[name] += 1
                    if op.kind in LAZY_EVIDENCE and op.outcome == OK and \
                            not getattr(op, "copies", None) and pre.length(op.seq) % pre.block_size:
                        shared[op.kind] += 1
            return v

        oracle.step = counting

    def result(self, end_state=None) -> dict | None:
        """The run's counts by class (every class of the model, zeros included), or None for
        a model without classes."""
        if self.model in NO_CLASSES:
            return None
        stats = getattr(end_state if end_state is not None else self.state, "stats", None)
        if self.model in STATS_CLASSES:  # (its oracle's stats: a dict)
            return {name: int((stats or {}).get(key, 0) or 0)
                    for name, key in STATS_CLASSES[self.model].items()}
        out = {name: self.counts.get(name, 0) for name in OUTCOMES}
        if self.model == "prefix":
            for name, attr in PREFIX_CLASSES.items():
                out[name] = int(getattr(stats, attr, 0) or 0)
        return out


    def counterexample(self, trace) -> None:
        """Told of the run's counterexample: the class of its violating step, from the states
        the trace recorded around it (none for a step that did not complete: a crash, a hang,
        a malformed result; nor for a model whose states hold no pool)."""
        v = trace.violation if trace is not None else None
        if v is None or v.kind not in COMPLETED or not 1 <= v.step <= len(trace.states) or \
                self.model == "engine":  # (an engine step has no class of the spec's)
            return
        from kvcheck.check.model import model_named

        m = model_named(trace.model)
        before = (trace.states[v.step - 2] if v.step >= 2
                  else m.initial_state_json(trace.scope))
        try:
            pre, post = (_snapshot(s, trace.num_blocks, trace.block_size)
                         for s in (m.pool_of(before), m.pool_of(trace.states[v.step - 1])))
            self.violating = classify(PY, pre, post, trace.ops[v.step - 1])
        except Exception:  # noqa: BLE001 - coverage is counted, never a run's end
            self.violating = None

    def notes(self) -> dict:
        """What the run says about the classes it could show (``merge_notes``)."""
        return {"shared_partial_tail": dict(self.shared_partial),
                "counterexample": [self.violating] if self.violating else []}


def _snapshot(state: dict, num_blocks: int, block_size: int) -> Snapshot:
    """A recorded pool (``Model.pool_of``) as the spec's state."""
    return Snapshot(num_blocks, block_size,
                    {int(q): [NULL if b is None else b for b in t]
                     for q, t in state["tables"].items()},
                    {int(q): n for q, n in state["lens"].items()}, state["refs"], state["free"])


def merge(total: dict, counts: dict | None) -> None:
    """Add one run's counts to ``total`` (class -> occurrences)."""
    for name, n in (counts or {}).items():
        total[name] = total.get(name, 0) + n


def merge_notes(total: dict, notes: dict | None) -> None:
    """Add one run's ``Counter.notes`` to ``total``."""
    if not notes:
        return
    shared = total.setdefault("shared_partial_tail", {})
    for kind, n in (notes.get("shared_partial_tail") or {}).items():
        shared[kind] = shared.get(kind, 0) + n
    seen = total.setdefault("counterexample", [])
    for name in notes.get("counterexample") or ():
        if name not in seen:
            seen.append(name)


def _eager(name: str) -> bool:
    """Whether class ``name`` is one only an eager fork or rebase shows (a copy of the
    partial tail, or running out of blocks for it: a lazy one allocates nothing)."""
    kind, outcome, pred = OUTCOMES[name]
    return kind in LAZY_EVIDENCE and (outcome == OOB or pred is _copied_tail)


def not_applicable(model: str, total: dict, notes: dict | None,
                   offered: set[str] | None = None, accepts: dict | None = None) -> dict[str, str]:
    """The classes this campaign's target can never show although it offers what they need,
    each with why: a refusal where it refused nothing (a refusal is a policy a target may
    have, never one it must have), an eager fork's or rebase's where its forks of a partial
    tail all shared it (lazily); an engine's cache hits where it accepts prefix caching only
    off (``accepts``: the campaign's ``Settings.accepts``)."""
    if model == "engine":
        if total.get("engine/cache-hit", 0) or True in (accepts or {}).get("caching", [True]):
            return {}
        return {"engine/cache-hit": "the target accepts prefix caching only off"}
    if model in NO_CLASSES or model == "hybrid":
        return {}
    shared = (notes or {}).get("shared_partial_tail") or {}
    out = {}
    for name in classes(model):
        if name not in OUTCOMES or total.get(name, 0):
            continue
        if offered is not None and not needs(name) <= offered:
            continue  # (not offered at all: said apart)
        kind, outcome, _ = OUTCOMES[name]
        if outcome == REFUSED and not any(total.get(c, 0) for c, (_, o, _) in OUTCOMES.items()
                                          if o == REFUSED):
            out[name] = ("the target refused nothing: a refusal is a policy a target may "
                         "declare, never one it must have")
        elif _eager(name) and shared.get(kind) and not any(
                total.get(c, 0) for c in OUTCOMES if _eager(c) and OUTCOMES[c][0] == kind):
            out[name] = (f"the target's {kind} is lazy: {shared[kind]:,} {kind}(s) of a partial "
                         f"tail shared it, and a lazy {kind} never copies nor runs out of blocks")
    return out


def warnings(model: str, total: dict, offered: set[str] | None,
             notes: dict | None = None,
             accepts: dict | None = None) -> tuple[list[str], list[str], dict[str, str]]:
    """The classes that never occurred over the campaign (a class some run's counterexample
    is, occurred: that is not a gap of coverage), those its target cannot show (it does not
    offer an operation they need), and those not applicable to it (``not_applicable``: the
    class, why)."""
    never, impossible = [], []
    na = not_applicable(model, total, notes, offered, accepts)
    shown = set((notes or {}).get("counterexample") or ())
    for name in classes(model):
        if total.get(name, 0):
            continue
        if offered is not None and not needs(name) <= offered:
            impossible.append(name)
        elif name not in na and name not in shown:
            never.append(name)
    return never, impossible, na
