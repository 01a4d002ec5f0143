"""`kvcheck replay --pytest-out`: a standalone test, failing on the bug, passing when fixed."""

from __future__ import annotations

import os
import subprocess
import sys

from traces_helpers import found_trace, target_of

from kvcheck.cli import main


def _pytest(path, target: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVCHECK_TARGET"}
    if target is not None:
        env["KVCHECK_TARGET"] = target
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(path)], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def test_reproducer_fails_on_bug_and_passes_on_reference(tmp_path, capsys):
    trace_file = tmp_path / "t.json"
    found_trace("cow-full-blocks").write(trace_file)
    repro = tmp_path / "test_repro_cow.py"
    assert main(["replay", str(trace_file), "--pytest-out", str(repro)]) == 1
    assert f"pytest reproducer written to {repro}" in capsys.readouterr().out
    src = repro.read_text()
    assert "import kvcheck" in src or "from kvcheck" in src
    assert "pickle" not in src and "Op('allocate'" in src
    buggy = _pytest(repro)
    assert buggy.returncode == 1, buggy.stdout
    assert "a full block is never copied" in buggy.stdout
    fixed = _pytest(repro, "reference")
    assert fixed.returncode == 0, fixed.stdout


def test_reproducer_for_another_target(tmp_path, capsys):
    trace_file = tmp_path / "t.json"
    found_trace("free-without-refcounts").write(trace_file)
    repro = tmp_path / "test_repro_ref.py"
    assert main(["replay", str(trace_file), "--target", "reference",
                 "--pytest-out", str(repro)]) == 0
    assert _pytest(repro).returncode == 0
    # the same file, pointed back at the buggy allocator, fails
    assert _pytest(repro, target_of("free-without-refcounts")).returncode == 1
