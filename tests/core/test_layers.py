"""The layers import one way: spec, then the checker, then targets (reaching the code under
test; the public adapter kit ``kvcheck.engines`` is there), models and proof engines, then the
front door (reports, the Python API, the command line). Checked on every import statement of
every module, at any depth (a function-level import counts too).

And adapters reach kvcheck through public names only (issue 35 §1), two rules:

* **docs examples** (every ``python`` code block of ``docs/*.md`` and ``README.md``, the
  adapter walkthroughs of ``docs/ADAPTERS.md`` among them) import from kvcheck no private
  name (a module path with a part, or an imported name, starting with ``_``) and nothing of
  ``kvcheck.impl`` (an adapter reaches the implementations through ``kvcheck.engines``), and
  read no attribute starting with a single ``_`` on any object (an engine's or kvcheck's
  privates: an example shows what a developer may rely on);
* **engine adapters** (every module of ``impl/thirdparty/`` whose name does not start with
  ``_``) import no private name of kvcheck, with one exception: the package's own private
  loader, ``kvcheck.impl.thirdparty._loader`` (``from . import _loader``, ``from ._loader
  import Loaded``), whose public face for adapters outside kvcheck is ``kvcheck.engines``.
  Nor does it read another kvcheck module's private attribute after a public import
  (``vllm_v1._stub_envs``): a stand-in it reuses is reached through a public name."""

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
    "kvcheck.engines": ("kvcheck/engines", 2),
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


# -- adapters reach kvcheck through public names ------------------------------------------
LOADER = "kvcheck.impl.thirdparty._loader"  # the adapters' own package's private helper


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def absolute_imports(tree: ast.AST, package: str, aliases: bool = False):
    """``(module, name or None, line)`` of every import in ``tree``, relative ones resolved
    against ``package`` (the importing module's package); with ``aliases``, each with the
    name it is bound to as a fourth item."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield (a.name, None, node.lineno) + ((a.asname,) if aliases else ())
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                yield (base, a.name, node.lineno) + ((a.asname or a.name,) if aliases else ())


def private_imports(tree: ast.AST, package: str, allowed: tuple = ()) -> list[str]:
    """Each import of a private kvcheck name in ``tree`` (but those under ``allowed``)."""
    bad = []
    for module, name, line in absolute_imports(tree, package):
        if not module.startswith("kvcheck"):
            continue
        full = module if name is None else f"{module}.{name}"
        if _private(full) and not any(full == a or full.startswith(a + ".") for a in allowed):
            bad.append(f"line {line}: {full}")
    return bad


ADAPTERS = sorted(p for p in (ROOT / "impl" / "thirdparty").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", ADAPTERS, ids=lambda p: p.name)
def test_engine_adapters_import_no_private_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = private_imports(tree, "kvcheck.impl.thirdparty", allowed=(LOADER,))
    assert not bad, f"{path.relative_to(ROOT)} imports private names of kvcheck: {bad}"


def private_reads(tree: ast.AST, package: str) -> list[str]:
    """Each ``module._name`` read of ``tree`` where ``module`` is a kvcheck module it
    imported (``from . import vllm_v1``, ``import kvcheck.x as y``): another module's
    private name, reached after a public import (the package's ``_loader`` aside)."""
    modules = {}  # the local name -> the kvcheck module (or name) it is bound to
    for module, name, _, bound in absolute_imports(tree, package, aliases=True):
        if module.startswith("kvcheck") and bound is not None:
            modules[bound] = module if name is None else f"{module}.{name}"
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in modules and node.attr.startswith("_") \
                and not node.attr.startswith("__") and modules[node.value.id] != LOADER:
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return bad


@pytest.mark.parametrize("path", ADAPTERS, ids=lambda p: p.name)
def test_engine_adapters_read_no_private_names_of_other_modules(path):
    """An adapter reuses another adapter's stand-ins through public names (its module's
    ``STUBS`` table, ``vllm_v1.unreachable``, ``vllm_v1.ONE_UTILS_STUBS``...), never
    ``vllm_v1._stub_envs``: what kvcheck's own adapters reach, a user's may."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = private_reads(tree, "kvcheck.impl.thirdparty")
    assert not bad, f"{path.relative_to(ROOT)} reads private names of other modules: {bad}"


def test_a_private_read_after_a_public_import_is_seen():
    tree = ast.parse("from . import vllm_v1, _loader\nx = vllm_v1._stub_envs\n"
                     "y = _loader._private\nz = vllm_v1.STUBS\n")
    assert private_reads(tree, "kvcheck.impl.thirdparty") == ["line 2: vllm_v1._stub_envs"]


def docs_examples():
    """``(where, code)`` of every python code block in the docs and the README."""
    import re

    for f in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]:
        text = f.read_text(encoding="utf-8")
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            yield f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)


EXAMPLES = list(docs_examples())


def test_the_walkthroughs_are_among_the_docs_examples():
    """(So the rule below cannot pass by finding nothing.)"""
    assert sum(where.startswith("docs/ADAPTERS.md") for where, _ in EXAMPLES) >= 2


@pytest.mark.parametrize("where,code", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_docs_examples_use_public_names_only(where, code):
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return  # an excerpt, not a program (its imports, if any, are not Python to check)
    bad = private_imports(tree, "")
    bad += [f"line {line}: {module}" for module, name, line in absolute_imports(tree, "")
            if module == "kvcheck.impl" or module.startswith("kvcheck.impl.")]
    bad += [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr)]
    assert not bad, f"the example at {where} reaches private names: {bad}"


def test_the_rules_catch_what_they_forbid():
    """The checks above, on code that breaks them (each rule can fail)."""
    tree = ast.parse("from ._loader import Loaded\nfrom .raw import _raised\n"
                     "from kvcheck.models.prefix import oracle\nfrom kvcheck.check import _x\n"
                     "import kvcheck.impl.thirdparty.vllm_v1\n")
    assert private_imports(tree, "kvcheck.impl.thirdparty", allowed=(LOADER,)) == [
        "line 2: kvcheck.impl.thirdparty.raw._raised", "line 4: kvcheck.check._x"]
    assert private_imports(tree, "kvcheck.impl.thirdparty")[0] == \
        "line 1: kvcheck.impl.thirdparty._loader.Loaded"
