"""``kvcheck prove``: the table, JSON, JUnit, exit codes."""

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

CORPUS = str(Path(__file__).parents[1] / "corpus" / "buggy.py")
SMALL = ["--blocks", "4", "--block-size", "2", "--seqs", "3", "--depth", "4", "--no-pairs",
         "--no-crosshair", "--budget", "60"]


def kvcheck(*args):
    return subprocess.run([sys.executable, "-m", "kvcheck", *args], capture_output=True,
                          text=True, timeout=600)


def test_reference_passes_with_junit(tmp_path):
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", *SMALL, "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS reference" in r.stdout
    cases = ET.parse(junit).getroot().iter("testcase")
    names = [c.get("name") for c in cases]
    assert any("refcount_conservation" in n for n in names)
    assert any("copy-on-write" in n for n in names)


def test_buggy_allocator_fails_with_shortest_trace(tmp_path):
    out = tmp_path / "t.json"
    r = kvcheck("prove", f"{CORPUS}:NoCopyOnWrite", *SMALL, "--json", "--trace-out", str(out))
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail"
    failed = [row for row in report["rows"] if row["result"] == "violated"]
    assert failed and all(row["engine"] == "exploration" for row in failed)
    trace = json.loads(out.read_text())
    assert [op["op"] for op in trace["ops"]] == ["allocate", "fork", "append_slot"]


