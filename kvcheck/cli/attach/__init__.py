"""``kvcheck attach``: an engine's own unit tests, with kvcheck's invariants checked inside.

vLLM's source distribution on PyPI ships its unit tests (v1: ``tests/v1/core/``:
``test_prefix_caching.py``, ``test_kv_cache_utils.py``, ``test_scheduler.py``,
``test_single_type_kv_cache_manager.py`` ...; v0: ``tests/core/``: ``test_scheduler.py``,
``test_chunked_prefill_scheduler.py``, ``block/test_block_manager.py`` ...).
``kvcheck attach vllm-v1==0.33.0 FILES`` (or ``vllm-v0==0.8.5 FILES``)

1. installs the release's Python files as ``kvcheck install`` does (the wheel's ``*.py``,
   into ``~/.cache/kvcheck/thirdparty/vllm-X``) and, once, the few small dependencies its
   KV-cache modules and tests import (``DEPS``, pinned, into ``~/.cache/kvcheck/attach/deps``
   with ``pip install --target``: never into the environment; for vllm-v0 also
   ``ENGINE_DEPS``: transformers, which v0's ``vllm/config.py`` imports at module level);
2. downloads the release's sdist from the package index at run time (once: its
   ``tests/`` folder is kept in ``~/.cache/kvcheck/attach/vllm-X/``, never in a
   repository) -- the sdist's top ``tests/conftest.py`` (model fixtures, GPU cleanup) is
   left out;
3. runs the chosen test files with pytest in a child process, with the plugin
   ``kvcheck.cli.attach.plugin``: ``import vllm.*`` answered from the release's own files
   (``finder.py``), and every public method of the KV-cache manager observed (v1's
   ``KVCacheManager``, v0's block space manager: ``observe.READERS``);
4. prints, per test file: passed / failed by the engine's own assertions / failed by
   kvcheck (with the clause) / not run (with the reason), and the number of states kvcheck
   checked. Exit 0: nothing failed (and states were checked); 1: a test failed (by kvcheck or
   by the engine's own assertions); 2: bad input, or a download or install that could not be
   done (one line); 4: nothing failed but kvcheck checked no state (the command's).

Offline: an sdist already on disk is used when it lies in ``$KVCHECK_SDIST_DIR``; the
index is ``$KVCHECK_INDEX_URL`` (default PyPI's simple index).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kvcheck.impl.thirdparty import install

INDEX_ENV = "KVCHECK_INDEX_URL"
SDIST_DIR_ENV = "KVCHECK_SDIST_DIR"
CACHE_ENV = "KVCHECK_ATTACH_DIR"
DEFAULT_INDEX = "https://pypi.org/simple"
# what vLLM's KV-cache modules and their tests import at module level, that this machine
# can install small (the rest of vLLM's dependencies -- transformers, fastapi, openai... --
# leave the modules importing them unavailable: finder.py)
DEPS = ("msgspec==0.23.0", "cbor2==6.3.0", "psutil==7.2.2", "pyzmq==27.3.0", "blake3==1.0.11",
        "cachetools==8.0.3", "uvloop==0.23.0", "prometheus_client==0.26.0")
# vLLM v0's vllm/config.py and vllm/inputs/ import transformers at module level (v1's import
# it lazily, or from modules its KV-cache tests do not reach): without it every scheduler test
# of v0 is not run. v0's scheduler tests build CacheConfig / SchedulerConfig directly, so
# transformers is imported but reads no model (no hub download). Pinned to one release that
# every v0 release in kvcheck's range accepts (0.4.2 asks >= 4.40.0, 0.8.5 and 0.9.2 >= 4.51.1),
# with what it imports that this environment lacks; installed beside DEPS, in a folder of its own
ENGINE_DEPS = {"vllm-v0": ("transformers==4.51.3", "tokenizers==0.21.4", "huggingface_hub==0.36.2",
                           "safetensors==0.8.0", "tqdm==4.70.1")}
# engines attach knows how to observe (their KV manager's classes: observe.READERS), and
# where a bare test file name is looked for under the sdist's tests/ (after tests/ itself)
ENGINES = {"vllm-v1": ("v1/core",), "vllm-v0": ("core", "core/block")}


class AttachError(Exception):
    """Bad input, or a download or install that could not be done (one line, exit 2)."""


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvcheck" / "attach"


def parse(release: str) -> tuple[install.Engine, str]:
    try:
        engine, version = install.parse(release)
    except install.InstallError as exc:
        raise AttachError(str(exc)) from None
    if engine.key not in ENGINES:
        raise AttachError(f"attach observes {', '.join(ENGINES)} only (vLLM v1's "
                          f"KVCacheManager, v0's block space manager), not {engine.key}")
    return engine, version


def ensure_deps(say=print, engine: str = "vllm-v1") -> Path:
    """The folder of ``DEPS`` and the engine's ``ENGINE_DEPS`` (installed once, with ``pip
    install --target``)."""
    extra = ENGINE_DEPS.get(engine, ())
    py = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    folder = cache_dir() / (f"deps-{engine}-{py}" if extra else f"deps-{py}")
    marker = folder / ".kvcheck-deps"
    want = " ".join((*DEPS, *extra))
    if marker.is_file() and marker.read_text().strip() == want:
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    say(f"kvcheck attach: installing {want} into {folder}")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(partial), *DEPS, *extra], capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines()
                 if ln.strip() and not ln.lstrip().startswith("WARNING")]
        shutil.rmtree(partial, ignore_errors=True)
        raise AttachError(f"cannot install {want} (offline?): "
                          f"{lines[-1] if lines else f'pip exited {p.returncode}'}")
    (partial / ".kvcheck-deps").write_text(want + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def _index_url() -> str:
    return os.environ.get(INDEX_ENV, DEFAULT_INDEX).rstrip("/")


def _sdist_url(dist: str, version: str) -> tuple[str, str | None]:
    """(url, sha256) of ``dist``'s sdist at ``version`` on the index (PEP 691 JSON)."""
    name = f"{dist}-{version}.tar.gz"
    url = f"{_index_url()}/{dist}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AttachError(f"cannot download the sdist of {dist} {version} from {url} (offline? "
                          f"put {name} in ${SDIST_DIR_ENV}): {exc}") from None
    for f in data.get("files", ()):
        if f.get("filename") == name:
            return f["url"], (f.get("hashes") or {}).get("sha256")
    raise AttachError(f"{url} lists no sdist {name} (the release ships none)")


