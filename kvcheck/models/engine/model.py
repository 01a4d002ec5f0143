"""The engine model, as data: an engine core (a real scheduler with its real KV-cache
manager) driven by engine steps with a generated model output.

Operations:

``add(seq, tokens, max_new, priority)``
    a request arrives with prompt ``tokens`` (token ids: prefix caching sees them), to
    generate at most ``max_new`` tokens (it also stops at the stop token the generated
    output may sample), with a ``priority`` (read under priority scheduling; the arrival
    order is the order of the ``add`` operations);
``abort(seq)``
    the request is aborted between steps;
``step(gen)``
    one engine step: ``schedule()``, the model runner's output generated from ``gen`` (the
    driver's ``step_gen(seed, k)`` for the run's ``k``-th step)
    (which requests sample, how many of their drafts are accepted, which token, whether
    it is the stop token, the drafts for the next step), ``update_from_output()``. The
    results record what the step scheduled and the output generated, so a trace shows
    the run; the output is a function of ``gen`` and each scheduled request's id and
    drafts, so a replay on another release generates the same output for the same
    schedule.

The scope: the KV pool (``num_blocks`` usable blocks of ``block_size`` tokens), the step's
token budget (``budget``: chunked prefill), ``max_seqs``, the scheduling ``policy``
(``fcfs`` or ``priority``; on ``sglang-engine`` also SGLang's ``lpm``, ``dfs-weight``, ``lof``
and ``random``, which promise no FCFS order: no rule here assumes one), prefix caching
(``caching``), the speculative tokens per step (``spec``: n-gram style drafts, 0 = none)
and ``max_model_len`` (the tokens a request may reach, hence its block-table row:
``cdiv(max_model_len, block_size)`` blocks; 0 = the engine's default: for vLLM's targets the
largest its release accepts on the pool at start-up, which no request the pool holds
reaches). What the run checks lives in ``oracle``.
Shrinking works on requests and steps (the generic shrinker drops operations, truncates
prompts, lowers counts; here: an abort dropped with its request, steps cut from the end).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvcheck.check.model import (
    COUNT,
    NEW_SEQ,
    SEQ,
    SEQS,
    TOKENS,
    VALUE,
    Arg,
    Model,
    OpSpec,
    Options,
    ScopeField,
    register,
)

POLICIES = ("fcfs", "priority")  # a trace's ``priority`` field: 0, 1
# SGLang's other SchedulePolicy policies (sglang-engine: the release's own calc_priority sorts
# the waiting queue); a trace's scope holds integers: its ``policy`` field is 1 + the index
OTHER_POLICIES = ("lpm", "dfs-weight", "lof", "random")


@dataclass(frozen=True)
class EngineScope:
    """The pool and the engine's scheduling settings (everything else at its default)."""

    num_blocks: int
    block_size: int
    budget: int = 16
    max_seqs: int = 8
    policy: str = "fcfs"
    caching: bool = True
    spec: int = 0
    max_model_len: int = 0  # tokens a request may reach (0: the engine's default for the pool)

    def describe(self) -> str:
        return (f"{self.num_blocks} blocks x {self.block_size} slots, budget {self.budget} "
                f"tokens, {self.max_seqs} seqs, {self.policy}, prefix caching "
                f"{'on' if self.caching else 'off'}"
                + (f", {self.spec} speculative tokens" if self.spec else "")
                + (f", max_model_len {self.max_model_len}" if self.max_model_len else ""))


@dataclass
class EngineOp:
    kind: str
    seq: int | None = None
    tokens: list | None = None
    max_new: int | None = None
    priority: int | None = None
    gen: int | None = None
    outcome: str = "ok"
    scheduled: dict | None = None  # results of a step
    sampled: dict | None = None
    drafts: dict | None = None
    finished: list | None = None


def _make(kind: str, **args) -> EngineOp:
    return EngineOp(kind, **args)


_MAP = {"type": "object", "maxProperties": 100000}
OPS = {
    "add": OpSpec("add", _make, (Arg("seq", NEW_SEQ), Arg("tokens", TOKENS),
                                 Arg("max_new", COUNT), Arg("priority", VALUE, low=0)),
                  doc="A request arrives: its prompt's token ids, at most max_new tokens to "
                      "generate, its priority (lower first, under priority scheduling); "
                      "only requests the pool can hold whole are added."),
    "abort": OpSpec("abort", _make, (Arg("seq", SEQ),),
                    doc="The request is aborted between steps: it releases every block."),
    "step": OpSpec("step", _make, (Arg("gen", VALUE, low=0),),
                   results=(Arg("scheduled", VALUE, schema=_MAP), Arg("sampled", VALUE, schema=_MAP),
                            Arg("drafts", VALUE, schema=_MAP), Arg("finished", SEQS)),
                   doc="One engine step: schedule(), the generated model output, "
                       "update_from_output(); every block-level, prefix-cache and engine "
                       "property holds after it."),
}


