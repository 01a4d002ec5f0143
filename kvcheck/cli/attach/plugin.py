"""The pytest side of ``kvcheck attach``: an engine's own tests, with kvcheck's checks inside.

    python -m pytest -p kvcheck.cli.attach.plugin --kvcheck-attach=RELEASE_DIR \\
        [--kvcheck-attach-engine=vllm-v1|vllm-v0] [--kvcheck-attach-deps=DIR] \\
        [--kvcheck-attach-report=FILE] TEST_FILES...

(``kvcheck attach`` runs exactly this, in a child process, from the folder where it put the
release's sdist tests; the plugin composes with any other pytest option.)

* ``--kvcheck-attach=DIR``: the folder holding the release's ``vllm`` package as
  ``kvcheck install`` left it; ``import vllm.*`` is answered from there (``finder.py``).
  ``--kvcheck-attach-deps=DIR``: a folder of the small dependencies kvcheck installed for it,
  appended to ``sys.path`` (the environment's own packages come first).
  ``--kvcheck-attach-engine``: the engine generation, whose ``observe.Reader`` names the
  manager classes to wrap and reads their state (default vllm-v1).
* Every public method of the release's KV-cache manager class -- vLLM v1's
  ``KVCacheManager`` (``allocate_slots``, ``free``, ``get_computed_blocks``, ``cache_blocks``,
  ``reset_prefix_cache`` ...), vLLM v0's block space manager (``SelfAttnBlockSpaceManager``
  or ``BlockSpaceManagerV2``: ``allocate``, ``append_slots``, ``fork``, ``free``,
  ``swap_out``, ``swap_in``, ...): whatever the release's class defines without a leading
  underscore -- is wrapped on the class, so every
  manager a test builds -- directly or through a ``Scheduler`` -- is observed: when the
  outermost call returns normally, kvcheck reads the manager's state and evaluates its
  invariants (``observe.py``). A broken one fails the test with the clause, the element, what
  was read and the rule (``KvcheckViolation``, an ``AssertionError``); it is also recorded, so
  a test whose own code swallows the exception still fails. A call that raises is not
  checked (the test may expect the raise; vLLM gives no guarantee about the state then).
  A manager kvcheck cannot read (a release without an attribute the reader expects)
  runs unobserved with that reason: kvcheck's shortcoming never fails an engine's test.
* Each test's outcome is one of: ``passed``; ``engine`` (failed by the engine's own
  assertion or error); ``kvcheck`` (failed by kvcheck, with the clause); ``not run`` (with
  the reason: it reached a module that cannot be imported here, ``finder.NotRunHere``; it
  was skipped, e.g. it needs CUDA; it needs a fixture of the sdist's top ``tests/conftest.py``,
  which is not loaded). ``--kvcheck-attach-report=FILE`` writes them as JSON, with the
  number of states checked per test.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from pathlib import Path

import pytest

# errors by which a release says it cannot run on this machine (not an assertion of its tests)
CANNOT_RUN = (
    ("Failed to infer device type",
     "needs a device platform (vLLM: 'Failed to infer device type': no CUDA, and the wheel's "
     "Python files are no CPU build)"),
    ("Device string must not be empty",  # vLLM 0.9's DeviceConfig on no platform: torch.device('')
     "needs a device platform (vLLM's DeviceConfig: no platform detected here, so its device "
     "type is empty and torch.device('') raises 'Device string must not be empty')"),
)


class KvcheckViolation(AssertionError):
    """kvcheck found a broken invariant in the state of an engine's KV-cache manager."""


