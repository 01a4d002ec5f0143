"""Load a third-party allocator's module files without its engine.

The packages we adapt (vLLM 0.33.0, vLLM 0.8.5, nano-vllm) import torch, CUDA
kernels and whole engines from their top-level ``__init__``; their allocator
modules mostly do not. This loader executes *just* the named module files of
an installed copy, under an isolated module name, and answers every import
those files make from a private table instead of ``sys.modules``:

* a name listed in ``files`` is executed from the install directory (the real
  third-party source, byte for byte);
* a name listed in ``stubs`` gets a stand-in module built by the adapter (and
  documented there: what it replaces and why that cannot change allocator
  behaviour);
* a package that is only a path component (``vllm``, ``vllm.v1``...) is an
  empty package: its ``__init__.py`` is *not* executed;
* any other name of the third-party distribution raises ``ImportError`` naming
  it -- nothing is stood in implicitly;
* every other import (stdlib, numpy, xxhash, ...) is the ordinary one.

Isolation works through each loaded module's ``__builtins__``: its
``__import__`` is replaced, so imports at module level *and* imports inside
functions resolve through the private table. Nothing named ``vllm`` (or
``torch``) is ever put into ``sys.modules``; the loaded files are registered
there only under ``kvcheck_tp_<dist>_<version>.<real name>`` (dataclasses and
pickling look classes' modules up there). Hence both vLLM versions, and a real
vLLM installed in the same interpreter, coexist.

Install directories: ``$KVCHECK_THIRDPARTY_DIR/<dist>-<version>/`` if the
environment variable is set, else ``~/.cache/kvcheck/thirdparty/<dist>-<version>/``
(``kvcheck install ENGINE[==VERSION]``, see ``install.py``); or, for the engine
installed in the user's own environment, its site-packages folder (``Dist.root``;
the files are still executed by this loader, never imported as ``vllm``).
"""

from __future__ import annotations

import builtins
import functools
import importlib.util
import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import StandInMissing

ENV_DIR = "KVCHECK_THIRDPARTY_DIR"
INSTALL_SCRIPT = "scripts/install_thirdparty.sh"
MARKER = ".kvcheck-installed"


class ThirdPartyMissing(RuntimeError):
    """A third-party package needed by an adapter is not installed."""


@dataclass(frozen=True)
class Dist:
    """One pinned third-party distribution."""

    key: str  # the installer's name for it, e.g. "vllm-v1"
    dist: str  # PyPI distribution name
    version: str  # pinned version
    top: str  # top-level import package inside it
    root: str = ""  # a folder holding ``top`` (an environment's site-packages); "" = the cache

    @property
    def dirname(self) -> str:
        return f"{self.dist}-{self.version}"

    @property
    def install_hint(self) -> str:
        return f"kvcheck install {self.key}=={self.version}"

    @property
    def source(self) -> str:
        """Where the files come from, in words (printed with a verdict)."""
        if self.root:
            return f"{self.dist} {self.version} installed in this environment ({self.root})"
        from kvcheck.impl.thirdparty.install import ENGINES  # install imports this module

        engine = ENGINES.get(self.key)
        if engine is not None and engine.family:  # vllm-v1-early: the pin is vllm-v1's
            engine = ENGINES[engine.family]
        if engine is None or engine.pinned == self.version:
            return f"{self.dist} {self.version} from the pinned sources in {install_dir(self)}"
        return (f"{self.dist} {self.version} from kvcheck install's sources in "
                f"{install_dir(self)} (not the pinned {engine.pinned})")


VLLM_V1 = Dist("vllm-v1", "vllm", "0.33.0", "vllm")
VLLM_V0 = Dist("vllm-v0", "vllm", "0.8.5", "vllm")
NANO_VLLM = Dist("nano-vllm", "nano-vllm-fork", "20260210", "nanovllm")
DISTS = {d.key: d for d in (VLLM_V1, VLLM_V0, NANO_VLLM)}


def base_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kvcheck" / "thirdparty"


