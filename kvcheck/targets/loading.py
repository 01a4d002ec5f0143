"""Turning a TARGET string into a ``Target`` the oracle can drive.

TARGET is a registered name (see ``kvcheck.registry``), ``module:attr`` or
``path/to/file.py:attr``, where ``attr`` is a factory (often a class) called
as ``factory(num_blocks, block_size)``. What it returns is used as is if it
speaks the ``Target`` protocol, else wrapped in ``SeedAdapter``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Collection
from pathlib import Path

from kvcheck.check.portable import is_file
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, guarded, record_phase
from kvcheck.errors import what_it_did
from kvcheck.targets.protocol import OPERATIONS, NotSeedShaped, SeedAdapter, is_target
from kvcheck.targets.registry import TARGETS


class TargetError(Exception):
    """Bad input: the target cannot be found, built or understood (exit 2)."""


def resolve(spec) -> tuple[str, object]:
    """``(label, factory)`` for a TARGET string or an already-callable factory."""
    if callable(spec):
        return getattr(spec, "__qualname__", repr(spec)), spec
    if not isinstance(spec, str) or not spec:
        raise TargetError(f"target must be a name or module:attr, got {spec!r}")
    if spec in TARGETS:
        return spec, _import_attr(TARGETS[spec][0])
    name, at, version = spec.partition("@")
    if at and not version:
        raise TargetError(f"target {spec!r}: no version after '@' (e.g. vllm-v0@0.4.2, "
                          f"@pinned or @installed)")
    if at and name in TARGETS and ":" not in spec:
        return spec, versioned(name, version)
    where, colon, attr = spec.rpartition(":")
    if colon and "@" in attr:  # module:factory@VERSION, file.py:factory@VERSION
        attr, _, version = attr.partition("@")
        return location(spec), with_version(_import_attr(f"{where}:{attr}"), spec, version)
    if ":" not in spec:
        from kvcheck.targets.registry import HYBRID_TARGETS

        if name in HYBRID_TARGETS:
            raise TargetError(f"{name!r} is a hybrid pool (several KV-cache groups): check it "
                              f"with kvcheck verify-hybrid {name}")
        names = ", ".join(sorted(TARGETS))
        raise TargetError(f"unknown target {spec!r}: use module:attr, file.py:attr or one of: {names}")
    return location(spec), _import_attr(spec)


def versioned(name: str, version: str):
    """The factory of registered target ``name`` at ``version`` (``vllm-v0@0.4.2``): the
    adapter of an engine generation loads any release of its range (``kvcheck install``);
    ``@pinned`` / ``@installed`` pick the pinned sources / this environment's engine."""
    import functools

    factory = _import_attr(TARGETS[name][0])
    key = getattr(sys.modules.get(factory.__module__), "ENGINE_KEY", None)
    if key is None or not version or not _takes_version(factory):
        raise TargetError(f"target {name!r} has no versions (TARGET@VERSION is for the "
                          f"engine adapters: {', '.join(sorted(versioned_targets()))})")
    from kvcheck.impl.thirdparty import install

    try:
        install.select(key, version, with_family=getattr(factory, "loads_family", False))
    except install.InstallError as exc:
        raise TargetError(str(exc)) from None
    except install.ThirdPartyMissing as exc:
        raise TargetError(str(exc)) from None
    return functools.partial(factory, version=version)


def with_version(factory, spec: str, version: str):
    """``factory`` with ``version=`` bound: a factory that takes a ``version`` keyword (the
    engine adapters' ``make``, ``make_prefix_guarded``, ...) is asked for that release."""
    import functools

    if not _takes_version(factory) or not version:
        raise TargetError(f"target {spec!r}: the factory takes no version (TARGET@VERSION is "
                          f"for factories with a 'version' keyword, as the engine adapters')")
    key = getattr(sys.modules.get(getattr(factory, "__module__", "")), "ENGINE_KEY", None)
    if key is not None:
        from kvcheck.impl.thirdparty import install

        try:
            install.select(key, version, with_family=getattr(factory, "loads_family", False))
        except (install.InstallError, install.ThirdPartyMissing) as exc:
            raise TargetError(str(exc)) from None
    return functools.partial(factory, version=version)


def _takes_version(factory) -> bool:
    import inspect

    try:
        return "version" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def versioned_targets() -> list[str]:
    """Registered targets whose adapter loads a range of releases (``TARGET@VERSION``): an
    ``ENGINE_KEY`` module (whose sources the engine line names) and a factory taking a
    ``version``."""
    return [name for name, (where, _) in TARGETS.items()
            if where.startswith("kvcheck.impl.thirdparty.") and getattr(
                importlib.import_module(where.partition(":")[0]), "ENGINE_KEY", None)
            and _takes_version(_import_attr(where))]


def engine_source(spec) -> str | None:
    """Which engine sources a registered third-party target (``NAME`` or ``NAME@VERSION``)
    loads, in words (``vllm 0.33.0 from the pinned sources in ...``); ``None`` for others."""
    if not isinstance(spec, str):
        return None
    from kvcheck.targets.registry import ENGINE_TARGETS, HYBRID_TARGETS

    name, _, version = spec.partition("@")
    where = TARGETS.get(name) or HYBRID_TARGETS.get(name) or ENGINE_TARGETS.get(name)
    if where is None or ":" in spec:
        return None
    module = importlib.import_module(where[0].partition(":")[0])
    key = getattr(module, "ENGINE_KEY", None)
    if key is None:
        return None
    from kvcheck.impl.thirdparty import install

    family = getattr(getattr(module, where[0].partition(":")[2], None), "loads_family", False)
    try:
        dist = install.select(key, version or None, with_family=family)
    except (install.InstallError, install.ThirdPartyMissing):
        return None
    text = dist.source
    engine = install.ENGINES[key]
    other = None if version or dist.root else install.environment_version(engine)
    if other:  # the user's own engine was not checked: say why
        rows = (engine, *install.family(key)) if family else (engine,)
        text += (f" (the {engine.dist} {other} of this environment is outside {key}'s range "
                 f"{' and '.join(r.range for r in rows)})")
    return text


