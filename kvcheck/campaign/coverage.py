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
out of blocks, multi-token steps). The scheduler model has no outcome classes in the spec:
its coverage says so instead of inventing any.
"""

from __future__ import annotations

from collections import Counter as _Counts

from kvcheck.spec.logic import PY
from kvcheck.spec.outcomes import OUTCOMES, classify

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

NO_CLASSES = {"scheduler": "the scheduler model has no outcome classes in the spec (its policy "
                           "clauses are checked at every step; nothing to count)"}


def classes(model: str) -> list[str]:
    """Every class a run of ``model`` can count, in the spec's order."""
    if model in NO_CLASSES:
        return []
    if model == "hybrid":
        return list(HYBRID_CLASSES)
    return list(OUTCOMES) + (list(PREFIX_CLASSES) if model == "prefix" else [])


def needs(name: str) -> set[str]:
    """The operations a target must offer for class ``name`` to be possible at all."""
    if name == "hybrid/append-tokens":
        return {"append_tokens"}
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
    """The outcome classes one run showed (``counts``) and the operations its target
    offered (``capabilities``)."""

    def __init__(self, model: str):
        self.model = model
        self.counts: _Counts = _Counts()
        self.capabilities: list[str] | None = None
        self.state = None

    def watch(self, state) -> None:
        """Told of the run state as the run starts: count every step of its block
        manager's oracle from now on."""
        from kvcheck.models.blocks.oracle import Oracle

        self.state = state
        oracle = state if isinstance(state, Oracle) else next(
            (v for v in vars(state).values() if isinstance(v, Oracle)), None)
        target = getattr(oracle if oracle is not None else state, "target", None)
        caps = getattr(target, "capabilities", None)
        if caps is not None:
            self.capabilities = sorted(str(c) for c in caps)
        if oracle is None:
            return
        step, counts = oracle.step, self.counts

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
            return v

        oracle.step = counting

    def result(self, end_state=None) -> dict | None:
        """The run's counts by class (every class of the model, zeros included), or None for
        a model without classes."""
        if self.model in NO_CLASSES:
            return None
        stats = getattr(end_state if end_state is not None else self.state, "stats", None)
        if self.model == "hybrid":  # (its oracle's stats: a dict)
            return {name: int((stats or {}).get(key, 0) or 0) for name, key in HYBRID_CLASSES.items()}
        out = {name: self.counts.get(name, 0) for name in OUTCOMES}
        if self.model == "prefix":
            for name, attr in PREFIX_CLASSES.items():
                out[name] = int(getattr(stats, attr, 0) or 0)
        return out


def merge(total: dict, counts: dict | None) -> None:
    """Add one run's counts to ``total`` (class -> occurrences)."""
    for name, n in (counts or {}).items():
        total[name] = total.get(name, 0) + n


def warnings(model: str, total: dict, offered: set[str] | None) -> tuple[list[str], list[str]]:
    """The classes that never occurred over the campaign, and those its target cannot show
    (it does not offer an operation they need)."""
    never, impossible = [], []
    for name in classes(model):
        if total.get(name, 0):
            continue
        if offered is not None and not needs(name) <= offered:
            impossible.append(name)
        else:
            never.append(name)
    return never, impossible
