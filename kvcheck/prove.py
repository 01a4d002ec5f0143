"""``prove``: every engine, one report, in two groups.

What was proved about the *spec* (``SPEC`` rows; they say nothing about the
target):
  * Z3 over the spec: 1-induction of every invariant (and isolation), BMC
    from the empty pool (``bmc_lemmas``: the invariants the induction rows prove are
    closed at every depth, the others asked of every run on the unrolling, every one to
    depth 2), and vacuity (a witness for every outcome class);
    1-induction of every prefix-cache invariant over the prefix manager's
    block steps (engine "z3 k-induction (prefix cache)").
What was checked on the *target* (``TARGET`` rows):
  * bounded exploration of the target: the Z3 witness runs replayed on it
    (every outcome class and every ordered pair found within the bound), and
    exhaustive BFS within the scope;
  * CrossHair on the reference's contracts (reference target only: it checks
    the reference implementation's code).
``Settings.target_only`` skips the spec rows (the witnesses are still searched:
they are what the target is driven with). Engines produce ``Row``s; rendering
(table, JSON, JUnit) is separate.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from kvcheck.check.trace import Trace
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.blocks.model import MODEL as BLOCKS
from kvcheck.models.blocks.oracle import Oracle, cyclic_blocks
from kvcheck.models.blocks.runs import Scope, explore
from kvcheck.proofs.bmc import bmc_lemmas, witnesses
from kvcheck.proofs.induction import cyclic_contracts, prove_invariants
from kvcheck.proofs.prefix_induction import prove_prefix_invariants
from kvcheck.proofs.prefix_model import PrefixModelScope
from kvcheck.proofs.tiers_induction import TierModelScope, prove_tier_invariants
from kvcheck.spec.contracts import REFUSED
from kvcheck.spec.logic import PY
from kvcheck.spec.outcomes import OUTCOMES, classify
from kvcheck.spec.symbolic import SymScope
from kvcheck.targets.loading import build, resolve

if TYPE_CHECKING:
    from kvcheck.check.shrink import Budget
    from kvcheck.check.violation import Violation
    from kvcheck.verify import TargetSpec

Say = Callable[[str], None]  # progress(text): what runs now

CROSSHAIR_CPU_SECONDS = 60.0
"""CrossHair's allowance per contract at ``--effort 1``: CPU seconds of its analysis (its
``--per_condition_timeout``), which a loaded machine does not shorten; ``--budget`` is
the outer wall-clock limit."""
SPEC, TARGET = "spec", "target"  # Row.group: proved about the spec / checked on the target
REFERENCES = ("reference", "reference-engine", "reference-eager")  # CrossHair checks these
NOT_APPLICABLE = "not applicable"  # a class that cannot occur at the scope (see bmc.witnesses)


NO_TARGET = "--model tiers proves the tiers spec; kvcheck verify-tiers checks a tiers target"
UNKNOWN, UNREACHABLE, VIOLATED = "unknown", "unreachable", "violated"
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


@dataclass
class Row:
    engine: str
    property: str
    scope: str
    result: str  # "holds" | "violated" | "unknown" | "unreachable" | "not applicable"
    seconds: float
    detail: str = ""
    group: str = SPEC
    undecided: str = ""  # an "unknown" row: the limit that stopped it (effort.TIME / EFFORT)

    # (``builtins.property``: in this class body ``property`` names the field above for a type
    # checker; at run time it is the builtin either way)
    @builtins.property
    def ok(self) -> bool:
        """Nothing wrong shown: it holds, cannot occur at this scope, or (a coverage
        warning) no run within the depth reaches it."""
        return self.result in ("holds", NOT_APPLICABLE, UNREACHABLE)

    @builtins.property
    def verdict(self) -> str:
        return FAIL if self.result == VIOLATED else INCONCLUSIVE if self.result == UNKNOWN else PASS


@dataclass
class Report:
    target: str
    rows: list[Row] = field(default_factory=list)
    counterexample: Trace | None = None
    seconds: float = 0.0
    spec_checked: bool = True  # False with Settings.target_only
    target_checked: bool = True  # False for the tiers spec's rows alone (prove_tiers)

    @property
    def verdict(self) -> str:
        """FAIL: a row is violated (a counterexample, or a disproved property, shown);
        INCONCLUSIVE: none is, and a row is undecided (a budget cut it short); else PASS."""
        return _verdict(self.rows)

    @property
    def ok(self) -> bool:
        return self.verdict == PASS

    def undecided(self) -> list[Row]:
        return [r for r in self.rows if r.result == UNKNOWN]

    def warnings(self) -> list[Row]:
        return [r for r in self.rows if r.result == UNREACHABLE]

    def not_decided(self) -> str:
        """What was not decided and what decides it, in one line ('' when all was)."""
        rows = self.undecided()
        if not rows:
            return ""
        from kvcheck.proofs import effort

        why = effort.TIME if any(r.undecided == effort.TIME for r in rows) else effort.EFFORT
        names = ", ".join(f"{r.engine}: {r.property}" for r in rows[:4])
        more = f" and {len(rows) - 4} more" if len(rows) > 4 else ""
        return f"not decided: {names}{more} ({effort.hint(why)})"

    def group(self, name: str) -> list[Row]:
        return [r for r in self.rows if r.group == name]

    def tally(self, name: str) -> dict[str, Any]:
        rows = self.group(name)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.result] = counts.get(r.result, 0) + 1
        return {"rows": len(rows), "holds": counts.get("holds", 0),
                "ok": _verdict(rows) == PASS, "verdict": _verdict(rows), "results": counts}

    def summary(self) -> str:
        """What was proved and what was checked, e.g. ``spec 35/35 proved; target 3/3 checked``."""
        parts = []
        for name, verb in ((SPEC, "proved"), (TARGET, "checked")):
            t = self.tally(name)
            if name == SPEC and not self.spec_checked:
                parts.append("spec not proved (--target-only)")
                continue
            if name == TARGET and not self.target_checked:
                parts.append(f"target not checked ({NO_TARGET})")
                continue
            text = f"{name} {t['holds']}/{t['rows']} {verb}"
            other = [f"{n} {result}" + (" at this scope" if result == NOT_APPLICABLE else "")
                     for result, n in t["results"].items() if result != "holds"]
            parts.append(text + (f" ({', '.join(other)})" if other else ""))
        return "; ".join(parts)

    def junit_suites(self) -> list[Any]:
        """Two suites, what was proved about the spec and what was checked on the target; each
        case's class name says which (``kvcheck.spec.<engine>`` / ``kvcheck.target.<engine>``).
        A row that is not applicable at the scope is a skipped case, never a passed one."""
        from kvcheck.report.junit import Case, Suite

        names = {SPEC: "spec: proved about the specification",
                 TARGET: f"target: checked on {self.target}"}
        suites = []
        for group in (SPEC, TARGET):
            suite = Suite(names[group])
            for r in self.group(group):
                case = Case(f"kvcheck.{group}.{r.engine.replace(' ', '_')}",
                            f"{r.property} [{r.scope}]", r.seconds, text=r.detail)
                if r.result == VIOLATED:  # only a counterexample or a disproof fails
                    case.failure, case.failure_type = f"{r.result}: {r.detail}", r.result
                elif r.result == UNKNOWN:  # not decided: inconclusive, never a failure
                    case.skipped = f"inconclusive: {r.detail}"
                elif r.result != "holds":  # not checked: never shown as passed
                    case.skipped = (f"warning: {r.detail}" if r.result == UNREACHABLE
                                    else f"{r.result}: {r.detail}")
                suite.cases.append(case)
            suites.append(suite)
        return suites

    def to_json(self) -> dict[str, Any]:
        groups = {}
        for name in (SPEC, TARGET):
            t = self.tally(name)
            groups[name] = {"checked": self.target_checked if name == TARGET else
                            self.spec_checked, "rows": t["rows"],
                            "holds": t["holds"], "results": t["results"],
                            "verdict": t["verdict"]}
        return {
            "target": self.target,
            "verdict": self.verdict,
            "not_decided": self.not_decided(),
            "warnings": [f"{r.engine}: {r.property}: {r.detail}" for r in self.warnings()],
            "seconds": round(self.seconds, 3),
            "rows": [asdict(r) for r in self.rows],
            "counterexample": None if self.counterexample is None else self.counterexample.to_json(),
            "summary": self.summary(),
            SPEC: groups[SPEC],
            TARGET: groups[TARGET],
        }


@dataclass
class Settings:
    num_blocks: int = 6
    block_size: int = 2
    seqs: int = 3
    depth: int = 6
    max_tokens: int | None = None  # default: 3 * block_size
    budget: float = 300.0
    pairs: bool = True
    crosshair: bool = True
    timeout: float = 10.0
    target_only: bool = False  # skip what is proved about the spec; check the target only
    shrink_budget: float | Budget | None = None  # a kvcheck.check.shrink.Budget (None: its defaults)
    effort: float = 1.0  # every solver allowance times this (kvcheck.proofs.effort)

    @property
    def tokens(self) -> int:
        return self.max_tokens or 3 * self.block_size


def _verdict(rows: list[Row]) -> str:
    verdicts = {r.verdict for r in rows}
    return FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS


def _z3_rows(st: Settings, report: Report, deadline: float, say: Say,
             cycle: tuple[int, frozenset[str]] | None = None) -> list[Any]:
    """The spec's rows (unless ``target_only``); the Z3 witnesses the target is driven with.
    ``cycle``: (W, the target's operations) for a target declaring a cyclic window: the
    induction is also run under it (rows named "... under a cyclic window of W blocks").

    Every query is bounded in Z3's resource units (``kvcheck.proofs.effort``), so what is
    decided is the same on any machine; ``deadline`` (by ``time.monotonic()``) is only the
    outer limit, and what it cuts reads "unknown" (INCONCLUSIVE)."""
    from kvcheck.proofs import effort

    sym = SymScope(st.num_blocks, st.block_size, st.seqs, st.tokens)

    def searching(d: int, found: int, goals: int) -> None:
        say(f"z3 coverage: depth {d}, witnesses for {found}/{goals} outcome classes and pairs")

    def left() -> float:
        return max(0.001, deadline - time.monotonic())

    def ms() -> int:
        return max(1, int(1000 * left()))

    if st.target_only:
        ws: list[Any] = witnesses(sym, st.depth, pairs=st.pairs, budget=left(), progress=searching)
        _deeper(sym, st, ws, left, say)
        return ws
    scope = sym.describe()
    proved = True

    def row(p: Any, prop: str | None = None) -> bool:
        result = {"proved": "holds"}.get(p.result, p.result)
        report.rows.append(Row(p.engine, prop or p.property, p.scope, result, p.seconds, p.detail,
                               undecided=p.undecided))
        held: bool = p.result == "proved"
        return held

    proofs = prove_invariants(sym, timeout_ms=ms(),
                              progress=lambda name: say(f"z3 k-induction: {name}"))
    for p in proofs:
        proved &= row(p)
    if cycle is not None:
        W, kinds = cycle
        say(f"z3 k-induction under the target's cyclic window of {W} block(s)")
        for p in prove_invariants(sym, contracts=cyclic_contracts(W, kinds), timeout_ms=ms()):
            proved &= row(p, f"{p.property} under a cyclic window of {W} block(s)")
    pscope = PrefixModelScope(st.num_blocks, st.block_size, holders=st.seqs)
    say("z3 k-induction (prefix cache): every prefix-cache invariant")
    for p in prove_prefix_invariants(pscope, timeout_ms=ms()):
        row(p)
    b = bmc_lemmas(sym, st.depth, budget=left(), proofs=proofs, progress=lambda d, closed, n: say(
        f"z3 bmc: depth {d} of {st.depth}, {closed} of {n} invariants closed by their induction"))
    name = f"no invariant broken within depth {st.depth}"
    if b.violated:
        report.rows.append(Row("z3 bmc", name, scope, VIOLATED, b.seconds,
                               f"{b.violated} broken at depth {b.depth}: " +
                               "; ".join(_show(o) for o in b.ops)))
    else:
        how = ("every invariant holds on the empty pool and each is preserved by every step "
               "from a state satisfying them all (its 1-induction above), so every depth holds"
               if not b.unrolled else
               f"{', '.join(b.unrolled)} asked of every run on the unrolling, "
               f"{len(b.closed)} other invariants closed by their 1-induction above")
        if b.closed and b.asked_all:
            how += (f"; every invariant also asked of every run to depth {b.asked_all} "
                    f"(apart from the induction)")
        searched = f"every run to depth {b.depth}: {how}"
        if b.complete:
            report.rows.append(Row("z3 bmc", name, scope, "holds", b.seconds, searched))
        else:
            why = b.undecided or effort.EFFORT
            report.rows.append(Row("z3 bmc", name, scope, UNKNOWN, b.seconds,
                                   f"{searched}; depth {b.depth + 1} undecided: "
                                   f"{effort.hint(why)}", undecided=why))
    ws = witnesses(sym, st.depth, pairs=st.pairs, budget=left(), progress=searching)
    _deeper(sym, st, ws, left, say)
    for w in ws:
        if " -> " in w.name:
            continue
        undecided = ""
        if w.depth:
            result, detail = "holds", f"witness depth {w.depth}"
        elif w.not_applicable:
            result = NOT_APPLICABLE
            detail = (f"cannot occur at this scope: Z3 shows no state satisfying every invariant "
                      f"has such a step (it can at {w.possible_at})")
        elif w.impossible:  # a disproved property of the spec: it can never show this class
            result = VIOLATED
            detail = ("Z3 shows no state satisfying every invariant has such a step, at this "
                      "scope or a larger one: the spec says nothing about it")
        elif w.searched:
            result, detail = UNREACHABLE, _unreached(st, w)
        else:
            undecided = w.undecided or effort.EFFORT
            result, detail = UNKNOWN, f"no witness found: {effort.hint(undecided)}"
        report.rows.append(Row("z3 coverage", f"reachable: {w.name}", scope, result, w.seconds,
                               detail, undecided=undecided))
    return ws


DEEPER = 3
"""How many depths beyond ``--depth`` a class without a witness is searched for, to say
which depth reaches it (``reached_at``)."""


def _deeper(sym: SymScope, st: Settings, ws: list[Any], left: Callable[[], float],
            say: Say) -> None:
    """For each class searched to ``st.depth`` without a witness that can occur at this
    scope: the depth that reaches it, up to ``DEEPER`` further (``Witness.reached_at``)."""
    from kvcheck.proofs.bmc import reach

    names = [w.name for w in ws if " -> " not in w.name and not w.depth and w.searched
             and not w.impossible]
    if not names:
        return
    say(f"z3 coverage: {len(names)} class(es) searched beyond depth {st.depth}")
    depths = reach(sym, names, st.depth, st.depth + DEEPER, budget=left())
    for w in ws:
        if w.name in depths:
            w.reached_at = depths[w.name]


def _unreached(st: Settings, w: Any) -> str:
    """A coverage warning: no run within ``--depth`` shows the class, and which depth does."""
    at = getattr(w, "reached_at", None)
    head = (f"warning: no run within depth {st.depth} shows it, so within this bound the spec "
            f"says nothing about it")
    if at:
        return f"{head}; a run of {at} operations reaches it (--depth {at} covers it)"
    return f"{head}; none within depth {st.depth + DEEPER} either"


def _show(op: Any) -> str:
    from kvcheck.models.blocks.witness import describe_op

    return describe_op(op)


def _replay_witnesses(st: Settings, factory: Any, ws: list[Any], report: Report,
                      out_of_blocks: type[BaseException] | None = None,
                      say: Say | None = None) -> None:
    """Run every Z3 witness on the target, checking it and recording which classes it showed."""
    t0 = time.perf_counter()
    seen_classes, seen_pairs = set(), set()
    ran = 0
    for w in ws:
        if not w.depth:
            continue
        oracle = Oracle(build(factory, st.num_blocks, st.block_size, out_of_blocks), mode="full",
                        timeout=st.timeout)
        prev = None
        with Watchdog(st.timeout) as wd:
            for req in w.ops:
                op = BLOCKS.request(req)
                if not oracle.valid(op):
                    break
                pre = oracle.snap
                v = oracle.step(op, wd)
                ran += 1
                if v is not None:
                    report.rows.append(Row("exploration", f"z3 witness '{w.name}' on the target",
                                           _scope(st), "violated", time.perf_counter() - t0,
                                           f"{v.name}: {v.witness}", TARGET))
                    if report.counterexample is None:
                        report.counterexample = _trace(report.target, st, w.ops, factory,
                                                       out_of_blocks, say)
                    return
                cls = classify(PY, pre, oracle.observed, op)
                seen_classes.add(cls)
                if prev is not None:
                    seen_pairs.add((prev, cls))
                prev = cls
    from kvcheck.proofs import effort

    pairs = [w for w in ws if " -> " in w.name]
    found_pairs = sum(1 for w in pairs if w.depth)
    cannot = sum(1 for w in pairs if not w.depth and w.impossible)
    no_pair = sum(1 for w in pairs if not w.depth and not w.impossible and w.searched)
    unsearched = sum(1 for w in pairs if not w.depth and not w.impossible and not w.searched)
    # A witness the clock kept from being searched is a run the target was never driven
    # with: the row is undecided. One the effort allowance left unsearched is a bound of
    # the check, the same on every machine, and said so.
    cut = [w.name for w in ws if not w.depth and not w.searched and w.undecided == effort.TIME]
    na = [w.name for w in ws if " -> " not in w.name and w.not_applicable]
    offered = build(factory, st.num_blocks, st.block_size, out_of_blocks).capabilities
    absent = [c for c in OUTCOMES if OUTCOMES[c][0] not in offered]
    # a refusal is a policy a target may have, never one it must have
    optional = [c for c in OUTCOMES if OUTCOMES[c][1] == REFUSED]
    applicable = [c for c in OUTCOMES if c not in na and c not in absent]
    missing = [c for c in applicable if c not in seen_classes and c not in optional]
    # a class whose shortest witness needs an operation the target lacks (e.g. an append
    # into a reserved block: a reservation needs append_slots) is not one it failed to show
    needs = {w.name: sorted({op.kind for op in w.ops} - set(offered)) for w in ws
             if w.name in missing and w.depth}
    needs = {c: kinds for c, kinds in needs.items() if kinds}
    missing = [c for c in missing if c not in needs]
    detail = (f"{ran} operations from {sum(1 for w in ws if w.depth)} witness runs; "
              f"{len(seen_classes & set(applicable))}/{len(applicable)} "
              f"{'applicable ' if na else ''}outcome classes and "
              f"{len(seen_pairs)} ordered pairs shown by the target "
              f"({found_pairs} pairs have Z3 witnesses, {cannot} cannot occur from any state "
              f"satisfying every invariant at this scope, {no_pair} are unreachable within depth "
              f"{st.depth}, {unsearched} were not searched within "
              f"{'the time budget' if cut else 'the effort allowance (--effort)'})")
    if na:
        detail += f"; not applicable at this scope: {', '.join(na)}"
    if absent:
        kinds = sorted({OUTCOMES[c][0] for c in absent})
        detail += f"; operations the target does not offer: {', '.join(kinds)}"
    if needs:
        detail += "; reached only through operations the target does not offer: " + ", ".join(
            f"{c} (its witness uses {'+'.join(kinds)})" for c, kinds in needs.items())
    if missing:
        detail += f"; never shown by the target: {', '.join(missing)}"
    if cut:
        report.rows.append(Row("exploration", "z3 witness runs pass the oracle", _scope(st),
                               UNKNOWN, time.perf_counter() - t0,
                               f"{detail}; {effort.hint(effort.TIME)}", TARGET, effort.TIME))
        return
    report.rows.append(Row("exploration", "z3 witness runs pass the oracle", _scope(st), "holds",
                           time.perf_counter() - t0, detail, TARGET))


def _scope(st: Settings) -> str:
    return Scope(st.num_blocks, st.block_size, st.seqs, st.tokens, st.depth).describe()


def _trace(label: str, st: Settings, ops: list[Any], factory: Any,
           out_of_blocks: type[BaseException] | None = None, say: Say | None = None) -> Trace | None:
    """The counterexample, shrunk like verify's (sizes lowered, ids renumbered)."""
    from kvcheck.models.blocks.runs import replay
    from kvcheck.verify import counterexample

    r = replay(factory, st.num_blocks, st.block_size, ops, out_of_blocks, timeout=st.timeout)
    if r.violation is None:
        return None  # not reproducible from scratch: report the row, not a trace
    return counterexample(label, factory, st.num_blocks, st.block_size, r.ops,
                          cast("Violation", r.violation), None,
                          out_of_blocks, timeout=st.timeout, budget=st.shrink_budget,
                          progress=None if say is None else lambda n, k: say(
                              f"shrinking: {n} attempts, counterexample of {k} operations"))


def prove(target: TargetSpec = "reference", st: Settings | None = None,
          progress: Say | None = None,
          out_of_blocks: type[BaseException] | None = None) -> Report:
    """Run every engine on ``target`` within ``st``. Raises TargetError on bad input.

    ``out_of_blocks``: the exception class the target signals out-of-blocks with (default:
    any named ``OutOfBlocks``), used wherever the target is built."""
    st = st or Settings()
    label, factory = resolve(target)
    built = build(factory, st.num_blocks, st.block_size, out_of_blocks)  # bad input: exit 2
    W = cyclic_blocks(built)
    cycle = (W, built.capabilities) if W else None
    report = Report(label, spec_checked=not st.target_only)
    start = time.monotonic()
    deadline = start + st.budget  # the outer limit: what it cuts is undecided, never a verdict
    say = progress or (lambda msg: None)  # progress(text): what runs now, often (throttle it)

    from kvcheck.proofs import effort

    say("z3: witnesses of every outcome class" if st.target_only else
        "z3: induction, bmc, coverage")
    with effort.scaled(st.effort):
        ws = _z3_rows(st, report, deadline, say, cycle)

    say("exploration: z3 witnesses on the target")
    _replay_witnesses(st, factory, ws, report, out_of_blocks, say)

    say("exploration: breadth-first search")
    scope = Scope(st.num_blocks, st.block_size, st.seqs, st.tokens, st.depth)
    left = max(0.001, deadline - time.monotonic())
    with Watchdog(st.timeout):
        ex = explore(factory, scope, out_of_blocks, timeout=st.timeout, budget=left,
                     progress=lambda d, states, ops: say(
                         f"exploration bfs: depth {d} of {st.depth}, {states} distinct states, "
                         f"{ops} operations"))
    if ex.violation is not None:
        report.rows.append(Row("exploration", "bfs: no violation", scope.describe(), "violated",
                               ex.seconds, f"{ex.violation.name}: {ex.violation.witness}", TARGET))
        report.counterexample = _trace(label, st, ex.ops, factory, out_of_blocks, say)
    else:
        report.rows.append(Row(
            "exploration", "bfs: no violation", scope.describe(),
            "holds" if ex.complete else UNKNOWN, ex.seconds,
            f"{ex.explored} operations explored, {ex.distinct} distinct states, depth {ex.depth}"
            + ("" if ex.complete else f" of {st.depth}; {effort.hint(effort.TIME)}"), TARGET,
            "" if ex.complete else effort.TIME))

    if st.crosshair and label in REFERENCES:
        say(f"crosshair: contracts of {label}")
        from kvcheck.proofs.crosshair_contracts import offered_by
        from kvcheck.proofs.crosshair_run import run_crosshair

        left = max(0.0, deadline - time.monotonic())
        results = run_crosshair(None if label == "reference" else label, budget_seconds=left,
                                per_condition_timeout=CROSSHAIR_CPU_SECONDS * st.effort,
                                properties=offered_by(factory) or None, scope="2,1,2,2,1")
        for r in results:
            result = {"proved-within-bound": "holds", "counterexample": VIOLATED}.get(
                r["result"], UNKNOWN)
            detail = ((r.get("message") or "").splitlines()[0][:200]
                      if r.get("message") else "")
            if result == UNKNOWN:  # CrossHair's bounds are its CPU seconds and the budget
                detail = f"{detail}; {effort.hint(effort.TIME)}" if detail else effort.hint(
                    effort.TIME)
            report.rows.append(Row("crosshair", f"contract of {r['property']}",
                                   str(r.get("scope", "")), result, r["seconds"], detail, TARGET,
                                   effort.TIME if result == UNKNOWN else ""))
    report.seconds = time.monotonic() - start
    return report


TIERS_SPEC = "the tiers spec"  # Report.target of prove_tiers


def prove_tiers(st: Settings | None = None, progress: Say | None = None) -> Report:
    """``kvcheck prove --model tiers``: the tiers spec's Z3 rows (``kvcheck.proofs.
    tiers_induction``): 1-induction of every per-block tier invariant over the tiers'
    block steps, the eviction of a held block refused, and the outcome classes' witnesses,
    on one pool of ``st.num_blocks`` blocks, at most ``st.seqs`` references per holder
    kind per block, witnesses searched to ``st.depth`` steps. No target is run (``kvcheck
    verify-tiers`` checks one). ``st.budget`` is only the outer limit: what it cuts is
    "unknown" (INCONCLUSIVE); ``st.effort`` scales each query's resource units."""
    from kvcheck.proofs import effort

    st = st or Settings()
    say = progress or (lambda msg: None)
    report = Report(TIERS_SPEC, target_checked=False)
    start = time.monotonic()
    deadline = start + st.budget
    scope = TierModelScope(st.num_blocks, holders=st.seqs)
    say("z3 k-induction (tiers): every per-block tier invariant, every block step")
    with effort.scaled(st.effort):
        proofs = prove_tier_invariants(scope, witness_depth=st.depth, timeout_ms=max(
            1, int(1000 * (deadline - time.monotonic()))))
    for p in proofs:
        result = {"proved": "holds"}.get(p.result, p.result)
        report.rows.append(Row(p.engine, p.property, p.scope, result, p.seconds, p.detail,
                               undecided=p.undecided))
    report.seconds = time.monotonic() - start
    return report
