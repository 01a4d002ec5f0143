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


# The engine cores and tier adapters added after the test above, one command each: a FAIL
# whose shrunk trace must match byte for byte, or a PASS whose counts must (a run that
# read the clock would differ in its steps, hits or preemptions under load).
LATER = {
    "aphrodite-v1-engine": (
        ("verify-engine", "aphrodite-v1-engine@0.22.0", "--policy", "priority",
         "--spec-tokens", "3", "--blocks", "6", "--seed", "6"), 1),  # vLLM #43569 in the fork
    "sglang-engine": (("verify-engine", "sglang-engine@0.5.22", "--ops", "300", "--seed", "3"), 0),
    "sglang-hicache-storage": (
        ("verify-tiers", "sglang-hicache-storage@0.5.5.post3", "--blocks", "8", "--block-size",
         "1", "--host-blocks", "24", "--ops", "300", "--seed", "0"), 1),  # sglang-13501
    # and those added after them
    "vllm-v1-pd-recv": (("verify-tiers", "vllm-v1-pd-recv-abort-frees@0.33.0", "--seed", "0"),
                        1),  # the planted early free at an abort while receiving
    "sglang-unified": (
        ("verify-tiers", "kvcheck.impl.thirdparty.sglang_unified:make_write_back@0.5.12.post1",
         "--blocks", "4", "--block-size", "1", "--host-blocks", "5", "--ops", "200", "--seed",
         "0"), 1),  # sglang-24585
    "sglang-engine-random": (("verify-engine", "sglang-engine@0.5.22", "--policy", "random",
                              "--ops", "300", "--seed", "3"), 0),  # its shuffle seeded by step
    "vllm-v0-engine-v1": (("verify-engine", "vllm-v0-engine-v1@0.4.2", "--no-prefix-caching",
                           "--seed", "1"), 0),  # block manager v1 under its own scheduler
    "vllm-v0-engine-window-chunked": (
        ("verify-engine", "vllm-v0-engine-window-chunked@0.8.5", "--no-prefix-caching",
         "--block-size", "2", "--seed", "0"), 1),  # vllm-11168 through chunked prefill
}


def _run_later(tmp: Path, tag: str) -> dict[str, tuple[int, bytes | dict]]:
    import json

    out = {}
    for name, (args, rc) in LATER.items():
        path = tmp / f"{name}-{tag}.json"
        r = kvcheck(*args, "--json", "--trace-out", str(path))
        assert r.returncode == rc, (name, r.stdout[-2000:], r.stderr[-2000:])
        if rc:
            out[name] = (r.returncode, path.read_bytes())
        else:
            got = json.loads(r.stdout)
            out[name] = (r.returncode, {k: got[k] for k in ("verdict", "ops", "operations",
                                                            "stats")})
    return out


def test_later_engine_and_tier_targets_give_the_same_verdict_beside_cpu_hogs(tmp_path):
    from kvcheck.impl.thirdparty import install

    install.ensure(install.ENGINES["aphrodite"], "0.22.0")
    install.ensure(install.ENGINES["sglang"], "0.5.22")
    install.ensure(install.ENGINES["sglang-hicache"], "0.5.5.post3")
    install.ensure(install.ENGINES["sglang-unified"], "0.5.12.post1")
    install.ensure(install.ENGINES["vllm-v1"], "0.33.0")
    install.ensure(install.ENGINES["vllm-v0-legacy"], "0.4.2")
    install.ensure(install.ENGINES["vllm-v0"], "0.8.5")
    idle = _run_later(tmp_path, "idle")
    with hogs():
        loaded = _run_later(tmp_path, "loaded")
    assert idle == loaded
