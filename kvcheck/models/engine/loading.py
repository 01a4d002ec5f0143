"""Engine TARGETs: ``vllm-v1-engine[@VERSION]`` (``kvcheck.targets.registry.ENGINE_TARGETS``),
``module:attr`` or ``file.py:attr``; a factory is called as ``factory(num_blocks,
block_size, budget=, max_seqs=, policy=, caching=, spec=)`` (the scope's settings), with
``max_model_len=`` where the run sets it."""

from __future__ import annotations

from kvcheck.check.watchdog import Interrupted, OperationTimeout, guarded, record_phase
from kvcheck.errors import describe_exception
from kvcheck.impl.errors import MisuseError
from kvcheck.targets.loading import TargetError, _import_attr, location, with_version

NEEDS = ("add", "abort", "step", "status", "computed", "blocks", "running", "waiting",
         "refcount", "free_blocks", "num_free", "token_ids", "block_hashes",
         "cached_entries", "block_hash")


def targets() -> dict[str, tuple[str, str]]:
    from kvcheck.targets import registry

    return getattr(registry, "ENGINE_TARGETS", {})


def resolve(spec):
    """``(label, factory)``, or None for a callable (the checker's own resolution)."""
    if not isinstance(spec, str):
        return None
    known = targets()
    if spec in known:
        return spec, _import_attr(known[spec][0])
    name, at, version = spec.partition("@")
    if at and name in known:
        return spec, with_version(_import_attr(known[name][0]), spec, version)
    if ":" not in spec:
        raise TargetError(f"unknown engine target {spec!r}: use module:attr, file.py:attr or "
                          f"one of: {', '.join(sorted(known)) or '(none)'}")
    return location(spec), _import_attr(spec)


def build(factory, scope):
    """The engine target for ``scope``; ``TargetError`` if it cannot be built (a release
    missing, a setting it refuses) or lacks what the oracle reads."""
    record_phase("build")
    try:
        with guarded(None):
            try:
                more = {"max_model_len": scope.max_model_len} if scope.max_model_len else {}
                target = factory(scope.num_blocks, scope.block_size, budget=scope.budget,
                                 max_seqs=scope.max_seqs, policy=scope.policy,
                                 caching=scope.caching, spec=scope.spec, **more)
            except (OperationTimeout, Interrupted):
                raise
            except BaseException as exc:  # noqa: BLE001 - the engine refused: bad input
                # (an adapter's refusal in full: it quotes the release's own words)
                limit = 2000 if isinstance(exc, MisuseError) else 300
                raise TargetError(f"cannot build the engine with {scope.describe()}: "
                                  f"{describe_exception(exc, limit)}") from None
    except OperationTimeout as exc:
        raise TargetError(f"building the engine {exc}") from None
    missing = [a for a in NEEDS if not callable(getattr(target, a, None))]
    if missing:
        raise TargetError(f"{type(target).__name__} is not an engine target: missing "
                          f"{', '.join(missing)}")
    return target
