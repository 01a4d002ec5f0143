"""The engine's run state: one run of an engine target, observed and checked after every
operation.

After every ``add``, ``abort`` and ``step`` the oracle reads the whole engine (the
scheduler's queues; each request's status, computed tokens and blocks; the block pool's
refcounts, free queue and hash map) and checks, with the spec's text:

1. **the KV calls of the step** (recorded at the KV-cache manager's boundary, in the
   order the scheduler made them): a cache lookup (``get_computed_blocks``) returns only
   blocks holding the requested prefix (``spec.prefix.cache_hits``'s rule, read on the
   ghost contents below); ``allocate_slots`` either refuses and changes nothing or
   appends to the request's blocks (its hits, then the fresh blocks it returns), and, on
   a target with a sliding window (``sliding_window`` tokens; ``null_block``, the engine's
   id of its null block), may replace an entry by the null block only wholly behind the
   window (``WINDOW``); ``free`` leaves the request holding nothing;
2. **what the forward pass writes**: each scheduled token at its position, into the
   request's block for that position, which must be a block the request was given fresh
   (never a cache hit: nothing is written into a shared or cached block); the oracle's
   ghost records each block's written slots and so its content (a prefix id, as the
   prefix model's ``Ghost`` interns them); on a target with ``keys_partial_blocks`` (vLLM
   v0's BlockSpaceManagerV1 with prefix caching: a key shares a block before the runner may
   skip it, a partial one included) a block given fresh may be one another request holds
   and wrote: each writes its own tokens' KV, the same at the same slot, and the ghost
   keeps the other's slots;
3. **the engine-level properties**: a request that is not running (finished, aborted,
   waiting, preempted) holds no block; a running request's blocks hold exactly what its
   computed tokens need (``spec.invariants.table_length``, with the slots up to the
   furthest one a step scheduled for it counted as reserved: a rejected draft's slots stay
   allocated), or on a preallocating release (to 0.8.4) at most its preallocation more;
   a request never holds more blocks than its block-table row, ``cdiv(max_model_len,
   block_size)`` (``ROW``: the run's ``max_model_len``, else the target's); a scheduled
   request computes at least one token (``COMPUTES``: a prompt wholly in the cache still
   recomputes its last token, whose logits the model samples from); the engine never
   raises (a crash is a violation naming the step); every request finishes within a bound
   when the pool can hold it (liveness: the bound is generous -- every request's whole
   work redone once per other request -- so only a starved or stuck request reaches it);
4. **every block-manager invariant** (``spec.invariants``) over the running requests'
   tables, the refcounts and the free queue, and, with prefix caching, **every
   prefix-cache invariant** (``spec.prefix``) over the pool's hash map: a key's meaning is
   the prefix whose tokens the release's own hasher gave that key (learned from every
   request's block hashes and token ids), a block's content the ghost's.

The run's ``sweep`` drains the engine (steps while a request is unfinished, recorded as
``implied`` operations), then every block must be free.
"""

from __future__ import annotations

from kvcheck.check import evidence
from kvcheck.check.copies import deep_copy
from kvcheck.check.model import recorded_step
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import Interrupted, OperationTimeout, Watchdog, active_watchdog
from kvcheck.errors import what_it_did
from kvcheck.models.blocks import witness
from kvcheck.models.engine.model import EngineOp, fits, step_gen
from kvcheck.models.prefix.oracle import Ghost
from kvcheck.spec import prefix as prefix_spec
from kvcheck.spec.engine import (
    APPENDS,
    APPENDS_DOC,
    COMPUTES,
    COMPUTES_DOC,
    FREED,
    HELD,
    HELD_DOC,
    HITS,
    LEAK,
    LIVENESS,
    PREALLOC,
    PREALLOC_DOC,
    QUEUES,
    QUEUES_DOC,
    REFUSED,
    ROW,
    ROW_DOC,
    SLOTS,
    SLOTS_DOC,
    WINDOW,
    WINDOW_DOC,
    WRITE_FRESH,
    WRITE_FRESH_DOC,
)
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.state import Snapshot

MAX_SEQ = 2**31 - 1
RUNNING = "RUNNING"