class EngineModel(Model):
    name = "engine"
    title = "an engine core (its own scheduler and KV-cache manager)"
    ops = OPS
    outcomes = ("ok",)
    scope_fields = (ScopeField("num_blocks"),)
    state_schema = {"type": "object"}

    # -- operations --------------------------------------------------------------------
    def describe(self, op) -> str:
        if op.kind == "add":
            return (f"add(seq={op.seq}, tokens={op.tokens}, max_new={op.max_new}, "
                    f"priority={op.priority})")
        if op.kind == "abort":
            return f"abort(seq={op.seq})"
        text = f"step(gen={op.gen})"
        if op.scheduled is not None:
            text += f" -> scheduled {op.scheduled}, sampled {op.sampled}"
            if op.drafts:
                text += f", drafts {op.drafts}"
            if op.finished:
                text += f", finished {op.finished}"
        return text

    # -- runs ----------------------------------------------------------------------------
    def resolve(self, spec):
        from kvcheck.models.engine.loading import resolve

        return resolve(spec)

    def build(self, factory, scope: EngineScope, options: Options):
        from kvcheck.models.engine.loading import build

        return build(factory, scope)

    def start(self, target, scope: EngineScope, options: Options):
        from kvcheck.models.engine.oracle import EngineOracle

        return EngineOracle(target, scope, options.mode, options.seed)

    def driver(self, seed: int, scope: EngineScope, target, options: Options):
        """Seeded requests over a few shared prompt stems (prefix-cache hits), arriving
        over the run, some aborted; ``Options.extra``: ``requests`` (default 10)."""
        return EngineDriver(seed, scope, options.extra.get("requests", 10), target)

    # -- shrinking -----------------------------------------------------------------------
    def size(self, ops: list) -> int:
        return sum(1 for o in ops if o.kind == "add")

    def count_hints(self, scope: EngineScope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_candidates(self, ops: list, scope: EngineScope):
        steps = [i for i, o in enumerate(ops) if o.kind == "step"]
        # the steps after the last non-step operation cut by half (the sweep drains the rest)
        last = max((i for i, o in enumerate(ops) if o.kind != "step"), default=-1)
        tail = [i for i in steps if i > last]
        if len(tail) > 1:
            yield ops[:last + 1 + len(tail) // 2], scope
        # speculation off, prefix caching off, fcfs, a smaller budget (with at most as many
        # sequences: vLLM's SchedulerConfig refuses max_num_seqs above max_num_batched_tokens):
        # a simpler engine showing the same bug
        import dataclasses

        budget = max(scope.block_size, scope.budget // 2)
        for change in ({"spec": 0}, {"caching": False}, {"policy": "fcfs"},
                       {"budget": budget, "max_seqs": min(scope.max_seqs, budget)}):
            smaller = dataclasses.replace(scope, **change)
            if smaller != scope:
                yield list(ops), smaller

    # -- showing -------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        parts = [f"running {state.get('running', [])}, waiting {state.get('waiting', [])}, "
                 f"free {state.get('num_free', '?')} of {len(state.get('refs', []))}"]
        tables = state.get("tables", {})
        if tables:
            lens = state.get("computed", {})
            parts.append("; ".join(f"req {q}: {lens.get(q, '?')} computed in {t}"
                                   for q, t in tables.items()))
        cached = state.get("cached", [])
        if cached:
            parts.append(f"cached blocks {cached}")
        return " | ".join(parts)

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        if op.kind == "add":
            return (f"request {op.seq} arrives: {len(op.tokens or [])} prompt tokens, at most "
                    f"{op.max_new} to generate, priority {op.priority}")
        if op.kind == "abort":
            return f"request {op.seq} is aborted"
        if op.scheduled is None:
            return "engine step"
        parts = [f"scheduled {op.scheduled}" if op.scheduled else "scheduled nothing"]
        if op.sampled:
            parts.append(f"sampled {op.sampled}")
        if op.finished:
            parts.append(f"finished {op.finished}")
        return "; ".join(parts)

    def initial_state_json(self, scope: EngineScope) -> dict:
        return {"running": [], "waiting": [], "tables": {}, "computed": {},
                "refs": [0] * scope.num_blocks, "num_free": scope.num_blocks, "cached": []}

    def scope_words(self, scope: EngineScope) -> str:
        return (f", budget {scope.budget}, {scope.max_seqs} seqs, {scope.policy}, caching "
                f"{'on' if scope.caching else 'off'}, spec {scope.spec}"
                + (f", max_model_len {scope.max_model_len}" if scope.max_model_len else ""))

    def scope_json(self, scope: EngineScope) -> dict:
        """A trace's scope holds integers: ``priority`` 1 for priority scheduling (0: fcfs),
        ``caching`` 1 for prefix caching on; ``max_model_len`` only when the run set it;
        ``policy`` only for one of SGLang's other policies: 1 + its index in
        ``OTHER_POLICIES`` (1 lpm, 2 dfs-weight, 3 lof, 4 random)."""
        out = {"num_blocks": scope.num_blocks, "block_size": scope.block_size,
               "budget": scope.budget, "max_seqs": scope.max_seqs,
               "priority": int(scope.policy == "priority"), "caching": int(scope.caching),
               "spec": scope.spec}
        if scope.policy in OTHER_POLICIES:
            out["policy"] = 1 + OTHER_POLICIES.index(scope.policy)
        if scope.max_model_len:
            out["max_model_len"] = scope.max_model_len
        return out

    def scope_from_json(self, data: dict) -> EngineScope:
        known = {"num_blocks", "block_size", "budget", "max_seqs", "priority", "caching", "spec",
                 "max_model_len", "policy"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}")
        values = {k: data[k] for k in ("budget", "max_seqs", "spec", "max_model_len")
                  if k in data}
        if any(type(v) is not int or v < 0 for v in (*values.values(), data["num_blocks"],
                                                        data["block_size"])):
            raise ValueError("num_blocks, block_size, budget, max_seqs, spec and max_model_len "
                             "must be non-negative integers")
        if data.get("priority", 0) not in (0, 1) or data.get("caching", 1) not in (0, 1):
            raise ValueError("priority and caching must be 0 or 1")
        policy = POLICIES[data.get("priority", 0)]
        if data.get("policy", 0):
            code = data["policy"]
            if type(code) is not int or not 0 < code <= len(OTHER_POLICIES) \
                    or data.get("priority", 0):
                raise ValueError(f"policy must be 1 .. {len(OTHER_POLICIES)} "
                                 f"({', '.join(OTHER_POLICIES)}), with priority 0")
            policy = OTHER_POLICIES[code - 1]
        return EngineScope(data["num_blocks"], data["block_size"], **values,
                           policy=policy,
                           caching=bool(data.get("caching", 1)))


def step_gen(seed: int, k: int) -> int:
    """The ``gen`` of a run's ``k``-th engine step (0-based): the driver's steps and the
    oracle's draining steps alike, so a step the shrinker drops from the end and the sweep
    runs again is the very same step."""
    return random.Random(seed * 1_000_003 + k).randrange(1 << 31)


def fits(scope: EngineScope, prompt: int, max_new: int, longest: int = 0) -> bool:
    """Whether the pool can hold the request whole: its prompt, every token it may
    generate (up to ``max_model_len`` where the run sets it: the engine stops a request
    there, and its input processor refuses a prompt that leaves no room for an output
    token, vLLM #27099) and a step's drafts; and, where the target declares
    ``longest_request`` (``longest``: an engine that neither chunks a prefill nor stops a
    request at a length, nano-vllm), whether prompt and output fit it."""
    total = prompt + max_new
    if longest and total > longest:
        return False
    if scope.max_model_len:
        if prompt >= scope.max_model_len:
            return False
        total = min(total, scope.max_model_len)
    need = -(-(total + scope.spec) // scope.block_size)
    return prompt >= 1 and max_new >= 1 and need <= scope.num_blocks


class EngineDriver:
    """A seeded run: ``n`` requests (prompts drawn over two shared stems, so that prefix
    caching hits, some a whole number of blocks long), arriving one at a time with
    probability 0.4 before each step, a few aborted, steps until every request has
    finished (the oracle's sweep drains what is left). A target may declare
    ``longest_request`` (see ``fits``) and ``aborts = False`` (an engine without aborts:
    none is drawn)."""

    def __init__(self, seed: int, scope: EngineScope, n: int, target=None):
        self.rng = random.Random(seed)
        self.seed, self.scope, self.n = seed, scope, n
        self.longest = getattr(target, "longest_request", 0)
        self.aborts = getattr(target, "aborts", True)
        bs = scope.block_size
        self.stems = [[self.rng.randint(2, 6) for _ in range(3 * bs)] for _ in range(2)]
        self.added = 0
        self.pending_abort: list[int] = []

    def _request(self) -> EngineOp | None:
        rng, s = self.rng, self.scope
        for _ in range(20):
            stem = rng.choice(self.stems)
            cut = rng.choice((0, s.block_size, 2 * s.block_size, rng.randint(0, len(stem))))
            tail = [rng.randint(2, 6) for _ in range(rng.choice((0, 1, rng.randint(1, 6))))]
            tokens = stem[:cut] + tail
            max_new = rng.randint(1, 3 * s.block_size)
            if fits(s, len(tokens), max_new, self.longest):
                q = self.added
                self.added += 1
                if rng.random() < 0.15 and self.aborts:
                    self.pending_abort.append(q)
                return EngineOp("add", seq=q, tokens=tokens, max_new=max_new,
                                priority=rng.randint(0, 2))
        return None

    def next_op(self, state):
        rng = self.rng
        if self.added < self.n and (not state.has_work() or rng.random() < 0.4):
            op = self._request()
            if op is not None:
                return op
            self.n = self.added
        if self.pending_abort and rng.random() < 0.2:
            q = self.pending_abort.pop(0)
            if q in state.live_seqs():
                return EngineOp("abort", seq=q)
        if state.has_work():
            return EngineOp("step", gen=step_gen(self.seed, state.engine_steps))
        return None


MODEL = register(EngineModel())
