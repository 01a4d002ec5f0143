"""``kvcheck campaign`` as a user runs it (a fresh process each time): exit codes, the
summary.json / junit.xml / index.html it leaves, signatures keeping their shortest trace,
resuming, runs cut by the time budget (never PASS), a target that ends or wedges its
worker process reported as a finding, coverage warnings, one corpus bug of every model."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
BUGGY = TESTS / "corpus" / "buggy.py"
ENDING = TESTS / "core" / "ending_targets.py"
SLOW = Path(__file__).with_name("slow_targets.py")


def campaign(*args, out: Path, timeout: float = 300):
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign", *map(str, args),
                        "--out", str(out)], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    return p


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def runs(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_a_passing_campaign(tmp_path):
    out = tmp_path / "c"
    p = campaign("reference", "--runs", "4", "--workers", "2", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("PASS reference: 4 campaign runs"), p.stdout
    s = summary(out)
    assert s["format"] == "kvcheck.campaign-summary" and s["verdict"] == "pass"
    assert s["runs"] == {"started": 4, "completed": 4, "passed": 4, "failed": 0, "cut": 0,
                         "refused": 0, "errors": 0}
    assert s["ops"] == sum(r["ops"] for r in runs(out)) > 0
    assert s["signatures"] == [] and s["coverage"]["classes"] is True
    assert set(s["coverage"]["total"]) >= {"allocate/ok", "append/copy-on-write"}
    assert [r["run"] for r in runs(out)] == [0, 1, 2, 3] or sorted(r["run"] for r in runs(out)) \
        == [0, 1, 2, 3]
    for r in runs(out):
        assert r["command"].startswith("kvcheck verify reference --blocks ")
    suite = ET.fromstring((out / "junit.xml").read_text()).find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 1 and cases[0].find("failure") is None and cases[0].find("skipped") is None
    assert "PASS" in (out / "index.html").read_text()


def test_violations_grouped_by_signature_with_their_shortest_trace(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{BUGGY}:NoCopyOnWrite", "--runs", "8", "--workers", "2", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith("found: [run "), p.stdout
    assert "FAIL " in p.stdout and "replay: kvcheck replay " in p.stdout
    s = summary(out)
    assert s["verdict"] == "fail" and s["signatures"]
    lines = runs(out)
    failed = [r for r in lines if r["verdict"] == "fail"]
    assert len(failed) == s["runs"]["failed"] >= 2
    assert sum(e["runs"] for e in s["signatures"]) == len(failed)
    for e in s["signatures"]:
        assert e["kind"] == "contract" and e["clause"].startswith("append_slot: ")
        assert set(e["op_kinds"]) <= {"allocate", "append_slot", "fork", "free_seq"}
        mine = [r for r in failed if r["signature"] == e["id"]]
        assert e["shortest"]["length"] == min(r["length"] for r in mine)
        assert e["shortest"]["run"] == min(r["run"] for r in mine
                                           if r["length"] == e["shortest"]["length"])
        trace = out / e["shortest"]["trace"]
        data = json.loads(trace.read_text())
        assert data["format"] == "kvcheck.trace" and len(data["ops"]) == e["shortest"]["length"]
        assert (out / e["shortest"]["html"]).read_text().startswith("<!DOCTYPE html>")
        replay = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay", str(trace)],
                                capture_output=True, text=True, timeout=120)
        assert replay.returncode == 1 and "REPRODUCED" in replay.stdout, replay.stdout
        assert e["rerun"].startswith("kvcheck verify ") and "--seed" in e["rerun"]
    # JUnit: one failed test case per signature; the index links every trace's page
    cases = ET.fromstring((out / "junit.xml").read_text()).iter("testcase")
    assert sorted(c.get("name") for c in cases if c.find("failure") is not None) == sorted(
        f"{e['kind']}: {e['clause']} [{'+'.join(e['op_kinds'])}]" for e in s["signatures"])
    index = (out / "index.html").read_text()
    for e in s["signatures"]:
        assert f'href="{e["shortest"]["html"]}"' in index


def test_resume_continues_with_the_next_runs_and_merges(tmp_path):
    out = tmp_path / "c"
    first = campaign(f"{BUGGY}:NoCopyOnWrite", "--runs", "3", out=out)
    assert first.returncode == 1
    before = summary(out)
    again = campaign(f"{BUGGY}:NoCopyOnWrite", "--runs", "2", out=out)
    assert again.returncode == 1, again.stdout + again.stderr
    s = summary(out)
    assert sorted(r["run"] for r in runs(out)) == [0, 1, 2, 3, 4]
    assert s["runs"]["completed"] == 5 and len(s["sessions"]) == 2
    assert s["sessions"][1]["runs"] == {"first": 3, "next": 5}
    assert sum(e["runs"] for e in s["signatures"]) == s["runs"]["failed"] >= \
        before["runs"]["failed"]
    assert {e["id"] for e in before["signatures"]} <= {e["id"] for e in s["signatures"]}
    # another campaign's directory is bad input, before anything runs
    other = campaign(f"{BUGGY}:NoCopyOnWrite", "--runs", "1", "--seed", "5", out=out)
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert "holds a campaign with seed 0" in other.stderr


def test_runs_cut_by_the_time_budget_are_never_a_pass(tmp_path):
    """No run finished within --time: INCONCLUSIVE (exit 4), never PASS or FAIL."""
    out = tmp_path / "c"
    p = campaign(f"{SLOW}:SlowAppends", "--time", "1s", "--workers", "2", out=out)
    assert p.returncode == 4, p.stdout + p.stderr
    assert p.stdout.startswith("INCONCLUSIVE "), p.stdout
    s = summary(out)
    assert s["verdict"] == "incomplete" and s["runs"]["completed"] == 0
    assert s["runs"]["cut"] == s["runs"]["started"] == 2
    case = ET.fromstring((out / "junit.xml").read_text()).find("testsuite/testcase")
    assert case.find("skipped") is not None


def test_an_interrupted_campaign_is_never_a_pass(tmp_path):
    """Ctrl-C once runs have passed: exit 130, INTERRUPTED (never PASS), and summary.json
    and junit.xml say interrupted. The signal is sent when the campaign's own files show
    passed runs, not after a time, so a loaded machine changes nothing."""
    import signal
    import time

    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", "campaign", "reference",
                             "--workers", "2", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def passed() -> int:
        try:
            return sum(r["verdict"] == "pass" for r in runs(out))
        except (OSError, ValueError):
            return 0  # (not written yet, or a line being written)

    while passed() < 2 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "PASS" not in stdout and "Traceback" not in stderr
    assert stdout.startswith("INTERRUPTED reference: "), stdout
    assert stderr.startswith("kvcheck: interrupted")
    s = summary(out)
    assert s["verdict"] == "interrupted" and s["interrupted"] and s["runs"]["completed"] >= 2
    case = ET.fromstring((out / "junit.xml").read_text()).find("testsuite/testcase")
    assert case.find("skipped").get("message").startswith("no verdict (interrupted)")
    # resumed and finished, the campaign has a verdict again
    p = campaign("reference", "--runs", "1", "--workers", "1", out=out)
    assert p.returncode == 0 and summary(out)["verdict"] == "pass", p.stdout + p.stderr


def test_an_interrupt_at_start_up_is_never_a_pass(tmp_path):
    """Ctrl-C as soon as the campaign's directory exists (before any run could end)."""
    import signal
    import time

    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", "campaign", f"{SLOW}:SlowAppends",
                             "--workers", "2", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not (out / "campaign.json").exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "PASS" not in stdout and "Traceback" not in stderr
    assert stderr.startswith("kvcheck: interrupted")
    if (out / "summary.json").exists():  # interrupted once the runs had started: they were cut
        assert summary(out)["verdict"] == "interrupted"


