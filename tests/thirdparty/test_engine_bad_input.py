"""Bad input to what issue 34 added to ``kvcheck verify-engine`` (``--max-model-len``, the
v0, aphrodite and nano-vllm engine targets' refusals) is one line and exit 2, never a
traceback."""

from __future__ import annotations

import pytest

from kvcheck.cli import main as kvcheck
from kvcheck.impl.thirdparty import install


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_bad_max_model_len_is_one_line(value, capsys):
    with pytest.raises(SystemExit) as e:
        kvcheck(["verify-engine", "vllm-v1-engine", "--max-model-len", value])
    assert e.value.code == 2
    assert "--max-model-len: expected a positive integer" in _one_line(capsys)


@pytest.mark.parametrize(("target", "flags", "says"), [
    ("vllm-v0-engine-chunked@0.5.5", [], "chunked prefill with prefix caching is not modelled"),
    ("vllm-v0-engine@0.9.2", ["--spec-tokens", "2"], "drives no speculative decoding"),
    ("nano-vllm-engine", ["--no-prefix-caching"], "prefix caching"),
])
def test_a_setting_an_engine_target_refuses_is_one_line(target, flags, says, capsys):
    for key, version in (("vllm-v0", "0.5.5"), ("vllm-v0", "0.9.2")):
        install.ensure(install.ENGINES[key], version)
    assert kvcheck(["verify-engine", target, *flags]) == 2
    err = _one_line(capsys)
    assert err.startswith("kvcheck: error: cannot build the engine") and says in err, err


@pytest.mark.parametrize(("target", "says"), [
    ("aphrodite-v1-engine@0.1.0", "aphrodite loads aphrodite-engine 0.20.0 .. 0.24.1, not 0.1.0"),
    ("sglang-engine-optimistic@0.5.18", "loads sglang 0.5.19 .. 0.5.23, not 0.5.18"),
])
def test_a_release_out_of_a_new_targets_range_is_one_line(target, says, capsys):
    assert kvcheck(["verify-engine", target, "--ops", "10"]) == 2
    assert says in _one_line(capsys)


# What a vLLM release's own SchedulerConfig refuses at start-up is refused, in its words
# (impl/thirdparty/vllm_config.py runs the release's validation method on the settings).
@pytest.mark.parametrize(("target", "flags", "says"), [
    ("vllm-v1-engine", ["--budget", "4", "--max-seqs", "8"],
     "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)"),
    ("vllm-v1-engine@0.9.2", ["--budget", "2", "--max-seqs", "3"],
     "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (3)"),
    ("vllm-v0-engine@0.9.2", ["--budget", "4", "--max-seqs", "8"],
     "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)"),
    ("vllm-v0-engine-chunked@0.5.4", ["--budget", "2", "--max-seqs", "4",
                                      "--no-prefix-caching"],
     "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)"),
    ("vllm-v0-engine@0.9.2", ["--max-model-len", "32"],
     "max_num_batched_tokens (16) is smaller than max_model_len (32)"),
])
def test_a_setting_the_release_config_refuses_is_one_line(target, flags, says, capsys):
    for key, version in (("vllm-v0", "0.5.4"), ("vllm-v0", "0.9.2"), ("vllm-v1", "0.9.2")):
        install.ensure(install.ENGINES[key], version)
    assert kvcheck(["verify-engine", target, *flags, "--ops", "10"]) == 2
    err = _one_line(capsys)
    assert "refuses these settings at start-up (its SchedulerConfig)" in err and says in err, err


def test_the_release_validation_is_run_on_every_generation():
    """The validation method is found and run on each layout: ``_verify_args`` in
    ``vllm/config.py`` (0.5.4), decorated by pydantic's ``model_validator`` (0.9.2), in
    ``vllm/config/scheduler.py`` (0.10.2), ``verify_max_model_len`` (0.33.0); a budget at
    least max_num_seqs and max_model_len (or chunked) passes."""
    from kvcheck.impl.thirdparty import _loader, vllm_config

    for key, version in (("vllm-v0", "0.5.4"), ("vllm-v0", "0.9.2"), ("vllm-v1", "0.10.2"),
                         ("vllm-v1", "0.33.0")):
        dist = install.ENGINES[key]
        install.ensure(dist, version)
        root = _loader.require(install.select(key, version))
        ok = dict(budget=16, max_seqs=8, max_model_len=16, chunked=False)
        assert vllm_config.refusal(root, "vllm", **ok) is None, version
        assert vllm_config.refusal(root, "vllm", **{**ok, "max_model_len": 1 << 16,
                                                    "chunked": True}) is None, version
        said = vllm_config.refusal(root, "vllm", **{**ok, "max_seqs": 17})
        assert said and "max_num_seqs (17)" in said, (version, said)
        said = vllm_config.refusal(root, "vllm", **{**ok, "max_model_len": 17})
        assert said and "smaller than max_model_len (17)" in said, (version, said)


def test_a_chunk_size_the_release_scheduler_refuses_is_one_line(capsys):
    """0.6.5 .. 0.7.2 raise at the first chunked prefill when prefix caching is on and the
    budget is not a whole number of blocks (was reported as an engine crash); 0.7.3 on
    round the chunk down instead and build."""
    from kvcheck.impl.thirdparty import vllm_v0_engine as ve

    for version in ("0.7.0", "0.7.3"):
        install.ensure(install.ENGINES["vllm-v0"], version)
    assert kvcheck(["verify-engine", "vllm-v0-engine-chunked@0.7.0", "--budget", "6",
                    "--max-seqs", "4", "--ops", "10"]) == 2
    err = _one_line(capsys)
    assert "refuses these settings at its first chunked prefill" in err, err
    assert "must be dividable by block size" in err and "(6) % block_size (4) = 2" in err, err
    ve.make_chunked(8, 4, budget=8, max_seqs=4, version="0.7.0")  # a whole number: builds
    ve.make_chunked(8, 4, budget=6, max_seqs=4, version="0.7.0", caching=False)
    ve.make_chunked(8, 4, budget=6, max_seqs=4, version="0.7.3")
