"""``benchmarks/campaign.py`` runs at a tiny budget (both parts, local processes), and refuses
bad arguments with one line and exit 2. Its figures are measured, never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/campaign.py", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_a_tiny_run_prints_both_parts():
    r = _run("--runs", "2", "--repeat", "2", "--no-ray", "--entries", "no-copy-on-write",
             "--campaign-time", "30s", "--close-repeat", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "## throughput" in out and "local: 2 workers / 1 worker = " in out
    # the 2 alternated pairs' ratios, and how busy the workers' cores were (a percentage)
    (summary,) = [line for line in out.splitlines() if line.startswith("local: ")]
    assert "pairs: median " in summary and len(summary.split("pairs: median ")[1].split()) == 3
    local = [line.split() for line in out.splitlines() if line.startswith("local ")]
    assert [row[1] for row in local] == ["1", "2"] and all(row[6].endswith("%") for row in local)
    assert "## time to the first violation" in out
    (row,) = [line for line in out.splitlines() if line.startswith("no-copy-on-write ")]
    # entry, verify, its median (fastest), exited, campaign, its median (fastest), exited,
    # speed-up, won: the pairs the campaign printed first, of the 2 alternated (3 where
    # the medians came within 10% of each other: a close call)
    fields = row.split()
    assert fields[1] == "found" and fields[5] == "found", row
    assert fields[3].startswith("(") and fields[7].startswith("("), row
    won, pairs = (int(x) for x in fields[10].split("/"))
    assert fields[9].endswith("x") and pairs in (2, 3) and 0 <= won <= pairs, row
    assert "entries both found" in out


@pytest.mark.parametrize("args", [("--runs", "0"), ("--entries", "nosuch"),
                                  ("--campaign-time", "soon"), ("--seed", "-1"),
                                  ("--close", "-0.1"), ("--close", "1.5"),
                                  ("--close-repeat", "-2")])
def test_bad_arguments(args):
    r = _run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("benchmarks/campaign.py: error: ")


@pytest.mark.parametrize("verify_s, campaign_s, pairs", [
    (1.00, 0.95, 11),  # within 10%: a close call, 11 pairs in all
    (0.95, 1.00, 11),  # whichever side leads
    (1.00, 0.50, 5),  # a clear result stays at --repeat
    (0.50, 1.00, 5),
])
def test_a_close_call_gets_more_pairs(monkeypatch, tmp_path, verify_s, campaign_s, pairs):
    """``first_violation``'s rule, with the commands' times made up: the medians within
    ``close`` of each other after ``repeat`` pairs go on to ``close_repeat`` pairs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_campaign",
                                                  ROOT / "benchmarks" / "campaign.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # (under its own name: no module "campaign" left behind)
    calls = []

    def kvcheck(*argv, first, timeout):
        calls.append(argv[0])
        t = verify_s if argv[0] == "verify" else campaign_s
        return 1, t, t, f"{first}the violation\n"

    monkeypatch.setattr(bench, "kvcheck", kvcheck)
    row = bench.first_violation("no-such-target", "1m", tmp_path, repeat=5, close=0.1,
                                close_repeat=11)
    assert row["pairs"] == pairs and calls.count("verify") == calls.count("campaign") == pairs
    assert row["campaign_won"] == (pairs if campaign_s <= verify_s else 0)
