"""The oracle's data mode: real K/V through a device-backed allocator.

The structural ``Oracle`` (contracts, invariants, shadow read-back of token
ids) drives the target as usual; this module wraps it and adds the data:

* every allocated or appended token carries random K/V (seeded);
* after every step every live sequence is read back *through the
  implementation* (``gather_many``, one launch) and compared, bit for bit,
  with the K/V that sequence was given (float16 / bfloat16 included);
* a write may only land in a slot the step reserved: a block that was
  shared (refcount > 1) when a step began must read back unchanged after it
  except at the slots that step legitimately wrote ("shared block written");
* the batched decode step is supported: every sequence's slot is reserved
  through the structural oracle (each reservation checked against
  ``append_slot``'s contract), then the data moves in one copy launch and one
  write launch (``run_step``), then everything is read back.

A *data target* is a ``Target`` that also offers::

    allocate(seq, n, k, v)        append_slot(seq, k, v)
    reserve_slot(seq) -> (block, offset, cow_src)     (bookkeeping only)
    run_step(reserved, k, v)      (copies, then writes)
    gather_many(seqs) -> [(k, v)] each [L, len, H, D]
    block_data(block) -> (k, v)   each [L, block_size, H, D] (raw, no table)
    kv_shape(n) -> (L, n, H, D)   and attribute ``store.dtype`` / ``store.device``

``kvcheck.impl.device.DeviceBlockManager`` is one. ``data_verify`` drives a
data target with the seeded ``RandomDriver`` and shrinks a failure to a short
replayable trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL
from kvcheck.errors import what_it_did
from kvcheck.models.blocks.driver import RandomDriver
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.spec.contracts import OK, Op

DATA_METHODS = ("reserve_slot", "run_step", "gather_many", "block_data", "kv_shape")


def is_data_target(obj: object) -> bool:
    return all(callable(getattr(obj, m, None)) for m in DATA_METHODS)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as integers of its width: exact comparison, NaN included."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two tensors (shape and dtype included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


class _Feed:
    """What the structural oracle drives: the target, with the step's K/V attached."""

    def __init__(self, target):
        self.t = target
        self.num_blocks, self.block_size = target.num_blocks, target.block_size
        self.capabilities = target.capabilities
        self.kv = None  # (k, v) for the next allocate / append_slot
        self.reserve_only = False  # inside a batched step: bookkeeping only
        for name in ("fork", "free_seq", "block_table", "refcount", "free_blocks", "num_free",
                     "table_identity", "seq_len", "is_out_of_blocks"):
            setattr(self, name, getattr(target, name))

    def allocate(self, seq, n_tokens):
        return self.t.allocate(seq, n_tokens, *self.kv)

    def append_slot(self, seq):
        if self.reserve_only:
            return self.t.reserve_slot(seq)
        return self.t.append_slot(seq, *self.kv)


@dataclass
class Step:
    """One step of a data trace: an operation or a batched decode step."""

    kind: str  # allocate | append_slot | fork | free_seq | batch
    seq: int = 0
    child: int = 0
    n_tokens: int = 0
    seqs: list[int] = field(default_factory=list)  # batch: the sequences, in order
    outcome: str = ""  # ok / oob (batch: per sequence, joined)
    result: object = None  # append_slot: (block, offset, cow_src); batch: list of them

    def request(self) -> Step:
        return Step(self.kind, self.seq, self.child, self.n_tokens, list(self.seqs))

    def describe(self) -> str:
        if self.kind == "allocate":
            call = f"allocate(seq={self.seq}, n={self.n_tokens})"
        elif self.kind == "fork":
            call = f"fork({self.seq} -> {self.child})"
        elif self.kind == "batch":
            call = f"decode_step(seqs={self.seqs})"
        else:
            call = f"{self.kind}(seq={self.seq})"
        if self.kind in ("append_slot", "batch") and self.result is not None:
            return f"{call} -> {_show_result(self.result)}"
        return f"{call} -> {self.outcome or 'not run'}"


def _show_result(result) -> str:
    def one(r):
        if r is None:
            return "out of blocks"
        block, off, src = r
        return f"block {block} slot {off}" + (f" (copy of block {src})" if src is not None else "")
    if isinstance(result, list):
        return "[" + "; ".join(one(r) for r in result) + "]"
    return one(result)


