"""What each run of a campaign checks: its seed, shape and operation mix (swarm testing).

Run 0 is the model's checking command at its defaults with the campaign's seed
(``kvcheck verify`` at 32 blocks x 4, 10,000 operations: ``kvcheck.defaults``), so a
campaign checks at least what that command checks, and finds what it finds as soon as it
would. Every later run draws its own configuration from the campaign's seed and the run's
number (``draw``), so a campaign is reproducible and resuming it continues the same sequence:

* a pool from tiny (one block) to large (4,096 blocks), block sizes 1 to 32 (1 often:
  some bugs show only there), prompts scaled with the block size;
* an operation mix: the driver's chances of allocate, fork and free_seq each multiplied
  by a factor from 1/4 to 4, or set to 0 (no forks at all, never a free): a run that
  favours one kind reaches interleavings the default mix makes rare (a pool kept full,
  long shared chains);
* a number of operations (the scheduler: requests; the device: a batch-step share).

Small scopes first: runs 1 to ``SMALL_FIRST`` draw from the small end only (pools of at most
``SMALL_POOL`` blocks, block sizes up to ``SMALL_BLOCK``, ``SMALL_OPS`` operations), each
with a mix drawn as above. Most allocator bugs show on a few blocks within a few operations,
where a run is cheap to drive and its counterexample cheap to shrink, so beside run 0 the
campaign tries many small shapes before the large ones (the small scope hypothesis; a
property-based tester starts small for the same reason); the full swarm follows.

``PLAN`` numbers this sequence: plan 1 (campaigns begun before run 0 was the command's
defaults) drew every run, run 0 included, from the full swarm; plan 2 made run 0 the
command's defaults and the later runs the full swarm; plan 3 puts the small scopes first.
A resumed campaign keeps the plan it began with.

The engine model (``kvcheck verify-engine``: an engine's own scheduler) has no operation mix:
its driver's workload is the requests, and a run draws the engine's settings instead (its
``ENGINE`` tables): a pool and block size, the requests, the step's token budget
(``--budget``: a prompt longer than it is prefilled in chunks), ``--max-seqs`` (at most the
budget, as vLLM's config requires), the scheduling policy, prefix caching on or off, the
speculative tokens per step (fewer than the budget, as vLLM's config requires) and
``--max-model-len`` (often unset) -- each only from the values the target accepts. What it
accepts is learnt once, when the campaign starts (``kvcheck.campaign.engine``: the target is
built at verify-engine's defaults with each value alone, in a process of its own) and kept in
the campaign's settings (``Settings.accepts``), so a resumed campaign draws the same runs; a
setting the target refuses (nano-vllm's speculative decoding, vLLM v0's chunked prefill with
prefix caching on an old release, a release without priority scheduling) is never drawn.
Its draws are keyed by the model's name, as every model's are, so adding it changed no
other model's sequence.

A ``RunSpec`` is small, picklable and JSON; ``command()`` is the one ``kvcheck`` command
line that re-runs it exactly (the checking commands take the mix as ``--mix``; the engine
model's settings are verify-engine's flags).
"""

from __future__ import annotations

import random
import re
import shlex
from dataclasses import asdict, dataclass, field

from kvcheck.defaults import RUN, SHRINK_SECONDS, SHRINK_STEPS

PLAN = 3  # run 0: the checking command at its defaults; then small scopes; then the swarm
SMALL_FIRST = 6  # runs 1..SMALL_FIRST of plan 3: small scopes
SMALL_POOL = 8  # blocks, at most, in a small-scope run
SMALL_BLOCK = 4  # block size, at most, in a small-scope run
MODELS = tuple(RUN)  # every model with a checking command (``kvcheck.defaults``)
COMMANDS = {"blocks": "verify", "prefix": "verify-prefix", "scheduler": "verify-scheduler",
            "device": "verify-device", "hybrid": "verify-hybrid", "tiers": "verify-tiers",
            "engine": "verify-engine"}

