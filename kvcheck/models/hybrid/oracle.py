"""The hybrid-pool oracle: every block-manager invariant over the (request, group)
tables of one shared pool, the hybrid invariants and the per-operation clauses of
``kvcheck.spec.hybrid``, and exception safety, after every operation.

``HybridOracle`` speaks ``kvcheck.check.model.RunState``. It reads the whole target after
every step (one mode: ``fast`` and ``full`` give the same checks) into a
``spec.hybrid.HybridSnapshot`` whose sequences are ``request * G + group``.

Ghost contents. The oracle plays the engine: every block position an allocation did not
serve from the cache, and every decode token, is written in each group; per pool block it
remembers the group and the token prefix its content was computed under, and how many
slots hold it. A position an allocation claims as a hit (below the cached tokens it
reports for that group) counts as *served* only if its block held, before the call, a
full block of exactly the request's prefix in the same group (``served`` in the spec).
"""

from __future__ import annotations

from kvcheck.check import evidence
from kvcheck.check.copies import deep_copy
from kvcheck.check.violation import Violation
from kvcheck.check.watchdog import CONTROL, Interrupted, OperationTimeout, active_watchdog, guarded
from kvcheck.errors import what_it_did
from kvcheck.models.hybrid.model import OPS
from kvcheck.spec import hybrid as H
from kvcheck.spec.contracts import OK, OOB, Domain
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import PY
from kvcheck.spec.state import NULL, Snapshot
from kvcheck.targets.loading import TargetError
from kvcheck.targets.observe import ObservationError, as_int

REQUIRED = ("windows", "block_table", "refcount", "free_blocks", "num_free", "seq_len")


def build(factory, scope, options):
    """The hybrid target ``factory(num_blocks, block_size)`` builds (``TargetError``: none)."""
    where = f"num_blocks={scope.num_blocks}, block_size={scope.block_size}"
    try:
        with guarded(None):
            target = factory(scope.num_blocks, scope.block_size)
            missing = [m for m in REQUIRED if not hasattr(target, m)]
            if missing:
                raise TargetError(f"{type(target).__name__} is not a hybrid target: it has no "
                                  f"{missing[0]} (needs {', '.join(REQUIRED)})")
            windows = list(target.windows)
    except TargetError:
        raise
    except OperationTimeout as exc:
        raise TargetError(f"building the target with {where} {exc}") from None
    except Interrupted:
        raise
    except BaseException as exc:  # noqa: BLE001 - the factory refused: bad input
        raise TargetError(f"cannot build target with {where}: it {what_it_did(exc)}") from None
    if not windows or any(type(w) is not int or w < 0 for w in windows):
        raise TargetError(f"{type(target).__name__}.windows must list one window (an int >= 0, "
                          f"0 = full attention) per KV-cache group, got {windows!r:.60}")
    if 1 in windows:  # see docs/hybrid.md: the one shape the block-manager spec cannot state
        raise TargetError(f"{type(target).__name__}.windows has a sliding window of 1 token: a "
                          f"token attending to itself only may drop the block of the last "
                          f"token, which null_entries forbids; kvcheck checks windows of at "
                          f"least 2 tokens")
    if options.out_of_blocks is not None:
        target.is_out_of_blocks = lambda exc: isinstance(exc, options.out_of_blocks)
    return target