class DataOracle:
    """Structural ``Oracle`` + the data comparison, one step at a time."""

    def __init__(self, target, mode: str = "fast", seed: int = 0, timeout: float | None = None):
        if not is_data_target(target):
            missing = [m for m in DATA_METHODS if not callable(getattr(target, m, None))]
            raise TypeError(f"{type(target).__name__} is not a data target: missing "
                            f"{', '.join(missing)}")
        self.target = target
        self.feed = _Feed(target)
        self.oracle = Oracle(self.feed, mode=mode, timeout=timeout)
        self.block_size = target.block_size
        self.gen = torch.Generator().manual_seed(seed)
        store = target.store
        self.dtype, self.device = store.dtype, store.device
        self.expected: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.names: dict[bytes, tuple[int, int]] = {}  # a token's K/V bytes -> (seq, position)
        self.history: list[Step] = []
        self.violation: Violation | None = self.oracle.violation

    # -- the oracle's view ---------------------------------------------------------
    def live(self) -> list[int]:
        return self.oracle.live()

    def num_free(self) -> int:
        return self.oracle._state().num_free()

    def valid(self, op: Op) -> bool:
        return self.oracle.valid(op)

    # -- K/V -----------------------------------------------------------------------
    def _random_kv(self, seq: int, first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.target.kv_shape(n)
        k = torch.randn(shape, generator=self.gen).to(self.dtype)
        v = torch.randn(shape, generator=self.gen).to(self.dtype)
        for i in range(n):
            self.names[self._key(k[:, i], v[:, i])] = (seq, first + i)
        return k.to(self.device), v.to(self.device)

    @staticmethod
    def _key(k: torch.Tensor, v: torch.Tensor) -> bytes:
        return _bits(k).cpu().numpy().tobytes() + _bits(v).cpu().numpy().tobytes()

    # -- steps ---------------------------------------------------------------------
    def step(self, op: Op) -> Violation | None:
        """One operation with data. Raises ValueError for an invalid ``op``."""
        if self.violation is not None:
            return self.violation
        rec = Step(op.kind, op.seq, op.child, op.n_tokens)
        self.history.append(rec)
        kv = None
        if op.kind == "allocate":
            kv = self._random_kv(op.seq, 0, op.n_tokens)
        elif op.kind == "append_slot":
            kv = self._random_kv(op.seq, self.oracle.lengths.get(op.seq, 0), 1)
        shared = self._shared_tails([op.seq] if op.kind == "append_slot" else [])
        self.feed.kv = kv
        try:
            v = self.oracle.step(op)
        except ValueError:
            self.history.pop()
            raise
        finally:
            self.feed.kv = None
        rec.outcome = op.outcome
        if op.kind == "append_slot" and op.outcome == OK:
            rec.result = (op.block, op.offset, op.cow_src)
        if v is None and op.outcome == OK:
            self._record(op, kv)
        written = [(op.block, op.offset)] if rec.result is not None else []
        v = v or self._check_shared(shared, written) or self.check()
        self.violation = v
        return v

    def batch(self, seqs: Sequence[int]) -> Violation | None:
        """A batched decode step: one new token for each of ``seqs`` (distinct, live).

        Each slot is reserved through the structural oracle (an out-of-blocks
        sequence gets no token this step, as an engine would preempt it),
        then ``run_step`` moves the data: every copy in one launch, then
        every write in one launch.
        """
        if self.violation is not None:
            return self.violation
        seqs = list(seqs)
        if len(set(seqs)) != len(seqs):
            raise ValueError("a decode step takes each sequence at most once")
        for q in seqs:
            if q not in self.oracle.lengths:
                raise ValueError(f"decode step on sequence {q}, which is not live")
        rec = Step("batch", seqs=seqs, result=[])
        self.history.append(rec)
        shared = self._shared_tails(seqs)
        reserved, rows, outcomes = [], [], []
        self.feed.reserve_only = True
        try:
            for q in seqs:
                op = Op("append_slot", seq=q)
                v = self.oracle.step(op)
                outcomes.append(op.outcome)
                if op.outcome == OK and op.block is not None:
                    reserved.append((op.block, op.offset, op.cow_src))
                    rows.append(q)
                    rec.result.append(reserved[-1])
                else:
                    rec.result.append(None)
                if v is not None:
                    self.violation = v
                    rec.outcome = ",".join(outcomes)
                    return v
        finally:
            self.feed.reserve_only = False
        rec.outcome = ",".join(outcomes)
        if reserved:
            parts = [self._random_kv(q, self.oracle.lengths[q] - 1, 1) for q in rows]
            k = torch.cat([p[0] for p in parts], dim=1)
            v = torch.cat([p[1] for p in parts], dim=1)
            try:
                self.target.run_step(reserved, k, v)
            except CONTROL:
                raise
            except BaseException as exc:  # noqa: BLE001 - the implementation's fault
                self.violation = Violation(self.oracle.steps, "crash", "run_step",
                                           witness=f"run_step {what_it_did(exc)}")
                return self.violation
            for i, q in enumerate(rows):
                self._append_expected(q, k[:, i : i + 1], v[:, i : i + 1])
        written = [(b, o) for b, o, _ in reserved]
        self.violation = self._check_shared(shared, written) or self.check()
        return self.violation

    def _record(self, op: Op, kv) -> None:
        if op.kind == "allocate":
            self.expected[op.seq] = kv
        elif op.kind == "append_slot":
            self._append_expected(op.seq, *kv)
        elif op.kind == "fork":
            self.expected[op.child] = self.expected[op.seq]
        else:
            self.expected.pop(op.seq, None)

    def _append_expected(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        ek, ev = self.expected[seq]
        self.expected[seq] = (torch.cat((ek, k), dim=1), torch.cat((ev, v), dim=1))

    # -- checks ----------------------------------------------------------------------
    def _shared_tails(self, seqs: Sequence[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The partial tail blocks of ``seqs`` that are shared now, with their contents."""
        out = {}
        t, bs = self.target, self.block_size
        for q in seqs:
            n = self.oracle.lengths.get(q)
            if not n or n % bs == 0:
                continue
            tail = list(t.block_table(q))[-1]
            if tail not in out and t.refcount(tail) > 1:
                k, v = t.block_data(tail)
                out[tail] = (k.clone(), v.clone())
        return out

    def _check_shared(self, shared: dict, written: list[tuple[int, int]]) -> Violation | None:
        """A block shared when the step began changed only at slots the step wrote."""
        for block, (k0, v0) in shared.items():
            k1, v1 = self.target.block_data(block)
            for off in range(self.block_size):
                if (block, off) in written:
                    continue
                if not (same(k0[:, off], k1[:, off]) and same(v0[:, off], v1[:, off])):
                    holders = [q for q in self.oracle.lengths
                               if block in list(self.target.block_table(q))]
                    return Violation(self.oracle.steps, "data", "shared block written", block,
                                     witness=(
                        f"block {block} was shared (refcount > 1) when the step began, yet its "
                        f"slot {off} changed from {self._name(k0[:, off], v0[:, off])} to "
                        f"{self._name(k1[:, off], v1[:, off])} though the step wrote no such "
                        f"slot; sequences holding it now: {holders}"))
        return None

    def check(self) -> Violation | None:
        """Read back every live sequence through the implementation; compare exactly."""
        seqs = sorted(self.expected)
        if not seqs:
            return None
        try:
            got = self.target.gather_many(seqs)
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the implementation's fault
            return Violation(self.oracle.steps, "crash", "gather",
                             witness=f"gather_many {what_it_did(exc)}")
        if len(got) != len(seqs):
            return Violation(self.oracle.steps, "malformed", "gather", witness=(
                f"gather_many of {len(seqs)} sequences returned {len(got)} results"))
        for q, (gk, gv) in zip(seqs, got, strict=True):
            ek, ev = self.expected[q]
            if same(gk, ek) and same(gv, ev):
                continue
            return self._mismatch(q, gk, gv, ek, ev)
        return None

    def _mismatch(self, q, gk, gv, ek, ev) -> Violation:
        n, bs = ek.shape[1], self.block_size
        table = list(self.target.block_table(q))
        if gk.shape != ek.shape or gv.shape != ev.shape:
            return Violation(self.oracle.steps, "data", "read-back", q, witness=(
                f"sequence {q} read back K/V of shape {tuple(gk.shape)}, expected "
                f"{tuple(ek.shape)} ({n} tokens)"))
        pos = next(p for p in range(n)
                   if not (same(gk[:, p], ek[:, p]) and same(gv[:, p], ev[:, p])))
        block = table[pos // bs] if pos // bs < len(table) else None
        return Violation(self.oracle.steps, "data", "read-back", q, witness=(
            f"sequence {q} (table {table}) position {pos} (block {block} slot {pos % bs}) "
            f"reads {self._name(gk[:, pos], gv[:, pos])}, expected its own token "
            f"{pos} ({self._name(ek[:, pos], ev[:, pos])})"), details={"position": pos})

    def _name(self, k: torch.Tensor, v: torch.Tensor) -> str:
        """What a slot holds, in words."""
        if bool(torch.isnan(k.float()).all()) and bool(torch.isnan(v.float()).all()):
            return "never-written memory (NaN)"
        who = self.names.get(self._key(k, v))
        if who is not None:
            return f"the K/V given to sequence {who[0]} for its token {who[1]}"
        return "K/V that no sequence was given"


# -- driving, replay, shrinking ---------------------------------------------------------
@dataclass
class DataResult:
    verdict: str  # pass | fail
    steps: int
    violation: Violation | None
    trace: list[Step]  # the (shrunk) failing steps
    original_length: int = 0

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    def render(self) -> str:
        if self.violation is None:
            return f"PASS: {self.steps} steps"
        lines = [f"{i + 1:3d}. {s.describe()}" for i, s in enumerate(self.trace)]
        v = self.violation
        lines.append(f"VIOLATION ({v.kind}: {v.name}): {v.witness}")
        return "\n".join(lines)


def _build(factory, num_blocks: int, block_size: int):
    return factory(num_blocks, block_size)


def run_steps(factory: Callable, num_blocks: int, block_size: int, steps: Sequence[Step],
              seed: int = 0, mode: str = "fast") -> tuple[Violation | None, list[Step]]:
    """Replay requests on a fresh target; steps whose precondition fails are skipped."""
    d = DataOracle(_build(factory, num_blocks, block_size), mode=mode, seed=seed)
    if d.violation is not None:
        return d.violation, []
    for s in steps:
        if s.kind == "batch":
            seqs = [q for q in s.seqs if q in d.oracle.lengths]
            if not seqs:
                continue
            v = d.batch(seqs)
        else:
            op = Op(s.kind, seq=s.seq, child=s.child, n_tokens=s.n_tokens)
            if not d.valid(op):
                continue
            v = d.step(op)
        if v is not None:
            return v, d.history
    v = d.oracle.sweep() if mode == "fast" else None
    return v, d.history


def shrink_steps(factory, num_blocks, block_size, steps: list[Step], key, seed: int = 0,
                 max_replays: int = 300) -> tuple[Violation | None, list[Step]]:
    """Greedy chunk deletion (halving to single steps, to a fixpoint) while the
    same violation (kind, name) still occurs; at most ``max_replays`` replays."""
    best_v, best = run_steps(factory, num_blocks, block_size, steps, seed)
    if best_v is None or best_v.key != key:
        return None, steps
    replays = 1
    reqs = [s.request() for s in best]
    chunk = max(1, len(reqs) // 2)
    while chunk >= 1 and replays < max_replays:
        i, changed = 0, False
        while i < len(reqs) and replays < max_replays:
            cand = reqs[:i] + reqs[i + chunk :]
            v, ran = run_steps(factory, num_blocks, block_size, cand, seed)
            replays += 1
            if v is not None and v.key == key:
                best_v, best, reqs, changed = v, ran, [s.request() for s in ran], True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return best_v, best


def data_verify(factory: Callable, num_blocks: int = 16, block_size: int = 4, ops: int = 300,
                seed: int = 0, batch_prob: float = 0.3, mode: str = "fast",
                do_shrink: bool = True) -> DataResult:
    """Drive a data target with the seeded ``RandomDriver``; on a violation, shrink it.

    Where the driver asks for an ``append_slot``, with probability
    ``batch_prob`` a batched decode step over a random subset of the live
    sequences runs instead (drawn from the driver's own seeded generator).
    """
    target = _build(factory, num_blocks, block_size)
    d = DataOracle(target, mode=mode, seed=seed)
    driver = RandomDriver(seed, num_blocks, block_size, target.capabilities)
    rng = driver.rng
    v = d.violation
    for _ in range(ops):
        if v is not None:
            break
        op = driver.next_op(d.live(), d.num_free())
        if op.kind == "append_slot" and rng.random() < batch_prob:
            live = d.live()
            v = d.batch(rng.sample(live, rng.randint(1, len(live))))
            continue
        if not d.valid(op):
            continue
        v = d.step(op)
    if v is None and mode == "fast":
        v = d.oracle.sweep() or d.check()
    if v is None:
        return DataResult("pass", len(d.history), None, [])
    history = d.history
    trace = history
    if do_shrink:
        sv, strace = shrink_steps(factory, num_blocks, block_size,
                                  [s.request() for s in history], v.key, seed)
        if sv is not None:
            v, trace = sv, strace
    return DataResult("fail", len(history), v, trace, len(history))
