"""The historical-bug benchmark: does kvcheck find the bugs that really shipped?

    python3 benchmarks/historical/run.py [--only ID ...] [--seeds N] [--dry-run] [--no-raw]

For every catalogue entry in reach (``catalogue.json``, ``reach: "yes"``): installs the
buggy and the fixed release's sources (``kvcheck install``: py files from the wheels,
idempotent, nothing downloaded when installed), runs the entry's kvcheck command on each
(``{version}`` replaced), and reports

* caught: the buggy release fails with the expected violation (clause; a list: any of
  them, one bug with several symptoms); another verdict is a miss, printed with what
  kvcheck said;
* inconclusive: a run that did not finish -- cut by ``--timeout`` (a wall-clock limit that
  guards against a hang, never a verdict: time decides nothing) or ending INCONCLUSIVE
  (exit 4, kvcheck's own budget) -- is neither a catch, nor a miss, nor a false alarm; it
  is printed as such and counted apart;
* false alarm: the fixed release does not pass (a documented deviation allowed by the
  command's ``--allow`` is not an alarm; it is counted in the command's output). A fixed
  release that still has another, documented bug (``fixed_findings``: finding id -> the
  clauses kvcheck reports for it, never the expected one) is no alarm when it fails with
  one of those clauses *and* the buggy release's shrunk counterexample, replayed on the
  fixed release (``kvcheck replay TRACE --target`` it), passes: the expected bug is gone
  at its own shape, the other finding is reported beside it;
* seconds to the counterexample (kvcheck's own time for the search, shrinking included)
  and the length of the shrunk trace;
* the raw replay (``hist_replays.py``, the engine's own objects, no adapter): it must reproduce
  on the buggy release and not on the fixed one;
* whether the buggy code path ran as the release ships it (``runs_release_code``): ``yes``
  (the code holding the bug is the release's own, run from its files; the adapter may play
  its caller, named in ``re_enacted``), ``partly`` (part of what the bug needs -- a check,
  a branch, an order of calls -- is kvcheck's re-enactment, named in ``re_enacted``), ``no``
  (the bug is shown in kvcheck's copy of the engine's code).

An entry's ``expected`` names the rule its bug breaks, never an operation: a crash is the
rule ``OPERATION: never raises`` (the engine raised, or the target ended the process, inside
that operation).

Entries out of reach, and pending ones, are listed with what kvcheck lacks and their raw
replay (when they have one); they are not in the totals. The last line is
``caught X/Y on buggy releases, N of them on the release's own code, Z false alarms on fixed
releases``: N counts the entries caught whose ``runs_release_code`` is ``yes``; when a
run did not finish, ``, K inconclusive (a release whose run did not finish: not counted
either way)`` follows (K counts releases, an entry's buggy and fixed apart).

``--dry-run`` checks the catalogue's schema and prints each command, installing and
running nothing. Exit 0 when every entry in reach was caught with no false alarm and
every raw replay agreed, 1 on a miss, a false alarm or a disagreeing replay, 4 when nothing
failed but some run did not finish (inconclusive), 2 on a bad catalogue.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CATALOGUE = HERE / "catalogue.json"
INCONCLUSIVE = 4  # kvcheck's exit for a run a budget cut short (kvcheck.errors.INCONCLUSIVE)

REQUIRED = ("id", "engine", "generation", "issue", "title", "buggy", "fixed", "reach",
            "runs_release_code")
IN_REACH = ("command", "expected", "raw")
RELEASE_CODE = ("yes", "partly", "no")
# Operation names: an expected clause is a rule, never one of these alone (a crash is
# ``OPERATION: never raises``, see the module doc).
OPERATIONS = frozenset({
    "allocate", "append", "append_slot", "append_slots", "free", "free_seq", "fork", "step",
    "add", "abort", "swap_in", "swap_out", "store", "load", "complete", "evict", "slide",
    "rollback", "rebase", "preempt", "drop_behind_window", "write", "read"})
NEVER_RAISES = "never raises"


class CatalogueError(Exception):
    pass


def load(path: Path = CATALOGUE) -> list[dict]:
    """The catalogue's entries, checked (``CatalogueError`` names what is wrong)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CatalogueError(f"{path}: no 'entries' list")
    seen = set()
    for e in entries:
        where = f"entry {e.get('id', '?')!r}" if isinstance(e, dict) else "an entry"
        if not isinstance(e, dict):
            raise CatalogueError(f"{where} is not an object")
        for key in REQUIRED:
            if key not in e:
                raise CatalogueError(f"{where}: no {key!r}")
        if e["id"] in seen:
            raise CatalogueError(f"{where}: id used twice")
        seen.add(e["id"])
        if e["reach"] not in ("yes", "pending", "no"):
            raise CatalogueError(f"{where}: reach must be yes, pending or no")
        if e["runs_release_code"] not in RELEASE_CODE:
            raise CatalogueError(f"{where}: runs_release_code must be yes, partly or no")
        if e["runs_release_code"] != "yes" and not e.get("re_enacted"):
            raise CatalogueError(f"{where}: runs_release_code {e['runs_release_code']} but no "
                                 f"'re_enacted' saying what kvcheck re-enacts")
        if e["reach"] == "yes":
            for key in IN_REACH:
                if key not in e:
                    raise CatalogueError(f"{where}: in reach but no {key!r}")
            cmd = e["command"]
            if not (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd)):
                raise CatalogueError(f"{where}: command must be a list of strings")
            if e["fixed"] is None and "fixed_note" not in e:
                raise CatalogueError(f"{where}: no fixed release and no fixed_note saying why")
            known = e.get("fixed_findings", {})
            if not (isinstance(known, dict) and all(
                    isinstance(v, list) and v and all(isinstance(c, str) for c in v)
                    for v in known.values())):
                raise CatalogueError(f"{where}: fixed_findings must map a finding to its clauses")
            want = e["expected"]
            if not (isinstance(want, str) or isinstance(want, list) and want
                    and all(isinstance(c, str) for c in want)):
                raise CatalogueError(f"{where}: expected must be a clause or a list of clauses")
            ops = [c for c in expected(e) if c in OPERATIONS]
            if ops:
                raise CatalogueError(f"{where}: expected {ops[0]!r} is an operation, not the "
                                     f"rule broken (a crash: '{ops[0]}: {NEVER_RAISES}')")
            if any(c in v for c in expected(e) for v in known.values()):
                raise CatalogueError(f"{where}: fixed_findings lists the expected clause")
            if known and sum("{version}" in a for a in cmd) != 1:
                raise CatalogueError(f"{where}: fixed_findings needs one '{{version}}' argument "
                                     f"(the target the counterexample is replayed on)")
        else:
            if not e.get("lacks"):
                raise CatalogueError(f"{where}: out of reach but no 'lacks'")
    return entries


