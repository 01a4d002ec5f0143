"""Portable traces (issue 35 §3): a trace names its target so that another checkout,
another directory or CI replays it without ``--target``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvcheck.check.portable import located, module_name, recorded
from kvcheck.check.trace import Trace

BUG = '''from kvcheck.impl.block_manager import BlockManager


class LeaksOnFree(BlockManager):
    """free_seq forgets the last block of a table of two or more."""

    def free_seq(self, seq):
        table = self.tables[seq]
        if len(table) > 1:
            table.pop()
        super().free_seq(seq)
'''


def kvcheck(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-c", "import sys; from kvcheck.cli import main; "
                           "sys.exit(main())", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, **(env or {})})


def project(root: Path) -> Path:
    (root / "alloc").mkdir(parents=True)
    (root / "traces").mkdir()
    (root / "alloc" / "mybug.py").write_text(BUG)
    return root


def test_a_trace_names_its_file_relative_to_itself_and_replays_from_another_checkout(tmp_path):
    one = project(tmp_path / "one")
    r = kvcheck("verify", "alloc/mybug.py:LeaksOnFree", "--trace-out", "traces/t.json", cwd=one)
    assert r.returncode == 1, r.stderr
    data = json.loads((one / "traces" / "t.json").read_text())
    assert data["target"] == "../alloc/mybug.py:LeaksOnFree"
    assert data["target_file"]["path"] == "../alloc/mybug.py"
    assert len(data["target_file"]["sha256"]) == 64
    two = tmp_path / "two"
    shutil.copytree(one, two)
    shutil.rmtree(one)  # (the writer's checkout is gone)
    for cwd in (tmp_path, two / "traces", two / "alloc"):
        r = kvcheck("replay", str(two / "traces" / "t.json"), cwd=cwd)
        assert r.returncode == 1 and r.stdout.startswith(
            f"REPRODUCED on {two / 'alloc' / 'mybug.py'}:LeaksOnFree"), (cwd, r.stdout, r.stderr)


def test_a_changed_target_file_is_said_and_a_missing_one_is_one_line(tmp_path):
    one = project(tmp_path / "one")
    assert kvcheck("verify", "alloc/mybug.py:LeaksOnFree", "--trace-out", "traces/t.json",
                   cwd=one).returncode == 1
    with open(one / "alloc" / "mybug.py", "a") as f:
        f.write("\n# edited since\n")
    r = kvcheck("replay", "traces/t.json", cwd=one)
    assert r.returncode == 1 and "differs from the file the trace was recorded on" in r.stderr
    (one / "alloc" / "mybug.py").unlink()
    r = kvcheck("replay", "traces/t.json", cwd=one)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "../alloc/mybug.py was found nowhere" in lines[0] and \
        "--target" in lines[0], lines


def test_an_importable_file_is_recorded_as_its_module(tmp_path):
    pkg = tmp_path / "site" / "myengine"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "alloc.py").write_text(BUG)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PYTHONPATH": str(tmp_path / "site")}
    r = kvcheck("verify", f"{pkg / 'alloc.py'}:LeaksOnFree", "--trace-out", "t.json", cwd=work,
                env=env)
    assert r.returncode == 1, r.stderr
    data = json.loads((work / "t.json").read_text())
    assert data["target"] == "myengine.alloc:LeaksOnFree" and "target_file" not in data
    r = kvcheck("replay", str(work / "t.json"), cwd=tmp_path, env=env)
    assert r.returncode == 1 and r.stdout.startswith("REPRODUCED on myengine.alloc:LeaksOnFree")


def test_a_folder_only_this_process_added_does_not_make_a_module(tmp_path):
    """A test runner's rootdir on ``sys.path`` is not there for ``kvcheck replay``."""
    (tmp_path / "mine.py").write_text(BUG)
    sys.path.insert(0, str(tmp_path))
    try:
        assert module_name(tmp_path / "mine.py") is None
        spec, target_file = recorded(f"{tmp_path / 'mine.py'}:LeaksOnFree", tmp_path / "t.json")
    finally:
        sys.path.remove(str(tmp_path))
    assert spec == "mine.py:LeaksOnFree" and target_file["path"] == "mine.py"


def test_old_traces_with_an_absolute_path_still_load(tmp_path):
    (tmp_path / "mine.py").write_text(BUG)
    target = f"{tmp_path / 'mine.py'}:LeaksOnFree"
    assert located(target) == (target, "")
    t = Trace(target, 4, 1, [])
    data = t.to_json()
    assert data["target"] == target and "target_file" not in data  # (not written to a file)
    assert Trace.from_json(data).loadable_target() == target


def test_the_pytest_reproducer_runs_from_any_checkout(tmp_path):
    one = project(tmp_path / "one")
    assert kvcheck("verify", "alloc/mybug.py:LeaksOnFree", "--trace-out", "traces/t.json",
                   cwd=one).returncode == 1
    assert kvcheck("replay", "traces/t.json", "--pytest-out", "traces/test_repro.py",
                   cwd=one).returncode == 1
    source = (one / "traces" / "test_repro.py").read_text()
    assert str(one) not in source and "'../alloc/mybug.py'" in source
    two = tmp_path / "two"
    shutil.copytree(one, two)
    shutil.rmtree(one)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(two / "traces" / "test_repro.py")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 1 and "free_seq" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(two / "traces" / "test_repro.py")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "KVCHECK_TARGET": "reference"})
    assert r.returncode == 0, r.stdout