# What the swarm draws from, per model: pools, block sizes, operations per run.
POOLS = {
    "blocks": (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 128, 256, 1024, 4096),
    "prefix": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128),
    "device": (1, 2, 3, 4, 6, 8, 12, 16, 32),
    "scheduler": (2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
    "hybrid": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 256),
    "tiers": (1, 2, 3, 4, 6, 8, 12, 16, 32),
    "engine": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),  # (raised to hold one request: _engine)
}
BLOCK_SIZES = {
    "blocks": (1, 1, 2, 2, 3, 4, 4, 8, 16, 32),
    "prefix": (1, 1, 2, 2, 3, 4, 4, 8, 16),
    "device": (1, 1, 2, 3, 4, 4, 8, 16),
    "scheduler": (1, 1, 2, 4, 4, 8, 16),
    "hybrid": (1, 1, 2, 2, 3, 4, 8, 16),
    "tiers": (1, 1, 2, 2, 3, 4, 8, 16),
    "engine": (1, 2, 2, 4, 4, 8, 16),
}
OPS = {
    "blocks": (300, 1000, 2000, 5000, 10000, 20000),
    "prefix": (200, 500, 1000, 2000, 5000),
    "device": (50, 100, 200, 400, 800),
    "scheduler": (2, 4, 6, 8, 12, 16, 24, 32),  # requests in the run's one workload
    "hybrid": (200, 500, 1000, 3000, 5000),
    "tiers": (200, 500, 1000, 3000),
    "engine": (2, 4, 8, 12, 20, 30, 50),  # requests in the run's workload (extra["requests"])
}
SMALL_OPS = {  # a small-scope run's length: a few times what fills its pool
    "blocks": (100, 300), "prefix": (100, 200), "device": (50, 100), "scheduler": (2, 4, 6),
    "hybrid": (100, 200), "tiers": (100, 200), "engine": (2, 4, 6)}
MIX = {"blocks": ("allocate", "fork", "free_seq", "max_prompt"),
       "prefix": ("allocate", "fork", "free_seq"),
       "device": ("allocate", "fork", "free_seq", "max_prompt"),
       "scheduler": (),
       "hybrid": ("allocate", "free_seq"),
       "tiers": ("allocate", "load", "store", "complete", "evict", "free", "swap"),
       "engine": ()}

# The engine model's settings a run draws (verify-engine's flags), each value only where the
# target accepts it (``Settings.accepts``); ``kvcheck.campaign.engine`` builds the target
# with each value alone to learn which. Small-scope runs draw budgets up to SMALL_BUDGET.
ENGINE = {
    "block_size": tuple(sorted(set(BLOCK_SIZES["engine"]))),
    "budget": (2, 4, 8, 16, 32, 64),  # --budget: the step's token budget (chunked prefill)
    "max_seqs": (1, 2, 3, 4, 8, 16),  # --max-seqs (drawn at most the budget)
    "policy": ("fcfs", "priority"),  # --policy
    "caching": (True, False),  # prefix caching on; --no-prefix-caching
    "spec": (0, 1, 2, 3, 4),  # --spec-tokens
}
SMALL_BUDGET = 16
# --max-model-len: "any" value accepted, only values "within" the budget (an engine that
# admits a prompt whole: nano-vllm, vLLM v0 without chunked prefill), or "none"
MODEL_LEN = ("any", "within", "none")


# How often a run leaves an operation out of its mix entirely (no forks: nothing shared; no
# frees: the pool stays full, so only the run's first operations fill it).
ZERO = {"fork": 0.1, "free_seq": 0.05}


