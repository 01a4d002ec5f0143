"""kvcheck's memory follows the run, not the block size or the prompt length; what
no engine would ever run is refused up front. Each case runs the CLI in a
subprocess limited to 1 GiB of address space: a clear line, never a traceback."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.check.trace import MAX_BLOCK_SIZE, MAX_PROMPT, schema

HERE = Path(__file__).resolve().parent
BUGGY = HERE.parent / "corpus" / "buggy.py"
KVCHECK = [sys.executable, "-c", "import sys; from kvcheck.cli import main; sys.exit(main())"]
LIMIT = 1 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _kvcheck(*args, cwd=HERE):
    p = subprocess.run([*KVCHECK, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       preexec_fn=_limit, timeout=600)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert "MemoryError" not in p.stderr + p.stdout, p.stderr[-3000:]
    if p.returncode == 2:
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p


def _trace(path: Path, num_blocks: int, block_size: int, ops: list) -> Path:
    path.write_text(json.dumps({"format": "kvcheck.trace", "version": 1, "target": "reference",
                                "scope": {"num_blocks": num_blocks, "block_size": block_size},
                                "ops": ops}))
    return path


def test_the_bounds_are_the_trace_formats():
    assert schema()["properties"]["scope"]["properties"]["block_size"]["maximum"] == MAX_BLOCK_SIZE
    assert MAX_PROMPT < schema()["$defs"]["blocks_op"]["oneOf"][0]["properties"]["n_tokens"]["maximum"]


@pytest.mark.parametrize("command", ["verify", "verify-prefix"])
def test_a_block_size_no_trace_can_record_is_refused(command):
    p = _kvcheck(command, "--block-size", 10_000_000, "--ops", 100)
    assert p.returncode == 2
    assert "at most 65536 tokens per block" in p.stderr


def test_verify_with_the_largest_blocks_runs_in_bounded_memory():
    """4096 blocks of 65536 slots: 2**28 slots, each a list entry before."""
    p = _kvcheck("verify", "--blocks", 4096, "--block-size", MAX_BLOCK_SIZE, "--ops", 3000)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("PASS reference: 3000 operations on 4096 blocks x 65536 slots")


def test_a_counterexample_with_the_largest_blocks_is_written_and_replayed(tmp_path):
    out = tmp_path / "t.json"
    p = _kvcheck("verify", f"{BUGGY}:NoCopyOnWrite", "--blocks", 64, "--block-size",
                 MAX_BLOCK_SIZE, "--ops", 2000, "--trace-out", out)
    assert p.returncode == 1 and "VIOLATION" in p.stdout, p.stderr
    p = _kvcheck("replay", out, "--target", f"{BUGGY}:NoCopyOnWrite")
    assert p.returncode == 1 and p.stdout.startswith("REPRODUCED"), p.stdout


def test_replaying_the_longest_prompt_runs_in_bounded_memory(tmp_path):
    """A 2**24-token prompt in blocks of 65536, forked and appended to."""
    n = MAX_PROMPT
    trace = _trace(tmp_path / "long.json", 1024, MAX_BLOCK_SIZE, [
        {"op": "allocate", "seq": 0, "n_tokens": n}, {"op": "append_slot", "seq": 0},
        {"op": "fork", "parent": 0, "child": 1}, {"op": "append_slot", "seq": 1},
        {"op": "append_slot", "seq": 0}, {"op": "free_seq", "seq": 0},
        {"op": "allocate", "seq": 2, "n_tokens": n - 5}, {"op": "append_slot", "seq": 2}])
    p = _kvcheck("replay", trace)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("PASS reference: all 8 operation(s)")


def test_a_prompt_beyond_any_context_is_refused(tmp_path):
    """2 billion tokens: schema-valid, and it fits a pool of 32768 blocks of 65536."""
    trace = _trace(tmp_path / "huge.json", 32768, MAX_BLOCK_SIZE, [
        {"op": "allocate", "seq": 0, "n_tokens": 2_000_000_000}, {"op": "append_slot", "seq": 0}])
    p = _kvcheck("replay", trace)
    assert p.returncode == 2
    assert "allocates 2000000000 tokens; kvcheck runs prompts of at most 16777216" in p.stderr


def test_running_out_of_memory_anyway_is_one_line(monkeypatch, capsys):
    """The last resort in ``kvcheck.cli.main``."""
    import kvcheck.verify
    from kvcheck.cli import main

    def hungry(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(kvcheck.verify, "verify", hungry)
    assert main(["verify", "--ops", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcheck: error: out of memory") and err.count("\n") == 1, err