class EngineOracle:
    """A run of an engine target (``kvcheck.models.engine.loading.build``); speaks
    ``kvcheck.check.model.RunState``."""

    def __init__(self, target, scope, mode: str = "fast", seed: int = 0):
        self.target, self.scope, self.mode, self.seed = target, scope, mode, seed
        self.nb, self.bs = scope.num_blocks, scope.block_size
        # the engine's id of the oracle's block 0 (the KV calls and writes name engine ids):
        # 1 where the engine's block 0 is a null block outside the pool (vLLM 0.8.3 on)
        self.off = getattr(target, "block_offset", 1)
        self.steps = 0  # operations checked
        self.engine_steps = 0
        self.violation: Violation | None = None
        self.requests: dict[int, EngineOp] = {}
        self.unfinished: dict[int, None] = {}
        self.work = 0  # sum of prompt + max_new over the requests added
        self.last_arrival = 0
        self.reached: dict[int, int] = {}  # request -> the furthest slot a step scheduled
        self.fresh: dict[int, set] = {}  # request -> vLLM block ids given it fresh
        # request -> {cached vLLM block id: its index} a block the request just filled was
        # swapped for (v0's promotion to an identical cached block; spec.engine.APPENDS_DOC)
        self.swapped: dict[int, dict[int, int]] = {}
        # a target whose cache keys a partial block and shares it, and shares a full block
        # before it is computed (vLLM v0's BlockSpaceManagerV1 with prefix caching): a
        # shared block given "fresh" keeps what its other holder wrote, a copy on write of
        # the last entry is read as one, a same-token rewrite keeps the slots after it
        self.shares = bool(getattr(target, "keys_partial_blocks", False))
        self.slots: dict[int, list] = {}  # vLLM block id -> [parent prefix id, {offset: token}]
        self.ghost = Ghost(self.bs)
        self.meanings: dict = {}  # block hash -> prefix id (what the release hashed it from)
        # requests finished or aborted whose block hashes were learned since: their tokens,
        # and so their hashes, no longer change (``_prefix`` reads them no more)
        self.settled: set[int] = set()
        self.stats = {"requests": 0, "finished": 0, "aborted": 0, "steps": 0,
                      "scheduled_tokens": 0, "preemptions": 0, "hits": 0, "kv_calls": 0}
        self.implied: list = []
        self.implied_states: list[dict] = []
        self.post: dict = {}
        wd = active_watchdog()
        if wd is not None:
            wd.enter()
        try:
            self.violation = self._check(0, "the fresh engine")
        except OperationTimeout as exc:
            self.violation = Violation(0, "hang", "observation", witness=f"reading the engine {exc}")
        finally:
            if wd is not None:
                wd.leave()

    # -- the run state's interface ----------------------------------------------------------
    def clone(self) -> EngineOracle:
        return deep_copy(self)

    def has_work(self) -> bool:
        return bool(self.unfinished)

    def live_seqs(self) -> list[int]:
        return list(self.unfinished)

    def valid(self, op) -> bool:
        if op.kind == "step":
            return self.has_work() and type(op.gen) is int and op.gen >= 0
        if op.kind == "abort":
            return op.seq in self.unfinished and getattr(self.target, "aborts", True)
        if op.kind == "add":
            q, toks, m, p = op.seq, op.tokens, op.max_new, op.priority
            return (type(q) is int and 0 <= q <= MAX_SEQ and q not in self.requests
                    and isinstance(toks, list) and all(type(t) is int and t >= 0 for t in toks)
                    and type(m) is int and type(p) is int
                    and fits(self.scope, len(toks), m, getattr(self.target, "longest_request", 0)))
        return False

    def step(self, op, watchdog: Watchdog | None = None) -> Violation | None:
        return recorded_step(self, op, watchdog, self._checked)

    def _checked(self, op, _watchdog) -> Violation | None:
        n = self.steps
        try:
            return getattr(self, "_" + op.kind)(op, n)
        except OperationTimeout as exc:
            return Violation(n, "hang", op.kind, witness=f"{op.kind} hung: {exc}")

    def sweep(self, watchdog: Watchdog | None = None) -> Violation | None:
        """Drain the engine (steps while a request is unfinished, recorded in ``implied``;
        each step's ``gen`` the driver's for that step, ``step_gen``), then every block is
        free."""
        while self.violation is None and self.has_work():
            op = EngineOp("step", gen=step_gen(self.seed, self.engine_steps))
            self.implied.append(op)
            self.step(op, watchdog)
            self.implied_states.append(self.observed_json())
        if self.violation is not None:
            return self.violation
        free = self.post.get("num_free", self.nb)
        held = [b for b, r in enumerate(self.post.get("refs", [])) if r]
        if free != self.nb or held:
            self.violation = Violation(self.steps, "invariant", LEAK, witness=(
                f"every request finished but {self.nb - free} of {self.nb} blocks are not free"
                + (f" (blocks {held} hold references)" if held else "")))
        return self.violation

    def observed_json(self) -> dict:
        return dict(self.post)

    # -- operations -----------------------------------------------------------------------
    def _crash(self, n: int, what: str, exc: BaseException, seq=None) -> Violation:
        return Violation(n, "crash", what, seq, witness=(
            f"{what} {what_it_did(exc)}{_where(exc)} (engine step {self.engine_steps}); the "
            f"engine never raises"), subject=None if seq is None else "seq")

    def _add(self, op, n: int) -> Violation | None:
        try:
            self.target.add(op.seq, list(op.tokens), op.max_new, op.priority)
        except Interrupted:
            raise
        except OperationTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - the engine's fault, reported
            return self._crash(n, "add_request", exc, op.seq)
        self.requests[op.seq] = op
        self.unfinished[op.seq] = None
        self.work += len(op.tokens) + op.max_new
        self.last_arrival = self.engine_steps
        self.stats["requests"] += 1
        self.fresh[op.seq] = set()
        return self._check(n, f"add({op.seq})")

    def _abort(self, op, n: int) -> Violation | None:
        try:
            self.target.abort(op.seq)
        except Interrupted:
            raise
        except OperationTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001
            return self._crash(n, "finish_requests (abort)", exc, op.seq)
        self.unfinished.pop(op.seq, None)
        self.stats["aborted"] += 1
        if self.shares:  # (its free is not among a step's calls: it holds nothing now)
            self.fresh[op.seq] = set()
        return self._check(n, f"abort({op.seq})")

    def _bound(self) -> int:
        k = len(self.requests)
        return self.last_arrival + k * self.work + k + 1

    def _step(self, op, n: int) -> Violation | None:
        if self.engine_steps >= self._bound():
            return Violation(n, "liveness", LIVENESS, witness=(
                f"{len(self.unfinished)} of {len(self.requests)} requests unfinished after "
                f"{self.engine_steps} engine steps (bound: last arrival {self.last_arrival} + "
                f"requests x their prompt and output tokens + requests + 1)"))
        self.engine_steps += 1
        self.stats["steps"] += 1
        was_running = set(self.post.get("running", []))
        try:
            r = self.target.step(op.gen)
        except Interrupted:
            raise
        except OperationTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - the engine's fault, reported
            return self._crash(n, "step", exc)
        op.scheduled = {str(q): k for q, k in sorted(r.scheduled.items())}
        op.sampled = {str(q): t for q, t in sorted(r.sampled.items())}
        op.drafts = {str(q): t for q, t in sorted(r.drafts.items()) if t}
        op.finished = []  # (filled in below once the step is checked)
        self.stats["scheduled_tokens"] += sum(r.scheduled.values())
        for q, k in sorted(r.scheduled.items()):
            if k < 1:
                return Violation(n, "contract", COMPUTES, q, subject="seq", doc=COMPUTES_DOC,
                                 witness=(f"step {self.engine_steps} scheduled request {q} with "
                                          f"{k} tokens to compute: the forward pass has no token "
                                          f"to sample the next one from"))
        self.stats["kv_calls"] += len(r.calls) + len(r.update_calls)
        hits: list = []  # (request, call): read by the forward pass, after its writes
        v = self._calls(n, r.calls, hits)
        if v is None:
            v = self._writes(n, r)
        for q, c in hits:
            v = v or self._hits(n, q, c)
        if v is None:
            v = self._calls(n, r.update_calls, hits)
        if v is not None:
            return v
        for q, (start, toks, _) in r.writes.items():  # the furthest slot a step reached
            self.reached[q] = max(self.reached.get(q, 0), start + len(toks))
        finished = op.finished
        for q in list(self.unfinished):
            try:
                done = self.target.is_finished(q)
            except Interrupted:
                raise
            except BaseException as exc:  # noqa: BLE001
                return self._crash(n, "reading a request's status", exc, q)
            if done:
                finished.append(q)
                del self.unfinished[q]
                self.stats["finished"] += 1
        v = self._check(n, f"engine step {self.engine_steps}")
        if v is None:
            running = set(self.post.get("running", []))
            self.stats["preemptions"] += len(
                [q for q in was_running if q not in running and q in self.unfinished])
        return v

    # -- the step's KV calls and writes -----------------------------------------------------
    def _calls(self, n: int, calls, hits: list) -> Violation | None:
        for c in calls:
            q = int(c.request_id)
            self._learn(c.hashes, c.tokens)
            if c.name == "get_computed_blocks":
                v = None
                hits.append((q, c))
            elif c.name in ("allocate_slots", "append_slots"):  # append_slots: to 0.7.1
                v = self._allocated(n, q, c)
            else:
                v = None
                if c.blocks_after:
                    v = Violation(n, "contract", FREED, q, subject="seq", witness=(
                        f"after free(request {q}) it still holds vLLM blocks {c.blocks_after}"))
                self.fresh[q] = set()
                self.swapped.pop(q, None)
                self.reached.pop(q, None)
            if v is not None:
                return v
        return None

    def _hits(self, n: int, q: int, c) -> Violation | None:
        from kvcheck.impl.thirdparty.vllm_v1_engine import result_blocks

        got = c.result[0] if isinstance(c.result, tuple) else c.result
        hits = result_blocks(got)
        self.stats["hits"] += len(hits)
        if not hits:
            return None
        chain = self.ghost.chain(self.target.token_ids(q))
        for i, b in enumerate(hits):
            want = chain[i] if i < len(chain) else -1
            have = self._content(b)
            if have != want:
                return Violation(n, "contract", HITS, b - self.off, subject="block", witness=(
                    f"request {q}'s lookup returned block {b - self.off} as its block {i}, "
                    f"which holds "
                    f"{self.ghost.show(have)} ({self._filled(b)} of {self.bs} slots written), "
                    f"not the requested {self.ghost.show(want)}"),
                    doc=prefix_spec.cache_hits.__doc__ or "")
        return None

    def _allocated(self, n: int, q: int, c) -> Violation | None:
        from kvcheck.impl.thirdparty.vllm_v1_engine import result_blocks

        before, after = c.blocks_before, c.blocks_after
        if c.result is None:
            if after != before or c.free_after != c.free_before:
                return Violation(n, "contract", REFUSED, q, subject="seq", witness=(
                    f"{c.name} for request {q} returned None, yet its blocks went "
                    f"from {before} to {after} and the free count from {c.free_before} to "
                    f"{c.free_after}"))
            return None
        new = result_blocks(c.result)
        kept = after[:len(before)]
        null = getattr(self.target, "null_block", None)
        window = getattr(self.target, "sliding_window", 0)
        dropped = [i for i, (b, a) in enumerate(zip(before, kept, strict=False))
                   if a == null and b != null] if window and null is not None else []
        if dropped:  # entries replaced by the null block: dropped behind the window (WINDOW)
            bad = [i for i in dropped if (i + 1) * self.bs + window > len(c.tokens)]
            if bad:
                return Violation(n, "contract", WINDOW, q, subject="seq", doc=WINDOW_DOC,
                                 witness=(
                    f"{c.name} for request {q} ({len(c.tokens)} tokens, a window of {window}) "
                    f"replaced its block {bad[0]} (block {before[bad[0]] - self.off}, tokens "
                    f"{bad[0] * self.bs} .. {(bad[0] + 1) * self.bs - 1}) by the null block: "
                    f"it holds some of the last {window} tokens"))
            self.stats["dropped"] = self.stats.get("dropped", 0) + len(dropped)
            for i in dropped:
                self.fresh.get(q, set()).discard(before[i])
            before = [null if i in dropped else b for i, b in enumerate(before)]
        copied: dict = {}
        if self.shares and c.copies and before:  # copy on write of the last entry (APPENDS_DOC)
            i = len(before) - 1
            old = before[i]
            cp = c.copies.get(old)
            if (cp is not None and i < len(kept) and kept[i] == cp and cp in new
                    and cp not in before and self._held_elsewhere(old, q)):
                slot = self.slots.get(old, [None, {}])
                copied[cp] = [slot[0], dict(slot[1])]
                self.fresh.get(q, set()).discard(old)
                before = [*before[:i], cp]
                self.stats["copied"] = self.stats.get("copied", 0) + 1
        swaps = [i for i, (b, a) in enumerate(zip(before, kept, strict=False))
                 if a != b] if kept != before else []  # (the usual call: none, no pass)
        if swaps and len(kept) == len(before):
            toks = self.target.token_ids(q)
            chain = self.ghost.chain(toks)
            fresh = self.fresh.get(q, set())
            if all(before[i] in fresh and i < len(chain)
                   and (self._content(kept[i]) == chain[i]
                        or self.shares and self._agrees(kept[i], chain, toks, i))
                   for i in swaps):  # promoted to an identical cached block (APPENDS_DOC)
                for i in swaps:
                    self.swapped.setdefault(q, {})[kept[i]] = i
                    if self.shares:  # (released: another request may be given it fresh)
                        fresh.discard(before[i])
                self.stats["promoted"] = self.stats.get("promoted", 0) + len(swaps)
                before = kept
        if kept != before or (new and after[len(after) - len(new):] != new):
            return Violation(n, "contract", APPENDS, q, subject="seq", doc=APPENDS_DOC, witness=(
                f"{c.name} for request {q}: its blocks went from {c.blocks_before} to {after}, "
                f"returning new blocks {new}"))
        for b in new:
            if b in copied:
                self.slots[b] = copied[b]
            elif not (self.shares and self._held_elsewhere(b, q)):
                self.slots[b] = [None, {}]
        self.fresh.setdefault(q, set()).update(new)
        return None

    def _held_elsewhere(self, b: int, q: int) -> bool:
        """Whether another request holds block ``b``, given it fresh (``shares``)."""
        return any(b in f for r, f in self.fresh.items() if r != q)

    def _agrees(self, b: int, chain, toks, i: int) -> bool:
        """Block ``b``'s written slots are those of the prefix ``chain[i]`` (the same parent
        and tokens), some maybe not written yet: a block another request promoted in the
        same step, whose last slot that step's forward pass writes (``shares``)."""
        slot = self.slots.get(b)
        parent = chain[i - 1] if i > 0 else -1
        return (slot is not None and slot[0] == parent
                and all(toks[i * self.bs + o] == t for o, t in slot[1].items()))

    def _writes(self, n: int, r) -> Violation | None:
        bs = self.bs
        for q, (start, toks, blocks) in r.writes.items():
            every = self.target.token_ids(q) + list(r.spec.get(q, []))
            chain = self.ghost.chain(every)
            fresh = self.fresh.get(q, set())
            for j, tok in enumerate(toks):
                p = start + j
                i = p // bs
                if i >= len(blocks):
                    return Violation(n, "contract", SLOTS, q, subject="seq", witness=(
                        f"request {q} was scheduled up to token {start + len(toks)} but holds "
                        f"{len(blocks)} block(s) of {bs}"), doc=SLOTS_DOC)
                b = blocks[i]
                parent = chain[i - 1] if 0 < i <= len(chain) else -1
                if b not in fresh and self.swapped.get(q, {}).get(b) == i:
                    slot = self.slots.get(b, [None, {}])
                    if slot[0] == parent and slot[1].get(p % bs) == tok:
                        continue  # the same token's KV again, into the block it was promoted to
                    if self.shares and slot[0] == parent and p % bs not in slot[1]:
                        slot[1][p % bs] = tok  # its slot not written yet (``_agrees``)
                        continue
                if b not in fresh:
                    return Violation(n, "contract", WRITE_FRESH, b - self.off, subject="block",
                                     doc=WRITE_FRESH_DOC, witness=(
                        f"step {self.engine_steps} writes request {q}'s token {p} into block "
                        f"{b - self.off} (its block {i}), which it reached through a cache hit: "
                        f"holding {self.ghost.show(self._content(b))}"))
                slot = self.slots.setdefault(b, [None, {}])
                if slot[0] != parent:
                    slot[0], slot[1] = parent, {}
                written = slot[1]
                if self.shares and written.get(p % bs) == tok:
                    continue  # the same KV again (a sharer's rewrite): the slots after it hold
                for o in [o for o in written if o > p % bs]:
                    del written[o]  # the KV after a rewritten slot was computed on other tokens
                written[p % bs] = tok
        return None

    def _learn(self, hashes, tokens) -> None:
        """Each block hash means the prefix of the tokens the release hashed it from (the
        request's block hashes against its token ids, at a KV call or after a step)."""
        if hashes:
            for h, pid in zip(hashes, self.ghost.chain(tokens), strict=False):
                self.meanings.setdefault(h, pid)

    def _filled(self, b: int) -> int:
        slot = self.slots.get(b)
        return 0 if slot is None else len(slot[1])

    def _content(self, b: int) -> int:
        slot = self.slots.get(b)
        if slot is None or len(slot[1]) != self.bs:
            return -1
        return self.ghost.intern(slot[0], tuple(slot[1][o] for o in range(self.bs)))

    # -- observing and checking the state ----------------------------------------------------
    def _check(self, n: int, what: str) -> Violation | None:
        t = self.target
        try:
            running, waiting = t.running(), t.waiting()
            refs = [t.refcount(b) for b in range(self.nb)]
            free = t.free_blocks()
            num_free = t.num_free()
            tables, computed, status = {}, {}, {}
            for q in self.requests:
                status[q] = t.status(q)
                blocks = t.blocks(q)
                if blocks:
                    tables[q] = blocks
                computed[q] = t.computed(q)
            entries = t.cached_entries() if self.scope.caching else []
        except Interrupted:
            raise
        except OperationTimeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - the engine's fault, reported
            return Violation(n, "malformed", "observation", witness=(
                f"reading the engine after {what} {what_it_did(exc)}"))
        cached = sorted({b for _, b in entries})
        self.post = {"running": running, "waiting": waiting,
                     "tables": {str(q): b for q, b in tables.items()},
                     "computed": {str(q): computed[q] for q in tables},
                     "refs": refs, "num_free": num_free, "cached": cached}
        seen: set = set()
        for where, q in [("running", q) for q in running] + [("waiting", q) for q in waiting]:
            if q in seen or (where == "running" and status.get(q) != RUNNING):
                return Violation(n, "invariant", QUEUES, q, subject="seq", doc=QUEUES_DOC,
                                 witness=(f"after {what}, request {q} "
                                          f"({str(status.get(q, '?')).lower()}) is in "
                                          f"{where}" + (" twice or in running and waiting"
                                                        if q in seen else "")
                                          + f": running {running}, waiting {waiting}"))
            seen.add(q)
        for q, blocks in tables.items():  # engine: only a running request holds blocks
            if status[q] != RUNNING:
                return Violation(n, "invariant", HELD, q, subject="seq", doc=HELD_DOC, witness=(
                    f"after {what}, request {q} ({status[q].lower()}) holds blocks {blocks}"))
        live = {q: computed[q] for q in tables}
        # a rejected draft's slots stay allocated (update_from_output rolls back
        # num_computed_tokens, not the blocks): reserved up to the furthest slot reached
        reserved = {q: max(0, self.reached.get(q, 0) - live[q]) for q in tables}
        # the block-table row: the run's max_model_len, else the engine's (if it says)
        cap_len = self.scope.max_model_len or getattr(t, "max_model_len", 0)
        if cap_len:
            row = -(-cap_len // self.bs)
            for q, blocks in tables.items():
                if len(blocks) > row:
                    return Violation(n, "invariant", ROW, q, subject="seq", doc=ROW_DOC,
                                     witness=(
                        f"after {what}, request {q} holds {len(blocks)} block(s), past its "
                        f"block-table row of {row} (max_model_len {cap_len}, {self.bs} slots a "
                        f"block)"))
        extra = getattr(t, "preallocate_blocks", 0)
        if extra:  # a preallocating release: the table is bounded, not exact
            for q, blocks in tables.items():
                need = -(-max(self.reached.get(q, 0), live[q]) // self.bs)
                if not need <= len(blocks) <= need + extra:
                    return Violation(n, "invariant", PREALLOC, q, subject="seq",
                                     doc=PREALLOC_DOC, witness=(
                        f"after {what}, request {q} holds {len(blocks)} block(s) for "
                        f"{need} needed (the release preallocates at most {extra})"))
                reserved[q] = len(blocks) * self.bs - live[q]
        snap = Snapshot(self.nb, self.bs, tables, live, refs, free, None, None, num_free,
                        reserved)
        v = self._invariants(n, snap, what)
        if v is None and self.scope.caching:
            v = self._prefix(n, tables, computed, refs, entries, what)
        return v

    def _invariants(self, n: int, snap: Snapshot, what: str) -> Violation | None:
        for inv in INVARIANTS:
            if inv.domain == "global":
                elements = (None,)
            else:
                elements = snap.blocks() if inv.domain == "block" else snap.seqs()
            for x in elements:
                if not inv.holds_for(PY, snap, x):
                    ev = evidence.for_invariant(inv, PY, snap, x)
                    return Violation(n, "invariant", inv.name, x,
                                     witness=f"after {what}: {witness.for_state(ev, snap)}",
                                     doc=inv.doc, subject=ev.subject, terms=ev.terms)
        return None

    def _prefix(self, n: int, tables, computed, refs, entries, what: str) -> Violation | None:
        t, bs = self.target, self.bs
        for q in self.requests:  # what the release hashed each request's blocks from
            if q not in self.settled:
                self._learn(t.block_hashes(q), t.token_ids(q))
                if q not in self.unfinished:
                    self.settled.add(q)
        queue = t.free_blocks()
        keyed = {b for _, b in entries}
        partial = set()
        for q, blocks in tables.items():
            partial.update(blocks[computed[q] // bs:])
        filled = {b - self.off: self._filled(b) for b in self.slots}
        content = {b - self.off: self._content(b) for b in self.slots}
        hashed = {b for b in range(self.nb) if t.block_hash(b) is not None}
        snap = prefix_spec.PrefixSnapshot(
            self.nb, bs, refs, [b for b in queue if b not in hashed],
            [b for b in queue if b in hashed], entries, self.meanings, partial, filled, content)
        for inv in prefix_spec.PREFIX_INVARIANTS:
            elements = (None,) if inv.domain == "global" else snap.blocks()
            for x in elements:
                if not inv.holds_for(PY, snap, x):
                    return Violation(n, "invariant", inv.name, x,
                                     subject=None if x is None else "block", doc=inv.doc,
                                     witness=self._prefix_witness(inv.name, x, snap, keyed, what))
        return None

    def _prefix_witness(self, name: str, b, snap, keyed, what: str) -> str:
        if b is None:
            return f"after {what}: the free queue's two parts disagree with the pool"
        return (f"after {what}: block {b} (refcount {snap.ref(b)}, "
                f"{'cached' if b in keyed else 'not cached'}) has {snap.filled(b)} of "
                f"{self.bs} slots written, holding {self.ghost.show(snap.content(b))}; its key "
                f"names {self.ghost.show(snap.meaning(b))}")


def _where(exc: BaseException) -> str:
    """`` in FILE:LINE (FUNCTION)``: the innermost frame of the exception in the engine's own
    files (an installed release's path, from its package on), '' if none."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/thirdparty/" in f.filename or "site-packages" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    parts = f.filename.replace("\\", "/").split("/")
    for top in ("vllm", "sglang", "aphrodite", "nanovllm", "nanovllmnpu"):
        if top in parts:
            parts = parts[parts.index(top):]
            break
    return f" in {'/'.join(parts)}:{f.lineno} ({f.name})"
