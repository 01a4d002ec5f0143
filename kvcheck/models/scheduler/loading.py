"""Finding and building a scheduler target: the scheduler, its block manager, how to observe both.

A *seed-shaped* scheduler is built as ``factory(bm, watermark_blocks)`` and has
``waiting`` (a deque of ``(seq, n_tokens)``), ``running`` (a list, oldest
first) and ``step() -> decoded seq ids``; ``add(seq, n[, max_new])`` and
``finish(seq)`` are used when present (else the oracle appends to ``waiting``
and retires finished sequences itself).

The block manager it is given is the user's (``block_manager``: a factory
``(num_blocks, block_size)``), else the module-level ``BlockManager`` of the
module that defines the scheduler factory (a scheduler written against its
own block manager, catching its own ``OutOfBlocks``), else the reference. It
must be seed-shaped (``tables``, ``ref``, ``free``, ``lens``): it is observed
through ``SeedAdapter``, as ``kvcheck verify`` observes one, and an
out-of-blocks exception escaping the scheduler is named as ``verify`` names
one (``out_of_blocks``; default: any exception class named ``OutOfBlocks``).
"""

from __future__ import annotations

import functools
import inspect
import sys

from kvcheck.check.watchdog import Interrupted, OperationTimeout, guarded, record_phase
from kvcheck.errors import describe_exception
from kvcheck.impl.block_manager import BlockManager
from kvcheck.models.scheduler.workload import WorkloadError, check_scope
from kvcheck.targets.loading import TargetError, _import_attr, load_exception, location
from kvcheck.targets.protocol import SeedAdapter

SCHEDULERS: dict[str, tuple[str, str]] = {
    "reference": ("kvcheck.impl.scheduler:Scheduler", "the reference scheduler (recompute)"),
    "swap": ("kvcheck.impl.swap:SwapScheduler",
             "the reference policy, victims swapped to a host pool (4x the device pool)"),
}

SEED_BM = ("tables", "ref", "free", "lens")  # what is read of a block manager


def resolve(spec) -> tuple[str, object]:
    """``(label, factory)`` for a scheduler name, ``module:attr``, ``file.py:attr`` or callable."""
    if callable(spec):
        return getattr(spec, "__qualname__", repr(spec)), spec
    if not isinstance(spec, str) or not spec:
        raise TargetError(f"scheduler must be a name or module:attr, got {spec!r}")
    if spec in SCHEDULERS:
        return spec, _import_attr(SCHEDULERS[spec][0])
    if ":" not in spec:
        names = ", ".join(sorted(SCHEDULERS))
        raise TargetError(f"unknown scheduler {spec!r}: use module:attr, file.py:attr or one of: "
                          f"{names}")
    return location(spec), _import_attr(spec)


def resolve_block_manager(spec, scheduler=None, label: str = "") -> tuple[str, object]:
    """``(label, factory)`` of the block manager: ``spec`` (``"reference"``,
    ``module:Attr``, ``file.py:Attr`` or a callable ``(num_blocks, block_size)``), else
    (``None``) the module-level ``BlockManager`` of the module defining ``scheduler``
    (the factory, as ``resolve`` gives it, from the scheduler ``label``), else the
    reference."""
    if callable(spec):
        return getattr(spec, "__qualname__", repr(spec)), spec
    if spec is not None:
        if spec == "reference":
            return spec, BlockManager
        if not isinstance(spec, str) or ":" not in spec:
            raise TargetError(f"--block-manager must be reference, module:Attr or file.py:Attr, "
                              f"got {spec!r}")
        try:
            return spec, _import_attr(spec)
        except TargetError as exc:
            raise TargetError(f"--block-manager {spec}: {exc}") from None
    f = scheduler
    while isinstance(f, functools.partial):
        f = f.func
    module = sys.modules.get(getattr(f, "__module__", None) or "")
    own = getattr(module, "BlockManager", None)
    if own is None or own is BlockManager or not callable(own):
        return "reference", BlockManager
    where = label.rpartition(":")[0] if ":" in label else module.__name__
    return f"{where}:BlockManager", own


