"""Every package folder is installed: pyproject.toml lists each one explicitly
(setuptools ``packages`` with ``package-dir``), so a new subpackage that is not
listed would work from the checkout and vanish from a ``pip install .``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _toml():
    """tomllib (Python 3.11+), or on 3.10 tomli, which pytest itself requires there: never
    a skip (the README says the suite skips nothing)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib


def test_every_package_folder_is_listed():
    tomllib = _toml()
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
    tomllib = _toml()
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


def test_scripts_test_sh_fails_a_skip_so_nothing_is_skipped(tmp_path):
    """The README says nothing is skipped after ``scripts/test.sh``: it runs the suite with
    ``KVCHECK_NO_SKIPS=1``, under which a skip is a failure saying why (tests/no_skips.py)."""
    import os
    import subprocess
    import sys

    assert "Nothing is skipped" in (ROOT / "README.md").read_text()
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "export KVCHECK_NO_SKIPS=1" in script.split("python3 -m pytest")[0]
    (tmp_path / "test_demo.py").write_text(
        "import pytest\n\ndef test_skips():\n    pytest.skip('a missing engine')\n\n"
        "def test_runs():\n    pass\n")

    def pytest_run(**env):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no_skips", "-p", "no:cacheprovider",
             str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT / "tests"), **env})

    enforced = pytest_run(KVCHECK_NO_SKIPS="1")
    assert enforced.returncode == 1, enforced.stdout
    assert "1 failed, 1 passed" in enforced.stdout and "a missing engine" in enforced.stdout
    assert "with KVCHECK_NO_SKIPS=1 (scripts/test.sh) the suite skips nothing" in enforced.stdout
    relaxed = pytest_run(KVCHECK_NO_SKIPS="")
    assert relaxed.returncode == 0 and "1 passed, 1 skipped" in relaxed.stdout, relaxed.stdout


def test_one_version_in_one_place():
    """The version is written once, in kvcheck/__init__.py; pyproject.toml reads it from
    there (``dynamic``), and the installed distribution reports it."""
    import importlib.metadata

    import kvcheck

    project = _project()
    assert "version" not in project and "version" in project["dynamic"]
    tomllib = _toml()
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "kvcheck.__version__"}
    assert importlib.metadata.version("kvcheck") == kvcheck.__version__
