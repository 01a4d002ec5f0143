"""The scheduler model: admission, decode order and preemption over a block manager.

``model`` (operations as data: ``add`` and ``step``; the scope with its watermark; the
seeded workload driver; shrink moves; how a run reads), ``oracle`` (a run's observation
and checks: the policy spec, the pools' invariants, retiring finished sequences,
liveness, ping-pongs), ``loading`` (finding and building a scheduler with its block
manager), ``workload`` (seeded requests that fit), ``runs`` (``verify`` over several
workloads, ``run_workload`` for one). Importing it registers the model as ``scheduler``.
"""

from kvcheck.models.scheduler.model import MODEL, SchedOp, SchedScope, SchedulerModel

__all__ = ["MODEL", "SchedOp", "SchedScope", "SchedulerModel"]
