"""The public API is typed (``kvcheck/py.typed``) and ``mypy --strict`` passes on it.

pyproject.toml's ``[tool.mypy]`` names the public modules (``kvcheck``, ``kvcheck.verify``,
``kvcheck.prove``, the ``Target`` protocol and ``SeedAdapter``, ``kvcheck.target``,
``kvcheck.errors``, the adapter kit ``kvcheck.engines``); the internal modules they import
are analysed silently. A user's
module typed against the API is checked too: a correct one passes, and misuses are caught
(the hints say something: they are not ``Any``). The runs share one cache, empty at the
start, under pytest's tmp path (about 5 s of CPU in all)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mypy(cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-pretty",
                           "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One mypy cache for this file's runs (empty at its start)."""
    return tmp_path_factory.mktemp("mypy-cache")


def test_public_api_passes_mypy_strict(cache):
    assert (ROOT / "kvcheck" / "py.typed").is_file()
    p = _mypy(cache)
    assert p.returncode == 0, f"mypy --strict on the public API (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    assert "Success" in p.stdout, p.stdout


CLIENT = '''
from __future__ import annotations

from kvcheck import SeedAdapter, Target
from kvcheck.errors import BAD_INPUT, UsageError, describe_exception
from kvcheck.prove import Report, Settings, prove
from kvcheck.verify import Op, Result, make_state_machine, replay_ops, verify


class Alloc:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.tables: dict[int, list[int]] = {}
        self.ref = [0] * num_blocks
        self.free = list(range(num_blocks))


def factory(num_blocks: int, block_size: int) -> SeedAdapter:
    return SeedAdapter(Alloc(num_blocks, block_size), num_blocks, block_size)


def check(target: Target) -> list[int]:
    return list(target.block_table(0)) + [target.refcount(0), target.num_free()]


def run() -> int:
    result: Result = verify(factory, num_blocks=8, block_size=2, ops=100, seed=1)
    if not result.ok and result.trace is not None:
        print(result.trace.dumps(), result.counts.get("allocate", {}).get("ok", 0))
    report: Report = prove("reference", Settings(num_blocks=4, depth=3), progress=print)
    replayed = replay_ops("blocks", factory, {"num_blocks": 8, "block_size": 2},
                          [Op("allocate", seq=0, n_tokens=3)])
    print(report.verdict, report.summary(), replayed.violation, describe_exception(UsageError("x")))
    return BAD_INPUT


TestAlloc = make_state_machine(factory, num_blocks=8, block_size=2).TestCase
'''

MISUSES = {  # a line appended to CLIENT -> the error code mypy must report on it
    'verify(factory, num_blocks="8")': "arg-type",
    'verify(factory).verdict + 1': "operator",
    'prove(factory, progress=lambda n: n + 1)': "operator",
    'SeedAdapter(Alloc(4, 2), 4, 2).refcount("a")': "arg-type",
    'make_state_machine(factory, mode=3)': "arg-type",
}


def test_a_client_typed_against_the_api(tmp_path, cache):
    """A user's module using the API passes ``mypy --strict``; each misuse is an error on
    its own line (so the public names are typed, not ``Any``)."""
    good = tmp_path / "client.py"
    good.write_text(textwrap.dedent(CLIENT))
    p = _mypy(cache, "--strict", str(good))
    assert p.returncode == 0, f"a correct client fails mypy --strict:\n{p.stdout}{p.stderr}"
    bad = tmp_path / "misuse.py"
    head = textwrap.dedent(CLIENT).rstrip("\n").split("\n")
    bad.write_text("\n".join([*head, *MISUSES]) + "\n")
    p = _mypy(cache, "--strict", str(bad))
    assert p.returncode == 1, f"misuses not caught (exit {p.returncode}):\n{p.stdout}{p.stderr}"
    for i, (line, code) in enumerate(MISUSES.items(), start=len(head) + 1):
        assert any(f"misuse.py:{i}: error:" in out and out.endswith(f"[{code}]")
                   for out in p.stdout.splitlines()), (
            f"{line!r} (line {i}) not reported as [{code}]:\n{p.stdout}")
