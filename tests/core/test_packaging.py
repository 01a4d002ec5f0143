"""Every package folder is installed: pyproject.toml lists each one explicitly
(setuptools ``packages`` with ``package-dir``), so a new subpackage that is not
listed would work from the checkout and vanish from a ``pip install .``."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the project supports 3.10)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, roots = set(config["packages"]), config["package-dir"]
    found = set()
    for name, folder in roots.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), f"not in pyproject.toml packages: {found - listed}"
    assert listed <= found, f"listed but missing: {listed - found}"


def _project():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set[str]:
    import re

    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_prove_runs_after_a_plain_install():
    """``pip install . && kvcheck prove`` runs CrossHair (in a subprocess, ``-m crosshair``):
    it is a runtime dependency, not a test extra."""
    deps = _names(_project()["dependencies"])
    assert {"z3-solver", "hypothesis", "crosshair-tool"} <= deps


def test_every_module_a_test_skips_without_is_a_test_extra():
    """The README says nothing is skipped after ``scripts/test.sh``: every module a test
    ``importorskip``s (other than the standard library's) comes from a distribution that
    ``[test]`` or the runtime dependencies install."""
    import importlib.metadata
    import re
    import sys

    project = _project()
    installed = _names(project["dependencies"]) | _names(project["optional-dependencies"]["test"])
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for module in re.findall(r"importorskip\(\s*[\"']([\w.]+)[\"']", path.read_text()):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names:
                continue
            names = {d.lower() for d in dists.get(top, [top])}
            if not names & installed:
                missing[module] = sorted(names)
    assert not missing, f"skipped on a fresh machine, not in the test extras: {missing}"
