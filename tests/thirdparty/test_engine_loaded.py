"""The engine model beside CPU hogs (issue 32's rule for issue 34's engine core): the
release's own scheduler driven with kvcheck's generated model output gives the same verdict
and, byte for byte, the same shrunk trace on an idle and on a loaded machine (the engine's
steps, the drafts and their acceptance, and the shrinker's budget depend on the seed
alone)."""

from __future__ import annotations

from pathlib import Path

from core.test_loaded_machine import hogs, kvcheck


def _trace(tmp: Path, tag: str) -> bytes:
    path = tmp / f"{tag}.json"
    r = kvcheck("verify-engine", "vllm-v1-engine@0.9.0", "--spec-tokens", "3", "--blocks", "6",
                "--seed", "2", "--trace-out", str(path))
    assert r.returncode == 1, r.stdout + r.stderr  # vllm-19459: the engine step raises
    assert "never raises" in r.stdout, r.stdout
    return path.read_bytes()


def test_the_engine_model_gives_the_same_trace_beside_a_cpu_hog(tmp_path):
    from kvcheck.impl.thirdparty import install

    install.ensure(install.ENGINES["vllm-v1-early"], "0.9.0")
    idle = _trace(tmp_path, "idle")
    with hogs():
        loaded = _trace(tmp_path, "loaded")
    assert idle == loaded