def fetch_sdist(dist: str, version: str, tmp: Path) -> Path:
    """The sdist tarball: from ``$KVCHECK_SDIST_DIR`` if there, else downloaded into ``tmp``."""
    name = f"{dist}-{version}.tar.gz"
    local = os.environ.get(SDIST_DIR_ENV)
    if local and (Path(local).expanduser() / name).is_file():
        return Path(local).expanduser() / name
    url, sha = _sdist_url(dist, version)
    out = tmp / name
    try:
        with urllib.request.urlopen(url, timeout=300) as resp, out.open("wb") as fh:
            shutil.copyfileobj(resp, fh)
    except (urllib.error.URLError, OSError) as exc:
        raise AttachError(f"cannot download {url} (offline? put {name} in "
                          f"${SDIST_DIR_ENV}): {exc}") from None
    if sha is not None:
        digest = hashlib.sha256(out.read_bytes()).hexdigest()
        if digest != sha:
            raise AttachError(f"{url}: sha256 {digest} is not the index's {sha}")
    return out


def ensure_tests(dist: str, version: str, say=print) -> Path:
    """The folder holding the release's sdist ``tests/`` (extracted once into the cache)."""
    folder = cache_dir() / f"{dist}-{version}"
    marker = folder / ".kvcheck-sdist"
    if marker.is_file() and marker.read_text().strip() == f"{dist}=={version}":
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="kvcheck-sdist-") as tmp:
        tarball = fetch_sdist(dist, version, Path(tmp))
        say(f"kvcheck attach: extracting tests/ of {tarball.name} into {folder}")
        prefix = f"{dist}-{version}/tests/"
        try:
            with tarfile.open(tarball) as tar:
                members = [m for m in tar.getmembers()
                           if m.name.startswith(prefix) and (m.isfile() or m.isdir())
                           and m.name != prefix + "conftest.py" and ".." not in m.name]
                if not any(m.isfile() for m in members):
                    raise AttachError(f"{tarball.name} ships no tests/ folder")
                for m in members:
                    m.name = m.name[len(f"{dist}-{version}/"):]
                tar.extractall(partial, members=members, filter="data")
        except (tarfile.TarError, OSError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise AttachError(f"cannot read {tarball}: {exc}") from None
    (partial / ".kvcheck-sdist").write_text(f"{dist}=={version}\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


@dataclass
class FileResult:
    passed: int = 0
    engine: int = 0
    kvcheck: int = 0
    not_run: int = 0
    checks: int = 0
    judged: int = 0  # tests during which kvcheck checked at least one state
    unobserved: int = 0  # tests whose managers kvcheck did not judge (out of scope)
    kvcheck_failures: list[tuple[str, str]] = field(default_factory=list)
    engine_failures: list[tuple[str, str]] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)
    unjudged: Counter = field(default_factory=Counter)  # why a test's manager was not judged
    uncollected: str = ""  # why pytest could not collect the file (none of its tests ran)


@dataclass
class Outcome:
    files: dict[str, FileResult]
    checks: int
    returncode: int
    unavailable: dict[str, str]


def run(release: str, files: list[str], extra: list[str] | None = None, say=print) -> Outcome:
    """Attach to ``release``'s tests ``files`` (paths under the sdist's ``tests/``, or under
    ``tests/v1/core/`` for vllm-v1, ``tests/core/`` or ``tests/core/block/`` for vllm-v0); the
    outcome per file."""
    engine, version = parse(release)
    if not files:
        raise AttachError("name at least one test file, e.g. test_prefix_caching.py")
    try:
        root = install.ensure(engine, version)
    except install.InstallError as exc:
        raise AttachError(str(exc)) from None
    deps = ensure_deps(say, engine.key)
    tests = ensure_tests(engine.dist, version, say)
    paths = []
    for f in files:
        name, sep, rest = f.partition("::")
        cands = [tests / name, tests / "tests" / name,
                 *(tests / "tests" / sub / name for sub in ENGINES[engine.key])]
        hit = next((c for c in cands if c.is_file() and c.resolve().is_relative_to(
            (tests / "tests").resolve())), None)
        if hit is None:
            raise AttachError(f"{engine.dist} {version}'s sdist has no test file {name} "
                              f"(under {tests / 'tests'})")
        paths.append(str(hit.relative_to(tests)) + sep + rest)
    with tempfile.TemporaryDirectory(prefix="kvcheck-attach-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "kvcheck.cli.attach.plugin",
               "-p", "no:cacheprovider", f"--rootdir={tests}", "-c", os.devnull,
               f"--kvcheck-attach={root}", f"--kvcheck-attach-deps={deps}",
               f"--kvcheck-attach-report={report}", f"--kvcheck-attach-engine={engine.key}",
               "-q", "--no-header", "-W", "ignore",
               "--tb=no", "--continue-on-collection-errors", *paths, *(extra or [])]
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        p = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True)
        if not report.is_file():
            tail = [ln for ln in (p.stdout + p.stderr).strip().splitlines() if ln.strip()]
            raise AttachError(f"pytest ended without a report (exit {p.returncode}): "
                              f"{tail[-1] if tail else 'no output'}")
        data = json.loads(report.read_text())
    return summarise(data, p.returncode)


