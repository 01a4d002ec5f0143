"""With ``KVCHECK_NO_SKIPS=1`` (``scripts/test.sh`` sets it), a test that would be skipped
fails instead, saying why it would have skipped: the README says the suite skips nothing
after ``scripts/test.sh`` has installed what it needs, and this makes that a checked fact.
Without it (a developer's partial checkout) a skip stays a skip. ``tests/conftest.py``
installs these hooks."""

from __future__ import annotations

import os

import pytest

ENV = "KVCHECK_NO_SKIPS"


def _enforced() -> bool:
    return os.environ.get(ENV) == "1"


def _failed(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped ({reason}), but with {ENV}=1 (scripts/test.sh) the suite skips "
                       f"nothing: install what it needs")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _enforced() and not hasattr(report, "wasxfail"):
        _failed(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _enforced():  # a module-level importorskip
        _failed(report)