def expected(entry: dict) -> list[str]:
    """The clauses the entry's bug shows as (``expected``: one, or a list of them)."""
    want = entry["expected"]
    return [want] if isinstance(want, str) else list(want)


def _engine_key(entry: dict) -> str:
    return entry["generation"]


def install(entry: dict, version: str) -> str | None:
    """Install ``version`` of the entry's engine generation; an error message or None."""
    from kvcheck.impl.thirdparty import install as inst

    engine = inst.ENGINES.get(_engine_key(entry))
    if engine is None:
        return f"no engine generation {_engine_key(entry)!r} in kvcheck install"
    try:
        if not engine.supports(version):
            return f"{engine.key} loads {engine.range}, not {version}"
        inst.ensure(engine, version)
    except inst.InstallError as exc:
        return str(exc)
    return None


def run_kvcheck(entry: dict, version: str, timeout: float, seed: int | None = None,
                trace_out: Path | None = None) -> dict:
    """The entry's command on ``version`` (with ``--seed seed`` instead of the catalogue's,
    if given; writing its counterexample to ``trace_out``, if given): verdict, violation
    name, seconds, trace length."""
    args = [a.replace("{version}", version) for a in entry["command"]]
    if trace_out is not None:
        args += ["--trace-out", str(trace_out)]
    if seed is not None:
        if "--seed" in args:
            i = args.index("--seed")
            del args[i:i + 2]
        args += ["--seed", str(seed)]
    args += ["--json"]
    start = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": None, "verdict": f"did not finish in {timeout:.0f} s (--timeout)",
                "wall": timeout, "unfinished": True}
    out = {"rc": p.returncode, "wall": time.monotonic() - start, "args": args}
    if p.returncode == INCONCLUSIVE:
        out["unfinished"] = True
    try:
        data = json.loads(p.stdout)
    except ValueError:
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        out["verdict"] = f"exit {p.returncode}: {err}"
        return out
    out["verdict"] = data.get("verdict")
    out["seconds"] = data.get("seconds")
    out["deviations"] = sum(d.get("count", 0) for d in (data.get("deviations") or {}).values()) \
        if isinstance(data.get("deviations"), dict) else len(data.get("deviations") or [])
    trace = data.get("violation")
    if isinstance(trace, dict):
        out["violation"] = clause(trace.get("violation") or {})
        out["length"] = len(trace.get("ops") or [])
        out["original"] = data.get("original_length")
    return out