def install_dir(dist: Dist) -> Path:
    """Where ``dist`` is installed (the directory holding its top package)."""
    if dist.root:
        return Path(dist.root)
    return base_dir() / dist.dirname


def is_installed(dist: Dist) -> bool:
    root = install_dir(dist)
    if dist.root:
        return (root / dist.top).is_dir()
    marker = root / MARKER
    return (
        (root / dist.top).is_dir()
        and marker.is_file()
        and marker.read_text().strip() == f"{dist.dist}=={dist.version}"
    )


def require(dist: Dist) -> Path:
    """The install directory of ``dist``; ``ThirdPartyMissing`` if absent."""
    if not is_installed(dist):
        raise ThirdPartyMissing(
            f"{dist.dist} {dist.version} is not installed in {install_dir(dist)}: "
            f"run `{dist.install_hint}`"
        )
    return install_dir(dist)


StubBuilder = Callable[[types.ModuleType, "Loaded"], None]
"""Fills a fresh stand-in module; gets the loader state to import real modules."""


class Loaded:
    """The private module table of one load: real name -> module object."""

    def __init__(self, dist: Dist, root: Path, files: Sequence[str],
                 stubs: Mapping[str, StubBuilder]):
        self.dist = dist
        self.root = root
        self.prefix = "kvcheck_tp_" + "".join(
            c if c.isalnum() else "_" for c in f"{dist.key}_{dist.version}"
        ) + ("_env" if dist.root else "")
        self.files = set(files)
        self.stubs = dict(stubs)
        self.modules: dict[str, types.ModuleType] = {}
        self.stood_in: list[str] = []
        self._builtins = dict(vars(builtins))
        self._builtins["__import__"] = self._import

    # -- lookup -------------------------------------------------------------
    def __getitem__(self, name: str) -> types.ModuleType:
        return self.get(name)

    def has(self, name: str) -> bool:
        """Whether ``name`` is one of the release's files this load executes (on use)."""
        return name in self.files

    def _ours(self, name: str) -> bool:
        top = self.dist.top
        return name == top or name.startswith(top + ".") or name in self.stubs

    def get(self, name: str) -> types.ModuleType:
        """The module ``name`` (real dotted name), loading it on first use."""
        mod = self.modules.get(name)
        if mod is not None:
            return mod
        parent, _, leaf = name.rpartition(".")
        if parent and parent.split(".")[0] == self.dist.top:
            self.get(parent)
        if name in self.stubs:
            mod = self._new_module(name, package=False)
            self.modules[name] = mod
            self.stood_in.append(name)
            self.stubs[name](mod, self)
        elif name in self.files:
            mod = self._exec_file(name)
        elif self._is_package_dir(name):
            mod = self._new_module(name, package=True)
            self.modules[name] = mod
        else:
            raise ImportError(
                f"{name} is imported by a {self.dist.dist} {self.dist.version} allocator "
                "module but is neither loaded nor stood in (see impl/thirdparty/_loader.py)",
                name=name,
            )
        if parent and parent in self.modules:
            setattr(self.modules[parent], leaf, mod)
        return mod

    def _is_package_dir(self, name: str) -> bool:
        return (self.root / name.replace(".", "/")).is_dir()

    def _new_module(self, name: str, package: bool) -> types.ModuleType:
        mod = types.ModuleType(f"{self.prefix}.{name}")
        mod.__dict__["__builtins__"] = self._builtins
        mod.__package__ = f"{self.prefix}.{name if package else name.rpartition('.')[0]}"
        if package:
            mod.__path__ = [str(self.root / name.replace(".", "/"))]
        mod.__kvcheck_real_name__ = name
        sys.modules[mod.__name__] = mod
        return mod

    def _exec_file(self, name: str) -> types.ModuleType:
        rel = name.replace(".", "/")
        path = self.root / f"{rel}.py"
        is_pkg = False
        if not path.is_file():
            path = self.root / rel / "__init__.py"
            is_pkg = True
        if not path.is_file():
            raise ImportError(f"{name}: no file {path}", name=name)
        spec = importlib.util.spec_from_file_location(
            f"{self.prefix}.{name}", path,
            submodule_search_locations=[str(path.parent)] if is_pkg else None,
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        mod.__dict__["__builtins__"] = self._builtins
        mod.__kvcheck_real_name__ = name
        self.modules[name] = mod
        sys.modules[spec.name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del self.modules[name]
            sys.modules.pop(spec.name, None)
            raise
        return mod

    # -- the import hook the loaded files see ---------------------------------
    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            package = (globals or {}).get("__package__") or ""
            real_pkg = package[len(self.prefix) + 1:] if package.startswith(self.prefix) else ""
            base = real_pkg.rsplit(".", level - 1)[0] if level > 1 else real_pkg
            name = f"{base}.{name}" if name else base
            level = 0
        if not self._ours(name):
            return builtins.__import__(name, globals, locals, fromlist, level)
        mod = self.get(name)
        if fromlist:
            for item in fromlist:
                if item != "*" and not hasattr(mod, item) and hasattr(mod, "__path__"):
                    sub = f"{name}.{item}"
                    if sub in self.files or sub in self.stubs or self._is_package_dir(sub):
                        self.get(sub)
            return mod
        head = name.split(".")[0]
        return self.modules[head] if head in self.modules else mod


_lock = threading.Lock()
_cache: dict[tuple, Loaded] = {}


def load(dist: Dist, files: Sequence[str], stubs: Mapping[str, StubBuilder],
         entry: Sequence[str]) -> Loaded:
    """Load ``entry`` modules of ``dist`` (and what they import, per the rules above).

    Cached per (dist, files, stub names, install folder): every adapter instance of one
    kind shares the same module objects, as an engine process would, and a cached load
    touches no file. It still works out the install folder (a few microseconds): an
    adapter keeps what it uses per operation (nano-vllm's ``Sequence`` class) instead of
    asking here each time.
    """
    key = (dist, tuple(sorted(files)), tuple(sorted(stubs)), tuple(entry),
           str(install_dir(dist)))
    with _lock:
        loaded = _cache.get(key)
        if loaded is None:  # only a first load reads the install on disk (its marker)
            loaded = Loaded(dist, require(dist), files, stubs)
            for name in entry:
                loaded.get(name)
            _cache[key] = loaded
        return loaded


# The engines' own log lines (a release's ``logger.warning("cannot store ...")``, hundreds
# a run) go to the ``kvcheck.thirdparty`` loggers; like any library's, they print only
# where the application configures logging (a NullHandler keeps Python's last-resort
# handler from writing every warning to stderr): ``logging.basicConfig()`` shows them.
logging.getLogger("kvcheck.thirdparty").addHandler(logging.NullHandler())


def exec_definitions(path: Path, namespace: dict, names: Sequence[str]) -> list[str]:
    """Execute, in ``namespace`` and in the file's order, the top-level definitions of
    ``names`` in the release's file ``path`` -- functions, classes and assignments (a
    table, a constant), each as its own source text has it -- and nothing else of the file
    (whose imports may need what cannot run here). The names found, in the file's order: a
    name the release does not define is not executed (the caller decides if that is bad).
    The definitions are parsed and compiled once per file and process (``_compiled``)."""
    code, found = _compiled(*_stamp(path), "", tuple(names), ())
    exec(code, namespace)  # noqa: S102 - the release's own source
    return list(found)


def exec_methods(path: Path, cls: str, names: Sequence[str], namespace: dict,
                 optional: Sequence[str] = ()) -> dict:
    """The methods ``names`` of the release's class ``cls`` in ``path`` (and those of
    ``optional`` the class defines), each compiled from its own source text in a copy of
    ``namespace`` (the class's other members and its bases are not run): name -> function,
    in the order asked. A method of ``names`` the class lacks raises ``ImportError``. The
    methods are parsed and compiled once per file and process (``_compiled``)."""
    code, found = _compiled(*_stamp(path), cls, tuple(names), tuple(optional))
    scope = dict(namespace)
    exec(code, scope)  # noqa: S102 - the release's own source
    made = scope[f"_{cls}Methods"]
    return {n: made.__dict__[n] for n in (*names, *optional) if n in found}


def _stamp(path: Path) -> tuple[str, int, int]:
    """``path`` with its modification time and size: ``_compiled``'s key (an installed
    release's files never change; a rewritten file is compiled again)."""
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


@functools.cache
def _compiled(path: str, _mtime: int, _size: int, cls: str, names: tuple[str, ...],
              optional: tuple[str, ...]) -> tuple[types.CodeType, tuple[str, ...]]:
    """The code and the names found of ``exec_definitions`` (``cls`` empty: the file's
    top-level definitions of ``names``) or of ``exec_methods`` (the methods of ``cls``, in
    a holder class ``_<cls>Methods``), once per file and process: a shrink builds a target
    hundreds of times, and parsing a release's file (vLLM's scheduler.py, 2,000+ lines) was
    most of a build."""
    import ast

    tree = ast.parse(Path(path).read_text(), path)
    if cls:
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        wanted = {*names, *optional}
        keep = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name in wanted]
        found = tuple(m.name for m in keep)
        missing = set(names) - set(found)
        if missing:
            raise ImportError(f"{path} has no {cls}.{', '.join(sorted(missing))}")
        holder = ast.ClassDef(name=f"_{cls}Methods", bases=[], keywords=[], body=keep,
                              decorator_list=[])
        module = ast.fix_missing_locations(ast.Module(body=[holder], type_ignores=[]))
        return compile(module, path, "exec"), found
    keep, found_list = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined = [node.name]
        elif isinstance(node, ast.Assign):
            defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined = [node.target.id]
        else:
            continue
        hit = [n for n in defined if n in names]
        if hit:
            keep.append(node)
            found_list += [n for n in hit if n not in found_list]
    return compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), tuple(found_list)


