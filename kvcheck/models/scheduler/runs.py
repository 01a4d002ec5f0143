"""The checker's runs for the scheduler model, in its own terms (workloads and requests).

``verify`` checks a scheduler on several seeded workloads (seeds ``seed``,
``seed + 1``, ...), each driven by ``kvcheck.check.run.drive`` and, at the first
violation, turned into a counterexample trace by
``kvcheck.check.shrink.counterexample``: the one trace format, model
``scheduler``, its watermark in the scope and the block manager given (when
named) in its settings. ``run_workload`` drives one given workload (the
simulator's run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvcheck.check.model import Options
from kvcheck.check.run import drive
from kvcheck.check.shrink import counterexample
from kvcheck.check.trace import Trace
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.scheduler.loading import resolve, resolve_block_manager
from kvcheck.models.scheduler.model import MODEL, SchedScope, requests_of
from kvcheck.models.scheduler.oracle import Finding, Stats, describe_json
from kvcheck.models.scheduler.workload import Request, generate
from kvcheck.targets.loading import load_exception, location

MINIMAL = ("1-minimal: dropping any request, shortening any prompt or output, moving any "
           "arrival earlier, shrinking the pool by a block or halving the whole scope stops it "
           "failing this way (the steps are those the requests need to reach the violation)")


def _limit(requests: list[Request]) -> int:
    """More operations than a run of ``requests`` can take: the liveness bound ends it sooner."""
    last = max([r.arrival for r in requests] or [0])
    return 2 * (len(requests) + last + sum(r.max_new for r in requests)) + 8


@dataclass
class Run:
    """One checked workload: the violation (or None), the run's figures and findings, and the
    operations as run."""

    violation: Violation | None
    stats: Stats
    findings: list[Finding]
    history: list
    state: object = None  # the run state at the end


def run_workload(factory, requests: list[Request], num_blocks: int, block_size: int,
                 watermark: int, timeout: float | None = 10.0, series: bool = False,
                 block_manager=None, out_of_blocks: type[BaseException] | None = None,
                 mode: str = "fast", seed: int = 0) -> Run:
    """``requests`` through the scheduler ``factory`` (``factory(bm, watermark)``), checked at
    every step (``series``: the free/running/waiting/preempted counts per step, for
    plotting). Raises ``TargetError`` when the scheduler or its block manager
    (``block_manager``, see ``resolve_block_manager``) cannot be built."""
    options = Options(mode=mode, timeout=timeout, out_of_blocks=out_of_blocks, seed=seed,
                      extra={"workload": list(requests), "block_manager": block_manager,
                             "series": series})
    run = drive(MODEL, factory, SchedScope(num_blocks, block_size, watermark), options, seed,
                _limit(requests))
    return Run(run.violation, run.state.stats, run.state.findings, run.history, run.state)


@dataclass
class Result:
    verdict: str  # "pass" | "fail"
    label: str
    workloads: int  # workloads run
    steps: int  # scheduler steps, over every workload
    seconds: float
    violation: Violation | None = None
    trace: Trace | None = None  # the (shrunk) counterexample
    original_requests: int = 0
    findings: list[Finding] = field(default_factory=list)
    stats: Stats | None = None  # the failing run's figures
    block_manager: str = "reference"  # the block manager driven (its label)

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    @property
    def workload(self) -> list[Request] | None:
        """The counterexample's requests, each arriving after the steps before it."""
        return None if self.trace is None else requests_of(self.trace.ops)

    @property
    def num_blocks(self) -> int:
        return 0 if self.trace is None else self.trace.num_blocks

    @property
    def minimal(self) -> str:
        return "" if self.trace is None else self.trace.minimality

    def steps_log(self) -> list[dict]:
        """Each step of the counterexample: the state before and after it, and what it decoded
        (``step`` is the operation's number, as the violation's is)."""
        t = self.trace
        if t is None:
            return []
        out, before = [], MODEL.initial_state_json(t.scope)
        for i, op in enumerate(t.ops):
            after = t.states[i] if i < len(t.states) else None
            if op.kind == "step":
                out.append({"step": i + 1, "before": describe_json(before),
                            "decoded": op.decoded, "after": describe_json(after)})
            before = after
        return out

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "target": self.label,
            "block_manager": self.block_manager,
            "workloads": self.workloads,
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "violation": None if self.violation is None else self.violation.to_json(),
            "workload": None if self.workload is None else [r.to_json() for r in self.workload],
            "num_blocks": self.num_blocks,
            "minimal": self.minimal,
            "original_requests": self.original_requests,
            "steps_log": self.steps_log(),
            "pingpongs": len(self.findings),
            "findings": [f.to_json() for f in self.findings[:20]],
            "trace": None if self.trace is None else self.trace.to_json(),
        }


def verify(target="reference", num_blocks: int = 16, block_size: int = 4, watermark: int = 1,
           requests: int = 12, seed: int = 0, workloads: int = 20, timeout: float | None = 10.0,
           do_shrink: bool = True, shrink_budget=None, progress=None,
           shrink_progress=None, block_manager=None,
           out_of_blocks: type[BaseException] | str | None = None, mode: str = "fast") -> Result:
    """Check ``target`` on ``workloads`` seeded workloads (seeds ``seed``, ``seed + 1``...),
    driving the block manager ``block_manager`` (see ``resolve_block_manager``), naming
    ``out_of_blocks`` (a class or ``module:Name``) as its out-of-blocks signal;
    ``progress(done)`` told of the workloads run, ``shrink_progress(attempts, requests)`` of
    the shrinking. Raises ``TargetError`` (bad input) when the scheduler or its block
    manager cannot be found or built, ``WorkloadError`` for a scope no request fits."""
    start = time.perf_counter()
    with Watchdog(timeout):  # importing the target is target code too
        label, factory = resolve(target)
        bm_label, bm = resolve_block_manager(block_manager, factory, label)
        settings = {"block_manager": location(block_manager)} \
            if isinstance(block_manager, str) else {}
        if isinstance(out_of_blocks, str):
            out_of_blocks, settings["out_of_blocks"] = (load_exception(out_of_blocks),
                                                        location(out_of_blocks))
    scope = SchedScope(num_blocks, block_size, watermark)
    steps = 0
    findings: list[Finding] = []
    for i in range(workloads):
        reqs = generate(seed + i, requests, num_blocks, block_size, watermark,
                        arrival_steps=2 * requests)
        options = Options(mode=mode, timeout=timeout, out_of_blocks=out_of_blocks, seed=seed + i,
                          extra={"workload": reqs, "block_manager": bm})
        run = drive(MODEL, factory, scope, options, seed + i, _limit(reqs))
        if progress is not None:
            progress(i + 1)
        steps += run.state.stats.steps
        findings.extend(run.state.findings)
        if run.violation is None:
            continue
        trace = counterexample(MODEL, label, factory, scope, run.history, run.violation,
                               seed + i, options, do_shrink, shrink_budget, shrink_progress,
                               unit="request")
        trace.settings = settings
        if trace.minimality.startswith("1-minimal: removing any one operation"):
            trace.minimality = MINIMAL + trace.minimality.partition(" failing")[2]
        return Result("fail", label, i + 1, steps, time.perf_counter() - start, trace.violation,
                      trace, len(reqs), findings, run.state.stats, bm_label)
    return Result("pass", label, workloads, steps, time.perf_counter() - start, findings=findings,
                  block_manager=bm_label)
