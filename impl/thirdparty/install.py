"""Install third-party allocator sources: ``kvcheck install ENGINE[==VERSION]``.

Each engine generation kvcheck adapts is one row of ``ENGINES``: the PyPI
distribution, its top-level package, the pinned version (what a plain
``kvcheck verify vllm-v1`` runs) and the range of releases the adapter loads.
Adding an engine is adding a row (and its adapter).

What is installed: the release's ``*.py`` files of the top-level package (plus
its ``.dist-info`` metadata), into ``$KVCHECK_THIRDPARTY_DIR/<dist>-<version>/``
(default ``~/.cache/kvcheck/thirdparty/``), never into site-packages, so many
releases of one package coexist. A vLLM wheel is 45 MB to 330 MB, almost all
compiled CUDA kernels: it is downloaded with ``pip download --no-deps`` into a
temporary directory, its Python files extracted, the wheel deleted
(``layout="py-only"``). A small pure-Python wheel is installed whole with
``pip install --no-deps --target`` (``layout="target"``).

* Idempotent: a directory whose marker file names ``dist==version`` is left
  alone, with no network access at all.
* Offline: a wheel already on disk is used instead of the index when it lies in
  ``$KVCHECK_WHEEL_DIR`` (a folder of ``*.whl`` files); a download that fails is
  one line naming the release and pip's last words.
* Bad input (an unknown engine, a version outside every adapter's range) is an
  ``InstallError``: one line, exit 2 from the command line.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import _loader

WHEEL_DIR_ENV = "KVCHECK_WHEEL_DIR"
ThirdPartyMissing = _loader.ThirdPartyMissing


class InstallError(Exception):
    """Bad input or an install that could not be done (one line, exit 2)."""


def version_key(version: str) -> tuple:
    """Order of PEP 440 final and post releases (``0.5.0.post1`` after ``0.5.0``); a
    pre-release sorts before its release. Enough for the versions in ``ENGINES``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\+.*)?", version)
    if not m:
        raise InstallError(f"cannot read version {version!r} (expected e.g. 0.4.2 or 0.5.0.post1)")
    nums = tuple(int(x) for x in m.group(1).split("."))
    nums += (0,) * (4 - len(nums))
    pre = (0, m.group(2), int(m.group(3))) if m.group(2) else (1, "", 0)
    return nums, pre, int(m.group(4) or 0)


@dataclass(frozen=True)
class Engine:
    """One engine generation: the releases its adapter loads."""

    key: str  # the name kvcheck uses (install ENGINE, the registered targets' prefix)
    dist: str  # PyPI distribution
    top: str  # top-level import package
    pinned: str  # the version used when none is asked for
    low: str  # oldest release the adapter loads (inclusive)
    high: str  # newest release the adapter loads (inclusive)
    layout: str = "py-only"  # "py-only" (extract *.py from the wheel) or "target" (pip --target)
    runtime_deps: tuple[str, ...] = ()  # real imports of the loaded modules, installed normally
    note: str = ""  # what the range is (printed with an unsupported version)
    exclude: tuple[str, ...] = ()  # releases in [low, high] that it does not load, with reason
    family: str = ""  # the engine key whose older releases this row loads (vllm-v1-early:
    # vllm-v1): ``ENGINE@VERSION`` and ``install ENGINE==VERSION`` of the family reach it

    def supports(self, version: str) -> bool:
        key = version_key(version)
        return (version_key(self.low) <= key <= version_key(self.high)
                and version not in self.exclude)

    @property
    def range(self) -> str:
        return self.low if self.low == self.high else f"{self.low} .. {self.high}"

    def dist_for(self, version: str | None = None) -> _loader.Dist:
        return _loader.Dist(self.key, self.dist, version or self.pinned, self.top)