def test_bad_input_exits_2():
    for args in (["prove", "nosuch"], ["prove", "--blocks", "0"], ["prove", "--blocks", "500"]):
        r = kvcheck(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


OOB = Path(__file__).parents[1] / "core" / "oob_named_otherwise.py"
SPEC_ENGINES = ("z3 k-induction", "z3 k-induction (prefix cache)", "z3 bmc", "z3 coverage")


def test_report_says_what_was_proved_and_what_was_checked(tmp_path):
    """The spec's rows (Z3 over the spec) and the target's rows (its code run) are told apart:
    in the table, the verdict line, the JSON and the JUnit suites."""
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", *SMALL, "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Proved about the spec" in r.stdout and "Checked on the target reference" in r.stdout
    verdict = r.stdout.strip().splitlines()[-1]
    import re

    m = re.match(r"PASS reference: spec (\d+)/(\d+) proved; target (\d+)/(\d+) checked", verdict)
    assert m and m[1] == m[2] and m[3] == m[4] and int(m[4]) >= 2, verdict
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    assert set(suites) == {"spec: proved about the specification", "target: checked on reference"}
    spec_cases = list(suites["spec: proved about the specification"].iter("testcase"))
    target_cases = list(suites["target: checked on reference"].iter("testcase"))
    assert len(spec_cases) == int(m[2]) and len(target_cases) == int(m[4])
    assert all(c.get("classname").startswith("kvcheck.spec.") for c in spec_cases)
    assert all(c.get("classname").startswith("kvcheck.target.") for c in target_cases)

    out = json.loads(kvcheck("prove", *SMALL, "--json").stdout)
    assert {"target", "verdict", "seconds", "rows", "counterexample"} <= set(out)  # kept
    assert out["spec"]["rows"] == int(m[2]) and out["target"]["rows"] == int(m[4])
    assert out["spec"]["verdict"] == out["target"]["verdict"] == "pass"
    assert out["summary"] in verdict
    for row in out["rows"]:
        assert row["group"] == ("spec" if row["engine"] in SPEC_ENGINES else "target"), row


def test_a_bug_in_the_target_fails_the_target_group_only():
    r = kvcheck("prove", f"{CORPUS}:NoCopyOnWrite", *SMALL, "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["spec"]["verdict"] == "pass" and out["target"]["verdict"] == "fail"
    assert "spec" in out["summary"] and "violated" in out["summary"]


def test_target_only_skips_the_spec():
    r = kvcheck("prove", *SMALL, "--target-only", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["spec"] == {"checked": False, "rows": 0, "holds": 0, "results": {},
                           "verdict": "pass"}
    assert out["rows"] and all(row["group"] == "target" for row in out["rows"])
    assert out["summary"].startswith("spec not proved (--target-only); target ")
    text = kvcheck("prove", *SMALL, "--target-only").stdout
    assert "z3 k-induction" not in text and "Proved about the spec: skipped" in text


def test_out_of_blocks_reaches_every_place_the_target_is_built(tmp_path):
    """Without --out-of-blocks the renamed exception is a crash, shown by the witness runs and
    the BFS, with a shrunk counterexample; with it, every target row holds."""
    args = ["--blocks", "3", "--block-size", "2", "--seqs", "2", "--depth", "4", "--no-pairs",
            "--target-only", "--json"]
    out = json.loads(kvcheck("prove", f"{OOB}:Renamed", *args,
                             "--trace-out", str(tmp_path / "t.json")).stdout)
    assert out["verdict"] == "fail" and out["counterexample"]["violation"]["kind"] == "crash"
    r = kvcheck("prove", f"{OOB}:Renamed", *args, "--out-of-blocks", f"{OOB}:PoolExhausted")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["target"]["verdict"] == "pass"
    r = kvcheck("prove", f"{OOB}:Renamed", *args, "--out-of-blocks", f"{OOB}:NotAnException")
    assert r.returncode == 2 and "not an exception" in r.stderr


def test_out_of_blocks_reaches_the_counterexample_shrink(tmp_path):
    """A target that breaks exception safety when it runs out of blocks, and signals that with
    a renamed exception: the shortest trace is that violation, shrunk with the renamed
    exception understood (a shrinker without it would see only crashes: 'not shrunk')."""
    target = tmp_path / "renamed_partial.py"
    target.write_text('''
from corpus.buggy import PartialAllocate
from kvcheck.impl.errors import OutOfBlocks
from oob_named_otherwise import PoolExhausted, Renamed


class Both(Renamed):
    def allocate(self, seq, n_tokens):
        try:
            return PartialAllocate.allocate(self, seq, n_tokens)
        except OutOfBlocks as exc:
            raise PoolExhausted(str(exc)) from None
''')
    import os

    path = os.pathsep.join([str(OOB.parent), str(Path(CORPUS).parents[1])])
    r = subprocess.run([sys.executable, "-m", "kvcheck", "prove", f"{target}:Both", "--blocks", "3",
                        "--block-size", "2", "--seqs", "2", "--depth", "4", "--no-pairs",
                        "--target-only", "--json", "--out-of-blocks",
                        "oob_named_otherwise:PoolExhausted"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": path})
    assert r.returncode == 1, r.stdout + r.stderr
    trace = json.loads(r.stdout)["counterexample"]
    assert trace["violation"]["kind"] != "crash", trace["violation"]
    assert trace["minimality"].startswith("1-minimal"), trace["minimality"]
    assert [op["op"] for op in trace["ops"]] == ["allocate"]


def test_block_size_1_marks_impossible_classes_not_applicable(tmp_path):
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", "reference", "--block-size", "1", "--blocks", "3", "--seqs", "2",
                "--depth", "4", "--no-crosshair", "--no-pairs", "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    skipped = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")
               if c.find("skipped") is not None]
    # (an append in place at one slot per block only into a reserved block: applicable)
    na_classes = {"append/copy-on-write",
                  "append/out-of-blocks-in-copy-on-write", "fork/copies-partial-tail",
                  "fork/out-of-blocks", "rebase/copies-partial-tail", "rebase/out-of-blocks"}
    assert {n.split("reachable: ")[1].split(" [")[0] for n in skipped} == na_classes, skipped
    na = [line for line in r.stdout.splitlines() if "reachable: " in line and " not applicable " in line]
    assert {line.split("reachable: ")[1].split()[0] for line in na} == na_classes
    assert "cannot occur at this scope: Z3 shows no state satisfying every invariant" in r.stdout
    assert "(6 not applicable at this scope)" in r.stdout.strip().splitlines()[-1]


def test_a_class_the_spec_rules_out_fails_prove(monkeypatch):
    """A class Z3 shows no valid state can step into, at this scope or a larger one, is a
    disproved property of the spec (the spec says nothing about it): FAIL, shown."""
    from kvcheck.prove import Settings, prove
    from kvcheck.spec.outcomes import OUTCOMES

    kind, outcome, _ = OUTCOMES["append/copy-on-write"]
    monkeypatch.setitem(OUTCOMES, "append/copy-on-write",
                        (kind, outcome, lambda L, pre, post, op: False))
    for block_size in (2, 1):
        report = prove("reference", Settings(3, block_size, 2, 4, pairs=False, crosshair=False))
        row = next(r for r in report.rows if r.property == "reachable: append/copy-on-write")
        assert row.result == "violated" and report.verdict == "fail", (block_size, row)
        assert "the spec says nothing about it" in row.detail


def test_coverage_unreachable_within_the_depth_is_a_warning_with_the_depth_that_reaches_it(tmp_path):
    """At depth 2 some classes need a longer run: PASS (exit 0) with a warning naming the
    depth that reaches each, and JUnit skips them (never a failure)."""
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", "--blocks", "3", "--block-size", "2", "--seqs", "2", "--depth", "2",
                "--no-pairs", "--no-crosshair", "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("PASS reference")
    warnings = [line for line in r.stdout.splitlines() if line.startswith("warning: ")]
    cow = next(line for line in warnings if "reachable: append/copy-on-write:" in line)
    assert "no run within depth 2 shows it" in cow
    assert "a run of 3 operations reaches it (--depth 3 covers it)" in cow
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0"
    case = next(c for c in root.iter("testcase") if "reachable: append/copy-on-write" in c.get("name"))
    assert case.find("skipped").get("message").startswith("warning: ")


def test_a_budget_that_cuts_the_work_short_is_inconclusive_never_fail(tmp_path):
    """--budget is an outer limit only: what it cuts reads unknown, the verdict is
    INCONCLUSIVE (exit 4), says what was not decided and which flag decides it, and the
    JUnit has no failure."""
    junit = tmp_path / "prove.xml"
    r = kvcheck("prove", "--blocks", "6", "--block-size", "2", "--seqs", "3", "--depth", "6",
                "--budget", "0.5", "--junit", str(junit))
    assert r.returncode == 4, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("INCONCLUSIVE reference: "), lines[-1]
    decided = next(line for line in lines if line.startswith("not decided: "))
    assert "a larger --budget decides it" in decided
    assert " violated " not in r.stdout
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0" and any(
        (c.find("skipped") is not None and c.find("skipped").get("message").startswith("inconclusive"))
        for c in root.iter("testcase"))
    j = json.loads(kvcheck("prove", "--blocks", "6", "--block-size", "2", "--seqs", "3",
                           "--depth", "6", "--budget", "0.5", "--json").stdout)
    assert j["verdict"] == "inconclusive" and "--budget" in j["not_decided"]


def test_a_solver_out_of_effort_is_inconclusive_and_names_effort(monkeypatch):
    """A query that uses its resource units up is undecided the same way on every machine:
    INCONCLUSIVE, naming --effort."""
    from kvcheck.proofs import effort, induction
    from kvcheck.prove import Settings, prove

    monkeypatch.setattr(effort, "QUERY_UNITS", 1)
    monkeypatch.setattr(induction, "PORTFOLIO_SLICES_RLIMIT", (1,))
    report = prove("reference", Settings(4, 2, 2, 3, pairs=False, crosshair=False))
    assert report.verdict == "inconclusive", report.summary()
    assert not [r for r in report.rows if r.result == "violated"]
    assert "a larger --effort decides it" in report.not_decided()
    assert all(r.undecided == effort.EFFORT for r in report.undecided())


def test_effort_counts_z3_resource_units():
    import z3

    from kvcheck.proofs import effort

    before = effort.used()
    x = z3.Ints(" ".join(f"x{i}" for i in range(12)))
    s = z3.Solver()
    s.add(z3.Distinct(*x), *[z3.And(v >= 0, v < 11) for v in x])  # pigeonhole: unsat, work
    effort.limit(s, 10_000)
    assert effort.check(s) == effort.EFFORT  # its units ran out, not the clock
    assert effort.used() - before >= 10_000
    effort.limit(s, 0, timeout_ms=1)
    assert effort.check(s) in (effort.TIME, effort.UNSAT)


def test_a_class_only_other_operations_reach_is_not_one_the_target_failed_to_show():
    """At one slot per block an in-place append needs a reserved block (a rollback's or a
    lookahead's): the seed-shaped reference, without those operations, is not said to have
    never shown it."""
    from kvcheck.prove import Settings, prove

    report = prove("reference", Settings(4, 1, 2, 4, pairs=False, crosshair=False))
    row = next(r for r in report.rows if r.property == "z3 witness runs pass the oracle")
    assert "reached only through operations the target does not offer: append/in-place " \
        "(its witness uses " in row.detail, row.detail
    never = row.detail.split("never shown by the target: ")[1] if "never shown" in row.detail \
        else ""
    assert "append/in-place" not in never
