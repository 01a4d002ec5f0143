"""``verify``: drive a target with the seeded random driver under the oracle,
and on a violation shrink it to a minimal trace."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvcheck.check.trace import Trace
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Watchdog
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.oracle import Oracle, ambient_watchdog
from kvcheck.shrink import budget_ran_out, replay, shrink
from kvcheck.targets.loading import TargetError, build, resolve


@dataclass
class Result:
    verdict: str  # "pass" | "fail"
    ops: int  # operations run
    seconds: float
    violation: Violation | None
    trace: Trace | None  # the (shrunk) counterexample
    original_length: int = 0  # operations up to the violation, before shrinking

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "ops": self.ops,
            "seconds": round(self.seconds, 3),
            "violation": None if self.trace is None else self.trace.to_json(),
            "original_length": self.original_length,
        }


def verify(target="reference", num_blocks: int = 32, block_size: int = 4, ops: int = 10_000,
           seed: int = 0, out_of_blocks=None, timeout: float | None = 10.0,
           mode: str = "fast", do_shrink: bool = True, shrink_budget: float = 60.0,
           progress: Callable[[int], None] | None = None, compiled: bool = True,
           shrink_progress: Callable[[int, int], None] | None = None) -> Result:
    """Check ``target`` for ``ops`` random operations. Raises ``TargetError`` on bad input.

    ``compiled=False`` evaluates the spec itself for every operation instead of
    its compiled form (same verdicts, slower; for comparison). ``progress(done)`` is told
    of the operations run, ``shrink_progress(attempts, length)`` of the shrinking."""
    start = time.perf_counter()
    with Watchdog(timeout) as wd:  # importing, building, every step and every observation
        label, factory = resolve(target)
        t = build(factory, num_blocks, block_size, out_of_blocks)
        oracle = Oracle(t, mode=mode, timeout=timeout, compiled=compiled)
        driver = RandomDriver(seed, num_blocks, block_size, t.capabilities)
        history = []
        v = oracle.violation
        state = oracle._state
        for i in range(ops):
            if v is not None:
                break
            op = driver.next_op(oracle.live_seqs(), state().num_free())
            if not oracle.valid(op):
                continue
            history.append(op)
            v = oracle.step(op, wd)
            if progress is not None and i % 1024 == 0:
                progress(i)
        if v is None:
            v = oracle.sweep(wd)
    if v is None and not history:  # nothing ran: nothing was checked, never a pass
        raise TargetError(f"no operation ran on {label} ({ops} requested): nothing was checked")
    seconds = time.perf_counter() - start
    if v is None:
        return Result("pass", oracle.steps, seconds, None, None)
    trace = counterexample(label, factory, num_blocks, block_size, history, v, seed,
                           out_of_blocks, timeout, do_shrink, shrink_budget, shrink_progress)
    return Result("fail", oracle.steps, time.perf_counter() - start, trace.violation, trace,
                  len(history))


# A hang is shrunk with at most this per-operation limit, so that each candidate that
# still hangs costs this long, not the run's whole timeout: a hang costs one full timeout.
HANG_SHRINK_TIMEOUT = 1.0


def counterexample(label, factory, num_blocks, block_size, history, v: Violation, seed,
                   out_of_blocks=None, timeout=10.0, do_shrink=True, budget=60.0,
                   progress=None) -> Trace:
    """A replayable trace for violation ``v`` found after ``history``; shrunk if asked
    (``progress(attempts, length)`` told of the shrinking).

    A hang is replayed with a per-operation limit of at most ``HANG_SHRINK_TIMEOUT``
    (the trace says so): the run already paid one full timeout to find it."""
    note = ""
    if v.kind == "hang" and timeout and timeout > HANG_SHRINK_TIMEOUT:
        timeout = HANG_SHRINK_TIMEOUT
        note = (f"; replayed with a {HANG_SHRINK_TIMEOUT:g} s limit per operation, shorter than "
                f"the run's, so that every replay that still hangs costs only that")
    with ambient_watchdog(timeout):  # for the steps the shrinker's search runs without one
        trace = _counterexample(label, factory, num_blocks, block_size, history, v, seed,
                                out_of_blocks, timeout, do_shrink, budget, progress)
    trace.minimality += note
    return trace


def _counterexample(label, factory, num_blocks, block_size, history, v, seed, out_of_blocks,
                    timeout, do_shrink, budget, progress=None) -> Trace:
    if do_shrink:
        s = shrink(factory, num_blocks, block_size, history, v.key, out_of_blocks, timeout, budget,
                   progress)
        if s is not None:
            how = ("1-minimal: removing any one operation or lowering any size stops it failing"
                   if s.one_minimal else budget_ran_out(budget, len(s.ops), "operation"))
            if s.shortest:
                how += f"; shortest: {s.shortest}"
            return Trace(label, s.num_blocks, s.block_size, s.ops, s.violation, seed, s.states, how)
    r = replay(factory, num_blocks, block_size, history, out_of_blocks, timeout, record=True)
    if r.violation is not None:
        return Trace(label, num_blocks, block_size, r.ops, r.violation, seed, r.states,
                     "not shrunk")
    # Found only by the fast mode's sweep and not reproducible in full mode: keep it as found.
    return Trace(label, num_blocks, block_size, history, v, seed, [], "not shrunk (fast mode only)")
