"""``vllm-v1-engine`` builds and runs on the releases it claims (issue 34 §1).

The claimed range (``install.ENGINES``: the ``vllm-v1`` family, 0.6.4.post1 .. 0.34.0) is
what README states; every installed release of it is swept by
``benchmarks/vllm_v1_releases.py`` (not the suite). Here, cheaply: one short run (4
requests) at the defaults, and one with drafts and priority scheduling where the release has
them, on the releases where what the adapter stands in for differs -- the ends of each
range (the early scheduler's first and last, the current family's first and last), the
edges of the one-module ``vllm.utils`` (to 0.10.x) and of the null block (0.8.3), and the
releases whose stand-ins were mended for them: the multimodal registry's
``get_encdec_max_encoder_len`` (0.14.0 .. 0.15.1), ``VllmConfig.is_encoder_only`` (0.28.0),
``CacheConfig.enable_mamba_fine_grained_prefix_cache`` (0.30.0). A setting or module the
adapter does not give raises at build or in a step (``StandInMissing``): the test fails.
The model runner's output record is built as each release types it: a crash in the
release's ``update_from_output`` on a record of the wrong type (0.7.3's ``typing.List``,
0.11.1's NumPy arrays, both found by the sweep) would fail here. A release without drafts
(before 0.7.3) or a policy (before 0.9.2) refuses them in words.
"""

from __future__ import annotations

import pytest

from kvcheck.impl.thirdparty import install
from kvcheck.models.engine.model import EngineScope
from kvcheck.targets.loading import TargetError
from kvcheck.verify import verify

# release -> (drafts, priority): what its scheduler has (0.7.3 on / 0.9.2 on)
RELEASES = {
    "0.6.4.post1": (False, False),  # the early family's first (token_inputs, append_slots)
    "0.7.3": (True, False),  # drafts and a list a request, typing.List-annotated
    "0.8.2": (True, False),  # the last without a null block
    "0.8.3": (True, False),  # the first with one
    "0.10.1.1": (True, True),  # the early family's last; vllm.utils one module
    "0.10.2": (True, True),  # the current family's first (bc_linter)
    "0.11.0": (True, True),  # vllm.utils a package
    "0.11.1": (True, True),  # sampled tokens a NumPy array a request (0.11.1, 0.11.2)
    "0.14.0": (True, True),  # get_encdec_max_encoder_len at start-up ...
    "0.15.1": (True, True),  # ... to 0.15.1
    "0.28.0": (True, True),  # is_encoder_only
    "0.30.0": (True, True),  # enable_mamba_fine_grained_prefix_cache
    "0.34.0": (True, True),  # the range's last
}


def _ensure(version):
    install.ensure(install.ENGINES[install.select("vllm-v1", version, with_family=True).key],
                   version)


def _run(version, spec=0, policy="fcfs"):
    scope = EngineScope(8, 4, spec=spec, policy=policy, caching=True, budget=16)
    return verify(f"vllm-v1-engine@{version}", 8, 4, 60, 0, model="engine", scope=scope,
                  do_shrink=False, extra={"requests": 4})


def test_the_claimed_range_is_the_install_range():
    """README's ``vllm-v1-engine@LOW..HIGH`` is the family's range in ``install.ENGINES``,
    and the releases below are in it."""
    rows = [install.ENGINES["vllm-v1-early"], install.ENGINES["vllm-v1"]]
    assert (rows[0].low, rows[1].high) == ("0.6.4.post1", "0.34.0")
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"`vllm-v1-engine@{rows[0].low}..{rows[1].high}`" in readme
    for v in RELEASES:
        install.select("vllm-v1", v, with_family=True)  # raises outside the range


@pytest.mark.parametrize("version", list(RELEASES))
def test_the_release_builds_and_runs(version):
    drafts, priority = RELEASES[version]
    _ensure(version)
    r = _run(version)
    assert r.verdict == "pass", (version, r.violation)
    st = r.state.stats
    assert r.state.target.version == version
    assert st["finished"] + st["aborted"] == st["requests"] == 4 and st["kv_calls"] > 10, st
    if drafts and priority:
        r = _run(version, spec=3, policy="priority")
        assert r.verdict == "pass", (version, r.violation)
        assert r.state.stats["requests"] == 4, r.state.stats
    for spec, policy, has in ((3, "fcfs", drafts), (0, "priority", priority)):
        if not has:  # refused in words at build, never a stand-in gap
            with pytest.raises(TargetError, match="MisuseError: .* has no"):
                _run(version, spec=spec, policy=policy)
