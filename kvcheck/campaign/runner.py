"""A campaign: many runs of the checker until the time or run budget ends.

``Campaign(settings, out, ...).run()`` opens (or resumes) the ``--out`` directory
(``results.Store``), starts the pool (``pools``), keeps every worker busy with the next
run drawn (``plan.draw``), records each run as it finishes, cuts the runs still in flight
when the time is up (a cut run is never counted as passed), and writes the summary.

A new campaign's run 0 is the model's command at its defaults (``plan.defaults``), started
first: the campaign's first verdict is that command's run, and the swarm beside it finds
what that command misses, or finds it sooner. The local runs started while run 0 is in
flight run at the lowest priority until it ends (``pools.LocalPool.submit``), on what it
leaves of the machine, then at the campaign's own: on a busy machine they do not slow it.
With ``--stop-on-failure`` the first violation ends the campaign, so while a run shrinks the
one it found, the local runs beside it are stopped (``pools.LocalPool.hold``): on a machine
whose cores share caches and memory, a run beside it would slow its shrinking by a fifth.
Run 0 is the exception while it is in flight (``going_on``): another run's shrink never
stops it (it may find the same bug and shrink it sooner, as the command alone would), and
a run already shrinking goes on beside run 0's shrink: the first shrunk violation ends
the campaign, which never waits on one shrink while the other, stopped, would have ended
sooner (the two share the machine meanwhile, as any runs beside each other do). The
small-scope runs (``plan.is_small``) go on once a shrink has lasted ``HEDGE`` seconds (a
hedged request): each takes milliseconds, and one that finds the bug ends the campaign long
before a long shrink would, while a short shrink, the common case, runs alone as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvcheck.campaign.plan import Settings, draw, is_defaults, is_small
from kvcheck.campaign.results import Store, now_iso

REFUSED_IN_A_ROW = 20  # refused runs, none completed: the target cannot be run at all
HEDGE = 0.25  # seconds of a shrink after which the small-scope runs go on beside it


@dataclass
class Budget:
    seconds: float | None = None  # wall-clock time for this session
    runs: int | None = None  # runs to start in this session


def going_on(shrinking: set[int], lead: int | None, small: set[int] = frozenset()) -> set[int]:
    """The runs in flight that go on while some shrink the violation they found (the rest
    wait: ``pools.LocalPool.hold``), ``lead`` being run 0 while in flight (else None) and
    ``small`` the small-scope runs in flight (``plan.is_small``): the shrinking runs, run 0,
    and the small-scope runs.

    Run 0 is the command at its defaults: another run's shrink never stops it, since it
    may find the bug itself and shrink it sooner (a swarm run on a tiny pool can find a
    bug first and still shrink it slower); a run already shrinking goes on beside run 0's
    shrink, since it may end first. A small-scope run takes milliseconds, its shrink as
    few: beside a long shrink (run 0's, of a trace of hundreds of operations on 32
    blocks) it costs that shrink little and may end the campaign long before it (the
    campaign passes them once a shrink has lasted ``HEDGE`` seconds)."""
    if not shrinking:
        return set()
    return shrinking | small | ({lead} if lead is not None else set())


class Campaign:
    """One session of a campaign (see the module doc). ``ray``: None for local processes,
    ``""`` for a local Ray cluster, else the address of one to join. ``on_found(entry)`` is
    told of every new signature or shorter trace, ``progress(status)`` of the figures (about
    four times a second)."""

    def __init__(self, settings: Settings, out: str, budget: Budget, workers: int | None = None,
                 ray: str | None = None, stop_on_failure: bool = False,
                 on_found: Callable[[dict], None] | None = None,
                 progress: Callable[[dict], None] | None = None):
        self.settings, self.out, self.budget = settings, out, budget
        self.workers, self.ray, self.stop_on_failure = workers, ray, stop_on_failure
        self.on_found, self.progress = on_found, progress
        self.store: Store | None = None
        self.interrupted = False

    def open(self) -> Store:
        """The ``--out`` directory, opened before anything runs (bad input raises here)."""
        if self.store is None:
            store = Store(self.out, self.settings).open()
            if self.settings.model == "engine" and self.settings.accepts is None:
                self._learn(store)
            self.store = store
        return self.store

    def _learn(self, store: Store) -> None:
        """The engine model: what the target accepts (``kvcheck.campaign.engine``), kept with
        the campaign's settings; a resumed campaign's own (its runs are drawn from it)."""
        from kvcheck.campaign import engine

        saved = store.previous.get("accepts") if store.resumed else None
        if saved is None:
            try:
                saved = engine.learn(self.settings, str(store.dir / "workers.log"))
            except BaseException:
                if not store.state["runs"]["started"]:
                    store.discard()  # nothing ever ran: the same --out serves the corrected command
                raise
        self.settings.accepts = saved
        store.state["settings"] = self.settings.to_json()
        store.save()

    def _pool(self):
        from kvcheck.campaign import pools

        if self.ray is None:
            return pools.LocalPool(self.workers, str(self.store.dir / "workers.log"),
                                   self.settings.model)
        return pools.RayPool(self.ray or None, self.workers, self.settings.model)

    def run(self) -> dict:
        """Run the session; the summary (``results.Store.summary``)."""
        store = self.open()
        t0 = time.monotonic()
        try:
            pool = self._pool()
        except BaseException:  # no pool (Ray missing, a cluster that cannot be joined)
            if not store.state["runs"]["started"]:
                store.discard()  # nothing ever ran: the same --out serves the corrected command
            raise
        start = time.monotonic()
        before = store.state["seconds"]
        first_run = store.next_run
        ops0 = store.state["ops"]
        runs0 = store.state["runs"]["completed"]
        deadline = start + self.budget.seconds if self.budget.seconds else None
        started, stop = 0, False
        refused_row = 0
        lead = None  # run 0 (the command's defaults), while in flight: the others run behind it

        def elapsed() -> float:
            return time.monotonic() - start

        def status() -> dict:
            e = elapsed()
            ops = store.state["ops"] - ops0
            return {"elapsed": e, "runs": store.state["runs"]["completed"] - runs0,
                    "cut": store.state["runs"]["cut"], "in_flight": len(pool.running),
                    "ops": ops, "ops_per_second": ops / e if e > 0 else 0.0,
                    "signatures": len(store.state["signatures"])}

        from kvcheck.check import interrupts

        try:
            while True:
                if interrupts.requested():  # a Ctrl-C the command line deferred
                    interrupts.clear()
                    raise KeyboardInterrupt
                now = time.monotonic()
                out_of_time = deadline is not None and now >= deadline
                while (not stop and not out_of_time and pool.free() > 0
                       and (self.budget.runs is None or started < self.budget.runs)):
                    spec = draw(self.settings, store.take(), store.plan)
                    pool.submit(spec, behind=lead is not None)
                    if is_defaults(spec.run, store.plan):
                        lead = spec.run
                    started += 1
                if not pool.running:
                    break
                if out_of_time:
                    for spec in pool.cancel():
                        store.record(spec, {"verdict": "cut"}, before + elapsed())
                    break
                wait = 0.25 if deadline is None else max(0.0, min(0.25, deadline - now))
                for spec, result in pool.wait(wait):
                    if spec.run == lead:
                        lead = None
                        pool.ahead()
                    found = store.record(spec, result, before + elapsed())
                    verdict = result.get("verdict")
                    refused_row = refused_row + 1 if verdict == "refused" else 0
                    if verdict == "bad-target" or (
                            refused_row >= REFUSED_IN_A_ROW and not store.state["runs"]["completed"]):
                        stop = True
                    if found is not None:
                        if self.on_found is not None:
                            self.on_found(found)
                        if self.stop_on_failure:
                            stop = True
                if self.stop_on_failure:  # the first violation ends the campaign: while one
                    shrinking = pool.shrinking()  # run -> since when
                    hedge = any(time.monotonic() - since >= HEDGE for since in shrinking.values())
                    small = {n for n in pool.in_flight() if is_small(n, store.plan)} if hedge \
                        else set()
                    pool.hold(going_on(set(shrinking), lead, small))  # is shrunk, others wait
                if stop and pool.running:
                    pool.hold(set())  # a run stopped beside the shrinking one may have ended
                    for spec, result in pool.wait(0.0):  # just before: its result is not lost
                        found = store.record(spec, result, before + elapsed())
                        if found is not None and self.on_found is not None:
                            self.on_found(found)
                    for spec in pool.cancel():
                        store.record(spec, {"verdict": "cut"}, before + elapsed())
                    break
                if self.progress is not None:
                    self.progress(status())
        except KeyboardInterrupt:
            self.interrupted = True
            for spec in pool.cancel():
                store.record(spec, {"verdict": "cut"}, before + elapsed())
        finally:
            final = status()  # before the pool closes (a Ray cluster's shutdown is not the runs')
            pool.close()
        store.end_session({"started": now_iso(), "seconds": round(final["elapsed"], 3),
                           "pool_start_s": round(start - t0, 3), "pool": pool.where,
                           "runs": {"first": first_run, "next": store.next_run},
                           "completed": final["runs"], "ops": final["ops"],
                           "ops_per_second": round(final["ops_per_second"], 1),
                           "interrupted": self.interrupted})
        return store.write_reports()
