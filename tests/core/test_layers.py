"""The layers import one way: spec, then the checker, then targets (reaching the code under
test), models and proof engines, then the front door (reports, the Python API, the command
line). Checked on every import statement of
every module, at any depth (a function-level import counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Where each top-level package of kvcheck lives in the tree, and its layer (lower first).
PACKAGES = {
    "kvcheck.spec": ("spec", 0),
    "kvcheck.errors": ("kvcheck/errors.py", 0),
    "kvcheck.defaults": ("kvcheck/defaults.py", 0),
    "kvcheck.check": ("kvcheck/check", 1),
    "kvcheck.compile": ("kvcheck/compile", 1),
    "kvcheck.targets": ("kvcheck/targets", 2),
    "kvcheck.impl": ("impl", 0),
    "kvcheck.models": ("kvcheck/models", 3),
    "kvcheck.proofs": ("proofs", 3),
    "kvcheck.report": ("kvcheck/report", 4),
    "kvcheck.tools": ("kvcheck/tools", 4),
    "kvcheck.verify": ("kvcheck/verify.py", 5),
    "kvcheck.prove": ("kvcheck/prove.py", 5),
    "kvcheck.campaign": ("kvcheck/campaign", 5),
    "kvcheck.cli": ("kvcheck/cli", 6),
    "kvcheck.pytest_plugin": ("kvcheck/pytest_plugin.py", 6),
}
LAYER_NAMES = {0: "spec", 1: "checker", 2: "targets", 3: "models and engines", 4: "reports and tools",
               5: "the Python API", 6: "the command line"}


def package_of(module: str) -> str | None:
    best = None
    for pkg in PACKAGES:
        if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best)):
            best = pkg
    return best


def modules():
    for pkg, (where, _) in PACKAGES.items():
        path = ROOT / where
        files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
        for f in files:
            rel = f.relative_to(path if path.suffix != ".py" else path.parent)
            name = pkg if path.suffix == ".py" else ".".join([pkg, *rel.with_suffix("").parts])
            yield name.removesuffix(".__init__"), f


def imports(f: Path):
    tree = ast.parse(f.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
            for a in node.names:
                yield f"{node.module}.{a.name}", node.lineno


@pytest.mark.parametrize("name,path", list(modules()), ids=lambda x: str(x))
def test_imports_go_one_way(name, path):
    mine = PACKAGES[package_of(name)][1]
    for target, line in imports(path):
        if not target.startswith("kvcheck"):
            continue
        if target == "kvcheck":  # the package itself (its version, the lazy public names)
            continue
        pkg = package_of(target)
        if pkg is None:
            continue  # a public shim (kvcheck.target) or kvcheck's own __init__
        theirs = PACKAGES[pkg][1]
        assert theirs <= mine, (f"{path.relative_to(ROOT)}:{line} imports {target}: "
                                f"{LAYER_NAMES[mine]} must not import {LAYER_NAMES[theirs]}")


def test_every_module_is_in_a_layer():
    stray = [p.name for p in (ROOT / "kvcheck").glob("*.py")
             if p.stem not in ("__init__", "__main__", "errors", "defaults", "verify", "prove", "target",
                               "shrink", "pytest_plugin")]
    assert not stray, f"modules at the top of kvcheck/ outside any layer: {stray}"