ENGINES: dict[str, Engine] = {e.key: e for e in (
    Engine("vllm-v1", "vllm", "vllm", pinned="0.33.0", low="0.10.2", high="0.34.0",
           runtime_deps=("numpy",),  # (0.34.0's token ids: vllm/v1/token_buffer.py)
           note="v1 KVCacheManager with BlockPool and KV-cache coordinator"),
    Engine("vllm-v0", "vllm", "vllm", pinned="0.8.5", low="0.4.2", high="0.9.2",
           note="v0 block manager v2 (vllm/core/block/): BlockTable, naive and "
                "prefix-caching allocators"),
    Engine("vllm-v0-legacy", "vllm", "vllm", pinned="0.4.0", low="0.3.3", high="0.6.2",
           note="v0 BlockSpaceManager v1 (vllm/core/block_manager[_v1].py), before block "
                "manager v2: target vllm-v0-legacy (impl/thirdparty/vllm_v0_legacy.py), a "
                "cyclic sliding window"),
    # after vllm-v0: a plain vllm==0.8.5 still names v0's generation; vllm-v1==0.8.5 this
    Engine("vllm-v1-early", "vllm", "vllm", pinned="0.10.1.1", low="0.6.4.post1",
           high="0.10.1.1", family="vllm-v1",
           note="v1 KVCacheManager from its first release: manager-side hashing, "
                "preallocation, BlockPool from 0.8, coordinator from 0.9.2 "
                "(impl/thirdparty/vllm_v1_early.py; vllm-v1@VERSION selects it)"),
    Engine("nano-vllm", "nano-vllm-fork", "nanovllm", pinned="20260210", low="20260210",
           high="20260210", layout="target", runtime_deps=("xxhash", "numpy"),
           note="nano-vllm-fork BlockManager"),
    Engine("sglang", "sglang", "sglang", pinned="0.5.23", low="0.4.8", high="0.5.23",
           note="SGLang token/paged allocators, sglang/srt/mem_cache/allocator.py (0.4.8 .. "
                "0.5.12) or the allocator/ package (0.5.13 on); they run on torch CPU "
                "tensors: torch==2.13.0 from the test extras; before 0.5.22 the paged one's "
                "Triton kernels run under Triton's interpreter"),
    Engine("sglang-radix", "sglang", "sglang", pinned="0.5.23", low="0.5.22", high="0.5.23",
           note="SGLang RadixCache with the scheduler's checkpoint / lock / unlock API "
                "(RadixCache.checkpoint, lock, unlock, path_device_indices: from 0.5.22)"),
    Engine("sglang-engine", "sglang", "sglang", pinned="0.5.23", low="0.5.19", high="0.5.23",
           note="SGLang's scheduler as an engine core (impl/thirdparty/sglang_engine.py): "
                "each release's own scheduler loop and the calls it makes, renamed across the "
                "range (0.5.19 .. 0.5.21: "
                "maybe_cache_unfinished_req, alloc_for_decode, release_kv_cache(is_insert); "
                "0.5.22 on: checkpoint_kv_cache, alloc_for_decode_default); before 0.5.19 the "
                "request's kv record is created at allocation (0.5.18) and the allocator "
                "modules import debug_utils (to 0.5.17)"),
    Engine("sglang-swa", "sglang", "sglang", pinned="0.5.23", low="0.5.13", high="0.5.23",
           note="SGLang SWATokenToKVPoolAllocator (mem_cache/allocator/swa.py: the package "
                "layout, 0.5.13 on) as a tiers target with the SWA pool behind "
                "full_to_swa_index_mapping (impl/thirdparty/sglang_swa.py)"),
    Engine("sglang-hicache", "sglang", "sglang", pinned="0.4.5", low="0.4.4.post2",
           high="0.5.20", family="sglang",
           note="SGLang HiRadixCache (mem_cache/hiradix_cache.py), its host pool and "
                "HiCacheController as a tiers target (impl/thirdparty/sglang_hicache.py): "
                "releases with hicache_ratio, at page size 1, the storage tier (0.4.9.post3 "
                "on) off (0.4.4 itself cannot build HiRadixCache: it calls "
                "RadixCache.__init__ without page_size; 0.4.4.post1 sizes the host pool 3x "
                "the device's; 0.5.21 on: UnifiedRadixCache, no hiradix_cache.py)"),
    Engine("sglang-unified", "sglang", "sglang", pinned="0.5.14", low="0.5.12",
           high="0.5.16", family="sglang",
           note="SGLang UnifiedRadixCache (mem_cache/unified_radix_cache.py) with its HiCache "
                "host tier (HybridCacheController, HostPoolGroup) as a tiers target "
                "(impl/thirdparty/sglang_unified.py): 0.5.12 is the first release with the "
                "host tier (0.5.11's tree has none); 0.5.17 on move the tree into the "
                "unified_cache/ package (cache actions), not loaded here"),
    Engine("aphrodite", "aphrodite-engine", "aphrodite", pinned="0.24.1", low="0.20.0",
           high="0.24.1", note="aphrodite-engine's v1 KVCacheManager (a vLLM v1 fork: 0.20.0 "
                               "and 0.21.0 read as vLLM 0.20's, 0.22.0 .. 0.24.1 as 0.26 .. "
                               "0.29's), aphrodite@VERSION"),
    Engine("aphrodite-v0", "aphrodite-engine", "aphrodite", pinned="0.6.5", low="0.6.0",
           high="0.6.5", exclude=("0.6.4",),
           note="aphrodite-engine's v0 block manager v2 (aphrodite/processing/block/: vLLM "
                "v0's BlockTable and allocators under aphrodite's names), "
                "kvcheck.impl.thirdparty.aphrodite_v0:make@VERSION (0.6.4 was never on PyPI: "
                "0.6.4.post1)"),
    Engine("aphrodite-legacy", "aphrodite-engine", "aphrodite", pinned="0.6.0", low="0.5.0",
           high="0.6.5", exclude=("0.6.4",),
           note="aphrodite-engine's BlockSpaceManager v1 (0.5.x aphrodite/processing/"
                "block_manager.py, 0.6.x block_manager_v1.py), loaded by "
                "impl/thirdparty/vllm_v0_legacy.py: raw replays and the Target "
                "kvcheck.impl.thirdparty.aphrodite_legacy:make@VERSION (a cyclic window) "
                "(0.6.x: aphrodite-v0 installs the same files)"),
    Engine("nano-vllm-npu", "nano-vllm-npu", "nanovllmnpu", pinned="0.0.2", low="0.0.1.post1",
           high="0.0.2", layout="target", runtime_deps=("xxhash", "numpy"),
           note="nano-vllm-npu BlockManager (upstream nano-vllm's: freed blocks keep their "
                "keys), kvcheck.impl.thirdparty.nano_vllm_upstream:make@VERSION"),
)}


