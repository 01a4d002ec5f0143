"""Campaigns: aggregate checked ops/s on 2 workers vs 1, and time to the first violation.

1. Throughput. The same campaign runs (``--runs N`` drawn from one seed: the same shapes,
   mixes and operations every time) on 1 worker and on 2, as local processes and as Ray
   tasks on a local Ray cluster started with as many CPUs as workers. Each figure is the
   session's checked operations over its wall-clock time, the pool's start excluded (it is
   printed apart); every session of one pool checks the same operations, so a ratio is
   that of the times. The 1- and 2-worker sessions alternate, ``--repeat`` pairs, the order
   swapped from pair to pair (load from elsewhere on a shared machine slows the 2-worker
   session most: it needs both cores, while the 1-worker one finds one free); each row
   shows its fastest session, and the summary line the ratio of the fastest and the median
   of the pairs' ratios. ``busy``, for local processes, is the runs' CPU time over the
   workers x the wall-clock time (the median of the row's sessions): how fully the pool kept its workers' cores busy
   (nothing else on the machine moves it much; a Ray worker is not a child of this process,
   so it is not shown there).
2. Time to the first violation of every entry of the block-manager corpus
   (``tests/corpus/buggy.py``), and of the registered third-party targets with a known
   finding that are importable here (``nano-vllm``: only at block size 1): ``kvcheck
   verify TARGET`` at its defaults (32 blocks x 4, 10,000 operations, seed 0) versus
   ``kvcheck campaign TARGET`` at its defaults (one worker per core, 1 minute; its run 0
   is that ``verify`` run, the swarm beside it) with ``--stop-on-failure`` (which changes
   only when it stops). Both are whole commands, timed from their start until they print
   the violation (shrunk) and until they exit. The two alternate, ``--repeat`` pairs per
   entry, the order swapped from pair to pair, so that a slow moment of a shared machine
   falls on both alike; each command's median of its ``--repeat`` times is shown, its
   fastest beside it. ``speed-up`` is verify's median over the campaign's, until each
   printed the violation; ``won`` the pairs in which the campaign printed it first (or
   together), out of all pairs: a close call (medians within ``--close``, 10%, of each
   other after ``--repeat`` pairs, whichever side leads: one slow moment of a shared
   machine decides a median of five) goes on to ``--close-repeat`` pairs (11) in all; a
   ``verify`` that passes missed the bug. ``load`` is the 1-minute load
   average after the entry's commands (this machine may be shared).

    python3 benchmarks/campaign.py                      # both parts, Ray where installed
    python3 benchmarks/campaign.py --runs 60 --no-ray   # longer throughput part, local only
    python3 benchmarks/campaign.py --no-corpus          # throughput only
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvcheck.cli.commands.common import OneLineParser, nonneg_int, positive_int

ROOT = Path(__file__).resolve().parents[1]
BUGGY = ROOT / "tests" / "corpus" / "buggy.py"
BEYOND = ("nano-vllm", "vllm-v0")  # registered targets with a finding (docs/findings.md)


def throughput(pool: str, workers: int, runs: int, seed: int, out: Path) -> dict:
    """One campaign session of ``runs`` runs of the reference: its figures."""
    import resource

    from kvcheck.campaign import Budget, Campaign, Settings

    c = Campaign(Settings("reference", seed=seed), str(out), Budget(runs=runs), workers,
                 "" if pool == "ray" else None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = c.run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if s["verdict"] != "pass":
        sys.exit(f"benchmarks/campaign.py: the reference did not pass: {s['verdict']}")
    session = s["sessions"][-1]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"ops": session["ops"], "seconds": session["seconds"],
            "rate": session["ops"] / session["seconds"], "start": session["pool_start_s"],
            "where": session["pool"],
            "busy": cpu / (workers * session["seconds"]) if pool == "local" else None}


def throughput_pairs(pool: str, runs: int, seed: int, repeat: int, tmp: Path) -> dict:
    """``repeat`` pairs of sessions on 1 and 2 workers, alternating, the order swapped from
    pair to pair: each worker count's sessions, and the pairs' ratios (2 workers / 1)."""
    got: dict[int, list[dict]] = {1: [], 2: []}
    for i in range(repeat):
        for workers in ((1, 2) if i % 2 == 0 else (2, 1)):
            got[workers].append(throughput(pool, workers, runs, seed,
                                           tmp / f"t-{pool}-{workers}-{i}"))
    ratios = [two["rate"] / one["rate"] for one, two in zip(got[1], got[2], strict=True)]
    return {"sessions": got, "ratios": ratios}


def kvcheck(*argv: str, first: str, timeout: float) -> tuple[int, float | None, float, str]:
    """Run a kvcheck command: its exit code, the seconds until it printed a line starting
    with ``first`` (None if it never did), its seconds in all, and its output."""
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    seen, lines = None, []
    try:
        for line in p.stdout:
            if seen is None and line.startswith(first):
                seen = time.perf_counter() - start
            lines.append(line)
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, seen, time.perf_counter() - start, "".join(lines)


def first_violation(target: str, campaign_time: str, tmp: Path, repeat: int = 1,
                    close: float = 0.0, close_repeat: int = 0) -> dict:
    """verify's and the campaign's time to the first violation of ``target``: until each
    printed it (verify its FAIL line, the campaign its first ``found:`` line, both after
    shrinking it), and until each command exited.

    The two commands alternate, ``repeat`` pairs, the order swapped from one pair to the
    next (a slow moment of a shared machine falls on both alike): each command's median
    and fastest, and how many pairs the campaign printed first (or together). Where both
    found it and the medians' ratio is within ``close`` of 1 after ``repeat`` pairs (a
    close call, which one slow moment decides), pairs go on to ``close_repeat`` in all,
    whichever side leads."""
    v_runs, c_runs = [], []

    def pair(i: int) -> str | None:
        """One pair of commands, in the order of pair ``i``; an error, or None."""
        order = ("verify", "campaign") if i % 2 == 0 else ("campaign", "verify")
        for which in order:
            if which == "verify":
                code, first, secs, text = kvcheck("verify", target, first="FAIL ", timeout=600)
                if code not in (0, 1):
                    return f"verify exit {code}: {text.strip().splitlines()[-1:]}"
                v_runs.append((first, secs))
            else:
                out = tmp / f"c-{abs(hash(target))}-{i}"
                code, first, secs, text = kvcheck(
                    "campaign", target, "--stop-on-failure", "--time", campaign_time,
                    "--out", str(out), first="found: ", timeout=900)
                c_runs.append((first, secs, code, text, out))
        return None

    def close_call() -> bool:
        firsts = [[r[0] for r in got] for got in (v_runs, c_runs)]
        return all(None not in f for f in firsts) and abs(
            statistics.median(firsts[0]) / statistics.median(firsts[1]) - 1) <= close

    for i in range(repeat):
        if (error := pair(i)) is not None:
            return {"error": error}
    if close_repeat > repeat and close_call():
        for i in range(repeat, close_repeat):
            if (error := pair(i)) is not None:
                return {"error": error}
    row = {"pairs": len(v_runs)}
    for name, got in (("verify", v_runs), ("campaign", c_runs)):
        firsts = [r[0] for r in got if r[0] is not None]
        # found only if every command of the pairs found it (the runs are deterministic)
        row[name] = "found" if len(firsts) == len(got) else "missed"
        row[f"{name}_first"] = statistics.median(firsts) if firsts else None
        row[f"{name}_fastest"] = min(firsts) if firsts else None
        row[f"{name}_s"] = statistics.median(r[1] for r in got)
    if row["verify"] == row["campaign"] == "found":
        row["campaign_won"] = sum(c[0] <= v[0] for v, c in zip(v_runs, c_runs, strict=True))
    c_first, _, c_code, c_text, out = min(c_runs, key=lambda r: r[0] if r[0] is not None else r[1])
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        s = None
    if c_first is not None and s is not None and s["signatures"]:
        e = s["signatures"][0]
        row.update(found_after_s=e["found_after_s"], run=e["first_run"],
                   shape=e["shortest"]["shape"], length=e["shortest"]["length"],
                   clause=f"{e['kind']} {e['clause']}")
    elif c_code not in (0, 1):
        row["error"] = c_text.strip().splitlines()[-1:] if c_text.strip() else ""
    return row


def corpus_targets(entries: list[str] | None) -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus.buggy import CORPUS

    names = sorted(CORPUS)
    if entries:
        unknown = [e for e in entries if e not in CORPUS and e not in BEYOND]
        if unknown:
            raise ValueError(f"unknown corpus entry {unknown[0]!r} (one of: "
                             f"{', '.join(names + list(BEYOND))})")
    out = [(n, f"{BUGGY}:{CORPUS[n][0].__name__}") for n in names if not entries or n in entries]
    from kvcheck.targets.loading import TargetError, resolve

    for name in BEYOND:
        if entries and name not in entries:
            continue
        try:
            resolve(name)
        except (TargetError, ImportError) as exc:
            print(f"({name}: not importable here, skipped: {exc})")
            continue
        out.append((name, name))
    return out


def main(argv=None) -> int:
    ap = OneLineParser(prog="benchmarks/campaign.py", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=positive_int, default=40,
                    help="campaign runs per throughput measurement (default: %(default)s)")
    ap.add_argument("--seed", type=nonneg_int, default=0)
    ap.add_argument("--repeat", type=positive_int, default=3,
                    help="alternating pairs of sessions (1 and 2 workers) per throughput pool, "
                         "and of commands per corpus entry (default: %(default)s)")
    ap.add_argument("--close", type=float, default=0.1,
                    help="a corpus entry whose medians are within this fraction of each other "
                         "after --repeat pairs is a close call (default: %(default)s)")
    ap.add_argument("--close-repeat", type=nonneg_int, default=11,
                    help="pairs in all for a close call (default: %(default)s; 0: no more)")
    ap.add_argument("--no-ray", action="store_true", help="local processes only")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--no-corpus", action="store_true")
    ap.add_argument("--entries", nargs="*", metavar="NAME",
                    help="corpus entries to time (default: all, and the registered targets)")
    ap.add_argument("--campaign-time", default="1m",
                    help="the campaign's time budget per entry (default: the campaign's "
                         "default, %(default)s)")
    args = ap.parse_args(argv)
    from kvcheck.campaign.plan import parse_duration

    try:
        parse_duration(args.campaign_time)
    except ValueError as exc:
        ap.error(f"argument --campaign-time: {exc}")
    if not 0 <= args.close < 1:
        ap.error(f"argument --close: a fraction from 0 up to 1, not {args.close}")
    rows = []
    if not args.no_corpus:
        try:
            rows = corpus_targets(args.entries)
        except ValueError as exc:
            ap.error(f"argument --entries: {exc}")
    pools = ["local"]
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("(ray is not installed: the Ray rows are skipped)")
        else:
            pools.append("ray")
    print(f"cores: {len(os.sched_getaffinity(0))}, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    with tempfile.TemporaryDirectory(prefix="kvcheck-bench-") as tmp_:
        tmp = Path(tmp_)
        if not args.no_throughput:
            print(f"\n## throughput: the reference, the same {args.runs} campaign runs "
                  f"(seed {args.seed}) on 1 and 2 workers")
            print(f"{'pool':<6} {'workers':>7} {'ops':>10} {'seconds':>8} {'checked ops/s':>14} "
                  f"{'pool start s':>12} {'busy':>6}  where")
            for pool in pools:
                got = throughput_pairs(pool, args.runs, args.seed, args.repeat, tmp)
                fastest = {}
                for workers in (1, 2):
                    sessions = got["sessions"][workers]
                    r = fastest[workers] = max(sessions, key=lambda x: x["rate"])
                    busy = ("" if r["busy"] is None else
                            f"{statistics.median(x['busy'] for x in sessions):>6.0%}")
                    print(f"{pool:<6} {workers:>7} {r['ops']:>10,} {r['seconds']:>8.2f} "
                          f"{r['rate']:>14,.0f} {r['start']:>12.2f} {busy:>6}  {r['where']}",
                          flush=True)
                ratios = got["ratios"]
                print(f"{pool}: 2 workers / 1 worker = {fastest[2]['rate'] / fastest[1]['rate']:.2f}x "
                      f"(fastest sessions); pairs: median {statistics.median(ratios):.2f}x, "
                      f"{' '.join(f'{x:.2f}x' for x in ratios)}", flush=True)
        if not args.no_corpus:
            print(f"\n## time to the first violation: kvcheck verify (defaults) vs kvcheck "
                  f"campaign (defaults, --time {args.campaign_time}, --stop-on-failure)")
            more = (f" ({args.close_repeat} for a close call, medians within {args.close:.0%})"
                    if args.close_repeat > args.repeat else "")
            print("seconds until the violation was printed (after shrinking): median (fastest) of "
                  f"{args.repeat}{more}, alternating; then until the command exited (median); "
                  "speed-up: verify's median / the campaign's; won: pairs the campaign printed "
                  "first, of all pairs")
            print(f"{'entry':<24} {'verify':>7} {'printed':>13} {'exited':>7} {'campaign':>9} "
                  f"{'printed':>13} {'exited':>7} {'speed-up':>9} {'won':>5} {'load':>5}  "
                  f"first signature (run: shape)")
            faster = missed_found = both = 0
            for name, target in rows:
                r = first_violation(target, args.campaign_time, tmp, args.repeat, args.close,
                                    args.close_repeat)
                if "verify_s" not in r:
                    print(f"{name:<24} {r['error']}")
                    continue
                if r["verify"] == "found" and r["campaign"] == "found":
                    both += 1
                    ratio = f"{r['verify_first'] / r['campaign_first']:.2f}x"
                    faster += r["campaign_first"] <= r["verify_first"]
                elif r["campaign"] == "found":
                    ratio = "only camp."
                    missed_found += 1
                else:
                    ratio = "-"

                def secs(x, fastest=None):
                    if x is None:
                        return "-"
                    return f"{x:.2f}" if fastest is None else f"{x:.2f} ({fastest:.2f})"

                won = f"{r['campaign_won']}/{r['pairs']}" if "campaign_won" in r else "-"
                what = (f"{r['clause']} (run {r['run']}: {r['shape']}; {r['length']} ops)"
                        if "clause" in r else r.get("error", ""))
                print(f"{name:<24} {r['verify']:>7} "
                      f"{secs(r['verify_first'], r['verify_fastest']):>13} "
                      f"{r['verify_s']:>7.2f} {r['campaign']:>9} "
                      f"{secs(r['campaign_first'], r['campaign_fastest']):>13} "
                      f"{r['campaign_s']:>7.2f} {ratio:>9} {won:>5} {os.getloadavg()[0]:>5.2f}  "
                      f"{what}", flush=True)
            print(f"campaign at least as fast as verify (median) on {faster} of the {both} "
                  f"entries both found; found {missed_found} that verify at its defaults missed; "
                  f"{len(rows)} entries")
    print(f"\nload average {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
