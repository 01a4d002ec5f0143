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
