"""``kvcheck verify-engine``: check an engine core -- the engine's own scheduler with its own
KV-cache manager and request objects -- driven by engine steps whose model output kvcheck
generates (issue 34).

The engine model (``kvcheck.models.engine``) run by the one checker: ``kvcheck.verify``
drives it and shrinks a violation to a trace of the one format (``model: "engine"``), which
``kvcheck replay`` and ``kvcheck report`` read like any other.
"""

from __future__ import annotations

from kvcheck.cli.commands import checking
from kvcheck.defaults import ENGINE_RUN

FULL_HELP = ("accepted for symmetry with the other checking commands: the engine oracle reads "
             "the whole engine after every operation in both modes (default: off, the same "
             "checks)")


def add_parser(sub) -> None:
    from kvcheck.cli.commands.common import nonneg_int, positive_int
    from kvcheck.models.engine.model import OTHER_POLICIES, POLICIES

    p = sub.add_parser("verify-engine", help="check an engine core (its own scheduler and KV-cache "
                                              "manager) step by step, no model",
                       description="Drive TARGET (an engine core; registered: vllm-v1-engine"
                                   "[@VERSION], vLLM v1's real Scheduler, KVCacheManager and "
                                   "Request; sglang-engine[@VERSION], SGLang's own "
                                   "Scheduler loop, ScheduleBatch, Req, SchedulePolicy, "
                                   "PrefillAdder and RadixCache) "
                                   "with seeded requests (shared prompt prefixes, "
                                   "priorities, aborts) and engine steps whose model output is "
                                   "generated from the seed (sampled tokens, accepted drafts, "
                                   "stop tokens); after every step check every block-level and "
                                   "prefix-cache invariant, each KV call the scheduler made, "
                                   "and the engine's own properties (held blocks, crashes, "
                                   "liveness). Exit 0 when every rule held, 1 on a violation, "
                                   "2 on bad input.")
    d = ENGINE_RUN

    def settings(q) -> None:
        q.add_argument("--budget", type=positive_int, default=d["budget"], metavar="TOKENS",
                       help="the step's token budget, max_num_batched_tokens: prompts longer "
                            "than it are prefilled in chunks (default: %(default)s)")
        q.add_argument("--max-seqs", type=positive_int, default=d["max_seqs"], metavar="N",
                       help="max_num_seqs: the most requests running at once, in sequences "
                            "(default: %(default)s)")
        q.add_argument("--policy", choices=(*POLICIES, *OTHER_POLICIES), default="fcfs",
                       help="the scheduling policy: fcfs, priority (then arrival), or, on "
                            "sglang-engine, one of SGLang's other SchedulePolicy policies "
                            "(lpm, dfs-weight, lof, random: the release's calc_priority "
                            "orders the waiting queue) (default: %(default)s)")
        q.add_argument("--spec-tokens", type=nonneg_int, default=0, metavar="K",
                       help="speculative tokens per step, in tokens (n-gram style drafts the "
                            "generated output proposes and accepts in part; default: "
                            "%(default)s, none)")
        q.add_argument("--no-prefix-caching", action="store_true",
                       help="run with prefix caching off (default: on)")
        q.add_argument("--max-model-len", type=positive_int, default=None, metavar="TOKENS",
                       help="max_model_len, in tokens: the most a request may reach (longer "
                            "prompts are not drawn) and so its block-table row, "
                            "cdiv(TOKENS, block size) blocks, which no request's table may "
                            "exceed; one the engine refuses at start-up on this pool (vLLM: "
                            "more than the KV pool holds) is refused in its words, exit 2 "
                            "(default: the largest the engine accepts on this pool, at most "
                            "65,536: vLLM's max_model_len=-1 auto-fit; nano-vllm: the budget)")
        q.add_argument("--requests", type=positive_int, default=d["requests"], metavar="N",
                       help="requests in the seeded workload (default: %(default)s)")

    checking.add_run_flags(p, "vllm-v1-engine", "engine core", d["num_blocks"], d["block_size"],
                           d["ops"], full_help=FULL_HELP, out_of_blocks=False, extra=settings)
    p.set_defaults(run=run, shrink_budget=d["shrink_steps"])


def run(args) -> int:
    from kvcheck.models.engine.model import EngineScope

    scope = EngineScope(args.blocks, args.block_size, args.budget, args.max_seqs, args.policy,
                        not args.no_prefix_caching, args.spec_tokens, args.max_model_len or 0)
    result = checking.run(args, "verify-engine", "engine", scope=scope,
                          extra={"requests": args.requests})
    return checking.report(args, result, "verify-engine", _passed, _json)


def _passed(r) -> str:
    st, scope = r.state.stats, r.state.scope
    return (f"{st['requests']} requests ({st['finished']} finished, {st['aborted']} aborted) "
            f"over {st['steps']} engine steps on {scope.describe()}: "
            f"{st['scheduled_tokens']} tokens scheduled, {st['preemptions']} preemptions, "
            f"{st['hits']} cache-hit blocks, {st['kv_calls']} KV calls checked; every "
            f"block-level, prefix-cache, KV-call and engine rule held")


def _json(r) -> dict:
    return {"stats": dict(r.state.stats),
            "original_length": r.original_length if not r.ok else r.ops}