def summarise(data: dict, returncode: int) -> Outcome:
    files: dict[str, FileResult] = defaultdict(FileResult)
    for nodeid, t in data["tests"].items():
        f = files[nodeid.split("::")[0]]
        test = nodeid.split("::", 1)[-1]
        f.checks += t["checks"]
        f.judged += bool(t["checks"])
        f.unobserved += bool(t.get("unobserved"))
        if t.get("unobserved"):
            f.unjudged[t["unobserved"]] += 1
        if t["outcome"] == "passed":
            f.passed += 1
        elif t["outcome"] == "kvcheck":
            f.kvcheck += 1
            f.kvcheck_failures.append((test, t["reason"]))
        elif t["outcome"] == "engine":
            f.engine += 1
            f.engine_failures.append((test, t["reason"]))
        else:
            f.not_run += 1
            f.reasons[t["reason"]] += 1
    for nodeid, why in data["collection_errors"].items():
        if nodeid and "::" not in nodeid:
            files[nodeid].uncollected = why
    return Outcome(dict(files), data["checks"], returncode, data.get("unavailable", {}))


def render(outcome: Outcome, release: str, verbose: bool = False) -> str:
    lines = []
    for name, f in sorted(outcome.files.items()):
        lines.append(f"{name}: {f.passed} passed, {f.engine} failed by the engine's own "
                     f"assertions, {f.kvcheck} failed by kvcheck, {f.not_run} not run; kvcheck "
                     f"checked {f.checks} states in {f.judged} tests ({f.unobserved} tests' "
                     f"managers not judged: out of scope)")
        for test, why in f.kvcheck_failures:
            lines.append(f"  FAILED by kvcheck: {test}: {why}")
        for test, why in f.engine_failures[: None if verbose else 5]:
            lines.append(f"  failed by the engine: {test}: {why}")
        if not verbose and len(f.engine_failures) > 5:
            lines.append(f"  ... and {len(f.engine_failures) - 5} more engine failures "
                         "(--verbose lists them)")
        if f.uncollected:
            lines.append(f"  no test of the file ran: it could not be collected: {f.uncollected}")
        for why, n in f.reasons.most_common():
            lines.append(f"  not run ({n}): {why}")
        if verbose:
            for why, n in f.unjudged.most_common():
                lines.append(f"  manager not judged ({n} tests): {why}")
    total = Counter()
    for f in outcome.files.values():
        total.update(passed=f.passed, engine=f.engine, kvcheck=f.kvcheck, not_run=f.not_run)
    lines.append(f"kvcheck attach {release}: {total['passed']} passed, {total['engine']} failed "
                 f"by the engine's own assertions, {total['kvcheck']} failed by kvcheck, "
                 f"{total['not_run']} not run; {outcome.checks} states checked")
    return "\n".join(lines)