class HybridOracle:
    def __init__(self, target, scope, options):
        self.target = target
        self.nb, self.bs = scope.num_blocks, scope.block_size
        self.windows = tuple(target.windows)
        self.G = len(self.windows)
        self.capabilities = frozenset(getattr(target, "capabilities", OPS))
        self.steps = 0
        self.violation: Violation | None = None
        self.tokens: dict[int, list] = {}  # live request -> its tokens (the oracle's)
        self.content: dict[int, tuple] = {}  # block -> (group, prefix its content is under)
        self.filled: dict[int, int] = {}  # block -> slots holding that content
        self.post = None
        self.stats = {"allocate": 0, "hits": 0, "append_slot": 0, "append_tokens": 0,
                      "free_seq": 0, "dropped": 0,
                      "oob": 0, "oob_dropping": 0}
        try:
            with guarded(None):
                self.post = self._capture()
            self.violation = self._invariants(0, self.post)
        except ObservationError as exc:
            self.violation = Violation(0, "malformed", "observation", witness=str(exc))
        except OperationTimeout as exc:
            self.violation = Violation(0, "hang", "observation", witness=f"reading the pool {exc}")

    # -- RunState ----------------------------------------------------------------------
    def clone(self):
        return deep_copy(self)

    def live(self) -> list[int]:
        return list(self.tokens)

    def live_seqs(self) -> list[int]:
        """The live requests (what the Hypothesis state machine draws from)."""
        return list(self.tokens)

    def num_free(self) -> int:
        return self.post.num_free() if self.post is not None else 0

    def valid(self, op) -> bool:
        if op.kind not in OPS or op.kind not in self.capabilities:
            return False
        if type(op.seq) is not int or not 0 <= op.seq < 2**31 // max(self.G, 1):
            return False
        if op.kind == "allocate":
            return op.seq not in self.tokens and len(op.tokens) >= 1
        if op.kind == "append_tokens" and not op.tokens:
            return False
        return op.seq in self.tokens

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
        except OperationTimeout as exc:
            v = Violation(n, "hang", "observation", witness=f"reading the pool {exc}")
        self.violation = v
        return v

    def sweep(self, watchdog=None):
        return self.violation

    def observed_json(self) -> dict:
        s = self.post
        if s is None:
            return {"windows": list(self.windows), "tables": {}, "refs": [0] * self.nb, "free": []}
        tables: dict = {}
        for q, t in sorted(s.base.tables.items()):
            tables.setdefault(str(q // self.G), [[] for _ in range(self.G)])[q % self.G] = list(t)
        return {"windows": list(self.windows), "tables": tables,
                "lens": {str(r): len(t) for r, t in self.tokens.items()},
                "refs": list(s.base.refs), "free": list(s.base.free.elements()),
                "num_free": s.num_free()}

    # -- one step ------------------------------------------------------------------------
    def _seqs(self, r: int) -> list[int]:
        return [r * self.G + g for g in range(self.G)]

    def _step(self, op, n: int) -> Violation | None:
        pre = self.post
        kind, r = op.kind, op.seq
        try:
            if kind == "allocate":
                result = self.target.allocate(r, list(op.tokens))
            elif kind == "append_slot":
                result = self.target.append_slot(r, op.token)
            elif kind == "append_tokens":
                result = self.target.append_tokens(r, list(op.tokens))
            else:
                result = self.target.free_seq(r)
            op.outcome = OK
        except OperationTimeout as exc:
            return Violation(n, "hang", kind, witness=f"{kind} {exc}")
        except Interrupted:
            raise
        except BaseException as exc:  # noqa: BLE001 - the target's exception, judged here
            if not self._oob(exc):
                return Violation(n, "crash", kind, r, witness=f"{kind} {what_it_did(exc)}",
                                 subject="seq")
            op.outcome = OOB
            self.stats["oob"] += 1
            post = self._capture()
            self.post = post
            if self._drops(pre, post, r):  # the allowance: a drop before the failure
                self.stats["oob_dropping"] += 1
            seqs = set(pre.seqs()) | set(post.seqs()) | set(self._seqs(r))
            dom = Domain(list(range(self.nb)), sorted(seqs))
            return self._clauses(n, op, H.out_of_blocks, (pre, post, op, dom), pre, post,
                                 H.out_of_blocks.__doc__) or self._invariants(n, post)
        served: set = set()
        if kind == "allocate":
            cached = self._cached(result)
            if isinstance(cached, str):
                return Violation(n, "malformed", "allocate result", r, witness=cached,
                                 subject="seq")
            op.cached = cached
            self.tokens[r] = list(op.tokens)
        elif kind == "append_slot":
            self.tokens[r].append(op.token)
        elif kind == "append_tokens":
            self.tokens[r].extend(op.tokens)
        else:
            gone = self.tokens.pop(r)
        post = self._capture({r: gone} if kind == "free_seq" else None)
        if kind == "allocate":
            served = self._served(r, post, op.cached)
            post = H.HybridSnapshot(post.base, self.windows, served)
        self.post = post
        self._count(op, pre, post)
        v = self._clauses(n, op, H.CONTRACTS[kind], (pre, post, op, self._seqs(r)), pre, post,
                          H.CONTRACTS[kind].__doc__)
        if v is None:
            v = self._invariants(n, post)
        self._write(op, post)
        return v

    def _count(self, op, pre, post) -> None:
        st = self.stats
        st[op.kind] += 1
        if op.kind == "allocate" and any(op.cached):
            st["hits"] += 1
        if op.kind in ("append_slot", "append_tokens"):
            st["dropped"] += self._drops(pre, post, op.seq)

    def _drops(self, pre, post, r: int) -> int:
        """Entries of request ``r`` that were pool blocks before and are null after."""
        n = 0
        for q in self._seqs(r):
            old, new = pre.base.tables.get(q, ()), post.base.tables.get(q, ())
            n += sum(1 for i, b in enumerate(new) if b == NULL and i < len(old) and old[i] != NULL)
        return n

    def _oob(self, exc) -> bool:
        try:
            if bool(self.target.is_out_of_blocks(exc)):
                return True
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - a broken test: not out-of-blocks
            pass
        return type(exc).__name__ == "OutOfBlocks"

    def _cached(self, result):
        """allocate's result as cached tokens per group (one int: the same for all)."""
        if result is None:
            return [0] * self.G
        try:
            if isinstance(result, int) and not isinstance(result, bool):
                return [int(result)] * self.G
            vals = [as_int(x, "a cached-token count") for x in result]
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - not a list of counts
            return f"allocate returned {result!r:.60}, expected the cached tokens per group"
        if len(vals) != self.G:
            return f"allocate returned {len(vals)} cached-token counts for {self.G} groups"
        return vals

    def _served(self, r: int, post, cached) -> set:
        """(q, i) of the positions served from the cache with the right content."""
        toks, B = self.tokens[r], self.bs
        out = set()
        for g, c in enumerate(cached):
            q = r * self.G + g
            t = post.base.tables.get(q, ())
            for i in range(min(len(t), max(c, 0) // B)):
                b = t[i]
                if (b != NULL and self.content.get(b) == (g, tuple(toks[: (i + 1) * B]))
                        and self.filled.get(b) == B):
                    out.add((q, i))
        return out

    def _write(self, op, post) -> None:
        """The engine's writes after a successful step: the ghost contents."""
        if op.outcome != OK or op.kind == "free_seq":
            return
        r, B = op.seq, self.bs
        toks = self.tokens[r]
        for g in range(self.G):
            t = post.base.tables.get(r * self.G + g, ())
            if op.kind == "allocate":
                start = max(op.cached[g], 0) // B
                positions = range(start, len(t))
            else:
                first = len(toks) - (1 if op.kind == "append_slot" else len(op.tokens))
                positions = range(first // B, (len(toks) - 1) // B + 1)
            for i in positions:
                if i < len(t) and t[i] != NULL:
                    end = min(len(toks), (i + 1) * B)
                    self.content[t[i]] = (g, tuple(toks[:end]))
                    self.filled[t[i]] = end - i * B

    # -- observation -----------------------------------------------------------------------
    def _read(self, what: str, fn, *args):
        try:
            return fn(*args)
        except CONTROL:
            raise
        except BaseException as exc:  # noqa: BLE001 - the target's fault, reported
            raise ObservationError(f"{what} {what_it_did(exc)}") from None

    def _capture(self, also: dict | None = None) -> H.HybridSnapshot:
        """The target's state; ``also``: requests just freed (request -> its tokens), read
        too, so a table the free left behind is seen."""
        t = self.target
        tables, lengths, impl_lengths, idents = {}, {}, {}, {}
        for r, toks in {**self.tokens, **(also or {})}.items():
            for g in range(self.G):
                q = r * self.G + g
                try:
                    raw = t.block_table(r, g)
                except (KeyError, LookupError):
                    continue
                except CONTROL:
                    raise
                except BaseException as exc:  # noqa: BLE001 - reported
                    raise ObservationError(f"block_table({r}, {g}) {what_it_did(exc)}") from None
                if raw is None:
                    continue
                entries = self._read(f"block_table({r}, {g})", list, raw)
                tables[q] = tuple(NULL if b is None else as_int(b, f"an entry of block_table({r}, {g})")
                                  for b in entries)
                lengths[q] = len(toks)
                if r in self.tokens:
                    impl_lengths[q] = as_int(self._read(f"seq_len({r})", t.seq_len, r),
                                             f"seq_len({r})")
                ident = getattr(t, "table_identity", None)
                idents[q] = None if ident is None else id(self._read(
                    f"table_identity({r}, {g})", ident, r, g))
        refs = [as_int(self._read(f"refcount({b})", t.refcount, b), f"refcount({b})")
                for b in range(self.nb)]
        free = [NULL if b is None else as_int(b, "an entry of free_blocks()")
                for b in self._read("free_blocks()", lambda: list(t.free_blocks()))]
        num_free = as_int(self._read("num_free()", t.num_free), "num_free()")
        base = Snapshot(self.nb, self.bs, tables, lengths, refs, free, impl_lengths, idents,
                        num_free)
        return H.HybridSnapshot(base, self.windows)

    # -- checks ---------------------------------------------------------------------------
    def _invariants(self, n: int, s) -> Violation | None:
        for inv in (*INVARIANTS, *H.HYBRID_INVARIANTS):
            if inv.domain == "global":
                elements = (None,)
            else:
                elements = s.blocks() if inv.domain == "block" else s.seqs()
            for x in elements:
                if not inv.holds_for(PY, s, x):
                    ev = evidence.for_invariant(inv, PY, s, x)
                    return Violation(n, "invariant", inv.name, x, witness=self._witness(
                        ev.subject, x, s), doc=inv.doc, subject=ev.subject, terms=ev.terms)
        return None

    def _clauses(self, n: int, op, fn, args, pre, post, doc) -> Violation | None:
        for name, element, holds in fn(PY, *args):
            if holds:
                continue
            log: list = []
            rpre, rpost = evidence.Recorder(pre, "pre", log), evidence.Recorder(post, "post", log)
            rargs = tuple(rpre if a is pre else rpost if a is post else a for a in args)
            if fn is H.out_of_blocks:
                rargs = (*rargs[:3], evidence.tagged_domain(args[3]))
            else:
                rargs = (*rargs[:3], [evidence.tag("seq", q) for q in args[3]])
            try:
                ev = evidence.for_clauses(fn(PY, *rargs), {"pre": pre, "post": post}, log)
            except Exception:  # noqa: BLE001 - evidence helps; the violation stands without it
                ev = None
            subject = ev.subject if ev is not None else None
            return Violation(n, "contract", name, element, witness=self._step_witness(
                op, element, subject, pre, post), doc=" ".join((doc or "").split()),
                subject=subject, terms=ev.terms if ev is not None else [])
        return None

    # -- words ----------------------------------------------------------------------------
    def _who(self, q: int) -> str:
        g = q % self.G
        w = self.windows[g]
        kind = "full attention" if w == 0 else f"sliding window {w}"
        return f"request {q // self.G}, group {g} ({kind})"

    def _shown(self, t) -> str:
        return "[" + ", ".join("null" if b == NULL else str(b) for b in t) + "]"

    def _block_words(self, s, b: int) -> str:
        names = [f"{self._who(q)} position {i}" for q, t in sorted(s.base.tables.items())
                 for i, x in enumerate(t) if x == b]
        return (f"block {b}: refcount {s.ref(b)}, on the free list {s.free_count(b)} time(s), "
                f"named by {len(names)} table entr{'y' if len(names) == 1 else 'ies'}"
                f"{': ' + '; '.join(names) if names else ''}")

    def _seq_words(self, s, q: int) -> str:
        t = s.base.tables.get(q)
        if t is None:
            return f"{self._who(q)} has no table"
        return (f"{self._who(q)} holds {self._shown(t)} for {s.length(q)} tokens "
                f"(the target counts {s.impl_length(q)})")

    def _witness(self, subject, x, s) -> str:
        pool = (f"the pool: {s.num_free()} free by num_free(), {s.free_entries()} on the free list, "
                f"{s.zero_refs()} blocks with refcount 0")
        if subject == "block":
            return f"{self._block_words(s, x)}; {pool}"
        if subject == "seq":
            return self._seq_words(s, x)
        return pool

    def _step_witness(self, op, element, subject, pre, post) -> str:
        head = f"after {op.kind}(seq={op.seq}" + (
            f", {len(op.tokens)} tokens) reporting cached tokens per group {op.cached}"
            if op.kind == "allocate" and op.cached is not None else ")")
        if op.outcome == OOB:
            head = f"{op.kind}(seq={op.seq}) ran out of blocks but changed the state"
        if subject == "seq" and element is not None:
            return f"{head}: {self._seq_words(post, element)}"
        if subject == "block" and element is not None:
            return f"{head}: before, {self._block_words(pre, element)}; after, " \
                   f"{self._block_words(post, element)}"
        return head