@dataclass
class Settings:
    """What every run of a campaign shares (the command line's flags)."""

    target: str
    model: str = "blocks"
    seed: int = 0
    timeout: float | None = 10.0
    shrink_seconds: float = SHRINK_SECONDS  # the wall-clock cap on a run's shrinking
    out_of_blocks: str | None = None  # module:Name
    block_manager: str | None = None  # the scheduler's
    shrink_steps: int | None = None  # a run's shrinking budget, in operations replayed (None:
    # the model's command's default, ``shrink_budget``)
    accepts: dict | None = None  # the engine model: the settings the target accepts (``ENGINE``
    # values by name, and ``max_model_len``: one of ``MODEL_LEN``); None: every one

    def __post_init__(self) -> None:
        if self.shrink_steps is None:
            self.shrink_steps = shrink_budget(self.model)

    def to_json(self) -> dict:
        return asdict(self)


def shrink_budget(model: str) -> int:
    """The shrinking budget of ``model``'s checking command at its defaults."""
    return RUN.get(model, {}).get("shrink_steps", SHRINK_STEPS)


@dataclass
class RunSpec:
    """One run: the shared settings' values it needs, and what it drew."""

    run: int
    model: str
    target: str
    seed: int
    scope: dict  # the model's scope, as a trace records it
    ops: int  # operations (the scheduler: requests; the engine: the most operations)
    extra: dict = field(default_factory=dict)  # weights (the mix), batch_prob; the engine's
    # requests
    timeout: float | None = 10.0
    shrink_seconds: float = SHRINK_SECONDS
    out_of_blocks: str | None = None
    block_manager: str | None = None
    shrink_steps: int = SHRINK_STEPS

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        return cls(**data)  # (a run recorded before shrink_steps gets the default)

    def shrink_budget(self):
        from kvcheck.check.shrink import Budget

        return Budget(self.shrink_steps, self.shrink_seconds)

    def describe(self) -> str:
        """The drawn shape and mix, in a few words."""
        s = self.scope
        words = f"{s['num_blocks']} x {s['block_size']}"
        if self.model == "engine":
            words += (f", {self.extra.get('requests')} requests, budget {s['budget']}, "
                      f"{s['max_seqs']} seqs, {_engine_policy(s)}, "
                      f"caching {'on' if s['caching'] else 'off'}")
            if s.get("spec"):
                words += f", {s['spec']} speculative tokens"
            if s.get("max_model_len"):
                words += f", max_model_len {s['max_model_len']}"
            return words
        if "watermark" in s:
            words += f", watermark {s['watermark']}, {self.ops} requests"
            if self.extra.get("workloads", 1) != 1:
                words += f" x {self.extra['workloads']} workloads"
        else:
            words += f", {self.ops} ops"
        mix = self.extra.get("weights")
        if mix:
            words += f", mix {mix_text(mix)}"
        if "batch_prob" in self.extra:
            words += f", batch {self.extra['batch_prob']:g}"
        return words

    def command(self) -> str:
        """The ``kvcheck`` command that re-runs exactly this run."""
        s = self.scope
        argv = ["kvcheck", COMMANDS[self.model], self.target, "--blocks", str(s["num_blocks"]),
                "--block-size", str(s["block_size"])]
        if self.model == "scheduler":
            argv += ["--watermark", str(s["watermark"]), "--requests", str(self.ops),
                     "--workloads", str(self.extra.get("workloads", 1))]
            if self.block_manager:
                argv += ["--block-manager", self.block_manager]
        elif self.model == "engine":
            argv += ["--ops", str(self.ops), "--requests", str(self.extra["requests"]),
                     "--budget", str(s["budget"]), "--max-seqs", str(s["max_seqs"]),
                     "--policy", _engine_policy(s),
                     "--spec-tokens", str(s["spec"])]
            if not s["caching"]:
                argv += ["--no-prefix-caching"]
            if s.get("max_model_len"):
                argv += ["--max-model-len", str(s["max_model_len"])]
        else:
            argv += ["--ops", str(self.ops)]
        argv += ["--seed", str(self.seed)]
        if self.extra.get("weights"):
            argv += ["--mix", mix_text(self.extra["weights"])]
        if "batch_prob" in self.extra:
            argv += ["--batch-prob", repr(self.extra["batch_prob"])]
        if self.out_of_blocks and self.model not in ("device", "engine"):
            argv += ["--out-of-blocks", self.out_of_blocks]
        if self.timeout != 10.0:
            argv += ["--timeout", f"{self.timeout or 0:g}"]
        if self.shrink_steps != shrink_budget(self.model):
            argv += ["--shrink-budget", str(self.shrink_steps)]
        if self.shrink_seconds != SHRINK_SECONDS:
            argv += ["--shrink-seconds", f"{self.shrink_seconds:g}"]
        return " ".join(shlex.quote(a) for a in argv)


