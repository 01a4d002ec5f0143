"""The tiers oracle: every block-manager invariant per pool (holders: sequences, pending
jobs, the cache, pins), the tier invariants and each operation's contract of
``kvcheck.spec.tiers``, after every operation.

``TierOracle`` speaks ``kvcheck.check.model.RunState``. It reads the whole target after
every step (one mode) into a ``spec.tiers.TierState``.

Ghost contents. The oracle plays the engine and its worker: every token a request is given
is written into the block its table names for it (the leading blocks a load copies are
written when the load completes, from the host blocks it copies); a completed store copies
what its source holds then into its destination; a failed load is recomputed; a swap
copies each block to the block at the same position of the sequence's new table. Each
block holds the prefix id of the tokens up to its last written slot. A key means the
prefix its store was asked to copy (the request's tokens up to the end of that block),
bound when the store that published it completes: never from what a block held when the
key was first seen.

Jobs are named ``(seq, n)``: the n-th job started for request seq, whatever ids the target
gives them, so a trace replays on any target and deleting another request's operations
leaves the name as it was.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from kvcheck.check.copies import deep_copy
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, active_watchdog, guarded
from kvcheck.errors import what_it_did
from kvcheck.models.tiers.data import DataLevel, is_data_target, kv
from kvcheck.models.tiers.model import OPS
from kvcheck.spec import tiers as T
from kvcheck.spec.contracts import OK, OOB
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.targets.loading import TargetError
from kvcheck.targets.observe import ObservationError, as_int

REQUIRED = ("pools", "refcount", "free_blocks", "table", "pending_jobs", "cache_entries",
            "evictable_blocks")
DATA = ("holds_its_tokens", "key_content")  # tier invariants about contents: kind "data"
HOST_OPS = ("store", "load", "evict", "swap_out", "swap_in", T.PREFETCH)  # what needs a host pool


def pool_sizes(scope, reported: dict, capabilities, load_from: str = T.HOST) -> dict:
    """The pools the oracle reads: the device; the host where the target reports one or
    has an operation that needs it (a load needs none where it reads a remote peer, the
    target's ``load_from``); every other pool the target reports (one behind a mapping,
    sized by the target)."""
    sizes = {T.DEVICE: scope.num_blocks}
    host_ops = set(HOST_OPS) - ({"load"} if load_from == T.REMOTE else set())
    if T.HOST in reported or host_ops & set(capabilities):
        sizes[T.HOST] = scope.host_blocks
    sizes.update({p: n for p, n in reported.items() if p not in (T.DEVICE, T.HOST)})
    return sizes


def load_from(target) -> str:
    """Where a target's loads read: the host pool, or a remote peer (``load_from =
    spec.tiers.REMOTE``: a P/D receive, docs/tiers.md)."""
    return T.REMOTE if getattr(target, "load_from", T.HOST) == T.REMOTE else T.HOST


def lookahead_slots(target) -> int:
    """The lookahead slots a target's swap-in asks for (capability ``lookahead``: the
    engine's configured ``lookahead_slots``, the same at every swap-in); 0 for others."""
    if "lookahead" not in getattr(target, "capabilities", ()):
        return 0
    n = getattr(target, "lookahead_slots", 0)
    return n if type(n) is int and 0 <= n <= 1024 else 0


def build(factory, scope, options):
    """The tiers target ``factory(num_blocks, block_size, host_blocks)`` builds."""
    where = (f"num_blocks={scope.num_blocks}, block_size={scope.block_size}, "
             f"host_blocks={scope.host_blocks}")
    try:
        with guarded(None):
            target = factory(scope.num_blocks, scope.block_size, scope.host_blocks)
            missing = [m for m in REQUIRED if not hasattr(target, m)]
            if missing:
                raise TargetError(f"{type(target).__name__} is not a tiers target: it has no "
                                  f"{missing[0]} (needs {', '.join(REQUIRED)}; docs/tiers.md)")
            pools = dict(target.pools())
    except TargetError:
        raise
    except OperationTimeout as exc:
        raise TargetError(f"building the target with {where} {exc}") from None
    except Interrupted:
        raise
    except BaseException as exc:  # noqa: BLE001 - the factory refused: bad input
        raise TargetError(f"cannot build target with {where}: it {what_it_did(exc)}") from None
    caps = getattr(target, "capabilities", T.CONTRACTS)
    want = {p: n for p, n in pool_sizes(scope, pools, caps, load_from(target)).items()
            if p in (T.DEVICE, T.HOST)}
    if {k: pools.get(k) for k in want} != want or not all(
            isinstance(p, str) and type(n) is int and n >= 1 for p, n in pools.items()):
        raise TargetError(f"{type(target).__name__}.pools() is {pools!r:.80}, expected at least "
                          f"{want} for {where}")
    if set(pools) - {T.DEVICE, T.HOST} and not hasattr(target, "mapped"):
        raise TargetError(f"{type(target).__name__} reports pools behind a mapping "
                          f"({', '.join(sorted(set(pools) - {T.DEVICE, T.HOST}))}) but has no "
                          "mapped(seq) (docs/tiers.md)")
    if options.out_of_blocks is not None:
        target.is_out_of_blocks = lambda exc: isinstance(exc, options.out_of_blocks)
    return target