def clause(violation: dict) -> str | None:
    """The rule a violation (a trace's ``violation`` record) names: its name, or for a crash
    (named by its operation) ``OPERATION: never raises``."""
    name = violation.get("name")
    if violation.get("kind") == "crash" and isinstance(name, str):
        return f"{name}: {NEVER_RAISES}"
    return name


def replay_on(entry: dict, trace: Path, version: str,
              timeout: float) -> tuple[bool | None, str]:
    """Whether ``trace`` passes on ``version`` of the entry's target (``kvcheck replay``);
    None when the replay did not finish (cut by ``--timeout``, or INCONCLUSIVE)."""
    target = next(a for a in entry["command"] if "{version}" in a).replace("{version}", version)
    try:
        p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "replay", str(trace),
                            "--target", target], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"replay did not finish in {timeout:.0f} s (--timeout)"
    line = (p.stdout.strip().splitlines() or p.stderr.strip().splitlines() or ["no output"])[0]
    if p.returncode == INCONCLUSIVE:
        return None, line
    return p.returncode == 0, line


def raw_replay(entry: dict, version: str):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import hist_replays

    fn = getattr(hist_replays, entry["raw"])
    try:
        return fn(version)
    except Exception as exc:  # noqa: BLE001 - a replay that cannot run is reported
        return None, f"raw replay raised {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, metavar="ID")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-raw", action="store_true", help="skip the raw replays")
    ap.add_argument("--timeout", type=float, default=1200.0,
                    help="seconds per kvcheck run before it is reported INCONCLUSIVE (a guard "
                         "against a hang, never a verdict; default 1200)")
    ap.add_argument("--seeds", type=int, default=1, metavar="N",
                    help="run each command with N seeds (the catalogue's, then 1, 2, ...): a "
                         "catch counts when every seed finds the expected clause, a false alarm "
                         "when any seed fails on the fixed release (default: 1)")
    args = ap.parse_args(argv)
    try:
        entries = load()
    except CatalogueError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2
    if args.only is not None:
        unknown = set(args.only) - {e["id"] for e in entries}
        if unknown:
            print(f"run.py: error: no entry {sorted(unknown)[0]!r}", file=sys.stderr)
            return 2
        entries = [e for e in entries if e["id"] in args.only]
    in_reach = [e for e in entries if e["reach"] == "yes"]
    caught = alarms = raw_bad = own = unfinished = missed = 0
    for e in in_reach:
        versions = [("buggy", e["buggy"])] + ([("fixed", e["fixed"])] if e["fixed"] else [])
        print(f"{e['id']} ({e['engine']}, {e['issue']}): buggy {e['buggy']}, fixed "
              f"{e['fixed'] or 'none: ' + e['fixed_note']}")
        print(f"  the release's own code: {e['runs_release_code']}"
              + (f" (kvcheck re-enacts: {e['re_enacted']})" if e.get("re_enacted") else ""))
        if args.dry_run:
            for role, v in versions:
                print(f"  {role}: kvcheck {' '.join(a.replace('{version}', v) for a in e['command'])}")
            continue
        results = {}
        extra: dict[str, list] = {"buggy": [], "fixed": []}
        known = e.get("fixed_findings", {})
        scratch = tempfile.TemporaryDirectory()
        trace = Path(scratch.name) / "buggy.json" if known else None
        for role, v in versions:
            err = install(e, v)
            if err:
                results[role] = {"rc": None, "verdict": f"not installed: {err}"}
                continue
            results[role] = run_kvcheck(e, v, args.timeout,
                                        trace_out=trace if role == "buggy" else None)
            extra[role] = [run_kvcheck(e, v, args.timeout, seed) for seed in
                           range(1, args.seeds)]
        b = results["buggy"]
        want = expected(e)
        cut = [r for r in [b] + extra["buggy"] if r.get("unfinished")]
        ok = b.get("rc") == 1 and b.get("violation") in want and all(
            r.get("rc") == 1 and r.get("violation") in want for r in extra["buggy"])
        caught += ok
        own += ok and e["runs_release_code"] == "yes"
        if cut and not ok:
            unfinished += 1
            print(f"  INCONCLUSIVE on {e['buggy']}: {cut[0]['verdict']} (not a miss: the run "
                  f"did not finish)")
        elif ok:
            print(f"  caught on {e['buggy']}: {b['violation']!r} in {b['seconds']:.2f} s, trace of "
                  f"{b['length']} operations (shrunk from {b['original']})")
            for seed, r in enumerate(extra["buggy"], 1):
                other = "" if r["violation"] == b["violation"] else f" ({r['violation']!r})"
                print(f"    seed {seed}: in {r['seconds']:.2f} s, {r['length']} operations{other}")
        else:
            missed += 1
            print(f"  MISSED on {e['buggy']}: {b.get('violation') or b.get('verdict')} "
                  f"(expected {e['expected']!r})")
        if "fixed" in results:
            f = results["fixed"]
            bad = [r for r in extra["fixed"] if r.get("rc") != 0]
            if f.get("rc") == 0 and bad:
                f = bad[0]
            other = _documented(known, [f] + bad)
            if f.get("unfinished"):
                unfinished += 1
                print(f"  INCONCLUSIVE on {e['fixed']}: {f['verdict']} (not an alarm: the run "
                      f"did not finish)")
            elif f.get("rc") == 0:
                dev = f" ({f['deviations']} allowed deviations)" if f.get("deviations") else ""
                seeds = f" ({args.seeds} seeds)" if args.seeds > 1 else ""
                print(f"  no alarm on {e['fixed']}: pass in {f['seconds']:.2f} s{dev}{seeds}")
            elif other and trace is not None and trace.is_file() and ok:
                passes, said = replay_on(e, trace, e["fixed"], args.timeout)
                if passes is None:
                    unfinished += 1
                    print(f"  INCONCLUSIVE on {e['fixed']}: the buggy release's counterexample's "
                          f"replay did not finish ({said}); documented finding {other} reported")
                elif passes:
                    print(f"  no alarm on {e['fixed']}: the buggy release's counterexample "
                          f"passes there ({said}); documented finding {other} reported: "
                          f"{f.get('violation')!r}, trace of {f.get('length')} operations")
                else:
                    alarms += 1
                    print(f"  FALSE ALARM on {e['fixed']}: the buggy release's counterexample "
                          f"fails there too: {said}")
            else:
                alarms += 1
                print(f"  FALSE ALARM on {e['fixed']}: {f.get('violation') or f.get('verdict')}")
        scratch.cleanup()
        if not args.no_raw:
            raw_bad += _print_raw(e, versions)
    others = [e for e in entries if e["reach"] != "yes"]
    for e in others:
        status = "pending" if e["reach"] == "pending" else "out of reach"
        print(f"{e['id']} ({e['engine']}, {e['issue']}): {status}: {e['lacks']}")
        if e.get("command"):
            v = e["buggy"].rpartition("==")[2]
            print(f"  kvcheck {' '.join(a.replace('{version}', v) for a in e['command'])}")
        if e.get("raw") and not args.dry_run and not args.no_raw:
            versions = [("buggy", e["buggy"])] + ([("fixed", e["fixed"])] if e["fixed"] else [])
            for _, v in versions:  # a release of a generation kvcheck installs; the replay
                install(e, v)  # reports what it cannot load (its own fork, or an error)
            raw_bad += _print_raw(e, versions)
    if args.dry_run:
        print(f"catalogue ok: {len(in_reach)} entries in reach, {len(others)} pending or out of "
              f"reach")
        return 0
    print(f"{len(others)} catalogued bug(s) pending or out of reach (not counted), "
          f"{raw_bad} raw replay(s) disagreeing")
    cut = (f", {unfinished} inconclusive (a release whose run did not finish: not counted "
           f"either way)" if unfinished else "")
    print(f"caught {caught}/{len(in_reach)} on buggy releases, {own} of them on the release's "
          f"own code, {alarms} false alarms on fixed releases{cut}")
    if alarms or raw_bad or missed:
        return 1
    return INCONCLUSIVE if unfinished else 0


def _documented(known: dict, runs: list) -> str | None:
    """The documented finding of the fixed release that every failing run of ``runs``
    reports (by clause), or None (a failure outside them is an alarm)."""
    failed = [r for r in runs if r.get("rc") != 0]
    ids = {next((k for k, clauses in known.items() if r.get("violation") in clauses), None)
           for r in failed}
    return ids.pop() if failed and len(ids) == 1 and None not in ids else None


def _print_raw(e: dict, versions) -> int:
    bad = 0
    for role, v in versions:
        got, evidence = raw_replay(e, v)
        want = role == "buggy"
        agree = got is want
        bad += not agree
        word = "reproduced" if got else ("not reproduced" if got is False else "error")
        print(f"  raw replay on {v} ({role}): {word}{'' if agree else ' (DISAGREES)'}: {evidence}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
