"""Issue 34 §1: does ``vllm-v1-engine`` build and run on every vLLM release kvcheck claims?

For each installed vLLM release from 0.6.4.post1 to the newest (``kvcheck install
vllm-v1==VERSION``; the ``vllm-v1`` family's range, ``install.ENGINES``), it runs
``kvcheck verify-engine vllm-v1-engine@VERSION --seed S`` at the defaults and with each of
``--spec-tokens 3``, ``--policy priority`` and ``--no-prefix-caching`` alone, each in its own
process, and sorts each run into:

* ``PASS`` / ``FAIL RULE`` (exit 0 / 1: the engine ran; a FAIL names the rule, to be matched
  against docs/findings.md's catalogue);
* ``refused`` (exit 2 in the release's or the adapter's words: a setting the release does
  not have -- no drafts in its runner output before 0.8.0, no policy before 0.9.2);
* ``GAP`` (exit 2 naming a kvcheck stand-in, ``StandInMissing`` / "kvcheck stand-in": the
  adapter fails to build or run the release -- kvcheck's gap, never the engine's), ``ERROR``
  (any other exit 2) or ``CRASH`` (any other exit: kvcheck itself).

A FAIL is the engine's only once it is matched to docs/findings.md (a crash inside the
release's code can still be kvcheck's, e.g. a model-runner record of the wrong type).

It prints one line per release and a summary; the exit status is 1 when any run is a GAP
or a crash. Shrinking is capped (``--shrink-budget``): a FAIL's rule is what is reported,
not its minimal trace (``kvcheck verify-engine`` without the cap gives that).

    python3 benchmarks/vllm_v1_releases.py                     # every installed release, seed 0
    python3 benchmarks/vllm_v1_releases.py --jobs 2 --seeds 0 1
    python3 benchmarks/vllm_v1_releases.py --releases 0.14.0 0.28.0 0.30.0

The wall time per run is printed for orientation only; no verdict depends on it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from kvcheck.impl.thirdparty import _loader, install

SETTINGS = {
    "default": [],
    "spec": ["--spec-tokens", "3"],
    "priority": ["--policy", "priority"],
    "no-cache": ["--no-prefix-caching"],
}
GAP_WORDS = ("kvcheck stand-in", "StandInMissing", "StandInGap", "Traceback")


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.replace(".post", ".").split("."))


def installed_releases() -> list[str]:
    """Every vLLM release installed in kvcheck's cache within the vllm-v1 family's range."""
    rows = [e for e in install.ENGINES.values() if e.key == "vllm-v1" or e.family == "vllm-v1"]
    low = min((e.low for e in rows), key=_key)
    high = max((e.high for e in rows), key=_key)
    found = []
    for path in _loader.base_dir().glob("vllm-*"):
        version = path.name[len("vllm-"):]
        if not version[:1].isdigit() or not (path / _loader.MARKER).exists():
            continue
        if _key(low) <= _key(version) <= _key(high):
            found.append(version)
    return sorted(found, key=_key)


def run_one(version: str, setting: str, seed: int, shrink_budget: int,
            timeout: float) -> dict:
    cmd = [sys.executable, "-m", "kvcheck", "verify-engine", f"vllm-v1-engine@{version}",
           "--seed", str(seed), "--json", "--shrink-budget", str(shrink_budget),
           *SETTINGS[setting]]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"version": version, "setting": setting, "seed": seed, "kind": "TIMEOUT",
                "what": f"no answer in {timeout:.0f} s (a guard, not a verdict)",
                "seconds": time.monotonic() - start}
    seconds = time.monotonic() - start
    err = p.stderr.strip().splitlines()
    said = err[-1] if err else ""
    kind, what = "CRASH", said
    if p.returncode in (0, 1):
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            doc = None
        if doc is not None and p.returncode == 0:
            kind, what = "PASS", f"{doc['stats'].get('steps', '?')} steps"
        elif doc is not None:
            v = (doc.get("violation") or {}).get("violation") or {}  # the trace's record
            kind = "FAIL"
            what = f"{v.get('kind')} {v.get('name')}: {v.get('witness') or ''}"[:200]
    elif p.returncode == 2:
        m = re.search(r"(\w+(?:Error|Missing|Gap)): (.*)", said)
        what = f"{m.group(1)}: {m.group(2)}" if m else said
        if any(w in p.stderr for w in GAP_WORDS):
            kind = "GAP"
        elif m and m.group(1) == "MisuseError":  # the release lacks the setting, in words
            kind = "refused"
        else:  # any other exit 2 is kvcheck's own error
            kind = "ERROR"
    elif any(w in p.stderr for w in GAP_WORDS):
        kind = "GAP"
    return {"version": version, "setting": setting, "seed": seed, "kind": kind,
            "what": what, "seconds": seconds, "rc": p.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", nargs="*", help="these releases (default: every installed)")
    ap.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shrink-budget", type=int, default=2000,
                    help="shrink operations per FAIL (the rule is reported, not the trace)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per run before it is reported TIMEOUT (a hang guard)")
    ap.add_argument("--json", metavar="FILE", help="also write every run's record here")
    args = ap.parse_args(argv)
    releases = args.releases or installed_releases()
    if not releases:
        print("no vLLM release installed (kvcheck install vllm-v1==VERSION)", file=sys.stderr)
        return 2
    jobs = [(v, s, seed) for v in releases for s in args.settings for seed in args.seeds]
    start = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(
            lambda j: run_one(*j, args.shrink_budget, args.timeout), jobs))
    wall = time.monotonic() - start
    by_release: dict[str, list[dict]] = {}
    for r in results:
        by_release.setdefault(r["version"], []).append(r)
    for version in releases:
        cells = []
        for r in by_release[version]:
            label = r["setting"] + (f"/s{r['seed']}" if len(args.seeds) > 1 else "")
            cells.append(f"{label}={r['kind']}" + (
                "" if r["kind"] == "PASS" else f" ({r['what']})"))
        print(f"{version:12s} " + "; ".join(cells))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
    built = sorted({r["version"] for r in results if r["kind"] in ("PASS", "FAIL")}, key=_key)
    broken = sorted({r["version"] for r in results if r["kind"] in ("GAP", "CRASH", "ERROR")},
                    key=_key)
    print(f"{len(releases)} releases, {len(results)} runs in {wall:.0f} s wall "
          f"({args.jobs} jobs): " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    print(f"ran (PASS or FAIL) on {len(built)} releases"
          + (f"; kvcheck gaps on {', '.join(broken)}" if broken else "; no kvcheck gap"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if broken or counts.get("TIMEOUT") else 0


if __name__ == "__main__":
    sys.exit(main())