class _UnknownJob(Exception):
    """The target reports a pending job no operation started."""


class TierOracle:
    def __init__(self, target, scope, options):
        self.target = target
        self.scope = scope
        self.nb, self.bs, self.nh = scope.num_blocks, scope.block_size, scope.host_blocks
        self.capabilities = frozenset(getattr(target, "capabilities", T.CONTRACTS))
        self.failures = frozenset(getattr(target, "failures", (T.STORE, T.LOAD)))
        self.sizes = pool_sizes(scope, dict(target.pools()), self.capabilities,
                                load_from(target))
        self.mapped_pools = [p for p in self.sizes if p not in (T.DEVICE, T.HOST)]
        self.slid: dict[int, int] = {}  # live request -> tokens behind its window (slide)
        self.steps = 0
        self.violation: Violation | None = None
        self.tokens: dict[int, list] = {}  # live request -> its tokens
        self.ids: dict[tuple, int] = {}  # token prefix -> prefix id
        self.prefixes: list[tuple] = []  # prefix id -> token prefix
        self.data = DataLevel(target, self.bs) if is_data_target(target) else None
        self._wq: dict[int, tuple] = {}  # live request -> _wants of its tokens (memo)
        self.content: dict[str, dict[int, int]] = {p: {} for p in self.sizes}  # the ghost
        self.meanings: dict = {}  # key -> prefix id
        self.published: dict = {}  # device key -> the prefix id its request cached under it
        self.jobs: dict[tuple, dict] = {}  # pending (seq, n) -> what started it
        self.by_id: dict = {}  # the target's job id -> (seq, n)
        self.started = Counter()  # request -> jobs started for it
        self.reserved: dict[int, int] = {}  # request -> lookahead slots its table keeps
        self.post: T.TierState | None = None
        self.stats = Counter()
        try:
            with guarded(None):
                if self.data is not None:
                    self._read("use_kv(kv)", target.use_kv, kv)
                self.post = self._with_ghost(self._capture())
            self.violation = self._invariants(0, self.post)
        except ObservationError as exc:
            self.violation = Violation(0, "malformed", "observation", witness=str(exc))
        except OperationTimeout as exc:
            self.violation = Violation(0, "hang", "observation", witness=f"reading the pools {exc}")

    # -- RunState ----------------------------------------------------------------------
    def clone(self):
        return deep_copy(self)

    def live(self) -> list[int]:
        return list(self.tokens)

    def live_seqs(self) -> list[int]:
        return list(self.tokens)

    def pending(self) -> list[tuple]:
        return list(self.jobs)

    def pool_of(self, q: int) -> str | None:
        return self.post.pool_of(q) if self.post is not None else None

    def num_free(self, pool: str = T.DEVICE) -> int:
        return sum(self.post.free[pool].values()) if self.post is not None else 0

    def valid(self, op) -> bool:
        kind = op.kind
        if kind not in OPS or kind not in self.capabilities:
            return False
        if kind == "complete":
            job = self.jobs.get((op.seq, op.job))
            if job is None or not isinstance(op.ok, bool) or not (
                    op.ok or job["kind"] in self.failures):
                return False
            if op.filled is None:
                return True
            if job["kind"] != T.PREFETCH:  # (a whole completion: the default, or none)
                return op.filled == (len(job["keys"]) if op.ok else 0)
            return op.ok and type(op.filled) is int and 0 <= op.filled <= len(job["keys"])
        if kind == "evict":
            return type(op.n) is int and op.n >= 1
        if type(op.seq) is not int or not 0 <= op.seq < 2**31:
            return False
        admits = getattr(self.target, "admits", None)  # (kvcheck/targets/protocol.py)
        if kind in ("allocate", "load", T.PREFETCH):
            return op.seq not in self.tokens and len(op.tokens) >= 1 and (
                admits is None or bool(admits(op)))
        if op.seq not in self.tokens:
            return False
        if admits is not None and not admits(op):
            return False  # an operation the engine's caller never makes (its adapter says)
        where = self.pool_of(op.seq)
        if kind == T.SLIDE:  # forward, never into the block of the newest token
            n = len(self.tokens[op.seq])
            return where == T.DEVICE and type(op.upto) is int and \
                self.slid.get(op.seq, 0) < op.upto <= (n - 1) // self.bs * self.bs
        if kind in ("swap_out", "swap_in", "append") and any(
                j["seq"] == op.seq and j["kind"] == T.LOAD for j in self.jobs.values()):
            return False  # (an engine runs or swaps a request only once its KV is there)
        if kind == "swap_in":  # with the engine's own lookahead slots (a constant)
            return where == T.HOST and op.lookahead == lookahead_slots(self.target)
        if kind in ("append", "store", "swap_out"):
            return where == T.DEVICE
        return True

    def step(self, op, watchdog=None):
        if self.violation is not None:
            return self.violation
        self.steps += 1
        n = self.steps
        wd = watchdog or active_watchdog()
        try:
            with guarded(wd):
                v = self._step(op, n)
        except ObservationError as exc:
            v = Violation(n, "malformed", "observation", witness=str(exc))
        except _UnknownJob as exc:
            v = Violation(n, "contract", T.UNKNOWN_JOB, witness=str(exc))
        except OperationTimeout as exc:
            v = Violation(n, "hang", "observation", witness=f"reading the pools {exc}")
        self.violation = v
        return v

    def sweep(self, watchdog=None):
        return self.violation

    def observed_json(self) -> dict:
        s = self.post
        if s is None:
            return {"pools": {}, "tables": {}}
        pools = {p: {"refs": list(s.refs[p]), "free": sorted(s.free[p].elements()),
                     "cached": sorted(s.keys(p).values())} for p in s.pools()}
        tables = {str(q): {"pool": s.pool_of(q), "blocks": list(t), "len": s.length(q),
                           **({"mapped": {p: list(s.mapped_table(p, q))
                                          for p in s.mapped_pools()}}
                              if s.mapped_pools() else {})}
                  for q, t in sorted(s.tables.items())}
        jobs = {f"{j[0]}.{j[1]}": {"kind": job.kind, "seq": job.seq, "src": list(job.src),
                                   "dst": list(job.dst)} for j, job in sorted(s.jobs.items())}
        return {"pools": pools, "tables": tables, "jobs": jobs}

    # -- the ghost -------------------------------------------------------------------------
    def _pid(self, prefix: tuple) -> int:
        pid = self.ids.get(prefix)
        if pid is None:
            pid = self.ids[prefix] = len(self.ids)
            self.prefixes.append(prefix)
        return pid

    def _wants(self, toks: list) -> tuple:
        B = self.bs
        return tuple(self._pid(tuple(toks[: min((i + 1) * B, len(toks))]))
                     for i in range(-(-len(toks) // B)))

    def _wants_of(self, q: int) -> tuple:
        """``_wants`` of live request q's tokens, kept until an operation on q changes them."""
        w = self._wq.get(q)
        if w is None:
            w = self._wq[q] = self._wants(self.tokens[q])
        return w

    # -- one step ------------------------------------------------------------------------
    def _call(self, op):
        t, kind, q = self.target, op.kind, op.seq
        if kind in ("allocate", "load"):
            return getattr(t, kind)(q, list(op.tokens))
        if kind == "append":
            return t.append(q, op.token)
        if kind in ("free", "store"):
            return getattr(t, kind)(q)
        if kind == "complete":
            if op.filled is not None and self.jobs[op.seq, op.job]["kind"] == T.PREFETCH:
                return t.complete(self.jobs[op.seq, op.job]["id"], op.ok, op.filled)
            return t.complete(self.jobs[op.seq, op.job]["id"], op.ok)
        if kind == T.PREFETCH:
            return t.prefetch(q, list(op.tokens))
        if kind == "evict":
            units = getattr(t, "eviction_units", None)  # (blocks one eviction takes together)
            op.units = tuple(tuple(self._blocks(u, "an eviction unit")) for u in self._read(
                "eviction_units('host')", lambda: list(units(T.HOST)))) if units else ()
            return t.evict(op.n)
        if kind == T.SLIDE:
            return t.slide(q, op.upto)
        if kind == "swap_in" and op.lookahead:  # (a target with "lookahead" only)
            op.admitted = bool(t.can_swap_in(q, op.lookahead))
            return t.swap_in(q, op.lookahead) if op.admitted else None
        check = getattr(t, f"can_{kind}")(q)
        op.admitted = bool(check)
        return getattr(t, kind)(q) if op.admitted else None

    def _step(self, op, n: int) -> Violation | None:
        pre = self.post
        kind, q = op.kind, op.seq
        try:
            result = self._call(op)
            op.outcome = OK
        except OperationTimeout as exc:
            return Violation(n, "hang", kind, witness=f"{kind} {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the target's exception, judged here
            if not self._oob(exc):
                return Violation(n, "crash", kind, witness=f"{kind} {what_it_did(exc)}")
            op.outcome = OOB
            self.stats["oob"] += 1
            post = self._with_ghost(self._capture())
            self.post = post
            return self._clauses(n, op, T.out_of_blocks, pre, post) or \
                self._invariants(n, post) or self._data_level(n, post)
        self.stats[kind] += 1
        freed: dict = {}
        self._wq.pop(q, None)
        if kind in ("allocate", "load"):
            self.tokens[q] = list(op.tokens)
        elif kind == "append":
            self.tokens[q].append(op.token)
            if isinstance(result, (tuple, list)) and len(result) == 2:
                op.block, op.offset = result
        elif kind == "free":
            freed[q] = self.tokens.pop(q)
            self.slid.pop(q, None)
        elif kind == T.SLIDE:
            self.slid[q] = op.upto
        started = kind in ("store", "load", T.PREFETCH) or (kind == "free" and result
                                                               is not None)
        if started:  # (a free may return the final store the engine starts at the end)
            if result is None:
                op.job = None
            else:
                if result in self.by_id:
                    return Violation(n, "contract", T.new_job(kind), q, witness=f"{kind}({q}) "
                                     f"returned job id {result!r}, already pending as job "
                                     f"{self.by_id[result]}")
                op.job = self.started[q]
                self.started[q] += 1
                self.by_id[result] = (q, op.job)
                self.jobs[q, op.job] = {"id": result, "kind": T.STORE if kind == "free" else
                                        kind, "seq": q, "keys": ()}
        name = (q, op.job)
        done = self.jobs.pop(name) if kind == "complete" else None
        if done is not None:
            self.by_id.pop(done["id"], None)
        post = self._capture(freed, done_job=(name, done) if done else None)
        if kind == "free" and op.job is not None and name in post.jobs:
            self.jobs[name]["kind"] = post.jobs[name].kind  # (a final store, or a send)
        if kind == "load":
            wants = self._wants(self.tokens[q])
            op.wanted = wants[: (len(op.tokens)) // self.bs]
            op.recompute_last = bool(getattr(self.target, "recomputes_last_token", False))
            job = post.jobs.get(name) if op.job is not None else None
            op.hits = len(job.src) if job is not None else 0
            if job is not None and job.src_pool == T.REMOTE:  # (what the peer's prefill
                # of the prompt lands in each destination, whoever holds it by then)
                table = post.table(q)
                self.jobs[name]["copy"] = tuple(
                    wants[table.index(d)] if d in table and table.index(d) < len(wants)
                    else None for d in job.dst)
        if kind in ("store", "free") and op.job is not None and name in post.jobs:
            self._key_store(name, pre, post, freed.get(q))
        if kind == T.PREFETCH and op.job is not None and name in post.jobs:
            self._key_prefetch(name, op, post)
        self._publish(op, pre, post, freed)
        self._write(op, pre, post, done)
        self._reserve(op)
        post = self._with_ghost(post)
        self.post = post
        fn = T.CONTRACTS[kind]
        return self._clauses(n, op, fn, pre, post) or self._invariants(n, post) or \
            self._data_level(n, post)

    def _key_store(self, j: tuple, pre, post, freed=None) -> None:
        """A store's intended keys: the request's prefix up to the end of each source's
        position in its table (a source not in it keeps None: the contract names it; a
        final store started by a free: the tokens the request ended with)."""
        job = post.jobs[j]
        wants = self._wants(self.tokens.get(job.seq) or freed or [])
        table = pre.table(job.seq)
        keys = tuple(wants[table.index(b)] if b in table and table.index(b) < len(wants)
                     else None for b in job.src)
        self.jobs[j]["keys"] = keys
        if not job.holds_src:  # (sources the job does not hold: what they held at the start,
            # kept until the copy lands -- spec.tiers.unheld_sources_kept -- is what it copies)
            dev = self.content.get(job.src_pool, {})
            self.jobs[j]["copy"] = tuple(dev.get(b) for b in job.src)
        post.jobs[j] = dataclasses.replace(job, keys=keys)

    def _key_prefetch(self, j: tuple, op, post) -> None:
        """A prefetch's keys: the prefix ids of the prompt's last full blocks, one per
        destination (the pages past the cached prefix; the storage is content-addressed:
        the page of a prefix holds that prefix's KV)."""
        job = post.jobs[j]
        full = len(op.tokens) // self.bs
        wants = self._wants(list(op.tokens))[:full]
        at = max(0, full - len(job.dst))
        keys = tuple(wants[at: at + len(job.dst)])
        keys += (None,) * (len(job.dst) - len(keys))  # (more pages than full blocks: the
        self.jobs[j]["keys"] = keys  # contract names it)
        post.jobs[j] = dataclasses.replace(job, keys=keys)

    def _write(self, op, pre, post, done) -> None:
        """The engine's and its worker's writes after a successful step (the ghost)."""
        kind, q, B = op.kind, op.seq, self.bs
        dev = self.content[T.DEVICE]
        if kind in ("allocate", "load", "append"):
            self._written_back(pre, post)
        if kind in ("allocate", "load") and post.live(q):
            wants = self._wants(self.tokens[q])
            job = post.jobs.get((q, op.job)) if op.job is not None else None
            kept = T.device_hits(pre, post, q) | set(job.dst if job is not None else ())
            for i, b in enumerate(post.table(q)):  # (a device hit or a loaded block: not
                if b not in kept and i < len(wants):  # written by the prefill)
                    dev[b] = wants[i]
        elif kind == "append" and post.live(q):
            i = (len(self.tokens[q]) - 1) // B
            t = post.table(q)
            if i < len(t):
                dev[t[i]] = self._wants(self.tokens[q])[i]
        elif kind in ("swap_out", "swap_in") and op.admitted and post.live(q):
            src, dst = pre.pool_of(q), post.pool_of(q)
            if src in self.content and dst in self.content:
                for a, b in zip(pre.table(q), post.table(q), strict=False):
                    if a in self.content[src]:
                        self.content[dst][b] = self.content[src][a]
        elif kind == "complete" and done is not None:
            job = pre.jobs.get((q, op.job))
            if job is None:
                return
            if job.kind == T.STORE and op.ok:
                host = self.content[T.HOST]
                keyed = {b: k for k, b in post.keys(T.HOST).items()}
                copy = done.get("copy")  # (sources the job did not hold: read at its start)
                for i, (s, d) in enumerate(zip(job.src, job.dst, strict=False)):
                    if copy is not None and i < len(copy):
                        if copy[i] is not None:
                            host[d] = copy[i]
                    elif s in dev:
                        host[d] = dev[s]
                    key = keyed.get(d)
                    if key is not None and key not in self.meanings and i < len(job.keys) \
                            and job.keys[i] is not None:
                        self.meanings[key] = job.keys[i]
            elif job.kind == T.PREFETCH:  # a filled page the cache keeps holds its prefix
                host = self.content[T.HOST]
                keyed = {b: k for k, b in post.keys(T.HOST).items()}
                for i, d in enumerate(job.dst[: T.filled_of(op, job)]):
                    key = keyed.get(d)
                    if key is not None and i < len(job.keys) and job.keys[i] is not None:
                        host[d] = job.keys[i]
                        self.meanings.setdefault(key, job.keys[i])
            elif job.kind == T.LOAD and job.src_pool == T.REMOTE:
                wants = self._wants(self.tokens.get(job.seq, []))
                table = post.table(job.seq) if post.live(job.seq) else []
                if op.ok:
                    for d, c in zip(job.dst, done.get("copy", ()), strict=False):
                        if c is not None:
                            dev[d] = c  # (the copy lands in d whoever holds it now)
                else:  # (failed: the engine recomputes the prompt in the request's table)
                    for i, b in enumerate(table[: len(wants)]):
                        dev[b] = wants[i]
            elif job.kind == T.LOAD:
                host = self.content[T.HOST]
                wants = self._wants(self.tokens.get(job.seq, []))
                for i, (s, d) in enumerate(zip(job.src, job.dst, strict=False)):
                    if op.ok and s in host:
                        dev[d] = host[s]
                    elif not op.ok and i < len(wants):
                        dev[d] = wants[i]  # the engine recomputes what the load could not copy

    def _reserve(self, op) -> None:
        """The lookahead slots a request's table keeps beyond its tokens: a swap-in with
        lookahead slots reserves them (as many as the most it was given), each token
        appended takes one; a new or ended request has none."""
        q, kind = op.seq, op.kind
        if kind == "swap_in" and op.admitted and op.lookahead:
            self.reserved[q] = max(self.reserved.get(q, 0), op.lookahead)
        elif kind == "append" and self.reserved.get(q):
            self.reserved[q] -= 1
        elif kind in ("allocate", "load", "free"):
            self.reserved.pop(q, None)

    def _publish(self, op, pre, post, freed) -> None:
        """A key a request's operation adds to the device cache names the prefix of the
        request's tokens up to that block's end: what the engine cached under it (kept
        aside, bound as the key's meaning only if the key reaches the host by a write-back:
        ``_written_back``)."""
        new = {k: b for k, b in post.keys(T.DEVICE).items() if k not in pre.keys(T.DEVICE)}
        toks = self.tokens.get(op.seq) or freed.get(op.seq)
        if not new or not toks:
            return
        table = post.table(op.seq) or pre.table(op.seq)
        wants = self._wants(toks)
        for k, b in new.items():
            if b in table and table.index(b) < len(wants):
                self.published.setdefault(k, wants[table.index(b)])

    def _written_back(self, pre, post) -> None:
        """A device eviction that writes a block back to the host (a write-back cache): the
        host block the key now names gets the device block's content, and the key the
        meaning its request cached it under."""
        was, host = pre.keys(T.DEVICE), self.content.get(T.HOST)
        if not was or host is None:  # (no device cache, or no host pool)
            return
        for k, h in post.keys(T.HOST).items():
            if k in was and k not in pre.keys(T.HOST):
                src = self.content[T.DEVICE].get(was[k])
                if src is not None:
                    host[h] = src
                if k not in self.meanings and k in self.published:
                    self.meanings[k] = self.published[k]

    def _with_ghost(self, s: T.TierState) -> T.TierState:
        s.reserved = {q: r for q, r in self.reserved.items() if r}
        s.contents = {p: dict(c) for p, c in self.content.items()}
        s.meanings = dict(self.meanings)
        s.wants = {q: self._wants_of(q) for q in self.tokens}
        return s

    def _oob(self, exc) -> bool:
        test = getattr(self.target, "is_out_of_blocks", None)
        if test is not None:
            try:
                if bool(test(exc)):
                    return True
            except CONTROL:
                raise
            except BaseException:  # noqa: BLE001 - a broken test: not out-of-blocks
                pass
        return type(exc).__name__ == "OutOfBlocks"

    # -- observation -----------------------------------------------------------------------
    def _read(self, what: str, fn, *args):
        try:
            return fn(*args)
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the target's fault, reported
            raise ObservationError(f"{what} {what_it_did(exc)}") from None

    def _blocks(self, raw, what: str) -> tuple:
        return tuple(as_int(b, f"an entry of {what}") for b in self._read(what, list, raw))

    def _capture(self, also: dict | None = None, done_job=None) -> T.TierState:
        """The target's state; ``also``: requests just freed (read too, so a table the free
        left behind is seen); ``done_job``: (number, record) of a job just completed (its
        id, should the target still report it pending)."""
        t = self.target
        refs = {p: [as_int(self._read(f"refcount({p!r}, {b})", t.refcount, p, b),
                           f"refcount({p!r}, {b})") for b in range(n)]
                for p, n in self.sizes.items()}
        free = {p: Counter(self._blocks(self._read(f"free_blocks({p!r})", t.free_blocks, p),
                                        f"free_blocks({p!r})")) for p in self.sizes}
        tables, where, lengths = {}, {}, {}
        for q, toks in {**self.tokens, **(also or {})}.items():
            try:
                got = t.table(q)
            except (KeyError, LookupError):
                continue
            except CONTROL:
                raise
            except BaseException as exc:  # noqa: BLE001 - reported
                raise ObservationError(f"table({q}) {what_it_did(exc)}") from None
            if got is None:
                continue
            try:
                pool, raw = got
            except (TypeError, ValueError):
                raise ObservationError(f"table({q}) is {got!r:.60}, expected (pool, blocks)") \
                    from None
            if pool not in self.sizes:
                raise ObservationError(f"table({q}) names pool {pool!r:.30}, not one of "
                                       f"{sorted(self.sizes)}")
            tables[q] = self._blocks(raw, f"table({q})")
            where[q], lengths[q] = pool, len(toks)
        jobs = {}
        raw_jobs = self._read("pending_jobs()", lambda: dict(t.pending_jobs()))
        for jid, d in raw_jobs.items():
            j = self.by_id.get(jid)
            if j is None:
                if done_job is not None and jid == done_job[1]["id"]:
                    j = done_job[0]  # completed, yet still reported pending
                else:
                    raise _UnknownJob(f"pending_jobs() reports job {jid!r:.40}, which no store "
                                      f"or load returned")
            try:
                (sp, src), (dp, dst) = d["src"], d["dst"]
                kind, seq = d["kind"], d["seq"]
            except (KeyError, TypeError, ValueError):
                raise ObservationError(f"pending_jobs()[{jid!r:.30}] is {d!r:.80}, expected "
                                       f"kind, seq, src (pool, blocks), dst (pool, blocks)") from None
            keys = self.jobs[j]["keys"] if j in self.jobs else ()
            jobs[j] = T.Job(kind, seq, sp, self._blocks(src, f"job {j}'s src"), dp,
                            self._blocks(dst, f"job {j}'s dst"), keys,
                            holds_src=bool(d.get("holds_src", True)),
                            holds_dst=bool(d.get("holds_dst", True)),
                            flushed=bool(d.get("flushed", False)))
        cache = {}
        for p in self.sizes:
            entries = self._read(f"cache_entries({p!r})", lambda p=p: list(t.cache_entries(p)))
            cache[p] = {}
            for e in entries:
                try:
                    key, b = e
                except (TypeError, ValueError):
                    raise ObservationError(f"cache_entries({p!r}) holds {e!r:.40}, expected "
                                           f"(key, block)") from None
                cache[p][key] = as_int(b, f"cache_entries({p!r})'s block for key {key!r:.30}")
        evictable = {p: frozenset(self._blocks(self._read(
            f"evictable_blocks({p!r})", t.evictable_blocks, p), f"evictable_blocks({p!r})"))
            for p in self.sizes}
        pins = {}
        if hasattr(t, "pins"):
            for p in self.sizes:
                raw = self._read(f"pins({p!r})", lambda p=p: dict(t.pins(p)))
                pins[p] = {str(k): self._blocks(v, f"pins({p!r})[{k!r:.20}]")
                           for k, v in raw.items()}
        s = T.TierState(self.bs, dict(self.sizes), refs, free, tables, where, lengths, jobs,
                        pins, cache, evictable, mapped=self._mapped(tables),
                        windows=self._windows(tables, where),
                        window_groups=1 if hasattr(t, "window") else 0,
                        num_free_reported=self._num_free())
        return s

    def _num_free(self) -> dict:
        """The target's own count of each pool's free blocks (optional ``num_free(pool)``;
        None: it keeps none there), checked against its free list (``num_free_agrees``)."""
        if not hasattr(self.target, "num_free"):
            return {}
        out = {}
        for p in self.sizes:
            n = self._read(f"num_free({p!r})", self.target.num_free, p)
            out[p] = None if n is None else as_int(n, f"num_free({p!r})")
        return out

    def _windows(self, tables: dict, where: dict) -> dict:
        """``window(q)`` of each request with a table, where the target has a
        sliding-window group sharing the request's pool: ``(pool, [block, or None behind
        the window])`` (None reads as ``NULL``)."""
        if not hasattr(self.target, "window"):
            return {}
        out = {}
        for q in tables:
            got = self._read(f"window({q})", self.target.window, q)
            try:
                pool, raw = got
            except (TypeError, ValueError):
                raise ObservationError(f"window({q}) is {got!r:.60}, expected (pool, blocks)") \
                    from None
            if pool != where[q]:
                raise ObservationError(f"window({q}) names pool {pool!r:.30}, not the pool of "
                                       f"the request's table ({where[q]})")
            out[q] = tuple(T.NULL if b is None else as_int(b, f"an entry of window({q})")
                           for b in self._read(f"window({q})", list, raw))
        return out

    def _mapped(self, tables: dict) -> dict:
        """``mapped(q)`` of each request with a table: ``{pool: [block, or None where
        released]}``, for the pools behind a mapping (None reads as ``NULL``)."""
        out: dict = {p: {} for p in self.mapped_pools}
        if not self.mapped_pools:
            return out
        for q in tables:
            raw = self._read(f"mapped({q})", lambda q=q: dict(self.target.mapped(q)))
            for p, blocks in raw.items():
                if p not in out:
                    raise ObservationError(f"mapped({q}) names pool {p!r:.30}, not one behind "
                                           f"a mapping ({', '.join(self.mapped_pools)})")
                out[p][q] = tuple(T.NULL if b is None else as_int(b, f"an entry of mapped({q})")
                                  for b in self._read(f"mapped({q})", list, blocks))
        return out

    # -- checks ---------------------------------------------------------------------------
    def _invariants(self, n: int, s: T.TierState) -> Violation | None:
        for p in s.pools():
            view = s.pool_view(p)
            for inv in INVARIANTS:
                if inv.domain == "global":
                    elements = (None,)
                else:
                    elements = view.blocks() if inv.domain == "block" else view.seqs()
                for x in elements:
                    if not inv.holds_for(PY, view, x):
                        element = x
                        subject = "block" if inv.domain == "block" else None
                        if inv.domain == "seq":
                            element, subject = view.names[x][1], "seq"
                        return Violation(n, "invariant", f"{p}: {inv.name}", element,
                                         witness=self._words(s, p, element, subject),
                                         doc=inv.doc, details={"pool": p}, subject=subject)
            for name, fn in T.TIER_BLOCK_INVARIANTS:
                for b in range(s.num_blocks(p)):
                    if not fn(PY, s, p, b):
                        return Violation(n, "data" if name in DATA else "invariant",
                                         f"{p}: {name}", b, witness=self._words(s, p, b, "block"),
                                         doc=T.invariant_doc(name), details={"pool": p},
                                         subject="block")
        for name, fn in T.TIER_SEQ_INVARIANTS:
            for q in s.seqs():
                if not fn(PY, s, q):
                    return Violation(n, "data" if name in DATA else "invariant", name, q,
                                     witness=self._words(s, s.pool_of(q), q, "seq"),
                                     doc=T.invariant_doc(name), subject="seq")
        for name, fn in T.TIER_GLOBAL_INVARIANTS:
            if not fn(PY, s):
                return Violation(n, "invariant", name, witness=self._pools_words(s),
                                 doc=T.invariant_doc(name))
        return None

    def _data_level(self, n: int, s: T.TierState) -> Violation | None:
        """A data target's K/V, read back: every block holds the K/V of its tokens."""
        if self.data is None:
            return None
        try:
            found = self.data.check(s, self.prefixes.__getitem__)
        except CONTROL:
            raise
        except ValueError as exc:
            return Violation(n, "malformed", "block_data", witness=str(exc))
        except BaseException as exc:  # noqa: BLE001 - the target's fault, reported
            return Violation(n, "malformed", "block_data", witness=f"block_data "
                             f"{what_it_did(exc)}")
        if found is None:
            return None
        p, b, witness = found
        return Violation(n, "data", T.DATA_READ_BACK, b, witness=witness,
                         doc=T.DATA_READ_BACK_DOC, details={"pool": p}, subject="block")

    def _clauses(self, n: int, op, fn, pre, post) -> Violation | None:
        for name, element, holds in fn(PY, pre, post, op):
            if holds:
                continue
            pool, x = element if isinstance(element, tuple) else (None, element)
            subject = "block" if pool is not None else ("seq" if x is not None else None)
            if op.kind == "complete" and pool is None:
                subject = None
            before = self._words(pre, pool, x, subject)
            after = self._words(post, pool, x, subject)
            witness = f"after {self._describe(op)}: before, {before}; after, {after}"
            return Violation(n, "contract", name, x, witness=witness,
                             doc=" ".join((fn.__doc__ or "").split()),
                             details={"pool": pool} if pool else {}, subject=subject)
        return None

    # -- words ----------------------------------------------------------------------------
    def _describe(self, op) -> str:
        from kvcheck.models.tiers.model import MODEL

        return MODEL.describe(op)

    def _holders_words(self, s, p, b) -> str:
        names = []
        for (kind, who), refs in s.holders(p).items():
            k = refs.count(b)
            if k:
                label = (f"seq {who}" if kind == "seq" else f"seq {who}'s mapping"
                         if kind == "mapped" else f"job {who[0]}.{who[1]}"
                         if kind == "job" else "the cache" if kind == "cache"
                         else f"seq {who}'s window" if kind == "window" else f"pin {who!r}")
                names.append(label + (f" x{k}" if k > 1 else ""))
        return ", ".join(names) or "no holder"

    def _words(self, s, p, x, subject) -> str:
        if s is None:
            return "(not observed)"
        if subject == "block" and p is not None and x is not None:
            keys = [k for k, b in s.keys(p).items() if b == x]
            pending = " (a pending transfer writes it)" if x in s.pending_dst(p) else ""
            return (f"{p} block {x}: refcount {s.ref(p, x)}, on the free list "
                    f"{s.free_count(p, x)} time(s), held by {self._holders_words(s, p, x)}"
                    + (f", findable under {len(keys)} key(s)" if keys else "")
                    + (", evictable" if x in s.evictable(p) else "") + pending)
        if subject == "seq" and x is not None:
            if not s.live(x):
                return f"seq {x} holds nothing"
            return (f"seq {x}: {s.length(x)} tokens in {s.pool_of(x)} blocks "
                    f"{list(s.table(x))}")
        return self._pools_words(s)

    def _pools_words(self, s) -> str:
        parts = []
        for p in s.pools():
            held = [b for b in range(s.num_blocks(p)) if s.ref(p, b)]
            parts.append(f"{p}: {sum(s.free[p].values())} on the free list, held {held}")
        return "; ".join(parts) + f"; {len(s.jobs)} job(s) pending, {len(s.tables)} request(s)"
