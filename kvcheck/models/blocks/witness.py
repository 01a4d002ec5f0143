"""Plain-English witnesses: the concrete numbers behind a violation, from its evidence.

Reporting is kept apart from checking: the oracle decides *that* a rule broke
(using only ``kvcheck.spec``) and gathers its evidence (``kvcheck.check.evidence``:
the element, what kind of thing it is, the terms the clause read). These functions
say *how*, in one or two sentences, with both sides of the disagreement (a refcount
and the number of table entries naming the block; what an append did to a shared
tail). They go by what the evidence is about (a block, a sequence, the whole state),
by the operation and by the terms read, never by a clause's name: a clause added or
renamed in the spec is explained by the same sentences.
"""

from __future__ import annotations

import re

from kvcheck.spec import contracts
from kvcheck.spec.contracts import OOB
from kvcheck.spec.logic import PY
from kvcheck.spec.state import NULL

_SENTENCES = re.compile(r"(?<=[.)])\s+(?=[A-Z])")


def rule_for(doc: str, op) -> str:
    """A contract's wording as it applies to the target that ran ``op``: its sentences about
    a cyclic window only where the target declares one (``op.cycle``, stamped by the oracle
    on every operation of such a target); the spec's text itself is unchanged."""
    text = " ".join((doc or "").split())
    if getattr(op, "cycle", 0):
        return text
    return " ".join(s for s in _SENTENCES.split(text) if "cyclic window" not in s)


def _holders(s, b: int) -> list[str]:
    out = []
    for q in sorted(s.seqs()):  # (in one order whichever state: fast and full agree)
        for i in s.positions(q):
            if s.table(q, i) == b:
                out.append(f"sequence {q} (position {i})")
    return out


def _holder_seqs(s, b: int) -> list[int]:
    return [q for q in s.seqs() if any(s.table(q, i) == b for i in s.positions(q))]


def _shown(table) -> str:
    """A table's entries, the null placeholder written ``null``."""
    return "[" + ", ".join("null" if b == NULL else str(b) for b in table) + "]"


def _table(s, q: int) -> str:
    return "(none)" if not s.live(q) else _shown([s.table(q, i) for i in s.positions(q)])


def _entries(n: int) -> str:
    return f"{n} table entr{'y' if n == 1 else 'ies'}"


def _seqs(qs) -> str:
    qs = list(qs)
    if not qs:
        return "no sequence"
    if len(qs) == 1:
        return f"sequence {qs[0]}"
    return "sequences " + ", ".join(map(str, qs[:-1])) + f" and {qs[-1]}"


def _read(ev, method: str) -> bool:
    """Whether the evidence's terms include one of vocabulary ``method``."""
    return any(t["term"].startswith(method + "(") for t in ev.terms)


def _aliasing(s, q: int) -> str:
    ids = getattr(s, "identities", None) or {}
    if not ids and hasattr(s, "_idents"):  # the fast mode's post-state view
        ids = {r: s.ident(r) for r in s.tables}
    mine = ids.get(q)
    others = [r for r in s.seqs() if r != q and mine is not None and ids.get(r) == mine]
    who = _seqs(others) if others else f"{s.sharers(q) - 1} other live sequence(s)"
    return (f"sequence {q}'s block table is the same list object as that of {who}, so "
            f"growing or copying one table silently rewrites the other")


def _seq_story(s, q: int) -> str:
    B, n, k = s.block_size, s.length(q), s.nblocks(q)
    text = (f"sequence {q} holds {n} tokens in {k} block(s) of {B} slots: {_table(s, q)} "
            f"(ceil({n}/{B}) = {-(-n // B)} needed")
    if k:
        text += f", {k * B - n} slots unused, at most {B - 1} may be"
    bad = [s.table(q, i) for i in s.positions(q) if not 0 <= s.table(q, i) < s.num_blocks]
    if bad:
        text += f"; ids outside 0..{s.num_blocks - 1}: {bad}"
    if s.impl_length(q) != n:
        text += f"; the allocator counts {s.impl_length(q)} tokens for it"
    return text + ")"