def mix_text(weights: dict) -> str:
    """``allocate=2.0,fork=0.5`` (what ``--mix`` reads back to the same numbers)."""
    return ",".join(f"{k}={v!r}" for k, v in weights.items())


def _factor(rng: random.Random, zero: float) -> float:
    """A weight: 1 (the default mix) a third of the time, 0 with probability ``zero``,
    else 1/4 to 4, log-uniform, to two decimals (what a command line reads back exactly)."""
    x = rng.random()
    if x < zero:
        return 0.0
    if x < 0.35:
        return 1.0
    return round(2.0 ** rng.uniform(-2.0, 2.0), 2)


def defaults(settings: Settings, run: int = 0) -> RunSpec:
    """The model's checking command at its defaults (``kvcheck.defaults``) with the
    campaign's seed and settings, as run ``run`` (the scheduler: all of its workloads; the
    engine: with ``--no-prefix-caching`` where the target accepts prefix caching only off,
    vLLM v0's chunked prefill on an old release)."""
    model = settings.model
    d = RUN[model]
    scope: dict = {"num_blocks": d["num_blocks"], "block_size": d["block_size"]}
    extra: dict = {}
    if model == "scheduler":
        scope["watermark"] = d["watermark"]
        ops = d["requests"]
        extra["workloads"] = d["workloads"]
    elif model == "engine":  # (prefix caching off where the target refuses it on there)
        scope = _engine_scope(d["num_blocks"], d["block_size"], d["budget"], d["max_seqs"],
                              "fcfs", True in accepted(settings, "caching"), 0, 0)
        ops = d["ops"]
        extra["requests"] = d["requests"]
    else:
        ops = d["ops"]
        if "batch_prob" in d:
            extra["batch_prob"] = d["batch_prob"]
    return RunSpec(run, model, settings.target, settings.seed, scope, ops, extra,
                   settings.timeout, settings.shrink_seconds, settings.out_of_blocks,
                   settings.block_manager, settings.shrink_steps)


def is_defaults(run: int, plan: int = PLAN) -> bool:
    """Whether run ``run`` of a campaign drawn by ``plan`` is the command at its defaults."""
    return plan >= 2 and run == 0


def is_small(run: int, plan: int = PLAN) -> bool:
    """Whether run ``run`` of a campaign drawn by ``plan`` is a small-scope run."""
    return plan >= 3 and 1 <= run <= SMALL_FIRST


def draw(settings: Settings, run: int, plan: int = PLAN) -> RunSpec:
    """Run ``run`` of the campaign with ``settings``: the same every time it is drawn. Under
    plan 3 (``PLAN``) run 0 is the command at its defaults (``defaults``), runs 1 to
    ``SMALL_FIRST`` the small-scope draws 0 to ``SMALL_FIRST - 1``, and run ``n`` after them
    the swarm's draw ``n - 1 - SMALL_FIRST``; under plan 2 run ``n`` is the swarm's draw
    ``n - 1``, under plan 1 the swarm's draw ``n``."""
    if is_defaults(run, plan):
        return defaults(settings)
    if is_small(run, plan):
        return _drawn(settings, run, f"small:{run - 1}", small=True)
    index = run - 1 - (SMALL_FIRST if plan >= 3 else 0) if plan >= 2 else run
    return _drawn(settings, run, str(index), small=False)


