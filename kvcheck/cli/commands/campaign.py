"""``kvcheck campaign``: many checker runs of one target, each with its own seed, shape and mix."""

from __future__ import annotations

import argparse

from kvcheck.cli.commands.common import (
    Progress,
    add_out_of_blocks,
    add_seed,
    add_shrink_seconds,
    add_timeout,
    emit_json,
    positive_int,
)
from kvcheck.defaults import RUN, SHRINK_STEPS

MODELS = tuple(RUN)  # the models with a checking command
DEFAULT_TIME = "1m"
DEFAULT_TARGET = {"blocks": "reference", "prefix": "prefix", "scheduler": "reference",
                  "device": "device", "hybrid": "reference-hybrid", "tiers": "reference-tiers",
                  "engine": "vllm-v1-engine"}  # each command's default target


def duration(text: str) -> float:
    from kvcheck.campaign.plan import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "campaign", help="many checking runs of one target: swarm shapes and mixes, every core, "
                         "a time budget, or a Ray cluster",
        description="Check TARGET with many runs of the checker, each with its own seed, pool "
                    "shape (1 to 4,096 blocks, block sizes 1 to 32) and operation mix, on every "
                    "core (or as Ray tasks), until the time or run budget ends. Violations are "
                    "grouped by signature (the broken clause and the shrunk trace's operation "
                    "kinds), each keeping its shortest trace; summary.json, junit.xml and "
                    "index.html land in --out, from which the campaign resumes. Exit 0 when "
                    "every completed run passed (and one did), 1 when a violation was found "
                    "or no run completed, 2 on bad input.")
    p.add_argument("target", nargs="?", default=None,
                   help="what to check, as the model's checking command takes it (an allocator; "
                        "a prefix-caching allocator with --model prefix; a scheduler with --model "
                        "scheduler; a data target with --model device; a hybrid pool with --model "
                        "hybrid; a tiered store with --model tiers; an engine core with --model "
                        "engine, e.g. vllm-v1-engine@0.33.0 or nano-vllm-engine): a registered "
                        "name, "
                        "module:attr or file.py:attr (default: the model's own reference: "
                        + ", ".join(f"{m} {t}" for m, t in DEFAULT_TARGET.items()) + ")")
    p.add_argument("--model", choices=MODELS, default="blocks",
                   help="what TARGET is checked as: blocks (verify), prefix (verify-prefix), "
                        "scheduler (verify-scheduler), device (verify-device), hybrid "
                        "(verify-hybrid), tiers (verify-tiers), engine (verify-engine: the "
                        "engine's settings drawn too, only those the target accepts) "
                        "(default: %(default)s)")
    p.add_argument("--time", type=duration, metavar="DURATION",
                   help=f"time budget: 90s, 10m, 1h (default: {DEFAULT_TIME} unless --runs is "
                        f"given); runs still in flight then are cut, never counted as passed")
    p.add_argument("--runs", type=positive_int, metavar="N",
                   help="run budget: start N runs in this session (with --time, whichever "
                        "ends first) (default: none, the time budget alone)")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="runs at once: local processes, or Ray tasks in flight (default: one "
                        "per core; with --ray, the cluster's CPUs)")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run each run as a Ray task: on a local Ray cluster started here, or on "
                        "the cluster at ADDRESS (e.g. ray://head:10001 or auto); needs "
                        "pip install 'kvcheck[ray]' (default: off: local processes)")
    p.add_argument("--out", default="kvcheck-campaign", metavar="DIR",
                   help="where the campaign's state, traces and summary go; a campaign found "
                        "there is resumed (default: %(default)s)")
    add_seed(p)
    p.add_argument("--stop-on-failure", action="store_true",
                   help="stop at the first violation, the runs in flight cut (default: off: "
                        "run until the budget ends)")
    p.add_argument("--block-manager", metavar="module:Attr",
                   help="with --model scheduler: the block manager given to the scheduler "
                        "(as verify-scheduler's; default: the module-level BlockManager of the "
                        "scheduler's module, else the reference)")
    add_out_of_blocks(p)
    add_timeout(p)
    add_shrink_seconds(p)
    for action in p._actions:  # the model's command's own budget unless given
        if action.dest == "shrink_budget":
            action.default = None
            action.help = action.help.replace(
                "(default: %(default)s)", f"(default: the model's checking command's: "
                f"{SHRINK_STEPS}; {RUN['engine']['shrink_steps']} for --model engine)")
    p.set_defaults(defers_interrupts=True)  # Ctrl-C is polled for by the campaign's loop
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object "
                                                        "instead of text (default: off)")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.campaign import Budget, Campaign, Settings
    from kvcheck.errors import UsageError
    from kvcheck.targets.loading import location

    if args.block_manager and args.model != "scheduler":
        raise UsageError("--block-manager is for --model scheduler")
    if args.out_of_blocks and args.model == "device":
        raise UsageError("--out-of-blocks is not for --model device (a data target's store "
                         "says when it is out of blocks)")
    if args.out_of_blocks and args.model == "engine":
        raise UsageError("--out-of-blocks is not for --model engine (the engine's own scheduler "
                         "meets its KV-cache manager's refusals itself)")
    if args.target is None:
        args.target = DEFAULT_TARGET[args.model]
    seconds = args.time if args.time is not None or args.runs else duration(DEFAULT_TIME)
    settings = Settings(target=location(args.target), model=args.model, seed=args.seed,
                        timeout=args.timeout, shrink_seconds=args.shrink_seconds,
                        shrink_steps=args.shrink_budget,
                        out_of_blocks=location(args.out_of_blocks) if args.out_of_blocks else None,
                        block_manager=(location(args.block_manager) if args.block_manager else None))
    bar = Progress(label="campaign") if not args.json else None

    def found(entry: dict) -> None:
        if args.json:
            return
        if bar:
            bar.close()
        sh = entry["shortest"]
        what = "found" if entry["new"] else "shorter"
        length = "" if entry["this_length"] is None else f" ({entry['this_length']} operations)"
        where = f" -> {campaign.store.dir / sh['trace']}" if sh["trace"] and (
            entry["new"] or entry["shorter"]) else ""
        print(f"{what}: [run {sh['run']}] {entry['kind']} {entry['clause']}{length}{where}",
              flush=True)

    def progress(st: dict) -> None:
        if bar:
            bar.say(f"campaign: {_clock(st['elapsed'])}, {st['runs']} runs done"
                    + (f" ({st['cut']} cut)" if st["cut"] else "")
                    + f", {st['ops_per_second']:,.0f} checked ops/s, {st['in_flight']} in flight, "
                      f"{st['signatures']} signature(s)")

    campaign = Campaign(settings, args.out, Budget(seconds, args.runs), args.workers, args.ray,
                        args.stop_on_failure, found, progress)
    campaign.open()  # bad --out before anything runs
    try:
        summary = campaign.run()
    finally:
        if bar:
            bar.close()
    return report(args, campaign, summary)