DEFAULT = ("vllm-v1", "vllm-v0", "nano-vllm")  # what a plain `kvcheck install` installs


def engines_for(name: str) -> list[Engine]:
    """The engines ``name`` denotes: an engine key (with the rows of its family: vllm-v1
    and vllm-v1-early), or a distribution (every engine of it)."""
    if name in ENGINES:
        return [ENGINES[name], *family(name)]
    return [e for e in ENGINES.values() if e.dist == name]


def named(name: str) -> list[Engine]:
    """``engines_for(name)``, or ``InstallError`` naming the known engines when it is none."""
    candidates = engines_for(name)
    if not candidates:
        known = ", ".join(list(ENGINES) + sorted({e.dist for e in ENGINES.values()} - set(ENGINES)))
        raise InstallError(f"unknown engine {name!r} (known: {known})")
    return candidates


def family(key: str) -> list[Engine]:
    """The rows that load older releases of engine ``key`` (``Engine.family``)."""
    return [e for e in ENGINES.values() if e.family == key]


def parse(requirement: str) -> tuple[Engine, str]:
    """``ENGINE[==VERSION]`` or ``DIST==VERSION`` -> (engine, version); ``InstallError``."""
    name, sep, version = requirement.strip().partition("==")
    name = name.strip()
    version = version.strip() if sep else ""
    if sep and not version:
        raise InstallError(f"{requirement!r}: no version after '=='")
    candidates = named(name)
    if not version:
        if name in ENGINES:
            return ENGINES[name], ENGINES[name].pinned
        if len(candidates) > 1:
            raise InstallError(
                f"{name!r} names several engine generations "
                f"({', '.join(e.key for e in candidates)}): give one, or {name}==VERSION")
        return candidates[0], candidates[0].pinned
    version_key(version)
    for engine in candidates:
        if engine.supports(version):
            return engine, version
    ranges = "; ".join(f"{e.key}: {e.range}" for e in candidates)
    raise InstallError(f"{name} {version} is not supported by any kvcheck adapter ({ranges})")


