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