START_UP_INTERRUPT = """
import os, signal, sys
import kvcheck.campaign.pools as pools

def preload(model, _original=pools.preload):
    class Field:  # a Ctrl-C while a class is made, as in an import of a dataclass:
        def __set_name__(self, owner, name):  # Python would turn it into RuntimeError
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**6):
                pass
    type("Made", (), {"field": Field()})
    _original(model)

pools.preload = preload
from kvcheck.cli import main
sys.exit(main(["campaign", "reference", "--workers", "1", "--out", sys.argv[1]]))
"""


def test_a_ctrl_c_in_the_middle_of_start_up_is_an_interruption(tmp_path):
    """Ctrl-C while the campaign imports what its runs need: deferred, then acted on by the
    campaign's loop (INTERRUPTED, exit 130), never an internal error nor a run to the end
    (a KeyboardInterrupt raised inside an import is turned into another error, or
    swallowed)."""
    out = tmp_path / "c"
    p = subprocess.run([sys.executable, "-c", START_UP_INTERRUPT, str(out)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 130, p.stdout + p.stderr
    assert p.stdout.startswith("INTERRUPTED reference: 0 runs completed"), p.stdout
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr
    assert summary(out)["verdict"] == "interrupted"


@pytest.mark.parametrize("cls,kind", [("SegfaultsInFork", "crash"), ("KilledInFork", "crash"),
                                      ("HardExitsInFork", "crash")])
def test_a_target_that_ends_its_worker_process_is_a_finding(tmp_path, cls, kind):
    out = tmp_path / "c"
    p = campaign(f"{ENDING}:{cls}", "--runs", "3", "--workers", "2", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    s = summary(out)
    assert s["runs"]["completed"] == 3 and s["runs"]["errors"] == 0
    (e,) = s["signatures"]
    assert e["kind"] == kind and e["clause"] == "fork" and "fork" in e["op_kinds"]
    if cls != "HardExitsInFork":  # os._exit inside a call is trapped: an ordinary crash
        assert e["op_kinds"] == ["fork"]  # (not shrunk: what was in flight)
        assert "the target ended the process during operation" in e["shortest"]["witness"]
        assert e["shortest"]["minimality"].startswith("not shrunk: the target ended the process")
    trace = json.loads((out / e["shortest"]["trace"]).read_text())
    assert trace["ops"][-1]["op"] == "fork"


def test_a_violation_found_before_shrinking_ended_the_worker_is_the_finding(tmp_path):
    """As for ``kvcheck verify`` (tests/core/test_process_ending.py): the run finds a leak, a
    replay while shrinking segfaults; the signature is the run's violation on the run's own
    operations, not a crash on a mixture of the replays'."""
    out = tmp_path / "c"
    p = campaign(f"{ENDING}:LeaksThenSegfaultsWhenShrunk", "--runs", "1", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    (e,) = summary(out)["signatures"]
    assert e["kind"] != "crash" and "free_seq" in e["clause"], e
    assert "while shrinking, a replay ended the process" in e["shortest"]["minimality"]
    trace = json.loads((out / e["shortest"]["trace"]).read_text())
    assert trace["ops"][-1]["op"] == "free_seq" and trace["violation"]["step"] == len(trace["ops"])


def test_a_target_that_wedges_its_worker_process_is_a_hang(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{ENDING}:HangsBeyondInterruption", "--runs", "1", "--timeout", "0.5",
                 out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    (e,) = summary(out)["signatures"]
    assert e["kind"] == "hang" and "could not be interrupted" in e["shortest"]["witness"]


@pytest.mark.parametrize("args,words", [
    (("nosuch",), "unknown target 'nosuch'"),
    ((f"{ENDING}:ExitsInConstructor", "--runs", "2"), "the target refused every shape drawn"),
    (("reference", "--time", "soon"), "expected a duration"),
    (("reference", "--block-manager", "reference"), "--block-manager is for --model scheduler"),
    (("reference", "--ray", "--model", "nope"), "invalid choice"),
    (("reference", "--runs", "0"), "argument --runs: expected a positive integer, got 0"),
    (("reference", "--workers", "0"), "argument --workers: expected a positive integer"),
    (("reference", "--time", "0s"), "expected a positive duration"),
    (("reference", "--time", "-5m"), "argument --time"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    p = campaign(*args, out=tmp_path / "c")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and words in p.stderr, p.stderr
    assert p.stdout == ""
    assert not (tmp_path / "c").exists()  # nothing ran: the same --out serves the fixed command


def test_an_unwritable_out_is_bad_input(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    p = campaign("reference", "--runs", "1", out=f / "sub")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"kvcheck: error: --out {f / 'sub'}: cannot create it")


def test_an_out_that_is_not_a_campaign_is_bad_input(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    (out / "campaign.json").write_text("{}")
    p = campaign("reference", "--runs", "1", out=out)
    assert p.returncode == 2 and "not a kvcheck campaign's state" in p.stderr
    f = tmp_path / "file"
    f.write_text("")
    p = campaign("reference", "--runs", "1", out=f)
    assert p.returncode == 2 and "not a directory" in p.stderr


def test_coverage_warns_of_classes_that_never_occurred(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{SLOW}:NoFork", "--runs", "3", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    c = summary(out)["coverage"]
    assert c["total"]["fork/ok"] == 0
    assert "fork/ok" in c["not_offered"] and "append/copy-on-write" in c["not_offered"]
    assert "note: classes the target cannot show" in p.stdout
    out2 = tmp_path / "c2"
    # seed 2: runs 1 and 2 are small scopes of block size 1 (the others are refused)
    p = campaign(f"{SLOW}:OnlyBlockSizeOne", "--runs", "3", "--seed", "2", out=out2)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "append/in-place" in summary(out2)["coverage"]["never"]
    assert "warning: outcome classes that never occurred: " in p.stdout


def test_coverage_says_not_applicable_for_what_a_lazy_target_without_refusals_cannot_show(
        tmp_path):
    out = tmp_path / "c"
    p = campaign("reference", "--runs", "3", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    c = summary(out)["coverage"]
    lazy = {"fork/copies-partial-tail", "fork/out-of-blocks"}
    assert set(c["not_applicable"]) == lazy | {"allocate/refused"}, c
    assert "lazy" in c["not_applicable"]["fork/out-of-blocks"]
    assert "refused nothing" in c["not_applicable"]["allocate/refused"]
    assert not set(c["not_applicable"]) & set(c["never"] + c["not_offered"])
    assert "warning: outcome classes that never occurred" not in p.stdout, p.stdout
    assert ("note: not applicable to this target: fork/copies-partial-tail, fork/out-of-blocks "
            "(the target's fork is lazy: ") in p.stdout
    assert "not applicable: the target refused nothing" in (out / "index.html").read_text()
    eager = tmp_path / "e"  # forks that copy their partial tail: those classes apply
    p = campaign("reference-eager", "--runs", "3", out=eager)
    assert p.returncode == 0, p.stdout + p.stderr
    c = summary(eager)["coverage"]
    assert c["total"]["fork/copies-partial-tail"] > 0
    assert not lazy & set(c["not_applicable"]) and "allocate/refused" in c["not_applicable"]


def test_a_class_the_counterexample_is_never_said_to_have_never_occurred(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{BUGGY}:NoCopyOnWrite", "--runs", "3", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    c = summary(out)["coverage"]
    assert c["total"]["append/copy-on-write"] == 0  # every one was the bug (none passed)
    assert c["counterexample"] == ["append/copy-on-write"]
    assert "append/copy-on-write" not in c["never"]
    warning = next(ln for ln in p.stdout.splitlines() + [""] if ln.startswith("warning: "))
    assert "append/copy-on-write" not in warning, p.stdout
    assert "note: classes that occurred only in a counterexample: append/copy-on-write" in p.stdout


def test_the_verdict_lists_what_the_target_made_vacuous(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{SLOW}:DeclaresVacuous", "--runs", "2", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("VACUOUS for this target: "))
    assert "refcount_conservation (the test target derives its counts)" in line
    assert "the contracts of" in line and "fork" in line
    vac = summary(out)["vacuous"]
    assert vac["refcount_conservation"] == "the test target derives its counts" and "fork" in vac
    plain = tmp_path / "p"
    assert campaign(f"{SLOW}:NoFork", "--runs", "1", out=plain).returncode == 0
    assert "vacuous" not in summary(plain)  # nothing declared: nothing listed (as verify)


def test_json_prints_the_summary(tmp_path):
    p = campaign("reference", "--model", "scheduler", "--runs", "2", "--json", out=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["verdict"] == "pass" and s["model"] == "scheduler"
    assert s["coverage"] == {"classes": False, "note": s["coverage"]["note"]}
    assert "no outcome classes" in s["coverage"]["note"]


CORPUS = [
    ("blocks", f"{BUGGY}:ReleaseBeforeAllocate", "contract"),
    ("prefix", f"{TESTS / 'prefix' / 'buggy_prefix.py'}:PartialBlockCached", "invariant"),
    ("scheduler", f"{TESTS / 'scheduler' / 'buggy.py'}:DecodeTwice", "policy"),
    ("device", f"{SLOW}:copy_full_block", "contract"),
    ("hybrid", f"{TESTS / 'corpus' / 'hybrid.py'}:FreeOneGroup", "invariant"),
]


@pytest.mark.parametrize("model,target,kind", CORPUS, ids=[c[0] for c in CORPUS])
def test_a_corpus_bug_of_every_model_is_found(tmp_path, model, target, kind):
    out = tmp_path / "c"
    p = campaign(target, "--model", model, "--runs", "6", "--workers", "2", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    s = summary(out)
    assert s["model"] == model and any(e["kind"] == kind for e in s["signatures"]), s
    for e in s["signatures"]:
        data = json.loads((out / e["shortest"]["trace"]).read_text())
        assert data["model"] == model


@pytest.mark.parametrize("model", ["blocks", "prefix", "scheduler", "device", "hybrid"])
def test_every_model_passes_on_its_reference(tmp_path, model):
    out = tmp_path / "c"
    p = campaign("--model", model, "--runs", "2", "--workers", "2", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    s = summary(out)
    assert s["verdict"] == "pass" and s["model"] == model and s["runs"]["passed"] == 2
    assert s["ops"] > 0
    verb = {"blocks": "verify", "prefix": "verify-prefix", "scheduler": "verify-scheduler",
            "device": "verify-device", "hybrid": "verify-hybrid"}[model]
    assert all(r["command"].startswith(f"kvcheck {verb} ") for r in runs(out))
    if model == "hybrid":  # its own classes, counted from its oracle (not the block manager's)
        assert set(s["coverage"]["total"]) == {"hybrid/hit", "hybrid/window-drop",
                                               "hybrid/out-of-blocks",
                                               "hybrid/out-of-blocks-after-a-drop",
                                               "hybrid/append-tokens"}, s["coverage"]
        assert s["coverage"]["total"]["hybrid/window-drop"] > 0


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        self.hrefs += [v for k, v in attrs if k == "href"]


def test_the_outputs_parse_and_every_trace_replays_and_reports(tmp_path):
    out = tmp_path / "c"
    p = campaign(f"{BUGGY}:FreeWithoutRefcounts", "--runs", "4", "--workers", "2", out=out)
    assert p.returncode == 1, p.stdout + p.stderr
    s = summary(out)
    assert s["signatures"]
    state = json.loads((out / "campaign.json").read_text())
    assert state["format"] == "kvcheck.campaign" and state["next_run"] == 4
    suite = ET.fromstring((out / "junit.xml").read_text()).find("testsuite")
    assert int(suite.get("failures")) == len(suite.findall("testcase")) == len(s["signatures"])
    links = Links()
    links.feed((out / "index.html").read_text())
    assert {"summary.json", "junit.xml", "runs.jsonl"} <= set(links.hrefs)
    for href in links.hrefs:
        assert (out / href).is_file(), href
    for e in s["signatures"]:
        trace = out / e["shortest"]["trace"]
        assert e["replay"] == f"kvcheck replay {trace}"
        r = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay", str(trace)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "REPRODUCED" in r.stdout, r.stdout + r.stderr
        page = tmp_path / f"{e['id']}.html"
        r = subprocess.run([sys.executable, "-m", "kvcheck.cli", "report", str(trace), "-o",
                            str(page)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert page.read_text().startswith("<!DOCTYPE html>")


def test_the_progress_line_is_drawn_only_on_a_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    import os
    import threading

    argv = [sys.executable, "-m", "kvcheck.cli", "campaign", "reference", "--runs", "6",
            "--workers", "2", "--out", str(tmp_path / "tty")]
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    got: list[bytes] = []

    def pump():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            got.append(data)

    reader = threading.Thread(target=pump)
    reader.start()
    stdout = proc.communicate(timeout=300)[0].decode()
    reader.join(timeout=10)
    os.close(master)
    terminal = b"".join(got).decode(errors="replace")
    assert proc.returncode == 0, stdout + terminal
    for words in ("campaign: ", " runs done", " checked ops/s", " signature(s)"):
        assert words in terminal, terminal
    assert "runs done" not in stdout
    piped = campaign("reference", "--runs", "2", out=tmp_path / "piped")
    assert piped.returncode == 0 and "runs done" not in piped.stderr + piped.stdout


def test_run_0_is_verify_at_its_defaults_recorded_like_any_run_and_resume_keeps_the_plan(
        tmp_path):
    from kvcheck.campaign.plan import PLAN, Settings, draw

    out = tmp_path / "c"
    p = campaign("reference", "--runs", "1", out=out)
    assert p.returncode == 0, p.stdout + p.stderr
    (line,) = runs(out)
    assert line["run"] == 0 and line["verdict"] == "pass" and line["ops"] == 10_000
    assert line["shape"] == "32 x 4, 10000 ops"
    # (shrinking's defaults are every command's: the command at its defaults, exactly)
    assert line["command"] == ("kvcheck verify reference --blocks 32 --block-size 4 --ops 10000 "
                               "--seed 0")
    assert sum(line["coverage"].values()) == 10_000  # counted like any run
    s = summary(out)
    assert s["runs"]["completed"] == 1 and s["ops"] == 10_000
    assert s["coverage"]["total"] == line["coverage"]
    assert json.loads((out / "campaign.json").read_text())["plan"] == PLAN
    again = campaign("reference", "--runs", "2", out=out)
    assert again.returncode == 0, again.stdout + again.stderr
    settings = Settings("reference")
    specs = sorted((r["spec"] for r in runs(out)), key=lambda x: x["run"])
    assert specs == [draw(settings, n).to_json() for n in range(3)]
    # a campaign begun before run 0 was the defaults (no plan in its state) resumes its own
    # sequence: run n is the swarm's draw n
    old = tmp_path / "old"
    assert campaign("reference", "--runs", "1", out=old).returncode == 0
    state = json.loads((old / "campaign.json").read_text())
    del state["plan"]
    (old / "campaign.json").write_text(json.dumps(state))
    p = campaign("reference", "--runs", "2", out=old)
    assert p.returncode == 0, p.stdout + p.stderr
    specs = sorted((r["spec"] for r in runs(old)), key=lambda x: x["run"])
    assert specs[1:] == [draw(settings, n, plan=1).to_json() for n in (1, 2)]
    assert json.loads((old / "campaign.json").read_text())["plan"] == 1
    # one begun under plan 2 (no small scopes first) resumes with plan 2's swarm
    two = tmp_path / "two"
    assert campaign("reference", "--runs", "1", out=two).returncode == 0
    begun = json.loads((two / "campaign.json").read_text())
    (two / "campaign.json").write_text(json.dumps({**begun, "plan": 2}))
    p = campaign("reference", "--runs", "2", out=two)
    assert p.returncode == 0, p.stdout + p.stderr
    specs = sorted((r["spec"] for r in runs(two)), key=lambda x: x["run"])
    assert specs[1:] == [draw(settings, n, plan=2).to_json() for n in (1, 2)]
    assert specs[1:] != [draw(settings, n).to_json() for n in (1, 2)]
    state["plan"] = 99
    (old / "campaign.json").write_text(json.dumps(state))
    p = campaign("reference", "--runs", "1", out=old)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "draws its runs by plan 99" in p.stderr


def test_the_runs_beside_run_0_run_behind_it_until_it_ends(tmp_path):
    import os

    from kvcheck.campaign.worker import BEHIND, can_restore

    base = os.nice(0)
    nice = tmp_path / "nice"
    nice.mkdir()
    env = {**os.environ, "KVCHECK_TEST_NICE": str(nice)}

    def run(*args, out):
        p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign",
                            f"{SLOW}:NotesItsPriority", "--timeout", "30", *args, "--out",
                            str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        got = sorted((f.name.split("-")[0], [int(x) for x in f.read_text().split()])
                     for f in nice.iterdir())
        for f in nice.iterdir():
            f.unlink()
        return got

    got = run("--runs", "2", "--workers", "2", out=tmp_path / "two")
    assert len(got) == 2 and ("32x4", [base]) in got, got  # run 0 at the campaign's priority
    (beside,) = [seen for shape, seen in got if shape != "32x4"]
    if can_restore():  # behind run 0 while it ran, then back to the campaign's priority
        assert beside == [min(base + BEHIND, 19), base], got
    else:  # never lowered where it could not be raised back
        assert beside == [base], got
    got = run("--runs", "3", "--workers", "1", out=tmp_path / "one")
    assert [seen for _, seen in got] == [[base]] * 3  # each started after run 0 ended
    got = run("--runs", "2", "--workers", "2", out=tmp_path / "one")  # resumed: no run 0
    assert [seen for _, seen in got] == [[base]] * 2


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc/PID/stat")
def test_with_stop_on_failure_the_runs_beside_a_shrinking_run_wait(tmp_path):
    import os

    beside = tmp_path / "beside"

    def run(*args, out):
        beside.mkdir()
        env = {**os.environ, "KVCHECK_TEST_BESIDE": str(beside)}
        p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign",
                            f"{SLOW}:ShrinksBesideAnother", "--workers", "2", "--time", "2m",
                            *args, "--out", str(out)], capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
        seen = (beside / "seen").read_text()
        for f in beside.iterdir():
            f.unlink()
        beside.rmdir()
        return p, seen

    p, seen = run("--stop-on-failure", out=tmp_path / "stop")
    assert seen and seen[-1] == "T", seen  # stopped while run 0 shrank (not at once: told first)
    s = summary(tmp_path / "stop")
    assert s["signatures"][0]["first_run"] == 0 and s["signatures"][0]["shortest"]["length"] <= 3
    # no stop: the machine is shared as ever (the slow run is cut when the time is up)
    p, seen = run("--time", "15s", out=tmp_path / "on")
    assert seen and "T" not in seen, seen


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc/PID/stat")
def test_with_stop_on_failure_a_small_scope_run_goes_on_beside_a_shrink(tmp_path):
    """Run 1, a small-scope run (slowed here: 20 ms per append), goes on once run 0's
    shrink of the violation it found has lasted HEDGE seconds (before: stopped, if at all)."""
    import os

    from kvcheck.campaign.plan import SMALL_POOL

    beside = tmp_path / "beside"
    beside.mkdir()
    env = {**os.environ, "KVCHECK_TEST_BESIDE": str(beside)}
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign",
                        f"{SLOW}:SmallRunsBesideAShrink", "--workers", "2", "--time", "2m",
                        "--stop-on-failure", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    seen = (beside / "seen").read_text()
    assert seen and seen[-1] != "T", seen  # run 1 ran on while run 0 shrank
    s = summary(tmp_path / "out")
    assert s["signatures"][0]["first_run"] == 0, s["signatures"]
    (run1,) = [r for r in runs(tmp_path / "out") if r["run"] == 1]
    assert run1["spec"]["scope"]["num_blocks"] <= SMALL_POOL  # a small-scope run


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc/PID/stat")
def test_with_stop_on_failure_run_0_goes_on_while_another_run_shrinks(tmp_path):
    """Run 0 is the command at its defaults: another run's shrink does not stop it (it may
    find the bug itself and shrink it sooner), so the campaign is never slower than the
    command alone for waiting on a slower shrink."""
    import os

    beside = tmp_path / "beside"
    beside.mkdir()
    env = {**os.environ, "KVCHECK_TEST_BESIDE": str(beside)}
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "campaign",
                        f"{SLOW}:OthersShrinkBesideRun0", "--workers", "2", "--time", "2m",
                        "--stop-on-failure", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    seen = (beside / "seen").read_text()
    assert seen and "T" not in seen, seen  # run 0 ran on while the other run shrank
    s = summary(tmp_path / "out")
    assert s["signatures"][0]["first_run"] != 0, s["signatures"]


def test_run_0_and_the_shrinking_runs_go_on_the_others_wait():
    from kvcheck.campaign.runner import going_on

    assert going_on(set(), 0) == set()  # nothing shrinks: nothing waits
    assert going_on({3}, None) == {3}  # no run 0 in flight: the shrinking run alone
    assert going_on({3}, 0) == {0, 3}  # run 0 goes on beside another run's shrink
    assert going_on({0}, 0) == {0}  # run 0 shrinks: the runs still searching wait
    assert going_on({0, 3}, 0) == {0, 3}  # a run already shrinking goes on beside it
    assert going_on({0}, 0, {2}) == {0, 2}  # the small-scope runs go on beside a shrink
    assert going_on({9}, None, {2}) == {9, 2}
    assert going_on(set(), 0, {2}) == set()  # nothing shrinks: nothing waits
