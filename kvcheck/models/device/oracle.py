"""The device model's run state: the block manager's oracle for the structure, plus the data.

``DataOracle`` speaks the checker's ``RunState`` (``kvcheck.check.model``): the one
driving loop, replay, shrinker and explorer (``kvcheck.check``) run it. The structural
``Oracle`` (contracts, invariants, shadow read-back of token ids, fast and full modes)
drives the target through ``DataTarget``; this adds the data:

* every allocated or appended token carries random K/V (seeded: ``Options.seed``);
* after every step every live sequence is read back *through the implementation*
  (``gather_many``, one launch) and compared, bit for bit, with the K/V that sequence
  was given (float16 / bfloat16 included): "read-back";
* a write may only land in a slot the step reserved: a block that was shared
  (refcount > 1) when a step began must read back unchanged after it except at the
  slots that step wrote: "shared block written";
* the batched decode step (``decode_step``): every sequence's slot is reserved through
  the structural oracle (each reservation checked against ``append_slot``'s contract),
  then the data moves in one copy launch and one write launch (``run_step``), then
  everything is read back.

The data check is whole after every step in both modes; the modes differ only in the
structural checks. Every call into the target (the data calls included) runs under the
run's watchdog: a hang, an exception or a result of the wrong shape is a violation,
never raised. On a GPU each call waits for the device, so that an asynchronous kernel
fault is reported as the call's own.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from kvcheck.check import watchdog as watchdog_module
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Interrupted, OperationTimeout, Watchdog, active_watchdog
from kvcheck.errors import what_it_did
from kvcheck.models.blocks.oracle import Oracle
from kvcheck.models.device.datatarget import DECODE, DataTarget, NotDataTarget
from kvcheck.spec.contracts import OK, OOB, Op

_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as integers of its width: exact comparison, NaN included."""
    return t.contiguous().view(_WIDTH[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two tensors (shape and dtype included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


class _Failed(Exception):
    """A data call went wrong: carries the violation."""

    def __init__(self, violation: Violation):
        super().__init__(violation.name)
        self.violation = violation


class DataOracle:
    """Structural ``Oracle`` + the data comparison, one step at a time (a ``RunState``).

    ``target`` is a data target (``kvcheck.models.device.datatarget``), as built or as
    ``DeviceModel.build`` wraps it; anything else is ``NotDataTarget``."""

    def __init__(self, target, mode: str = "fast", seed: int = 0, timeout: float | None = None,
                 compiled: bool = True):
        feed = target if isinstance(target, DataTarget) else DataTarget(target)
        store = getattr(feed.t, "store", None)
        dtype, device = getattr(store, "dtype", None), getattr(store, "device", None)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                and isinstance(device, torch.device)):
            raise NotDataTarget(f"{type(feed.t).__name__}.store must have a floating-point "
                                f"torch dtype and a torch device (got dtype {dtype!r}, device "
                                f"{device!r})")
        self.feed, self.target = feed, feed.t
        self.dtype, self.device = dtype, device
        feed.cuda = device.type == "cuda"
        self.oracle = Oracle(feed, mode=mode, timeout=timeout, compiled=compiled)
        self.mode = mode
        self.block_size = feed.block_size
        self.gen = torch.Generator().manual_seed(seed)
        self.expected: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.names: dict[bytes, tuple[int, int]] = {}  # a token's K/V bytes -> (seq, position)
        self.steps = 0
        self.stats = {"decode_steps": 0, "copies": 0, "tokens": 0, "read_backs": 0}
        self._rec = None  # the supervisor's recorder, during a step of a recording re-run
        self.violation: Violation | None = self.oracle.violation
        self._shape = (1, 1, 1)
        if self.violation is None:
            try:
                self._shape = self._token_shape()
            except _Failed as exc:
                self.violation = exc.violation

    # -- the checker's view (RunState) -------------------------------------------------
    def live_seqs(self) -> list[int]:
        return self.oracle.live_seqs()

    def live(self) -> list[int]:
        """The live sequences, in order."""
        return sorted(self.oracle.lengths)

    def num_free(self) -> int:
        return self.oracle._state().num_free()

    def observed_json(self) -> dict:
        return self.oracle.observed_json()

    def valid(self, op) -> bool:
        if op.kind != DECODE:
            return self.oracle.valid(op)
        return DECODE in self.feed.capabilities and self._decode_problem(op.seqs) is None

    def _decode_problem(self, seqs) -> str | None:
        if not seqs:
            return "a decode step takes at least one sequence"
        if len(set(seqs)) != len(seqs):
            return "a decode step takes each sequence at most once"
        dead = [q for q in seqs if q not in self.oracle.lengths]
        if dead:
            return f"decode step on sequence {dead[0]}, which is not live"
        return None

    def clone(self) -> DataOracle:
        """An independent copy: the target (its store included) deep-copied."""
        new = copy.copy(self)
        new.oracle = self.oracle.clone()
        new.feed = new.oracle.target
        new.target = new.feed.t
        new.gen = torch.Generator()
        new.gen.set_state(self.gen.get_state())
        new.expected = dict(self.expected)
        new.names = dict(self.names)
        new.stats = dict(self.stats)
        return new

    # -- steps ------------------------------------------------------------------------------
    def step(self, op, watchdog: Watchdog | None = None) -> Violation | None:
        """Run ``op`` (one of the four, or a ``DecodeStep``) with data and check it; the
        violation, if any. Raises ValueError for an op whose precondition fails."""
        if self.violation is not None:
            return self.violation
        if op.kind == DECODE:
            problem = self._decode_problem(op.seqs)
            if problem:
                raise ValueError(problem)
        elif not self.oracle.valid(op):
            raise ValueError(f"precondition of {op.kind} fails (or the target lacks it): {op}")
        if watchdog is None:
            watchdog = active_watchdog()
        self.steps += 1
        rec = watchdog_module.RECORDER
        if rec is not None:  # this step is the recorded one; the structural steps inside are not
            rec.op(op)
            watchdog_module.RECORDER, self._rec = None, rec
        v = None
        try:
            v = self._decode(op, watchdog) if op.kind == DECODE else self._single(op, watchdog)
        except _Failed as exc:
            v = exc.violation
        finally:
            if rec is not None:
                watchdog_module.RECORDER, self._rec = rec, None
                rec.outcome(op, v)
        if v is not None:
            v.step = self.steps
        self.violation = v
        return v

    def sweep(self, watchdog: Watchdog | None = None) -> Violation | None:
        """The structural oracle's sweep (fast mode: everything the steps did not
        audit), then every live sequence read back once more."""
        if self.violation is not None:
            return self.violation
        if watchdog is None:
            watchdog = active_watchdog()
        v = self.oracle.sweep(watchdog)
        if v is None:
            try:
                v = self.check(watchdog)
            except _Failed as exc:
                v = exc.violation
        if v is not None:
            v.step = self.steps
        self.violation = v
        return v

    def _single(self, op: Op, wd) -> Violation | None:
        kv = None
        if op.kind == "allocate":
            kv = self._random_kv(op.seq, 0, op.n_tokens)
        elif op.kind == "append_slot":
            kv = self._random_kv(op.seq, self.oracle.lengths[op.seq], 1)
        shared = self._shared_tails([op.seq] if op.kind == "append_slot" else [], wd)
        self._phase(op)
        self.feed.kv = kv
        try:
            v = self.oracle.step(op, wd)
        finally:
            self.feed.kv = None
        if v is not None:
            return v
        written = []
        if op.outcome == OK:
            self._record(op, kv)
            if op.kind == "append_slot":
                written.append((op.block, op.offset))
                self.stats["copies"] += op.cow_src is not None
        return self._check_shared(shared, written, wd) or self.check(wd)

    def _decode(self, op, wd) -> Violation | None:
        """Each slot reserved through the structural oracle (a sequence the pool cannot
        serve gets no token this step, as an engine would preempt it), then ``run_step``
        moves the data: every copy in one launch, then every write in one launch."""
        seqs = list(op.seqs)
        self.stats["decode_steps"] += 1
        shared = self._shared_tails(seqs, wd)
        reserved, rows, results = [], [], []
        op.reserved = results
        self._phase(op)
        self.feed.reserve_only = True
        try:
            for q in seqs:
                sub = Op("append_slot", seq=q)
                v = self.oracle.step(sub, wd)
                if sub.outcome == OK and sub.block is not None:
                    reserved.append((sub.block, sub.offset, sub.cow_src))
                    rows.append(q)
                    results.append(reserved[-1])
                else:
                    results.append(None)
                if v is not None:
                    op.outcome = OK if reserved else OOB
                    return v
        finally:
            self.feed.reserve_only = False
        op.outcome = OK if reserved else OOB
        if reserved:
            parts = [self._random_kv(q, self.oracle.lengths[q] - 1, 1) for q in rows]
            k = torch.cat([p[0] for p in parts], dim=1)
            v = torch.cat([p[1] for p in parts], dim=1)
            self._call("run_step", wd, self.target.run_step, list(reserved), k, v)
            for i, q in enumerate(rows):
                self._append_expected(q, k[:, i : i + 1], v[:, i : i + 1])
            self.stats["copies"] += sum(src is not None for _, _, src in reserved)
        written = [(b, o) for b, o, _ in reserved]
        return self._check_shared(shared, written, wd) or self.check(wd)

    # -- K/V --------------------------------------------------------------------------------
    def _token_shape(self) -> tuple[int, int, int]:
        """(L, H, D) from the target's ``kv_shape(1)``, once."""
        got = self._call("kv_shape", None, self.target.kv_shape, 1)
        try:
            shape = tuple(got)
            ok = len(shape) == 4 and all(type(x) is int and x >= 1 for x in shape) \
                and shape[1] == 1
        except TypeError:
            ok = False
        if not ok:
            raise _Failed(Violation(0, "malformed", "kv_shape", witness=(
                f"kv_shape(1) returned {_short(got)}, expected (layers, 1, heads, head_dim) "
                f"of positive integers")))
        return shape[0], shape[2], shape[3]

    def _random_kv(self, seq: int, first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        L, H, D = self._shape
        shape = (L, n, H, D)
        k = torch.randn(shape, generator=self.gen).to(self.dtype)
        v = torch.randn(shape, generator=self.gen).to(self.dtype)
        for i in range(n):
            self.names[self._key(k[:, i], v[:, i])] = (seq, first + i)
        self.stats["tokens"] += n
        return k.to(self.device), v.to(self.device)

    @staticmethod
    def _key(k: torch.Tensor, v: torch.Tensor) -> bytes:
        return _bits(k).cpu().numpy().tobytes() + _bits(v).cpu().numpy().tobytes()

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

    # -- calls into the target ----------------------------------------------------------------
    def _call(self, what: str, wd, fn, *args):
        """``fn(*args)`` as one call into the target, under the watchdog, waiting for the
        device; a hang or an exception raises ``_Failed`` with the violation."""
        if wd is None:
            wd = active_watchdog()
        self._phase(f"{what} (the data of operation {self.steps})")
        if wd is not None:
            wd.enter()
        try:
            result = fn(*args)
            self.feed.sync()
            return result
        except OperationTimeout as exc:
            raise _Failed(Violation(self.steps, "hang", what, witness=f"{what} {exc}")) from None
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the implementation's fault
            raise _Failed(Violation(self.steps, "crash", what,
                                    witness=f"{what} {what_it_did(exc)}")) from None
        finally:
            if wd is not None:
                wd.leave()

    def _phase(self, what) -> None:
        """Tell the supervisor's recording re-run (if this is one) what runs now: an
        operation (the structural calls) or a data call."""
        if self._rec is not None:
            if not isinstance(what, str):
                from kvcheck.models.device.model import MODEL

                what = f"operation {self.steps}: {MODEL.describe(MODEL.request(what))}"
            self._rec.phase(what)

    def _block(self, block: int, wd) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``block``'s raw K/V through ``block_data``, checked for its shape."""
        got = self._call("block_data", wd, self.target.block_data, block)
        L, H, D = self._shape
        want = (L, self.block_size, H, D)
        pair = _pair(got)
        if pair is not None:
            pair = _plain(pair[0], self.device), _plain(pair[1], self.device)
        if pair is None or any(t is None or tuple(t.shape) != want or t.dtype != self.dtype
                               for t in pair):
            raise _Failed(Violation(self.steps, "malformed", "block_data", block,
                                    subject="block", witness=(
                f"block_data({block}) returned {_short(got)}, expected (k, v), each a dense "
                f"tensor of shape {want} and dtype {self.dtype}")))
        return pair

    # -- checks -------------------------------------------------------------------------------
    def _shared_tails(self, seqs: Sequence[int], wd) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The partial tail blocks of ``seqs`` that are shared now (as the structural
        oracle observed them), with their contents."""
        out = {}
        s, bs = self.oracle._state(), self.block_size
        for q in seqs:
            n = self.oracle.lengths.get(q)
            if not n or n % bs == 0:
                continue
            tail = s.table_tuple(q)[-1]
            if tail not in out and s.ref(tail) > 1:
                k, v = self._block(tail, wd)
                out[tail] = (k.clone(), v.clone())
        return out

    def _check_shared(self, shared: dict, written: list[tuple[int, int]], wd) -> Violation | None:
        """A block shared when the step began changed only at slots the step wrote."""
        for block, (k0, v0) in shared.items():
            k1, v1 = self._block(block, wd)
            for off in range(self.block_size):
                if (block, off) in written:
                    continue
                if not (same(k0[:, off], k1[:, off]) and same(v0[:, off], v1[:, off])):
                    s = self.oracle._state()
                    holders = [q for q in sorted(self.oracle.lengths) if block in s.table_tuple(q)]
                    return Violation(self.steps, "data", "shared block written", block,
                                     subject="block", witness=(
                        f"block {block} was shared (refcount > 1) when the step began, yet its "
                        f"slot {off} changed from {self._name(k0[:, off], v0[:, off])} to "
                        f"{self._name(k1[:, off], v1[:, off])} though the step wrote no such "
                        f"slot; sequences holding it now: {holders}"), details={"slot": off})
        return None

    def check(self, watchdog: Watchdog | None = None) -> Violation | None:
        """Read back every live sequence through the implementation; compare exactly."""
        seqs = sorted(self.expected)
        if not seqs:
            return None
        try:
            got = self._call("gather_many", watchdog, self.target.gather_many, seqs)
        except _Failed as exc:
            return exc.violation
        try:
            got = list(got)
        except Exception:  # noqa: BLE001 - not a sequence at all
            got = None
        if got is None or len(got) != len(seqs):
            return Violation(self.steps, "malformed", "gather", witness=(
                f"gather_many of {len(seqs)} sequences returned "
                f"{_short(got) if got is None else f'{len(got)} results'}"))
        self.stats["read_backs"] += 1
        for q, item in zip(seqs, got, strict=True):
            pair = _pair(item)
            if pair is None:
                return Violation(self.steps, "malformed", "gather", q, subject="seq", witness=(
                    f"gather_many returned {_short(item)} for sequence {q}, expected (k, v) "
                    f"tensors"))
            ek, ev = self.expected[q]
            gk, gv = _plain(pair[0], ek.device), _plain(pair[1], ev.device)
            if gk is None or gv is None:
                return Violation(self.steps, "malformed", "gather", q, subject="seq", witness=(
                    f"gather_many returned K/V for sequence {q} that is not a dense tensor "
                    f"kvcheck can read on {ek.device}: {_short(pair[0])}, {_short(pair[1])}"))
            if same(gk, ek) and same(gv, ev):
                continue
            return self._mismatch(q, gk, gv, ek, ev)
        return None

    def _mismatch(self, q, gk, gv, ek, ev) -> Violation:
        n, bs = ek.shape[1], self.block_size
        table = list(self.oracle._state().table_tuple(q))
        if gk.shape != ek.shape or gv.shape != ev.shape or gk.dtype != ek.dtype \
                or gv.dtype != ev.dtype:
            return Violation(self.steps, "data", "read-back", q, subject="seq", witness=(
                f"sequence {q} read back K/V of shape {tuple(gk.shape)} and {tuple(gv.shape)} "
                f"({gk.dtype}, {gv.dtype}), expected {tuple(ek.shape)} ({ek.dtype}: {n} "
                f"token{'' if n == 1 else 's'})"))
        pos = next(p for p in range(n)
                   if not (same(gk[:, p], ek[:, p]) and same(gv[:, p], ev[:, p])))
        block = table[pos // bs] if pos // bs < len(table) else None
        return Violation(self.steps, "data", "read-back", q, subject="seq", witness=(
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


def _pair(x) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``x`` as a (k, v) pair of tensors, or None."""
    try:
        k, v = x
    except Exception:  # noqa: BLE001 - not a pair
        return None
    if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        return k, v
    return None


def _plain(t: torch.Tensor, device) -> torch.Tensor | None:
    """``t`` as a dense tensor on ``device`` whose bits kvcheck can compare, or None."""
    try:
        if t.layout != torch.strided or t.element_size() not in _WIDTH:
            return None
        return t if t.device == device else t.to(device)
    except Exception:  # noqa: BLE001 - a tensor that cannot be moved (meta, a broken subclass)
        return None


def _short(x) -> str:
    try:
        text = repr(x) if not isinstance(x, torch.Tensor) else f"a tensor of shape {tuple(x.shape)}"
    except Exception:  # noqa: BLE001 - an unprintable object
        text = f"a {type(x).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."