def location(spec: str) -> str:
    """Where a ``module:attr`` or ``file.py:attr`` string points, from any working directory:
    a file that exists is made absolute; modules and registered names stay as they are
    (what traces record, so ``kvcheck replay`` finds the target from elsewhere)."""
    where, sep, attr = spec.rpartition(":")
    if sep and where and is_file(where) and Path(where).is_file():
        return f"{Path(where).resolve()}:{attr}"
    return spec


def _import_attr(spec: str):
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {spec!r} must look like module:attr")
    record_phase("import")
    with guarded(None):  # importing runs the target's module code: under the active watchdog
        return _import_guarded(spec, where, attr)


def _import_guarded(spec: str, where: str, attr: str):
    try:
        if is_file(where):
            path = Path(where)
            if not path.is_file():
                raise TargetError(f"target file {where} does not exist")
            name = f"kvcheck_target_{abs(hash(str(path.resolve())))}"
            module = sys.modules.get(name)  # load a file once, so its classes stay one class
            if module is None:
                module = _load_file(name, path)
        else:
            module = importlib.import_module(where)
    except TargetError:
        raise
    except OperationTimeout as exc:
        raise TargetError(f"importing {where!r} {exc}") from None
    except Interrupted:
        raise
    except BaseException as exc:  # noqa: BLE001 - any import failure is bad input
        raise TargetError(f"cannot import {where!r}: it {what_it_did(exc)}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - a missing (or raising) attribute
            raise TargetError(f"{where!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TargetError(f"{spec!r} is not callable: it must be a factory(num_blocks, block_size)")
    return obj


def _load_file(name: str, path: Path):
    """Execute ``path`` as module ``name`` with its folder importable while it loads (as
    ``python path`` would have it), so it can import the modules that sit beside it."""
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def build(factory, num_blocks: int, block_size: int, out_of_blocks=None):
    """Call the factory and adapt what it returns.

    Raises ``TargetError`` when the factory itself refuses (bad sizes, wrong
    signature) or returns something that is neither a Target nor seed-shaped.
    """
    where = f"num_blocks={num_blocks}, block_size={block_size}"
    record_phase("build")
    try:
        with guarded(None):  # the constructor is target code: under the active watchdog
            impl = factory(num_blocks, block_size)
            windows = getattr(impl, "windows", None)
            if isinstance(windows, (list, tuple)) and len(windows) > 1 and all(
                    type(w) is int for w in windows):  # one table per group: not this model's
                raise TargetError(f"{type(impl).__name__} is a hybrid pool (windows "
                                  f"{list(windows)!r:.40}, one table per KV-cache group): check "
                                  f"it with kvcheck verify-hybrid")
            if is_target(impl):
                if out_of_blocks is not None:
                    impl.is_out_of_blocks = lambda exc: isinstance(exc, out_of_blocks)
                target = impl
            else:
                target = SeedAdapter(impl, num_blocks, block_size, out_of_blocks)
            check_capabilities(target, type(impl).__name__)
            return target
    except (NotSeedShaped, TargetError) as exc:
        raise TargetError(str(exc)) from None
    except OperationTimeout as exc:
        raise TargetError(f"building the target with {where} {exc}") from None
    except Interrupted:
        raise
    except BaseException as exc:  # noqa: BLE001 - the factory refused or misbehaved: bad input
        raise TargetError(f"cannot build target with {where}: it {what_it_did(exc)}") from None


def check_capabilities(target, name: str = "the target") -> None:
    """``TargetError`` unless ``target.capabilities`` lets kvcheck issue operations.

    Names kvcheck does not know are ignored (a newer target may offer more);
    without ``allocate`` no sequence can ever exist, so nothing could run and
    nothing would be checked: that is bad input, never a pass.
    """
    caps = getattr(target, "capabilities", None)
    if caps is None or isinstance(caps, (str, bytes)) or not isinstance(caps, Collection):
        raise TargetError(f"{name}.capabilities must be a set of operation names "
                          f"({', '.join(OPERATIONS)}), got {_short(caps)}")
    known = [op for op in OPERATIONS if op in caps]
    if not known and type(target) is SeedAdapter:
        raise TargetError(f"{name} has none of the methods {', '.join(OPERATIONS)}: no operation "
                          f"could run, so nothing could be checked")
    if not known:
        raise TargetError(f"{name} offers no operation kvcheck knows: capabilities "
                          f"{_short(caps)} name none of {', '.join(OPERATIONS)}, so nothing "
                          f"could be checked")
    if "allocate" not in known:
        raise TargetError(f"{name} does not offer allocate (capabilities: {', '.join(known)}): "
                          f"without it no sequence exists and no operation can run, so nothing "
                          f"could be checked")


def _short(value) -> str:
    text = repr(sorted(value, key=str) if isinstance(value, (set, frozenset)) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_exception(spec: str) -> type[BaseException]:
    """``module:Name`` of the out-of-blocks exception class."""
    cls = _import_attr(spec)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise TargetError(f"{spec!r} is not an exception class")
    return cls
