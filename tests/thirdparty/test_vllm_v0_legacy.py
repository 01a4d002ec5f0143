"""vLLM BlockSpaceManager v1 (0.3.3 / 0.4.0) loaded from the releases' own files
(``impl/thirdparty/vllm_v0_legacy.py``) and the raw replays of vLLM #1556 / PR #3347
(``benchmarks/historical/hist_replays.py``). Skips when a release is not installed
(``kvcheck install vllm-v0-legacy==VERSION``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvcheck.impl.thirdparty import _loader, install, vllm_v0_legacy

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "kvcheck_historical_replays_legacy", ROOT / "benchmarks" / "historical" / "hist_replays.py")
replays = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replays)


def _need(version: str) -> None:
    if not _loader.is_installed(install.select(vllm_v0_legacy.ENGINE_KEY, version)):
        pytest.skip(f"vLLM {version} sources not installed "
                    f"(kvcheck install vllm-v0-legacy=={version})")


@pytest.mark.parametrize("version,module,cls", [
    ("0.3.3", "vllm.core.block_manager", "BlockSpaceManager"),
    ("0.4.0", "vllm.core.block_manager_v1", "BlockSpaceManagerV1"),
])
def test_each_release_loads_its_own_block_manager(version, module, cls):
    _need(version)
    mods = vllm_v0_legacy.load(version)
    assert mods.dist.version == version
    assert vllm_v0_legacy.manager_class(mods).__name__ == cls
    assert vllm_v0_legacy.manager_module(mods.root) == module
    m = vllm_v0_legacy.build(version, num_blocks=4, block_size=2, sliding_window=4)
    assert m.block_sliding_window == 2 and m.get_num_free_gpu_blocks() == 4


def test_a_version_outside_the_range_is_refused():
    with pytest.raises(install.InstallError, match="0.3.3 .. 0.4.0"):
        vllm_v0_legacy.load("0.4.1")


def test_1556_double_free_on_0_3_3_not_on_0_4_0():
    _need("0.3.3")
    _need("0.4.0")
    buggy, evidence = replays.replay_vllm_1556("0.3.3")
    assert buggy and "Double free!" in evidence, evidence
    fixed, evidence = replays.replay_vllm_1556("0.4.0")
    assert not fixed and "4 of 4 blocks free" in evidence, evidence


def test_a_wrapped_table_keeps_one_reference_per_sequence():
    """The semantics the catalogue's spec design rests on: a table naming one block at
    positions i and i + W holds one reference to it (allocate sets ref_count once)."""
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        m = vllm_v0_legacy.build(version, num_blocks=4, block_size=1, sliding_window=1)
        a = vllm_v0_legacy.Seq(0, 3, 1)
        m.allocate(vllm_v0_legacy.Group(a))
        (only,) = set(m.get_block_table(a))
        assert m.get_block_table(a) == [only] * 3
        assert m.block_tables[0][0].ref_count == 1 and m.get_num_free_gpu_blocks() == 3


def test_fork_of_a_wrapped_table_counts_each_entry_on_0_3_3_only():
    refs = {}
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        m = vllm_v0_legacy.build(version, num_blocks=4, block_size=1, sliding_window=1)
        a, c = vllm_v0_legacy.Seq(0, 2, 1), vllm_v0_legacy.Seq(1, 2, 1)
        m.allocate(vllm_v0_legacy.Group(a))
        m.fork(a, c)
        refs[version] = m.block_tables[0][0].ref_count
    assert refs == {"0.3.3": 3, "0.4.0": 2}  # two sequences hold it


def test_stale_entry_after_copy_on_write_is_written_into_on_both_releases():
    """docs/findings.md F10: what PR #3347 did not fix."""
    for version in ("0.3.3", "0.4.0"):
        _need(version)
        crossed, evidence = replays.replay_v1_window_stale_entry(version)
        assert crossed, (version, evidence)
