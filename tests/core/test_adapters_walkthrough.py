"""The adapter walkthroughs of docs/ADAPTERS.md ("Writing an adapter") run as written.

Every ``python`` block of that section opening with ``# file: PATH`` is written to PATH in a
fresh folder (an engine kvcheck does not know, ``toyllm``, under ``site-packages/``, whose
package ``__init__`` raises: kvcheck must run its block manager's file without importing
it), and every ``$ ... kvcheck verify ...`` command shown is run there in-process: its exit
code is the one its first line (PASS / FAIL) says, and every output line the doc shows is a
line of the real output (the timing in brackets aside). The vLLM v1 plugin runs on the
pinned vLLM v1 (``scripts/test.sh`` installs it). A planted bug in the plugin is caught too.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from kvcheck import engines
from kvcheck.cli import main as kvcheck
from kvcheck.engines import vllm_v1 as kit_vllm_v1

DOC = Path(__file__).resolve().parents[2] / "docs" / "ADAPTERS.md"
SECTION = "## Writing an adapter"


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def files() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(
        r"^```python\n# file: (\S+)\n(.*?)^```", section(), re.S | re.M)}


def commands() -> list[tuple[list[str], list[str]]]:
    """(kvcheck's arguments, the output lines shown) of each ``$`` command of the section."""
    out = []
    for m in re.finditer(r"^```\n\$ (.*?)\n(.*?)^```", section(), re.S | re.M):
        words = shlex.split(m.group(1))
        while "=" in words[0]:  # environment assignments (PYTHONPATH=...): set by the fixture
            words.pop(0)
        assert words[0] == "kvcheck", m.group(1)
        out.append((words[1:], m.group(2).splitlines()))
    return out


def untimed(line: str) -> str:
    return re.sub(r" \[[^\]]*\]$", "", line.rstrip())


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The walkthroughs' files written out; toyllm on the path; the folder the cwd."""
    for path, code in files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(code, encoding="utf-8")
    (tmp_path / "site-packages" / "toyllm" / "__init__.py").write_text(
        "raise ImportError('toyllm starts a GPU runtime: kvcheck must not import it')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site-packages"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_section_has_both_walkthroughs():
    assert sorted(files()) == ["beam_plugin.py", "buggy.py", "site-packages/toyllm/block_manager.py",
                               "toy_adapter.py"]
    shown = [args[1] for args, _ in commands()]
    assert shown == ["toy_adapter.py:make", "buggy.py:make_buggy", "beam_plugin.py:make"]


@pytest.mark.parametrize("index", range(3))
def test_each_command_gives_what_the_doc_shows(folder, capsys, index):
    args, shown = commands()[index]
    code = kvcheck(args)
    out = capsys.readouterr().out
    assert code == (0 if shown[0].startswith("PASS") else 1), out
    lines = {untimed(line) for line in out.splitlines()}
    missing = [line for line in shown if untimed(line) not in lines]
    assert not missing, f"shown in the doc but not printed: {missing}\n--- printed:\n{out}"


def test_the_toy_engine_runs_from_its_file_never_imported(folder):
    sys.path.insert(0, str(folder))
    try:
        import toy_adapter  # noqa: PLC0415 - the walkthrough's file, written by the fixture
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("toy_adapter", None)
    target = toy_adapter.make(4, 2)
    assert Path(target.engine.__file__) == folder / "site-packages" / "toyllm" / "block_manager.py"
    assert "toyllm" not in sys.modules and "toyllm.block_manager" not in sys.modules
    target.allocate(0, 3)
    assert target.block_table(0) == [0, 1] and target.num_free() == 2


def test_the_plugin_without_its_references_is_caught(folder, capsys):
    code = (folder / "beam_plugin.py").read_text()
    assert code.count("self.pool.touch(") == 1
    (folder / "beam_plugin.py").write_text(code.replace("self.pool.touch(", "(lambda blocks: None)("))
    assert kvcheck(["verify", "beam_plugin.py:make", "--blocks", "6", "--block-size", "2",
                    "--ops", "400"]) == 1
    out = capsys.readouterr().out
    assert "fork: refcount +1 per entry of the child's table, -1 per entry it had" in out, out


def test_the_kit_reexports_what_kvchecks_adapters_use():
    from kvcheck.impl import errors  # noqa: PLC0415
    from kvcheck.impl.thirdparty import _loader, vllm_v1  # noqa: PLC0415

    for name in engines.__all__:
        assert hasattr(engines, name), name
    for name in kit_vllm_v1.__all__:
        assert hasattr(kit_vllm_v1, name), name
    assert engines.OutOfBlocks is errors.OutOfBlocks and engines.load is _loader.load
    assert kit_vllm_v1.VllmV1Target is vllm_v1.VllmV1Target
    assert engines.copies([(3, 5)], offset=1) == [(2, 4)] and engines.copies(None) == []
