"""A release that reads more than kvcheck's stand-in gives (a setting, a method of a stand-in
worker) is kvcheck's gap, not the engine's crash: one line naming the stand-in and what was
read, exit 2, no verdict, whichever checking command and however the engine wrapped it."""

from __future__ import annotations

import pytest
from core.test_loaded_machine import kvcheck

HERE = "tests/core/stand_in_targets.py"


@pytest.mark.parametrize("target, read", [
    ("WorkerLacksAMethod", "_Worker.flush"),
    ("EngineWrapsTheGap", "vllm_config.watermark_config"),
])
def test_a_stand_in_gap_is_one_line_and_exit_2_never_a_fail(target, read):
    r = kvcheck("verify", f"{HERE}:{target}", "--blocks", "8", "--block-size", "2", "--ops",
                "300", "--seed", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "VIOLATION" not in r.stdout, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kvcheck: error: cannot run this release as it is: "), lines
    assert read in lines[0] and "stand_in_targets.py" in lines[0], lines
    assert "not a verdict on the engine" in lines[0]


def test_the_engine_s_own_attribute_error_is_still_its_crash():
    """Only kvcheck's stand-ins make a gap: an AttributeError of the engine's own objects
    is a crash, judged (the gap check does not excuse the engine)."""
    r = kvcheck("verify", f"{HERE}:OwnAttributeError", "--blocks", "8",
                "--block-size", "2", "--ops", "300", "--seed", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "VIOLATION" in r.stdout and "AttributeError" in r.stdout, r.stdout