class SchedTarget:
    """A scheduler with its block manager (and a swapping one's host pool), as one target:
    what the oracle drives, observes and copies (``copy.deepcopy`` copies the scheduler and
    its block manager together, so they stay one system)."""

    capabilities = frozenset({"add", "step"})

    def __init__(self, sched, bm, num_blocks: int, block_size: int, watermark: int,
                 out_of_blocks: type[BaseException] | None = None):
        self.sched, self.bm = sched, bm
        self.num_blocks, self.block_size, self.watermark = num_blocks, block_size, watermark
        self.view = SeedAdapter(bm, num_blocks, block_size, out_of_blocks)
        add = getattr(sched, "add", None)
        self.has_add = callable(add)
        self.add_takes_max = False
        if self.has_add:
            try:
                self.add_takes_max = len(inspect.signature(add).parameters) >= 3
            except (TypeError, ValueError):
                self.add_takes_max = False
        self.has_finish = callable(getattr(sched, "finish", None))
        host = getattr(sched, "host", None)  # a swapping scheduler's host pool
        self.host = None
        if (isinstance(host, (BlockManager, type(bm))) and host is not bm
                and all(hasattr(host, a) for a in (*SEED_BM, "num_blocks", "block_size"))):
            self.host = SeedAdapter(host, host.num_blocks, host.block_size, out_of_blocks)

    # -- the calls the oracle makes (each under its watchdog) ---------------------------
    def add(self, seq: int, prompt: int, max_new: int) -> None:
        s = self.sched
        if not self.has_add:
            s.waiting.append((seq, prompt))
        elif self.add_takes_max:
            s.add(seq, prompt, max_new)
        else:
            s.add(seq, prompt)

    def step(self):
        return self.sched.step()

    def finish(self, seq: int) -> None:
        """Retire ``seq``: the scheduler's ``finish``, else what an engine would do (take it
        out of ``running`` and free its blocks)."""
        if self.has_finish:
            self.sched.finish(seq)
        else:
            self.sched.running.remove(seq)
            self.bm.free_seq(seq)

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        return self.view.is_out_of_blocks(exc)


def block_manager_factory(spec, factory):
    """The block-manager factory ``spec`` names (see ``resolve_block_manager``)."""
    return resolve_block_manager(spec, factory)[1]


def out_of_blocks_class(options) -> type[BaseException] | None:
    """The out-of-blocks class of a run: ``Options.out_of_blocks``, else the one a trace's
    settings name (``module:Name``), else None (any class named ``OutOfBlocks``)."""
    if options.out_of_blocks is not None:
        return options.out_of_blocks
    spec = options.extra.get("out_of_blocks")
    if isinstance(spec, type) and issubclass(spec, BaseException):
        return spec
    return load_exception(spec) if isinstance(spec, str) and spec else None


def build(factory, num_blocks: int, block_size: int, watermark: int, block_manager=None,
          out_of_blocks: type[BaseException] | None = None) -> SchedTarget:
    """The target; ``TargetError`` if the scope admits nothing, or the scheduler or its block
    manager cannot be built or is not seed-shaped. ``block_manager``: its factory or spec
    (default: see ``resolve_block_manager``)."""
    try:
        check_scope(num_blocks, block_size, watermark)
    except WorkloadError as exc:
        raise TargetError(str(exc)) from None
    if block_manager is None or isinstance(block_manager, str):
        block_manager = block_manager_factory(block_manager, factory)
    record_phase("build")
    where = f"num_blocks={num_blocks}, block_size={block_size}"
    try:
        with guarded(None):  # constructors are target code: under the active watchdog
            try:
                bm = block_manager(num_blocks, block_size)
            except (OperationTimeout, Interrupted):
                raise
            except BaseException as exc:  # noqa: BLE001 - the block manager refused: bad input
                raise TargetError(f"cannot build the block manager with {where}: "
                                  f"{describe_exception(exc)}") from None
            missing = [a for a in SEED_BM if not _has(bm, a)]
            if missing:
                raise TargetError(f"{type(bm).__name__} is not a seed-shaped block manager: "
                                  f"missing attribute(s) {', '.join(missing)}")
            try:
                sched = factory(bm, watermark)
            except (OperationTimeout, Interrupted):
                raise
            except BaseException as exc:  # noqa: BLE001 - the factory refused: bad input
                raise TargetError(f"cannot build scheduler with watermark_blocks={watermark} on "
                                  f"{num_blocks} blocks of {block_size}: "
                                  f"{describe_exception(exc)}") from None
            missing = [a for a in ("waiting", "running") if not _has(sched, a)]
            if not (_has(sched, "step") and callable(sched.step)):
                missing.append("step()")
            if missing:
                raise TargetError(f"{type(sched).__name__} is not a seed-shaped scheduler: "
                                  f"missing {', '.join(missing)}")
            return SchedTarget(sched, bm, num_blocks, block_size, watermark, out_of_blocks)
    except OperationTimeout as exc:
        raise TargetError(f"building the scheduler with {where} {exc}") from None


def _has(obj, name: str) -> bool:
    """``hasattr``, for an object whose attributes may raise anything."""
    try:
        getattr(obj, name)
    except (OperationTimeout, Interrupted):
        raise
    except BaseException:  # noqa: BLE001 - a property that raises is an attribute it lacks
        return False
    return True
