"""Plain-English witnesses: the concrete numbers behind a violation.

Reporting is kept apart from checking: the oracle decides *that* a rule broke
(using only ``kvcheck.spec``); these functions say *how*, in one sentence,
with both sides of the disagreement.
"""

from __future__ import annotations


def _holders(s, b: int) -> list[str]:
    out = []
    for q in s.seqs():
        for i in s.positions(q):
            if s.table(q, i) == b:
                out.append(f"sequence {q} (position {i})")
    return out


def _table(s, q: int) -> str:
    return "no table" if not s.live(q) else str([s.table(q, i) for i in s.positions(q)])


def for_invariant(name: str, x, s) -> str:
    B = s.block_size
    if name == "refcount_conservation":
        who = _holders(s, x)
        held = ", ".join(who) if who else "none"
        return (f"block {x} has refcount {s.ref(x)} but {s.holders(x)} table entries reference it"
                f" (held by: {held})")
    if name == "free_list":
        return (f"block {x} has refcount {s.ref(x)} and is on the free list "
                f"{s.free_count(x)} time(s); it must be there once iff its refcount is 0")
    if name == "free_list_size":
        return (f"the free list holds {s.num_free()} entries but {s.zero_refs()} blocks have "
                f"refcount 0")
    if name == "free_list_in_pool":
        return (f"the free list has {s.num_free()} entries, of which only "
                f"{sum(1 for b in s.blocks() if s.free_count(b) >= 1)} distinct pool blocks")
    if name == "table_length":
        n = s.length(x)
        need = -(-n // B)
        return (f"sequence {x} holds {n} tokens, so it needs ceil({n}/{B}) = {need} blocks, "
                f"but its table has {s.nblocks(x)}: {_table(s, x)}")
    if name == "length_agrees":
        return (f"the allocator counts {s.impl_length(x)} tokens for sequence {x}, "
                f"but it was given {s.length(x)}")
    if name == "no_aliasing":
        return (f"sequence {x}'s block table is the same object as that of "
                f"{s.sharers(x) - 1} other live sequence(s)")
    if name == "valid_block_ids":
        return f"sequence {x}'s table {_table(s, x)} names ids outside 0..{s.num_blocks - 1}"
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


def for_clause(name: str, element, pre, post, op) -> str:
    q = op.seq
    head = describe_op(op)
    if name == "isolation":
        b = op.block
        others = [h for h in _holders(post, b) if not h.startswith(f"sequence {q} ")]
        return (f"{head}: sequence {q} writes slot {op.offset} of block {b}, which "
                f"{', '.join(others) or 'another table'} can still read "
                f"(block {b} has {post.holders(b)} table entries, refcount {post.ref(b)})")
    parts = [f"{head} broke '{name}'"]
    seqs = (q, op.child) if op.kind == "fork" else (q,)
    for s in seqs:
        parts.append(f"sequence {s} table before {_table(pre, s)} after {_table(post, s)}")
    if element is not None and element not in seqs and isinstance(element, int):
        b = element
        parts.append(f"block {b}: refcount {pre.ref(b)} -> {post.ref(b)}, on free list "
                     f"{pre.free_count(b)} -> {post.free_count(b)} time(s)")
    if op.kind == "append_slot" and op.outcome == "ok":
        tail = pre.tail(q)
        parts.append(f"the last block before was {tail} with refcount {pre.ref(tail)}, "
                     f"{pre.length(q) % pre.block_size} of {pre.block_size} slots used")
    parts.append(f"free list length {pre.num_free()} -> {post.num_free()}")
    return "; ".join(parts)


def for_data(q, pos, block, B, read, want, shadow, tables) -> str:
    where = "a slot no table names" if block is None else f"slot {pos % B} of block {block}"
    got = "nothing ever written" if read is None else f"token t{read}"
    owner = shadow.owner(read) if read is not None else None
    if owner is not None and owner != q:
        got += f" (written by sequence {owner})"
    return (f"sequence {q} reads its token #{pos} from {where} and finds {got} "
            f"instead of its own token t{want}")