_state = threading.local()
RESULTS: dict[str, dict] = {}
COLLECT: dict[str, str] = {}  # a file that could not be collected -> why
_current: dict = {"checks": 0, "violations": [], "unobserved": None}
TOTAL = {"checks": 0}


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvcheck-attach", "kvcheck attach: kvcheck's checks inside an "
                                              "engine's own tests")
    group.addoption("--kvcheck-attach", default=None, metavar="DIR",
                    help="the installed release's folder (holding its vllm package)")
    group.addoption("--kvcheck-attach-deps", default=None, metavar="DIR",
                    help="a folder of dependencies to append to sys.path")
    group.addoption("--kvcheck-attach-report", default=None, metavar="FILE",
                    help="write each test's outcome as JSON")
    group.addoption("--kvcheck-attach-engine", default="vllm-v1", metavar="ENGINE",
                    help="the engine generation whose KV-cache manager to observe: vllm-v1 "
                         "(KVCacheManager) or vllm-v0 (the v0 block space manager) "
                         "(default: vllm-v1)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    root = config.getoption("kvcheck_attach")
    if not root:
        return
    deps = config.getoption("kvcheck_attach_deps")
    if deps:
        sys.path.append(str(deps))
    from kvcheck.cli.attach import finder, observe

    engine = config.getoption("kvcheck_attach_engine")
    if engine not in observe.READERS:
        raise pytest.UsageError(f"--kvcheck-attach-engine: {engine!r} is not one of "
                                f"{', '.join(observe.READERS)}")
    READER["reader"] = reader = observe.READERS[engine]
    READER["roots"] = (str(Path(root)) + "/", str(Path(root).resolve()) + "/")
    finder.install(Path(root))
    for marker in ("cpu_test", "slow_test", "skip_global_cleanup", "core_model", "hybrid_model",
                   "cpu_model", "split", "distributed", "optional"):  # the sdist's markers
        config.addinivalue_line("markers", f"{marker}: a marker of the engine's test suite")
    for cls in reader.manager_classes():  # the release's own files, through the finder
        wrap(cls)
    for cls, read_only in reader.pool_classes():
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and callable(value) and name not in read_only and \
                    not isinstance(value, (type, staticmethod, classmethod)):
                setattr(cls, name, _outside(value))


READER: dict = {}  # "reader": the engine's observe.Reader (set by pytest_configure)


def _outside(method):
    """A pool method (v1's ``BlockPool``, v0's ``CpuGpuBlockAllocator``) called other than
    from inside a manager call (by the test itself, staging a scenario: taking blocks,
    caching them) changes the pool behind the manager's back: the pool is marked, and a
    manager over it is no longer judged."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if getattr(_state, "depth", 0) == 0:
            self.__kvcheck_edited__ = True
        return method(self, *args, **kwargs)

    return call


def wrap(cls) -> list[str]:
    """Wrap every public method ``cls`` defines; the names wrapped."""
    names = []
    for name, value in list(vars(cls).items()):
        if name.startswith("_") or not callable(value) or isinstance(value, (type, staticmethod,
                                                                              classmethod)):
            continue
        setattr(cls, name, _observed(f"{cls.__name__}.{name}", value))
        names.append(name)
    return names


def _hands_off(name: str, result) -> bool:
    """Whether the call handed references over (an empty hand-off changes nothing)."""
    try:
        return bool(result[1]) if name == "take_kv_cache_block_copies" else bool(result)
    except (TypeError, IndexError, KeyError):
        return True  # a release returning something else: not judged from then on


def _observed(qualname: str, method):
    name = qualname.rpartition(".")[2]

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            _before(self)
            why = READER["reader"].outside_contract(self, name, args, kwargs,
                                                    not _from_release(sys._getframe(1)))
            if why is not None and getattr(self, "__kvcheck_scope__", None) is None:
                self.__kvcheck_scope__ = why
                _current["unobserved"] = why
        _state.depth = depth + 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _state.depth = depth
        handoff = READER["reader"].handoff
        if depth == 0 and name in handoff and _hands_off(name, result):
            self.__kvcheck_handoff__ = handoff[name]
        if depth == 0 and not getattr(self, "__kvcheck_broken__", False):
            _check(self, f"{qualname}()")
        return result

    call.__kvcheck_wrapped__ = method
    return call


def _from_release(frame) -> bool:
    """Whether the call comes from the release's own code (its scheduler), not a test's."""
    return frame.f_code.co_filename.startswith(READER.get("roots", ()) or ("\0",))


def _before(manager) -> None:
    """A state changed since the manager's last call returned was changed by someone else
    (a test that edits the pool or the hash map directly, as vLLM's own tests sometimes do
    to stage a scenario): kvcheck judges the manager's methods, not those edits, so it stops
    judging this manager (counted as unobserved, with the reason)."""
    last = getattr(manager, "__kvcheck_last__", None)
    if last is None or getattr(manager, "__kvcheck_scope__", None) is not None:
        return
    try:
        edited = READER["reader"].read(manager) != last
    except Exception as exc:  # noqa: BLE001 - kvcheck's reading, never the test's failure
        _unreadable(manager, exc)
        return
    if edited:
        manager.__kvcheck_scope__ = "its state was edited between its calls (not by its methods)"
        _current["unobserved"] = manager.__kvcheck_scope__


def _unreadable(manager, exc: BaseException) -> None:
    """kvcheck could not read a manager of this release (an attribute it expects is not
    there): kvcheck's shortcoming, so the manager runs unobserved with the reason, and the
    test's verdict is its own."""
    from kvcheck.errors import describe_exception

    manager.__kvcheck_scope__ = f"kvcheck cannot read this manager ({describe_exception(exc)})"
    _current["unobserved"] = manager.__kvcheck_scope__


def _check(manager, call: str) -> None:
    from kvcheck.cli.attach import observe

    reader = READER["reader"]
    scope = getattr(manager, "__kvcheck_scope__", False)
    if scope is False:
        try:
            scope = manager.__kvcheck_scope__ = reader.out_of_scope(manager)
        except Exception as exc:  # noqa: BLE001 - kvcheck's reading, never the test's failure
            _unreadable(manager, exc)
            return
    if scope is None and getattr(manager, "__kvcheck_handoff__", None):
        scope = manager.__kvcheck_scope__ = manager.__kvcheck_handoff__
    if scope is None and any(getattr(pool, "__kvcheck_edited__", False)
                             for pool in reader.pools(manager)):
        scope = manager.__kvcheck_scope__ = ("the test changed its block pool directly (not "
                                             "through the manager)")
    if scope is not None:
        _current["unobserved"] = scope
        return
    try:
        state = reader.read(manager)
        broken = observe.check(state)
    except Exception as exc:  # noqa: BLE001 - kvcheck's reading, never the test's failure
        _unreadable(manager, exc)
        return
    manager.__kvcheck_last__ = state
    _current["checks"] += 1
    TOTAL["checks"] += 1
    if broken is not None:
        manager.__kvcheck_broken__ = True  # one report per manager
        text = broken.explain(call)
        _current["violations"].append({"clause": broken.clause, "message": text})
        raise KvcheckViolation(text)


def _not_run_reason(exc: BaseException | None) -> str | None:
    from kvcheck.cli.attach import finder

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, finder.NotRunHere):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["checks"] = 0
    _current["violations"] = []
    _current["unobserved"] = None
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not item.config.getoption("kvcheck_attach"):
        return
    rep = outcome.get_result()
    entry = RESULTS.setdefault(item.nodeid, {"outcome": "passed", "reason": "", "checks": 0})
    entry["checks"] = _current["checks"]
    if _current["unobserved"]:
        entry["unobserved"] = _current["unobserved"]
    if entry["outcome"] != "passed":
        return  # the first phase that did not pass says what happened
    violations = _current["violations"]
    if violations:
        entry["outcome"], entry["reason"] = "kvcheck", violations[0]["message"]
        entry["clause"] = violations[0]["clause"]
        if not rep.failed:  # the test's own code swallowed kvcheck's exception
            rep.outcome = "failed"
            rep.longrepr = violations[0]["message"]
        return
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        entry["outcome"], entry["reason"] = "not run", f"skipped: {reason.removeprefix('Skipped: ')}"
    elif rep.failed:
        exc = call.excinfo.value if call.excinfo is not None else None
        why = _not_run_reason(exc)
        if why is None and call.excinfo is not None and \
                call.excinfo.typename == "FixtureLookupError":
            why = (f"needs the fixture {getattr(exc, 'argname', '?')!r} of the sdist's "
                   "tests/conftest.py, which attach does not load")
        if why is None and exc is not None:
            why = next((reason for words, reason in CANNOT_RUN if words in str(exc)), None)
        if why is None and call.excinfo is not None and \
                call.excinfo.typename == "CalledProcessError" and "vllm" in str(exc):
            why = ("runs vLLM in a subprocess of its own, where attach's import hook is not "
                   "installed (no vllm package to import there)")
        if why is None and rep.when == "setup" and "fixture '" in str(rep.longrepr) and \
                "not found" in str(rep.longrepr):
            line = next((ln.strip() for ln in str(rep.longrepr).splitlines()
                         if "fixture '" in ln and "not found" in ln), "")
            why = f"needs a fixture the attached files do not define ({line.lstrip('E ')})"
        if why is not None:
            entry["outcome"], entry["reason"] = "not run", why
        else:
            text = " ".join(str(exc).split()) if exc is not None else str(rep.longrepr)[:200]
            name = call.excinfo.typename if call.excinfo is not None else "error"
            entry["outcome"], entry["reason"] = "engine", f"{name}: {text[:300]}"


def pytest_collectreport(report) -> None:
    if report.failed:
        text = str(report.longrepr)
        reason = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("E ")), "")
        COLLECT[report.nodeid] = reason or text.strip().splitlines()[-1]


def pytest_sessionfinish(session, exitstatus) -> None:
    path = session.config.getoption("kvcheck_attach_report")
    if not path:
        return
    from kvcheck.cli.attach import finder

    Path(path).write_text(json.dumps({
        "tests": RESULTS, "collection_errors": COLLECT, "checks": TOTAL["checks"],
        "unavailable": finder.UNAVAILABLE}, indent=1))