def for_state(ev, s) -> str:
    """A state invariant's witness: what its element looks like in state ``s``."""
    x = ev.element
    if ev.subject == "block":
        who = _holders(s, x)
        text = (f"block {x} has refcount {s.ref(x)} but {_entries(s.holders(x))} reference it"
                f" (held by: {', '.join(who) if who else 'none'})")
        if _read(ev, "free_count"):
            text += (f"; it is on the free list {s.free_count(x)} time(s), and must be there "
                     f"once iff its refcount is 0")
        return text
    if ev.subject == "seq":
        if _read(ev, "sharers"):
            return _aliasing(s, x)
        return _seq_story(s, x)
    # a whole-state rule: say what it compared, by the terms it read
    if _read(ev, "free_entries") and _read(ev, "num_free"):
        return (f"the allocator counts {s.num_free()} free blocks (its num_free), but its free "
                f"list holds {s.free_entries()} entries")
    if _read(ev, "free_count"):
        distinct = sum(1 for b in s.blocks() if s.free_count(b) >= 1)
        entries = s.free_entries() if hasattr(s, "free_entries") else s.num_free()
        return f"the free list has {entries} entries, of which only {distinct} distinct pool blocks"
    if _read(ev, "zero_refs"):
        return (f"the allocator counts {s.num_free()} free blocks but {s.zero_refs()} blocks have "
                f"refcount 0")
    return "; ".join(f"{t['term']} = {t.get('state')}" for t in ev.terms) or "the whole state"


def _behind(before: dict, q: int, window: int, block_size: int) -> str:
    """`` (blocks [..])``: the entries of ``q``'s table (in a trace's state) behind the window."""
    n = before.get("lens", {}).get(str(q))
    table = before.get("tables", {}).get(str(q))
    if n is None or table is None:
        return ""
    skip = max(0, n - window) // block_size
    return f" (positions 0..{skip - 1}: {_shown(table[:skip])})" if skip else " (none are)"


def describe_op(op) -> str:
    """An operation and its outcome, in words."""
    kind = op.kind
    if kind == "allocate":
        head = f"allocate(seq={op.seq}, n_tokens={op.n_tokens})"
    elif kind in ("append_slot", "free_seq", "preempt"):
        head = f"{kind}(seq={op.seq})"
    elif kind == "fork":
        head = f"fork(parent={op.seq}, child={op.child})"
    elif kind == "append_slots":
        head = f"append_slots(seq={op.seq}, n_tokens={op.n_tokens}, lookahead={op.lookahead})"
    elif kind == "rollback":
        head = f"rollback(seq={op.seq}, n_tokens={op.n_tokens})"
    elif kind == "rebase":
        head = f"rebase(source={op.seq}, child={op.child})"
    elif kind == "drop_behind_window":
        head = f"drop_behind_window(seq={op.seq}, window={op.n_tokens})"
    else:
        head = f"{kind}(seq={op.seq})"
    if op.outcome == "oob":
        return f"{head} -> OutOfBlocks"
    if op.outcome == "refused":
        return f"{head} -> refused"
    if kind == "append_slot" and op.block is not None:
        return f"{head} -> (block={op.block}, offset={op.offset}, cow_src={op.cow_src})"
    if op.copies:
        return f"{head} -> copies {[list(c) for c in op.copies]}"
    return head


def _block_story(b: int, pre, post) -> str:
    """Block ``b`` before and after: its refcount against the table entries naming it."""
    held = ", ".join(h.replace(" (position ", " at position ").replace(")", "")
                     for h in _holders(post, b)) or "no table"
    r0, r1, h0, h1 = pre.ref(b), post.ref(b), pre.holders(b), post.holders(b)
    ref = f"stayed {r1}" if r0 == r1 else f"went {r0} -> {r1}"
    ent = f"stayed {h1}" if h0 == h1 else f"went {h0} -> {h1}"
    text = (f"block {b}'s refcount {ref} while the table entries naming it {ent} "
            f"(after the step: {held})")
    f0, f1 = pre.free_count(b), post.free_count(b)
    if f0 != f1 or f1:
        text += f"; it is on the free list {f1} time(s) (before: {f0})"
    return text