def _clock(seconds: float) -> str:
    from kvcheck.campaign.plan import show_duration

    return show_duration(seconds)


def report(args, campaign, s: dict) -> int:
    import sys

    from kvcheck.errors import FAIL, INCONCLUSIVE, INTERNAL, INTERRUPTED, PASS, UsageError

    verdict = s["verdict"]
    if verdict == "bad-input":
        if not s["runs"]["completed"]:
            campaign.store.discard()  # nothing ran: the same --out serves the corrected command
        raise UsageError(s.get("error") or f"the target refused every shape drawn "
                                           f"({s.get('last_refusal')})")
    if args.json:
        emit_json(s)
    else:
        _print(args, campaign, s)
    if campaign.interrupted or verdict == "interrupted":
        print("kvcheck: interrupted: the runs in flight were cut; the campaign resumes from "
              f"{campaign.store.dir}", file=sys.stderr)
        return INTERRUPTED
    return {"pass": PASS, "fail": FAIL, "incomplete": INCONCLUSIVE, "error": INTERNAL}[verdict]


def _print(args, campaign, s: dict) -> None:
    runs, sigs = s["runs"], s["signatures"]
    d = campaign.store.dir
    cut = (f"; {runs['cut']} cut before they finished (time up, stopped or interrupted), never "
           f"counted" if runs["cut"] else "")
    refused = (f"; {runs['refused']} refused by the target (shapes it cannot be built at, "
               f"e.g. {s.get('last_refusal')})" if runs["refused"] else "")
    errors = f"; {runs['errors']} failed in kvcheck ({s.get('last_error')})" if runs["errors"] else ""
    sessions = len(s["sessions"])
    where = s["sessions"][-1]["pool"] if s["sessions"] else "no pool"
    figures = (f"{s['ops']:,} checked operations in {_clock(s['seconds'])} "
               f"({s['ops_per_second']:,.0f}/s) on {where}"
               + (f", over {sessions} sessions" if sessions > 1 else ""))
    verdict = s["verdict"]
    if verdict == "pass":
        print(f"PASS {s['target']}: {runs['completed']} campaign runs ({s['model']} model, seed "
              f"{s['seed']}) all passed{cut}{refused}: {figures}")
    elif verdict == "fail":
        print(f"FAIL {s['target']}: {len(sigs)} signature(s) in {runs['completed']} completed "
              f"runs ({runs['failed']} failed){cut}{refused}{errors}: {figures}")
        for i, e in enumerate(sigs, 1):
            sh = e["shortest"]
            length = "no trace" if sh["length"] is None else f"shortest {sh['length']} operations"
            print(f"  {i}. {e['kind']} {e['clause']} [{'+'.join(e['op_kinds']) or '-'}]: "
                  f"{e['runs']} run(s), {length} (run {sh['run']}: {sh['shape']})")
            print(f"     {sh['witness']}")
            if e["replay"]:
                print(f"     replay: {e['replay']}")
            print(f"     re-run: {e['rerun']}")
    elif verdict == "incomplete":
        print(f"INCONCLUSIVE {s['target']}: no run completed{cut}{refused}: no verdict "
              f"(a longer --time lets a run finish)")
    elif verdict == "interrupted":
        print(f"INTERRUPTED {s['target']}: {runs['completed']} runs completed{cut}{refused}"
              f"{errors}, then Ctrl-C: no verdict (the same command resumes the campaign)")
    else:
        print(f"ERROR {s['target']}: {runs['completed']} runs completed{cut}{refused}{errors}: "
              f"no verdict")
    if s.get("vacuous"):
        from kvcheck.targets import vacuity

        print(vacuity.line(s["vacuous"]))
    c = s["coverage"]
    if not c["classes"]:
        print(f"coverage: {c['note']}")
    else:
        total = c["total"]
        seen = sum(1 for n in total.values() if n)
        print(f"coverage: {seen}/{len(total)} outcome classes occurred: "
              + ", ".join(f"{k} {n:,}" for k, n in total.items()))
        if c.get("counterexample"):
            print(f"note: classes that occurred only in a counterexample: "
                  f"{', '.join(c['counterexample'])}")
        if c["never"]:
            print(f"warning: outcome classes that never occurred: {', '.join(c['never'])}")
        reasons: dict[str, list[str]] = {}
        for k, why in (c.get("not_applicable") or {}).items():
            reasons.setdefault(why, []).append(k)
        for why, names in reasons.items():
            print(f"note: not applicable to this target: {', '.join(names)} ({why})")
        if c["not_offered"]:
            print(f"note: classes the target cannot show (it lacks an operation they need): "
                  f"{', '.join(c['not_offered'])}")
    print(f"summary: {d / 'summary.json'}, {d / 'junit.xml'}, {d / 'index.html'}")