PINNED = "pinned"  # TARGET@pinned: the pinned sources even when the environment has the engine
INSTALLED = "installed"  # TARGET@installed: the environment's engine, or an error


@functools.cache
def environment_version(engine: Engine) -> str | None:
    """The version of ``engine.dist`` installed in this environment (any), or ``None``."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.util.find_spec(engine.top) is None:
            return None
        return importlib.metadata.version(engine.dist)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


@functools.cache  # once per process: every target built (shrinking builds
def environment(engine: Engine) -> _loader.Dist | None:  # hundreds) would look it up again
    """The engine as installed in this Python environment (``pip install vllm``), if its
    files are there and its version is one the adapter loads; nothing is imported."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec(engine.top)
        version = importlib.metadata.version(engine.dist)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    try:
        if not engine.supports(version):
            return None
    except InstallError:
        return None
    return _loader.Dist(engine.key, engine.dist, version, engine.top, root=str(pkg.parent))


def select(key: str, version: str | None = None, with_family: bool = False) -> _loader.Dist:
    """Which sources the adapter of engine ``key`` loads (the ``@VERSION`` of a target):

    * ``None`` -- the engine installed in this environment if its version is in the
      adapter's range, else the pinned version from the cache;
    * ``"pinned"`` -- the pinned version from the cache;
    * ``"installed"`` -- the environment's engine (``ThirdPartyMissing`` if absent or
      outside the range);
    * a version -- that release from the cache (``kvcheck install KEY==VERSION``).

    ``with_family``: the rows of ``key``'s family count too (``vllm-v1-early`` for
    ``vllm-v1``: what ``vllm_v1.make`` loads, and a target whose factory says
    ``loads_family``); the returned ``Dist.key`` names the row. Whether the files are
    there is checked when they are loaded (``_loader.require``).
    """
    engine = ENGINES[key]
    rows = (engine, *family(key)) if with_family else (engine,)
    if version in (None, INSTALLED):
        for row in rows:
            env = environment(row)
            if env is not None:
                return env
        if version == INSTALLED:
            ranges = " or ".join(r.range for r in rows)
            raise _loader.ThirdPartyMissing(
                f"{engine.dist} {ranges} is not installed in this Python environment "
                f"({sys.executable})")
        return engine.dist_for(engine.pinned)
    if version == PINNED:
        return engine.dist_for(engine.pinned)
    for row in rows:
        if row.supports(version):
            return row.dist_for(version)
    ranges = " and ".join(r.range for r in rows)
    raise InstallError(f"{key} loads {engine.dist} {ranges}, not {version}")


def find(engine: Engine, version: str | None = None) -> Path | None:
    """The install directory of ``engine`` at ``version`` if installed, else ``None``."""
    dist = engine.dist_for(version)
    return _loader.install_dir(dist) if _loader.is_installed(dist) else None