def _changed_blocks(pre, post) -> list[int]:
    try:
        blocks = post.blocks()
    except Exception:  # noqa: BLE001 - a partial view may not list every block
        return []
    return [b for b in blocks
            if pre.ref(b) != post.ref(b) or pre.free_count(b) != post.free_count(b)
            or pre.holders(b) != post.holders(b)]


def _slot_block(pre, q: int):
    """The block holding slot number len of ``q`` (its next token: position len // B of its
    table), or None past the table's end (the last block full, nothing reserved)."""
    p = contracts.slot_position(PY, pre, q)
    return pre.table(q, p) if p < pre.nblocks(q) else None


def _tail_words(pre, q: int) -> str:
    """The block sequence ``q``'s next token goes to, before an append, in words: its last
    block, or one it holds reserved (a lookahead's, a rollback's)."""
    B, n = pre.block_size, pre.length(q)
    b = _slot_block(pre, q)
    if b is None:
        b, state = pre.tail(q), f"full ({B} of {B} slots used), nothing reserved after it,"
        where = f"sequence {q}'s last block {b}"
    else:
        used, p = n % B, contracts.slot_position(PY, pre, q)
        where = (f"sequence {q}'s last block {b}" if p == pre.nblocks(q) - 1 else
                 f"sequence {q}'s block {b} (position {p}, where token #{n} goes)")
        state = (f"reserved (0 of {B} slots used)" if used == 0 else
                 f"partial ({used} of {B} slots used)"
                 + (", with reserved blocks after it," if p < pre.nblocks(q) - 1 else ""))
    others = [r for r in _holder_seqs(pre, b) if r != q]
    share = (f"shared with {_seqs(others)} (refcount {pre.ref(b)})" if pre.ref(b) > 1
             else f"held by sequence {q} alone (refcount {pre.ref(b)})")
    return f"{where} was {state} and {share}"


def _append_did(op, pre, post) -> str:
    """What a successful append did, in words."""
    q, at = op.seq, _slot_block(pre, op.seq)
    if op.cow_src is not None:
        return (f"it copied block {op.cow_src} into block {op.block} (cow_src={op.cow_src}) and "
                f"wrote slot {op.offset} there: sequence {q}'s table went {_table(pre, q)} -> "
                f"{_table(post, q)} and the free list {pre.num_free()} -> {post.num_free()}")
    if at is not None and op.block == at:
        others = [r for r in _holder_seqs(post, at) if r != q]
        where = f", where {_seqs(others)} can still read it" if others else ""
        return f"it wrote slot {op.offset} of block {at} in place (cow_src=None){where}"
    return (f"it returned block {op.block}, offset {op.offset}: sequence {q}'s table went "
            f"{_table(pre, q)} -> {_table(post, q)}")


def for_step(ev, pre, post, op) -> str:
    """An operation's witness: what the broken clause's element looked like before and
    after ``op``, and what ``op`` did (under a cyclic window, also how the spec reads the
    call: ``_cyclic``)."""
    text = _for_step(ev, pre, post, op)
    note = _cyclic(pre, post, op)
    return f"{text}; {note}" if note else text