def _drawn(settings: Settings, run: int, key: str, small: bool) -> RunSpec:
    """Run ``run``: a shape, length and mix drawn from the campaign's seed and ``key`` (the
    swarm's draw number, or ``small:`` and the small-scope draw's), from the small end of
    each choice if ``small``."""
    model = settings.model
    rng = random.Random(f"kvcheck-campaign:{model}:{settings.seed}:{key}")
    if model == "engine":
        return _engine(settings, run, rng, small)
    pools, sizes, lengths = POOLS[model], BLOCK_SIZES[model], OPS[model]
    if small:
        pools = tuple(n for n in pools if n <= SMALL_POOL)
        sizes = tuple(b for b in sizes if b <= SMALL_BLOCK)
        lengths = SMALL_OPS[model]
    seed = rng.getrandbits(31)
    nb = rng.choice(pools)
    bs = rng.choice(sizes)
    ops = rng.choice(lengths)
    scope: dict = {"num_blocks": nb, "block_size": bs}
    extra: dict = {}
    if model == "scheduler":
        nb = max(nb, 2)
        scope = {"num_blocks": nb, "block_size": bs,
                 "watermark": rng.choice((0, 1, 1, 1, 2, 3)) % nb}
    else:
        ops = max(ops, min(OPS[model][-1], 3 * nb))  # enough operations to fill the pool
        weights: dict = {}
        for k in MIX[model]:
            if k == "max_prompt":
                weights[k] = max(1, round(3 * bs * 2.0 ** rng.uniform(-2.0, 1.5)))
            else:
                weights[k] = _factor(rng, ZERO.get(k, 0.0))
        weights = {k: v for k, v in weights.items() if k == "max_prompt" or v != 1.0}
        if weights:
            extra["weights"] = weights
        if model == "device":
            extra["batch_prob"] = round(rng.uniform(0.0, 0.8), 2)
    return RunSpec(run, model, settings.target, seed, scope, ops, extra, settings.timeout,
                   settings.shrink_seconds, settings.out_of_blocks, settings.block_manager,
                   settings.shrink_steps)


def _engine_scope(nb: int, bs: int, budget: int, max_seqs: int, policy: str, caching: bool,
                  spec: int, model_len: int) -> dict:
    """An engine run's scope, as its trace records it (``EngineModel.scope_json``)."""
    from kvcheck.models.engine.model import MODEL, EngineScope

    return MODEL.scope_json(EngineScope(nb, bs, budget, max_seqs, policy, caching, spec,
                                        model_len))


def _engine_policy(scope: dict) -> str:
    """An engine run's scheduling policy, as ``EngineModel.scope_from_json`` reads it from
    the scope (fcfs, priority, or one of SGLang's other policies)."""
    from kvcheck.models.engine.model import MODEL

    return MODEL.scope_from_json(scope).policy


def accepted(settings: Settings, name: str) -> tuple:
    """The values of the engine setting ``name`` the campaign's target accepts, in
    ``ENGINE``'s order (every value where nothing was learnt)."""
    values = ENGINE[name]
    if settings.accepts is None:
        return values
    ok = settings.accepts.get(name, values)
    return tuple(v for v in values if v in ok)