class StandIn:
    """A base for an adapter's stand-in classes (a worker's half, a scheduler shell, a
    manager the engine builds around the KV code): reading an attribute the class does not
    define raises ``StandInMissing`` (``kvcheck.impl.errors``) naming the class, the
    attribute and the adapter (``WHERE``), so a release that reads more than the stand-in
    gives stops the run with one line and exit 2 instead of seeming to crash itself."""

    WHERE = "an adapter's stand-in"  # the module defining the stand-in, for the message

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInMissing(f"the release reads {type(self).__name__}.{name}, which kvcheck's "
                             f"stand-in {type(self).__name__} ({self.WHERE}) does not give")


class Settings:
    """A stand-in namespace of settings (a release's config objects): reading one it does
    not hold raises ``StandInMissing`` naming its path (``vllm_config.watermark_config``)
    and the adapter; settings are fixed for a run, so a deep copy of an engine shares
    them."""

    def __init__(self, path: str, where: str, **values):
        self.__dict__["_path"], self.__dict__["_where"] = path, where
        self.__dict__.update(values)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInMissing(f"the release reads {self._path}.{name}, a setting kvcheck's "
                             f"stand-in ({self._where}) does not give")

    def __deepcopy__(self, memo):
        return self


def stub_logger(mod: types.ModuleType, _loaded: Loaded) -> None:
    """Stand-in for ``<pkg>.logger``: ``init_logger`` returns a stdlib logger under
    ``kvcheck.thirdparty`` (quiet unless the application configures logging).

    Logging only reports; no allocator decision reads it.
    """
    def init_logger(name: str) -> logging.Logger:
        return logging.getLogger(f"kvcheck.thirdparty.{name}")

    mod.init_logger = init_logger


_TAKES: dict[tuple[Callable, str], bool] = {}


def takes(function: Callable, name: str) -> bool:
    """Whether ``function`` (a release's function or unbound method: the class's, not a
    bound one, which is a new object per call) has a parameter ``name``; looked up once
    per function, as adapters ask it on every operation."""
    key = (function, name)
    found = _TAKES.get(key)
    if found is None:
        import inspect

        found = _TAKES[key] = name in inspect.signature(function).parameters
    return found