def _cyclic(pre, post, op) -> str:
    """How the spec reads ``op`` under the target's cyclic window (empty: as ever)."""
    if not getattr(op, "cycle", 0) or op.outcome == OOB:
        return ""
    W, q = op.cycle, op.seq
    if op.kind == "allocate":
        need = -(-op.n_tokens // pre.block_size)
        if need <= W:
            return ""
        return (f"under the cyclic window of {W} block(s) a prompt of {need} blocks takes "
                f"{W} free blocks for its last {W} positions, the {need - W} before them null")
    if op.kind != "append_slot":
        return ""
    skip = contracts.cyclic_skip(PY, pre, op)
    if not skip:
        return ""
    j = skip - 1
    old = pre.table(q, j)
    text = (f"under the cyclic window of {W} block(s) this append past it is the drop of "
            f"position {j} (block {old}, refcount {pre.ref(old)}: "
            f"{'released, free again' if pre.ref(old) == 1 else 'another table keeps it'}) "
            f"then an append at a block boundary, which takes a block free by then")
    b = op.block
    if b is not None and b != old and pre.ref(b) > 0:
        others = [h for h in _holders(pre, b) if not h.startswith(f"sequence {q} ")]
        text += f"; block {b} was not free: {', '.join(others) or 'a table'} held it"
    return text


def _for_step(ev, pre, post, op) -> str:
    head = describe_op(op)
    x = ev.element
    if op.outcome == OOB:
        lead = f"{head} failed, so it must leave everything unchanged, but '{ev.name}' broke: "
    else:
        lead = f"{head} broke '{ev.name}': "
    if ev.subject == "block":
        if op.kind == "append_slot" and op.outcome != OOB and x == op.block:
            others = [h for h in _holders(post, x) if not h.startswith(f"sequence {op.seq} ")]
            return (f"{lead}sequence {op.seq} writes slot {op.offset} of block {x}, which "
                    f"{', '.join(others) or 'another table'} can still read (block {x} has "
                    f"{_entries(post.holders(x))}, refcount {post.ref(x)})")
        return lead + _block_story(x, pre, post)
    if ev.subject == "seq":
        if _read(ev, "sharers") and post.sharers(x) != 1:
            return lead + _aliasing(post, x)
        if op.kind == "append_slot" and op.outcome != OOB and x == op.seq:
            return f"{lead}{_tail_words(pre, x)}; {_append_did(op, pre, post)}"
        text = (f"sequence {x}'s table {_table(pre, x)} -> {_table(post, x)}, length "
                f"{pre.length(x)} -> {post.length(x)}")
        seqs = (op.seq, op.child) if op.kind == "fork" else (op.seq,)
        for r in seqs:
            if r != x:
                text += f"; sequence {r}'s table {_table(pre, r)} -> {_table(post, r)}"
        if op.kind == "allocate":
            need = -(-op.n_tokens // pre.block_size)
            text += f"; it needs ceil({op.n_tokens}/{pre.block_size}) = {need} block(s)"
        return lead + text
    detail = f"the free list went {pre.num_free()} -> {post.num_free()} entries"
    if op.kind == "allocate":
        need = -(-op.n_tokens // pre.block_size)
        detail += f"; it needs ceil({op.n_tokens}/{pre.block_size}) = {need} block(s)"
    changed = _changed_blocks(pre, post)
    if changed:
        detail += "; " + "; ".join(_block_story(b, pre, post) for b in changed[:3])
    return lead + detail


def for_data(q, pos, block, B, read, want, shadow, tables) -> str:
    where = "a slot no table names" if block is None else f"slot {pos % B} of block {block}"
    got = "nothing ever written" if read is None else f"token t{read}"
    owner = shadow.owner(read) if read is not None else None
    if owner is not None and owner != q:
        got += f" (written by sequence {owner})"
    return (f"sequence {q} reads its token #{pos} from {where} and finds {got} "
            f"instead of its own token t{want}")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def state_line(state: dict) -> str:
    """One observed state, in one line."""
    tables = state.get("tables", {})
    lens = state.get("lens", {})
    refs = state.get("refs", [])
    seqs = "; ".join(f"seq {q}: {_plural(lens[q], 'token') if q in lens else '? tokens'} in "
                     f"{_shown(t)}"
                     for q, t in tables.items())
    shared = ", ".join(f"block {b}={r}" for b, r in enumerate(refs) if r > 1)
    free = state.get("free", [])
    shown = str(free)
    if len(free) > 32:
        shown = f"[{', '.join(map(str, free[:32]))}, ...] ({len(free)} entries)"
    parts = [seqs or "no sequences", f"free {shown}"]
    if shared:
        parts.append(f"shared: {shared}")
    return " | ".join(parts)


def narrate(op, before: dict | None, after: dict | None, block_size: int) -> str:
    """What one operation did, in words, from the states around it (either may be missing)."""
    q = op.seq
    free0 = set(before.get("free", [])) if before is not None else None
    free1 = set(after.get("free", [])) if after is not None else None
    table1 = (after or {}).get("tables", {}).get(str(op.child if op.kind == "fork" else q))
    if table1 is not None:
        table1 = _shown(table1)
    if op.outcome == "refused":
        return "refused by the target's own policy; nothing may change"
    if op.kind == "append_slots":
        grown = f" in {table1}" if table1 is not None else ""
        if op.outcome == "oob":
            return "out of blocks; nothing may change"
        copies = f", after copying {[list(c) for c in op.copies]}" if op.copies else ""
        return (f"sequence {q} is given {_plural(op.n_tokens, 'more token')} and reserves "
                f"{_plural(op.lookahead, 'slot')} beyond them{grown}{copies}")
    if op.kind == "rollback":
        return f"sequence {q} drops its last {_plural(op.n_tokens, 'token')}" + (
            f"; its table is {table1}" if table1 is not None else "")
    if op.kind == "rebase":
        t2 = (after or {}).get("tables", {}).get(str(op.child))
        if op.outcome == "oob":
            return "out of blocks; nothing may change"
        return (f"sequence {op.child} drops its blocks and continues sequence {q}'s history"
                + (f", sharing blocks {_shown(t2)}" if t2 is not None else ""))
    if op.kind == "preempt":
        return f"sequence {q} is preempted for recompute; its blocks are released"
    if op.kind == "drop_behind_window":
        behind = "" if before is None else _behind(before, q, op.n_tokens, block_size)
        return (f"sequence {q}'s attention reads only its last {_plural(op.n_tokens, 'token')}: "
                f"the blocks wholly behind them are released and become null{behind}"
                + (f"; its table is {table1}" if table1 is not None else ""))
    if op.outcome == "oob":
        if op.kind == "allocate":
            need = -(-op.n_tokens // block_size)
            have = f", {len(before.get('free', []))} free" if before is not None else ""
            return (f"out of blocks: {_plural(op.n_tokens, 'token')} need "
                    f"{_plural(need, 'block')}{have}; nothing may change")
        return "out of blocks; nothing may change"
    if op.kind == "allocate":
        where = f" in {table1}" if table1 is not None else ""
        return f"sequence {q} is given {_plural(op.n_tokens, 'token')}{where}"
    if op.kind == "fork":
        where = f", sharing blocks {table1}" if table1 is not None else ""
        copied = f" (copied at fork time: {[list(c) for c in op.copies]})" if op.copies else ""
        return f"sequence {op.child} starts as a copy of sequence {q}{where}{copied}"
    if op.kind == "free_seq":
        if free0 is not None and free1 is not None:
            back = sorted(free1 - free0)
            if back:
                return f"sequence {q} is freed; block(s) {back} return to the free list"
            return f"sequence {q} is freed; no block returns to the free list"
        return f"sequence {q} is freed"
    # append_slot
    if op.block is None:
        return f"sequence {q} asks for one more slot"
    n = None
    if before is not None and str(q) in before.get("lens", {}):
        n = before["lens"][str(q)]
    token = f"token #{n}" if n is not None else "its next token"
    text = f"sequence {q} puts {token} in slot {op.offset} of block {op.block}"
    if op.cow_src is not None:
        text += f", after copying block {op.cow_src} into it"
    elif op.offset == 0:
        t0 = (before or {}).get("tables", {}).get(str(q))
        t1 = (after or {}).get("tables", {}).get(str(q))
        # (a cyclic window's append past it: the block that left the window, now null there)
        left = [i for i, b in enumerate(t0 or ()) if b == op.block and t1 is not None
                and i < len(t1) and t1[i] in (None, NULL)]
        held = t0 is not None and op.block in t0 and not left  # a block it held reserved
        text += (f" (the block that left the window at position {left[0]}, reused in place)"
                 if left else " (a block it held reserved)" if held else " (a fresh block)")
    return text
