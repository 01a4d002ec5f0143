"""The scheduler model, as data: two operations, its scope, its workloads, its shrink moves.

A run is a stream of ``add(seq, prompt, max_new)`` (a request arrives) and
``step()`` (one scheduler step; its results the ids decoded and those that
finished) operations; a seeded workload (``workload.generate``: requests with
arrival steps) is the driver's stream: the requests arriving before each step,
then the step, while the scheduler has work (idle time is skipped). The run's
checks live in ``oracle`` (the policy spec, the pools' invariants, retiring
sequences, liveness, ping-pongs); what is here is what the checker needs to
draw, serialise and shrink runs.

The scope is the device pool (``num_blocks`` of ``block_size`` tokens) and the
admission ``watermark``. The generic shrinker drops requests and steps, lowers
prompts and outputs (counts) and the pool size (smallest first, as is or with
the requests scaled to it), and renumbers ids; the moves only a scheduler has:
a request's arrival earlier (to the start, halfway, one step), every arrival
halved, and the whole scope halved (pool, prompts, outputs and arrivals).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.check.model import COUNT, NEW_SEQ, SEQS, Arg, Model, OpSpec, Options, ScopeField, register
from kvcheck.models.scheduler.workload import Request
from kvcheck.spec import scheduler as policy


@dataclass(frozen=True)
class SchedScope:
    """A device pool of ``num_blocks`` blocks of ``block_size`` tokens, and the admission
    ``watermark`` in blocks."""

    num_blocks: int
    block_size: int
    watermark: int = 1

    def describe(self) -> str:
        return f"{self.num_blocks} blocks x {self.block_size} slots, watermark {self.watermark}"


@dataclass
class SchedOp:
    """One operation: ``add`` (``seq``, ``prompt``, ``max_new``) or ``step``, with what a step
    returned (``decoded``) and the sequences it retired (``finished``)."""

    kind: str
    seq: int | None = None
    prompt: int | None = None
    max_new: int | None = None
    outcome: str = "ok"
    decoded: list[int] | None = None
    finished: list[int] | None = None


def _make(kind: str, **args) -> SchedOp:
    return SchedOp(kind, **args)


ADD_DOC = ("A request arrives: seq with a prompt of prompt tokens, to generate max_new tokens; "
           "queued through the scheduler's add(seq, prompt[, max_new]), else appended to "
           "waiting. Only requests that fit are added (their prompt, and every length they may "
           "be preempted at, fit the pool minus the watermark; their final length the pool).")

OPS = {
    "add": OpSpec("add", _make, (Arg("seq", NEW_SEQ), Arg("prompt", COUNT), Arg("max_new", COUNT)),
                  doc=ADD_DOC),
    "step": OpSpec("step", _make, results=(Arg("decoded", SEQS), Arg("finished", SEQS)),
                   doc=policy.DOCS["step"]),
}

_ID = {"$ref": "#/$defs/block"}  # any integer: what a scheduler holds is observed, not trusted
_KEYS = {"pattern": "^-?(0|[1-9][0-9]{0,18})$"}
_POOL = {
    "tables": {"type": "object", "maxProperties": 100000, "propertyNames": _KEYS,
               "additionalProperties": {"type": "array", "maxItems": 1048576, "items": _ID}},
    "lens": {"type": "object", "maxProperties": 100000, "propertyNames": _KEYS,
             "additionalProperties": _ID},
    "refs": {"type": "array", "maxItems": 1048576, "items": _ID},
    "free": {"type": "array", "maxItems": 1048576, "items": _ID},
}
STATE_SCHEMA = {  # the queues, the device pool (as the block manager's states), the host pool
    "type": "object", "required": ["running", "waiting", "tables", "refs", "free"],
    "additionalProperties": False,
    "properties": {
        "running": {"type": "array", "maxItems": 1048576, "items": _ID},
        "waiting": {"type": "array", "maxItems": 1048576,
                    "items": {"type": "array", "maxItems": 2, "items": _ID}},
        **_POOL,
        "host": {"type": "object", "required": ["tables", "refs", "free"],
                 "additionalProperties": False, "properties": _POOL},
    },
}


class SchedulerModel(Model):
    name = "scheduler"
    title = "scheduler over a block manager"
    ops = OPS
    outcomes = ("ok",)
    scope_fields = (ScopeField("num_blocks"),)
    state_schema = STATE_SCHEMA

    # -- operations ----------------------------------------------------------------
    def describe(self, op) -> str:
        if op.kind == "add":
            return f"add(seq={op.seq}, prompt={op.prompt}, max_new={op.max_new})"
        text = "step()"
        if op.decoded is not None:
            text += f" -> decoded {op.decoded}"
            if op.finished:
                text += f", finished {op.finished}"
        return text

    def check_state_json(self, state: dict, scope, where: str) -> None:
        from kvcheck.check.trace import TraceError

        if len(state["refs"]) != scope.num_blocks:
            raise TraceError(f"{where}.refs: {len(state['refs'])} refcounts for a pool of "
                             f"{scope.num_blocks} blocks")
        for i, w in enumerate(state["waiting"]):
            if len(w) != 2:
                raise TraceError(f"{where}.waiting[{i}]: expected a (seq, n_tokens) pair")

    # -- runs -----------------------------------------------------------------------
    def resolve(self, spec):
        from kvcheck.models.scheduler.loading import resolve

        return resolve(spec)

    def build(self, factory, scope: SchedScope, options: Options):
        from kvcheck.models.scheduler.loading import build, out_of_blocks_class

        return build(factory, scope.num_blocks, scope.block_size, scope.watermark,
                     options.extra.get("block_manager"), out_of_blocks_class(options))

    def start(self, target, scope: SchedScope, options: Options):
        from kvcheck.models.scheduler.oracle import SchedOracle

        return SchedOracle(target, scope, options.mode, options.compiled,
                           bool(options.extra.get("series", False)))

    def driver(self, seed: int, scope: SchedScope, target, options: Options):
        """The workload ``Options.extra["workload"]`` (requests), else ``requests`` (default 12)
        generated from ``seed`` with arrivals spread over ``arrival_steps`` (default twice
        as many) steps."""
        from kvcheck.models.scheduler.workload import generate

        reqs = options.extra.get("workload")
        if reqs is None:
            n = options.extra.get("requests", 12)
            reqs = generate(seed, n, scope.num_blocks, scope.block_size, scope.watermark,
                            arrival_steps=options.extra.get("arrival_steps", 2 * n))
        return WorkloadDriver(reqs)

    # -- shrinking ------------------------------------------------------------------
    def size(self, ops: list) -> int:
        """A counterexample's length in requests (its steps follow from them)."""
        return sum(1 for o in ops if o.kind == "add")

    def count_hints(self, scope: SchedScope) -> tuple[int, ...]:
        return (scope.block_size,)

    def shrink_candidates(self, ops: list, scope: SchedScope):
        reqs, total = requests_of(ops), sum(1 for o in ops if o.kind == "step")
        # a request's arrival earlier: to the start, halfway, one step
        for i, r in enumerate(reqs):
            for a in dict.fromkeys((0, r.arrival // 2, r.arrival - 1)):
                if 0 <= a < r.arrival:
                    yield ops_of([*reqs[:i], _at(r, a), *reqs[i + 1:]], total), scope
        if any(r.arrival > 1 for r in reqs):  # every arrival halved
            last = max(r.arrival for r in reqs)
            yield ops_of([_at(r, r.arrival // 2) for r in reqs], last // 2 + total - last), scope
        half = max(scope.watermark + 1, scope.num_blocks // 2)
        if half < scope.num_blocks:  # the whole scope at half scale
            last = max([r.arrival for r in reqs] or [0])
            smaller = [Request(r.seq, -(-r.prompt // 2), -(-r.max_new // 2), r.arrival // 2)
                       for r in reqs]
            yield ops_of(smaller, last // 2 + (total - last + 1) // 2), \
                SchedScope(half, scope.block_size, scope.watermark)

    def scope_variants(self, ops: list, scope: SchedScope, smaller: SchedScope):
        if smaller.num_blocks < scope.num_blocks:  # prompts and outputs scaled with the pool
            nb, snb = scope.num_blocks, smaller.num_blocks
            out = [self.request(o) for o in ops]
            for o in out:
                if o.kind == "add":
                    o.prompt = max(1, -(-o.prompt * snb // nb))
                    o.max_new = max(1, -(-o.max_new * snb // nb))
            yield out

    # -- showing ------------------------------------------------------------------------
    def state_line(self, state: dict) -> str:
        from kvcheck.models.scheduler.oracle import show_waiting

        free, refs = state.get("free", []), state.get("refs", [])
        parts = [f"running {state.get('running', [])}, waiting "
                 f"{show_waiting(state.get('waiting', []))}, free {len(free)} of {len(refs)}"]
        tables, lens = state.get("tables", {}), state.get("lens", {})
        if tables:
            parts.append("; ".join(f"seq {q}: {lens.get(q, '?')} tokens in {t}"
                                   for q, t in tables.items()))
        host = state.get("host")
        if host is not None:
            parts.append(f"host: {len(host.get('tables', {}))} sequence(s), free "
                         f"{len(host.get('free', []))} of {len(host.get('refs', []))}")
        return " | ".join(parts)

    def narrate(self, op, before: dict | None, after: dict | None, block_size: int) -> str:
        if op.kind == "add":
            text = (f"request {op.seq} arrives: a prompt of {_plural(op.prompt, 'token')}, "
                    f"{_plural(op.max_new, 'token')} to generate")
            return text
        finished = list(op.finished or [])
        if before is None or after is None:
            return "step" if op.decoded is None else f"decoded {op.decoded}"
        was_running = list(before.get("running", []))
        now = set(after.get("running", [])) | set(finished)
        admitted = [w[0] for w in before.get("waiting", []) if w and w[0] in now]
        preempted = [q for q in was_running + admitted if q not in now]
        parts = []
        if admitted:
            parts.append(f"admitted {admitted}")
        if op.decoded is not None:
            parts.append(f"decoded {op.decoded}" if op.decoded else "decoded nothing")
        if preempted:
            parts.append(f"preempted {preempted} (back to waiting)")
        if finished:
            parts.append(f"finished {finished} (retired)")
        return "; ".join(parts) or "step"

    def initial_state_json(self, scope: SchedScope) -> dict:
        return {"running": [], "waiting": [], "tables": {}, "lens": {},
                "refs": [0] * scope.num_blocks, "free": list(range(scope.num_blocks))}

    def scope_words(self, scope: SchedScope) -> str:
        return f", watermark {scope.watermark}"

    def scope_json(self, scope: SchedScope) -> dict:
        return {"num_blocks": scope.num_blocks, "block_size": scope.block_size,
                "watermark": scope.watermark}

    def scope_from_json(self, data: dict) -> SchedScope:
        """A watermark not given is 1 (the command line's default)."""
        unknown = sorted(set(data) - {"num_blocks", "block_size", "watermark"})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}")
        values = [data["num_blocks"], data["block_size"], data.get("watermark", 1)]
        if any(type(v) is not int or v < 0 for v in values):
            raise ValueError("num_blocks, block_size and watermark must be non-negative integers")
        return SchedScope(*values)


class WorkloadDriver:
    """A workload's operation stream: before each step the requests that have arrived, then
    the step, while the scheduler has work; when it has none the clock jumps to the next
    arrival; then the stream ends (the run's sweep checks what must hold at the end)."""

    def __init__(self, requests: list[Request]):
        from collections import deque

        self.pending = deque(sorted(requests, key=lambda r: (r.arrival, r.seq)))
        self.t = 0

    def next_op(self, state):
        pending = self.pending
        if pending and pending[0].arrival <= self.t:
            return _add(pending.popleft())
        if state.has_work():
            self.t += 1
            return SchedOp("step")
        if pending:
            self.t = pending[0].arrival
            return _add(pending.popleft())
        return None


def _add(r: Request) -> SchedOp:
    return SchedOp("add", seq=r.seq, prompt=r.prompt, max_new=r.max_new)


def _at(r: Request, arrival: int) -> Request:
    return Request(r.seq, r.prompt, r.max_new, arrival)


def _plural(n, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def requests_of(ops: list) -> list[Request]:
    """The requests of an operation stream, each arriving after the steps before it."""
    steps, out = 0, []
    for op in ops:
        if op.kind == "step":
            steps += 1
        elif op.kind == "add":
            out.append(Request(op.seq, op.prompt, op.max_new, steps))
    return out


def ops_of(requests: list[Request], steps: int = 0) -> list[SchedOp]:
    """The stream of ``requests`` (each added after ``arrival`` steps, in order) with
    ``steps`` steps in all (at least up to the last arrival)."""
    out, t = [], 0
    for r in sorted(requests, key=lambda r: r.arrival):  # stable: same-step order kept
        while t < r.arrival:
            out.append(SchedOp("step"))
            t += 1
        out.append(_add(r))
    out += [SchedOp("step") for _ in range(steps - t)]
    return out


MODEL = register(SchedulerModel())