def install(engine: Engine, version: str | None = None,
            say: Callable[[str], None] = print) -> Path:
    """Install ``engine`` at ``version`` (default: its pin) if it is not yet; its directory."""
    version = version or engine.pinned
    if not engine.supports(version):
        raise InstallError(f"{engine.key} loads {engine.dist} {engine.range}, not {version}")
    dist = engine.dist_for(version)
    dest = _loader.install_dir(dist)
    if _loader.is_installed(dist):
        say(f"{engine.dist} {version}: already installed in {dest}")
        _runtime_deps(engine, say)
        return dest
    partial = dest.with_name(dest.name + ".partial")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="kvcheck-wheel-") as tmp:
            if engine.layout == "target":
                _pip(["install", "--no-deps", "--target", str(partial),
                      f"{engine.dist}=={version}"], engine, version)
            else:
                wheel = _local_wheel(engine.dist, version) or _download(engine, version,
                                                                        Path(tmp))
                n = extract_py(wheel, partial, engine.top)
                say(f"{engine.dist} {version}: extracted {n} files from {wheel.name}")
        (partial / _loader.MARKER).write_text(f"{engine.dist}=={version}\n")
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    except OSError as exc:  # the install folder cannot be written (a file, read-only, full)
        shutil.rmtree(partial, ignore_errors=True)
        blocker = next((p for p in (dest.parent, *dest.parent.parents)
                        if p.exists() and not p.is_dir()), None)
        why = (f"{blocker} is not a directory" if blocker is not None
               else f"{exc.filename or dest.parent}: {exc.strerror or exc}")
        raise InstallError(f"cannot install {engine.dist} {version} into {dest.parent} "
                           f"(set ${_loader.ENV_DIR} to a writable folder): {why}") from None
    say(f"{engine.dist} {version}: installed in {dest}")
    _runtime_deps(engine, say)
    return dest


def ensure(engine: Engine, version: str | None = None) -> Path:
    """The install directory, installing quietly if needed (for the benchmark and tests)."""
    return find(engine, version) or install(engine, version, say=lambda _m: None)


def extract_py(wheel: Path, dest: Path, top: str) -> int:
    """Extract ``top``'s ``*.py`` files and the dist-info metadata of ``wheel`` into ``dest``."""
    n = 0
    if not zipfile.is_zipfile(wheel):
        raise InstallError(f"{wheel} is not a wheel (not a zip file)")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if (name.startswith(top + "/") and name.endswith(".py")) or (
                    ".dist-info/" in name and name.endswith(("METADATA", "LICENSE", "RECORD"))):
                z.extract(name, dest)
                n += 1
    if not (dest / top).is_dir():
        raise InstallError(f"{wheel.name} holds no package {top!r}")
    return n


def _local_wheel(dist: str, version: str) -> Path | None:
    folder = os.environ.get(WHEEL_DIR_ENV)
    if not folder:
        return None
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    for whl in sorted(Path(folder).expanduser().glob("*.whl")):
        parts = whl.name.split("-")
        if len(parts) >= 2 and re.sub(r"[-_.]+", "_", parts[0]).lower() == norm \
                and parts[1] == version:
            return whl
    return None


def _download(engine: Engine, version: str, tmp: Path) -> Path:
    _pip(["download", "--no-deps", "--only-binary=:all:", "-d", str(tmp),
          f"{engine.dist}=={version}"], engine, version)
    wheels = sorted(tmp.glob("*.whl"))
    if not wheels:
        raise InstallError(f"pip downloaded no wheel for {engine.dist}=={version}")
    return wheels[0]


def _pip(args: list[str], engine: Engine, version: str) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines()
                 if ln.strip() and not ln.lstrip().startswith("WARNING")]
        last = lines[-1] if lines else f"pip exited {p.returncode}"
        raise InstallError(f"cannot fetch {engine.dist}=={version} (offline? put its wheel in "
                           f"${WHEEL_DIR_ENV}): {last}")


def _runtime_deps(engine: Engine, say: Callable[[str], None]) -> None:
    import importlib.util

    missing = [m for m in engine.runtime_deps if importlib.util.find_spec(m) is None]
    if missing:
        say(f"installing runtime dependencies: {' '.join(missing)}")
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise InstallError(f"cannot install {' '.join(missing)} (needed by {engine.key})")


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcheck.impl.thirdparty.install ENGINE[==VERSION] ...`` (the shell script's)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        for req in argv or DEFAULT:
            engine, version = parse(req)
            install(engine, version)
    except InstallError as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
