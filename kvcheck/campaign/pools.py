"""Where a campaign's runs run: local processes (one per core), or Ray tasks on a cluster.

Both pools take runs (``submit``), hand back finished ones (``wait``) and cut the ones in
flight (``cancel``). Every run is a ``kvcheck.campaign.worker.Watched`` child process: in
the local pool the campaign's process watches its children itself; under Ray each run is
one task (``num_cpus=1``) whose worker process watches the run's child the same way, so
a target that ends or wedges its process is a finding of that run, never a lost worker.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import wait as wait_for

from kvcheck.campaign.plan import RunSpec
from kvcheck.campaign.worker import BEHIND, POLL, Watched, can_restore, preload
from kvcheck.check.processes import cores
from kvcheck.errors import UsageError


class LocalPool:
    """Up to ``workers`` runs at once, each in a child process of this one."""

    name = "local processes"

    def __init__(self, workers: int | None = None, log: str | None = None,
                 model: str | None = None):
        if model is not None:
            preload(model)
        self.capacity = workers or cores()
        self.log = log
        self.running: dict[int, Watched] = {}
        self.where = f"{self.capacity} local process{'es' if self.capacity != 1 else ''}"
        self.behind = BEHIND if can_restore() else 0  # lowered only where it can be undone

    def free(self) -> int:
        return self.capacity - len(self.running)

    def submit(self, spec: RunSpec, behind: bool = False) -> None:
        """Start ``spec``; ``behind``: at the lowest priority until ``ahead`` (where this
        process may raise it back: else at its own), so that it runs on what the runs in
        flight leave of the machine, never slowing them."""
        self.running[spec.run] = Watched(spec, self.log, self.behind if behind else 0)

    def ahead(self) -> None:
        """Every run in flight back to this process's priority."""
        for w in self.running.values():
            w.restore()

    def shrinking(self) -> dict[int, float]:
        """The runs in flight that found a violation and are shrinking it, each with the
        moment (``time.monotonic``) it began."""
        return {run: w.shrinking_since for run, w in self.running.items()
                if w.shrinking_since is not None}

    def in_flight(self) -> set[int]:
        """The run numbers in flight."""
        return set(self.running)

    def hold(self, runs: set[int]) -> None:
        """While ``runs`` is not empty, every other run in flight is stopped (the machine
        is theirs); once it is empty, every run goes on."""
        for run, w in self.running.items():
            w.pause(bool(runs) and run not in runs)

    def wait(self, timeout: float) -> list[tuple[RunSpec, dict]]:
        """The runs that finished within ``timeout`` seconds (at least one look at each)."""
        if not self.running:
            return []
        wait_for([w.conn for w in self.running.values() if not w.paused],
                 timeout=max(0.0, min(timeout, POLL)))
        done = []
        for run, w in list(self.running.items()):
            result = w.pump()
            if result is not None:
                del self.running[run]
                done.append((w.spec, result))
        return done

    def cancel(self) -> list[RunSpec]:
        """Cut every run in flight (its process killed): the runs cut."""
        cut = []
        for w in self.running.values():
            w.kill()
            cut.append(w.spec)
        self.running.clear()
        return cut

    def close(self) -> None:
        self.cancel()


def _ray_warm(model: str | None) -> int:
    """A Ray task that only readies its worker process: kvcheck's modules for ``model``
    imported (what every run forks from); its process id."""
    if model is not None:
        preload(model)
    return os.getpid()


def _ray_task(spec_json: dict) -> dict:
    """A Ray task: one run, watched from the Ray worker process."""
    from kvcheck.campaign.worker import run_watched

    spec = RunSpec.from_json(spec_json)
    preload(spec.model)  # once per Ray worker process: its runs fork from it
    return run_watched(spec)


class RayPool:
    """Runs as Ray tasks: on a local Ray cluster started here (``address`` None: ``ray.init()``
    with ``workers`` CPUs), or on the cluster at ``address``, as many in flight as
    ``workers`` (default: the cluster's CPUs)."""

    name = "Ray tasks"

    def __init__(self, address: str | None = None, workers: int | None = None,
                 model: str | None = None):
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'kvcheck[ray]'") from None
        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            kw = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            try:
                if address:
                    ray.init(address=address, **kw)
                else:
                    ray.init(num_cpus=workers or cores(), **kw)
            except Exception as exc:  # noqa: BLE001 - Ray's own words, in one line
                from kvcheck.errors import describe_exception

                where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
                raise UsageError(f"--ray: cannot start or join {where}: "
                                 f"{describe_exception(exc)}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        self.capacity = workers or cpus
        self.task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        self.running: dict = {}  # object ref -> (spec, submitted at)
        # start the workers before the first run (the pool's start, not the runs' time): one
        # task per slot at once, each importing what the runs need
        warm = ray.remote(num_cpus=1, max_retries=0)(_ray_warm)
        try:
            ray.get([warm.remote(model) for _ in range(self.capacity)])
        except Exception as exc:  # noqa: BLE001 - Ray's own words, in one line
            from kvcheck.errors import describe_exception

            self.close()
            raise UsageError(f"--ray: the cluster's workers cannot run kvcheck: "
                             f"{describe_exception(exc)}") from None
        self.where = (f"{self.capacity} Ray task{'s' if self.capacity != 1 else ''} at a time on "
                      f"{'the cluster at ' + address if address else 'a local Ray cluster'} "
                      f"({cpus} CPU{'s' if cpus != 1 else ''})")

    def free(self) -> int:
        return self.capacity - len(self.running)

    def submit(self, spec: RunSpec, behind: bool = False) -> None:
        """Start ``spec`` as a task (``behind`` is for local processes: a Ray worker's
        priority is the cluster's)."""
        self.running[self.task.remote(spec.to_json())] = (spec, time.monotonic())

    def ahead(self) -> None:
        pass

    def shrinking(self) -> dict[int, float]:
        """(A Ray task tells nothing before it ends.)"""
        return {}

    def in_flight(self) -> set[int]:
        return {spec.run for spec, _ in self.running.values()}

    def hold(self, runs: set[int]) -> None:
        pass

    def wait(self, timeout: float) -> list[tuple[RunSpec, dict]]:
        if not self.running:
            return []
        ray = self.ray
        # the first to finish ends the wait (a free worker gets its next run at once), then
        # every other one already finished
        ready, rest = ray.wait(list(self.running), num_returns=1,
                               timeout=max(0.0, min(timeout, POLL)))
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        done = []
        for ref in ready:
            spec, since = self.running.pop(ref)
            try:
                result = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task itself failed (its worker died)
                from kvcheck.errors import describe_exception

                result = {"run": spec.run, "verdict": "error", "seconds": time.monotonic() - since,
                          "error": f"the Ray task failed: {describe_exception(exc)}"}
            done.append((spec, result))
        return done

    def cancel(self) -> list[RunSpec]:
        cut = []
        for ref, (spec, _) in self.running.items():
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished, or gone with its worker
                pass
            cut.append(spec)
        self.running.clear()
        return cut

    def close(self) -> None:
        self.cancel()
        if self.started_here:
            self.ray.shutdown()
