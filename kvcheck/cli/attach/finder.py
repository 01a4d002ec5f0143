"""``import vllm.*`` answered from an installed release's own files (``kvcheck attach``).

Runs only inside the pytest process that ``kvcheck attach`` starts (never in kvcheck's own
process): there the engine's test files must ``import vllm.v1.core.kv_cache_manager`` and
monkeypatch its attributes by their real names, so, unlike ``impl/thirdparty/_loader.py``
(which keeps every loaded file under a private prefix), the release's files are registered
under their real names. What is the same as the loader: nothing is imported from an
installed ``vllm`` package; every ``vllm.*`` module is the release's own ``.py`` file,
executed from ``kvcheck install``'s folder (``~/.cache/kvcheck/thirdparty/vllm-X``), byte
for byte; nothing of it is rewritten or stood in.

What cannot run here. The wheel's files are Python only (no compiled ``vllm._C``) and
vLLM's dependencies are mostly not installed (transformers, fastapi, openai...; the small
ones the KV-cache code and its tests need are: ``kvcheck attach`` installs msgspec, cbor2,
psutil, pyzmq, blake3 and cachetools into its own cache folder). A release file whose
import fails (a missing dependency, no CUDA, a module-level call into something that
cannot run) becomes an *unavailable* module: every name read from it is an unavailable
placeholder, and any use of one -- a call, an instantiation, ``isinstance`` or
``issubclass`` against it, an attribute of an instance -- raises ``NotRunHere`` naming the
module and why it could not be imported. A placeholder never behaves like the real thing
(there is no stand-in behaviour to trust); it only lets a test file whose module-level
imports name such a module be collected, so that its tests that never touch it run, and
those that do are reported *not run* with that reason (never passed, never failed).

The release's ``vllm/__init__.py`` runs as it is (it imports ``vllm.env_override``, which
sets environment variables and torch flags, and resolves ``vllm.SamplingParams`` etc.
lazily).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path


class NotRunHere(Exception):
    """A test reached a part of the engine that cannot run on this machine (its module
    could not be imported here); the test is reported as not run, with this reason."""


UNAVAILABLE: dict[str, str] = {}  # module name -> why it could not be imported (for reports)


def _why(exc: BaseException) -> str:
    if isinstance(exc, NotRunHere):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"needs {exc.name.split('.')[0]}, not installed here" if not exc.name.startswith(
            "vllm") else f"needs {exc.name}, which is not in the release's wheel"
    text = " ".join(str(exc).split())
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _PlaceholderMeta(type):
    """The class of every unavailable name: using it raises ``NotRunHere``."""

    def _refuse(cls):
        raise NotRunHere(cls.__kvcheck_unavailable__)

    def __call__(cls, *args, **kwargs):
        cls._refuse()

    def __getattr__(cls, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return placeholder(f"{cls.__qualname__}.{attr}", cls.__kvcheck_unavailable__)

    def __instancecheck__(cls, obj):
        cls._refuse()

    def __subclasscheck__(cls, sub):
        cls._refuse()

    def __getitem__(cls, item):  # Placeholder[int] in an annotation evaluated at import
        return cls

    def __or__(cls, other):  # Placeholder | None
        return cls

    __ror__ = __or__

    def __iter__(cls):
        cls._refuse()

    def __bool__(cls):
        return True


def _any_schema(cls, source, handler):
    """pydantic's schema of a field typed with an unavailable class: any value (pydantic
    cannot build one otherwise, and a config class naming, say, transformers'
    ``PretrainedConfig`` would make the whole config module unavailable)."""
    from pydantic_core import core_schema

    return core_schema.any_schema()


def placeholder(qualname: str, reason: str) -> type:
    """An unavailable name: a class whose every use raises ``NotRunHere(reason)``."""
    return _PlaceholderMeta(qualname.rpartition(".")[2] or qualname, (), {
        "__kvcheck_unavailable__": reason, "__qualname__": qualname,
        "__module__": "kvcheck.unavailable",
        "__get_pydantic_core_schema__": classmethod(_any_schema)})


class UnavailableModule(types.ModuleType):
    """A release module that could not be imported here: its names are placeholders."""

    def __init__(self, name: str, reason: str, path: list[str] | None):
        super().__init__(name)
        self.__kvcheck_unavailable__ = reason
        if path is not None:
            self.__path__ = path

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = placeholder(f"{self.__name__}.{attr}", self.__kvcheck_unavailable__)
        setattr(self, attr, value)
        return value


class _ReleaseLoader(importlib.abc.Loader):
    """Executes a release file; a file that cannot be imported here becomes unavailable."""

    def __init__(self, path: Path | None):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        if self.path is None:  # a folder without __init__.py: a namespace package
            return
        code = compile(self.path.read_bytes(), str(self.path), "exec", dont_inherit=True)
        try:
            exec(code, module.__dict__)
        except Exception as exc:  # noqa: BLE001 - the module is unavailable here, and why
            reason = f"{name} cannot be imported here ({_why(exc)})"
            UNAVAILABLE[name] = reason
            path = getattr(module, "__path__", None)
            stand = UnavailableModule(name, reason, list(path) if path is not None else None)
            stand.__spec__ = module.__spec__
            stand.__file__ = str(self.path)
            sys.modules[name] = stand
            parent, _, leaf = name.rpartition(".")
            if parent and parent in sys.modules:
                setattr(sys.modules[parent], leaf, stand)


class ReleaseFinder(importlib.abc.MetaPathFinder):
    """Finds ``top`` and ``top.*`` in ``root`` (a folder holding the release's package)."""

    def __init__(self, root: Path, top: str = "vllm"):
        self.root = Path(root)
        self.top = top

    def find_spec(self, name, path=None, target=None):
        if name != self.top and not name.startswith(self.top + "."):
            return None
        rel = self.root / name.replace(".", "/")
        if rel.is_dir():
            init = rel / "__init__.py"
            spec = importlib.machinery.ModuleSpec(
                name, _ReleaseLoader(init if init.is_file() else None),
                origin=str(init) if init.is_file() else None, is_package=True)
            spec.submodule_search_locations = [str(rel)]
            spec.has_location = init.is_file()
            return spec
        file = rel.with_suffix(".py")
        if file.is_file():
            spec = importlib.util.spec_from_file_location(name, file, loader=_ReleaseLoader(file))
            return spec
        return None  # not in the wheel's Python files: ModuleNotFoundError, as for any module


def install(root: Path, top: str = "vllm") -> ReleaseFinder:
    """Put the release finder first on ``sys.meta_path`` (this process only)."""
    if any(name == top or name.startswith(top + ".") for name in sys.modules):
        raise RuntimeError(f"{top} is already imported in this process")
    finder = ReleaseFinder(root, top)
    sys.meta_path.insert(0, finder)
    return finder
