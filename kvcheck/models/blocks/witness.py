"""Plain-English witnesses: the concrete numbers behind a violation.

Reporting is kept apart from checking: the oracle decides *that* a rule broke
(using only ``kvcheck.spec``); these functions say *how*, in one or two
sentences, with both sides of the disagreement (e.g. a refcount and the
number of table entries that name the block).
"""

from __future__ import annotations

# Contract clauses whose element is a block id (the others name a sequence).
BLOCK_CLAUSES = frozenset({
    "isolation",
    "refcount unchanged",
    "free-list membership unchanged",
    "blocks handed out are distinct",
    "refcount +1 for each block handed out, others unchanged",
    "blocks handed out leave the free list, others stay",
    "refcounts change only as the operation says",
    "free list changes only as the operation says",
    "refcount +1 per parent entry, others unchanged",
    "free list unchanged",
    "refcount -1 per entry of the freed table",
    "a block joins the free list exactly when its refcount reaches 0",
})
OPS = ("allocate", "append_slot", "fork", "free_seq")


def clause_subject(name: str, element) -> str | None:
    """``"block"`` or ``"seq"``: what a clause's (or a violation's) element names."""
    if element is None:
        return None
    head, _, rest = name.partition(": ")
    base = rest if head in OPS and rest else name
    base = base.removeprefix("exception_safety: ")
    if base in BLOCK_CLAUSES or base.startswith("frame: untouched refcount"):
        return "block"
    return "seq"


def _holders(s, b: int) -> list[str]:
    out = []
    for q in s.seqs():
        for i in s.positions(q):
            if s.table(q, i) == b:
                out.append(f"sequence {q} (position {i})")
    return out


def _holder_seqs(s, b: int) -> list[int]:
    return [q for q in s.seqs() if any(s.table(q, i) == b for i in s.positions(q))]


def _table(s, q: int) -> str:
    return "no table" if not s.live(q) else str([s.table(q, i) for i in s.positions(q)])


def _entries(n: int) -> str:
    return f"{n} table entr{'y' if n == 1 else 'ies'}"


def _seqs(qs) -> str:
    qs = list(qs)
    if not qs:
        return "no sequence"
    if len(qs) == 1:
        return f"sequence {qs[0]}"
    return "sequences " + ", ".join(map(str, qs[:-1])) + f" and {qs[-1]}"