def _engine(settings: Settings, run: int, rng: random.Random, small: bool) -> RunSpec:
    """An engine run: a pool, block size and request count as the other models draw theirs
    (from the small end if ``small``), and the engine's settings, each from the values the
    target accepts: a budget, at most that many sequences, priority scheduling a third of
    the time, prefix caching off a third of the time, speculative tokens half the time
    (fewer than the budget: vLLM's config refuses a budget without room for a token beside
    the drafts, ``max_num_batched_tokens <= num_lookahead_tokens``), a
    max_model_len a quarter of the time (within the budget where the target requires it,
    and within the pool's tokens, which every engine accepts at start-up).
    Where the run's seeded workload would have no request at all (none of the driver's
    tries at its first fits: a tiny pool, a short max_model_len, a budget that an engine
    admitting a request whole cannot fit one into), the pool, max_model_len and that budget
    grow until one fits, so that every run checks something."""
    seed = rng.getrandbits(31)
    pools, sizes = POOLS["engine"], accepted(settings, "block_size")
    budgets = accepted(settings, "budget")
    lengths = SMALL_OPS["engine"] if small else OPS["engine"]
    if small:
        pools = tuple(n for n in pools if n <= SMALL_POOL)
        sizes = tuple(b for b in sizes if b <= SMALL_BLOCK) or sizes[:1]
        budgets = tuple(b for b in budgets if b <= SMALL_BUDGET) or budgets[:1]
    nb, bs, requests = rng.choice(pools), rng.choice(sizes), rng.choice(lengths)
    budget = rng.choice(budgets)
    seqs = accepted(settings, "max_seqs")
    max_seqs = rng.choice(tuple(m for m in seqs if m <= budget) or seqs[:1])

    def either(name: str, default, other, chance: float):
        ok = accepted(settings, name)
        pick = other if rng.random() < chance else default
        return pick if pick in ok else (default if default in ok else ok[0])

    policy = either("policy", "fcfs", "priority", 1 / 3)
    caching = either("caching", True, False, 1 / 3)
    drafts = tuple(k for k in accepted(settings, "spec") if 0 < k < budget)
    spec = rng.choice(drafts) if drafts and rng.random() < 0.5 else 0
    model_len = 0
    mode = (settings.accepts or {}).get("max_model_len", "any")
    if rng.random() < 0.25 and mode != "none":
        model_len = rng.randint(2, 6 * bs + 6)  # about the longest request drawn
        if mode == "within":
            model_len = min(model_len, budget)
        # at most what the pool holds: every engine starts with that (vLLM refuses more at
        # start-up, vllm_config.pool_refusal); the pool and it grow together below
        model_len = min(model_len, nb * bs)
    whole = bool((settings.accepts or {}).get("whole"))
    for _ in range(64):  # at most: each round grows the pool, max_model_len or the budget
        scope = _engine_scope(nb, bs, budget, max_seqs, policy, caching, spec, model_len)
        if _first_request(seed, scope, requests, whole):
            break
        nb *= 2
        if model_len:
            model_len *= 2
        if whole:  # the request fits the budget whole (or max_model_len, within it)
            bigger = [b for b in accepted(settings, "budget") if b > budget]
            if bigger and not (model_len and model_len < budget):
                budget = bigger[0]
        if mode == "within":
            model_len = min(model_len, budget)
    return RunSpec(run, "engine", settings.target, seed, scope, RUN["engine"]["ops"],
                   {"requests": requests}, settings.timeout, settings.shrink_seconds, None,
                   None, settings.shrink_steps)


def _first_request(seed: int, scope: dict, requests: int, whole: bool) -> bool:
    """Whether the seeded workload of an engine run at ``scope`` has a request at all: the
    driver's first operation is its first request, drawn before anything else from the
    run's seed (``EngineDriver._request``: None when none of its tries fits the pool)."""
    from types import SimpleNamespace

    from kvcheck.models.engine.model import MODEL, EngineDriver

    s = MODEL.scope_from_json(scope)
    longest = (s.max_model_len or s.budget) if whole else 0
    return EngineDriver(seed, s, requests, SimpleNamespace(longest_request=longest))._request() \
        is not None


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``10m``, ``1h``, ``1h30m`` or a plain number of seconds;
    ``ValueError`` for anything else (or zero)."""
    t = text.strip().lower()
    try:
        seconds = float(t)
    except ValueError:
        m = _DURATION.fullmatch(t)
        if not t or m is None or not any(m.groups()):
            raise ValueError(f"expected a duration like 90s, 10m or 1h, got {text!r}") from None
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = 3600 * h + 60 * mi + s
    if not 0 < seconds < float("inf"):
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


def show_duration(seconds: float) -> str:
    """``1m05s``, ``42.1s``, ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"
