"""A ``file.py:Attr`` target: it may import the modules beside it, and a trace records where
it is (relative to the trace file, tests/traces/test_portable.py), so ``kvcheck replay``
works from any directory."""

from __future__ import annotations

import json
import subprocess
import sys

from kvcheck.targets.loading import location, resolve

KVCHECK = [sys.executable, "-c", "import sys; from kvcheck.cli import main; sys.exit(main())"]

HELPER = '''
from kvcheck.impl.block_manager import BlockManager


class WritesShared(BlockManager):
    """Never copies a shared partial block: the writer scribbles on its sibling's tokens."""

    def append_slot(self, seq):
        table, n = self.tables[seq], self.lens[seq]
        if n % self.block_size == 0:
            return super().append_slot(seq)
        self.lens[seq] = n + 1
        return table[-1], n % self.block_size, None
'''

TARGET = '''
from allocator_helper_beside import WritesShared  # a module next to this file


class Alloc(WritesShared):
    pass
'''


def _project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "allocator_helper_beside.py").write_text(HELPER)
    (proj / "alloc.py").write_text(TARGET)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    return proj


def test_verify_here_replay_there(tmp_path):
    proj = _project(tmp_path)
    run = dict(capture_output=True, text=True, timeout=300)
    p = subprocess.run([*KVCHECK, "verify", "../proj/alloc.py:Alloc", "--ops", "2000",
                        "--trace-out", "t.json"], cwd=tmp_path / "a", **run)
    assert p.returncode == 1, p.stdout + p.stderr
    recorded = json.loads((tmp_path / "a" / "t.json").read_text())["target"]
    assert recorded == "../proj/alloc.py:Alloc"  # relative to the trace (portable)
    assert proj.joinpath("alloc.py").is_file()
    p = subprocess.run([*KVCHECK, "replay", "../a/t.json"], cwd=tmp_path / "b", **run)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith("REPRODUCED"), p.stdout


def test_the_folder_is_importable_only_while_the_file_loads(tmp_path, monkeypatch):
    proj = _project(tmp_path)
    monkeypatch.chdir(tmp_path / "a")
    before = list(sys.path)
    label, factory = resolve("../proj/alloc.py:Alloc")
    assert factory.__name__ == "Alloc" and sys.path == before
    assert label == location("../proj/alloc.py:Alloc") == f"{(proj / 'alloc.py').resolve()}:Alloc"


def test_module_and_registered_names_are_recorded_as_given():
    assert location("kvcheck.impl.block_manager:BlockManager") == \
        "kvcheck.impl.block_manager:BlockManager"
    assert location("reference") == "reference"
    assert resolve("reference")[0] == "reference"