def for_invariant(name: str, x, s) -> str:
    B = s.block_size
    if name == "refcount_conservation":
        who = _holders(s, x)
        held = ", ".join(who) if who else "none"
        return (f"block {x} has refcount {s.ref(x)} but {_entries(s.holders(x))} reference it"
                f" (held by: {held})")
    if name == "free_list":
        return (f"block {x} has refcount {s.ref(x)} and is on the free list "
                f"{s.free_count(x)} time(s); it must be there once iff its refcount is 0")
    if name == "free_list_size":
        return (f"the allocator counts {s.num_free()} free blocks but {s.zero_refs()} blocks "
                f"have refcount 0")
    if name == "free_list_in_pool":
        return (f"the free list has {s.free_entries()} entries, of which only "
                f"{sum(1 for b in s.blocks() if s.free_count(b) >= 1)} distinct pool blocks")
    if name == "num_free_agrees":
        return (f"the allocator counts {s.num_free()} free blocks (its num_free), but its free "
                f"list holds {s.free_entries()} entries")
    if name == "table_length":
        n = s.length(x)
        need = -(-n // B)
        return (f"sequence {x} holds {n} tokens, so it needs ceil({n}/{B}) = {need} blocks, "
                f"but its table has {s.nblocks(x)}: {_table(s, x)}")
    if name == "waste_bound":
        n, k = s.length(x), s.nblocks(x)
        return (f"sequence {x} holds {n} tokens in {k} blocks of {B} slots ({_table(s, x)}), "
                f"leaving {k * B - n} slots unused; at most {B - 1} may be")
    if name == "length_agrees":
        return (f"the allocator counts {s.impl_length(x)} tokens for sequence {x}, "
                f"but it was given {s.length(x)}")
    if name == "no_aliasing":
        ids = getattr(s, "identities", {})
        mine = ids.get(x)
        others = [q for q in s.seqs() if q != x and mine is not None and ids.get(q) == mine]
        who = _seqs(others) if others else f"{s.sharers(x) - 1} other live sequence(s)"
        return (f"sequence {x}'s block table is the same list object as that of {who}, so "
                f"growing or copying one table silently rewrites the other")
    if name == "valid_block_ids":
        return f"sequence {x}'s table {_table(s, x)} names ids outside 0..{s.num_blocks - 1}"
    if name == "empty_start":
        return "a fresh allocator must start with every block free"
    return f"{name} fails at {x}"


def describe_op(op) -> str:
    """An operation and its outcome, in words."""
    if op.kind == "allocate":
        head = f"allocate(seq={op.seq}, n_tokens={op.n_tokens})"
    elif op.kind == "append_slot":
        head = f"append_slot(seq={op.seq})"
    elif op.kind == "fork":
        head = f"fork(parent={op.seq}, child={op.child})"
    else:
        head = f"free_seq(seq={op.seq})"
    if op.outcome == "oob":
        return f"{head} -> OutOfBlocks"
    if op.kind == "append_slot" and op.block is not None:
        return f"{head} -> (block={op.block}, offset={op.offset}, cow_src={op.cow_src})"
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


def _tail_words(pre, q: int) -> str:
    """Sequence ``q``'s last block before an append, in words."""
    B, n = pre.block_size, pre.length(q)
    tail = pre.tail(q)
    used = n - (pre.nblocks(q) - 1) * B if pre.nblocks(q) else 0
    full = "full" if n % B == 0 else "partial"
    others = [r for r in _holder_seqs(pre, tail) if r != q]
    share = (f"shared with {_seqs(others)} (refcount {pre.ref(tail)})" if pre.ref(tail) > 1
             else f"held by sequence {q} alone (refcount {pre.ref(tail)})")
    return f"sequence {q}'s last block {tail} was {full} ({used} of {B} slots used) and {share}"


def for_clause(name: str, element, pre, post, op) -> str:
    q = op.seq
    head = describe_op(op)
    base = name.removeprefix("exception_safety: ")
    if name == "isolation":
        b = op.block
        others = [h for h in _holders(post, b) if not h.startswith(f"sequence {q} ")]
        return (f"{head}: sequence {q} writes slot {op.offset} of block {b}, which "
                f"{', '.join(others) or 'another table'} can still read "
                f"(block {b} has {_entries(post.holders(b))}, refcount {post.ref(b)})")
    if op.kind == "append_slot" and op.outcome == "ok" and name == "a full block is never copied":
        return (f"{head}: {_tail_words(pre, q)}, so the new token needs just one fresh block; "
                f"instead append_slot copied block {op.cow_src} (cow_src={op.cow_src}): "
                f"sequence {q}'s table went {_table(pre, q)} -> {_table(post, q)} and the free "
                f"list {pre.num_free()} -> {post.num_free()}")
    if op.kind == "append_slot" and op.outcome == "ok" and name.startswith("a shared partial"):
        tail = pre.tail(q)
        others = [r for r in _holder_seqs(post, tail) if r != q]
        if op.block == tail and op.cow_src is None:
            did = (f"instead it wrote slot {op.offset} of block {tail} in place (cow_src=None), "
                   f"where {_seqs(others)} can still read it")
        else:
            did = (f"instead it returned block {op.block}, cow_src={op.cow_src}, and sequence "
                   f"{q}'s table went {_table(pre, q)} -> {_table(post, q)}")
        return (f"{head}: {_tail_words(pre, q)}, so it must be copied before slot "
                f"{pre.length(q) % pre.block_size} is written; {did}")
    if name.startswith("exception_safety:"):
        what = "must leave everything unchanged"
        if clause_subject(name, element) == "block":
            detail = _block_story(element, pre, post)
        elif element is not None:
            detail = (f"sequence {element}'s table {_table(pre, element)} -> "
                      f"{_table(post, element)}, length {pre.length(element)} -> "
                      f"{post.length(element)}")
        else:
            changed = _changed_blocks(pre, post)
            detail = f"the free list went {pre.num_free()} -> {post.num_free()} entries"
            if changed:
                detail += "; " + "; ".join(_block_story(b, pre, post) for b in changed[:3])
        return f"{head} failed, so it {what}, but '{base}' broke: {detail}"
    if clause_subject(name, element) == "block":
        b = element
        return f"{head} broke '{name}': {_block_story(b, pre, post)}"
    if name.endswith("its own object") and element is not None:
        ids = getattr(post, "identities", {})
        mine = ids.get(element)
        others = [r for r in post.seqs()
                  if r != element and mine is not None and ids.get(r) == mine]
        who = _seqs(others) if others else f"{post.sharers(element) - 1} other sequence(s)"
        return (f"{head}: sequence {element}'s table {_table(post, element)} is the same list "
                f"object as the table of {who}, so growing or copying one silently rewrites "
                f"the other")
    parts = [f"{head} broke '{name}'"]
    seqs = (q, op.child) if op.kind == "fork" else (q,)
    for s in seqs:
        parts.append(f"sequence {s} table before {_table(pre, s)} after {_table(post, s)}")
    if element is not None and element not in seqs:
        parts.append(f"sequence {element} table before {_table(pre, element)} after "
                     f"{_table(post, element)}")
    if op.kind == "append_slot" and op.outcome == "ok":
        parts.append(_tail_words(pre, q))
    if op.kind == "allocate":
        need = -(-op.n_tokens // pre.block_size)
        parts.append(f"it needs ceil({op.n_tokens}/{pre.block_size}) = {need} block(s)")
    parts.append(f"free list length {pre.num_free()} -> {post.num_free()}")
    if element is None:
        parts += [_block_story(b, pre, post) for b in _changed_blocks(pre, post)[:3]]
    return "; ".join(parts)


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
    seqs = "; ".join(f"seq {q}: {_plural(lens[q], 'token') if q in lens else '? tokens'} in {t}"
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
        return f"sequence {op.child} starts as a copy of sequence {q}{where}"
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
        text += " (a fresh block)"
    return text
