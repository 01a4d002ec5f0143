"""Raw reproductions on SGLang 0.5.23: the allocator and radix-cache calls, no adapter.

As ``raw.py`` does for vLLM and nano-vllm: each ``replay_*`` takes operations

    ("allocate", seq, n_tokens[, token_ids]) | ("append_slot", seq[, token_id]) | ("free_seq", seq)

builds SGLang's own objects through the adapter modules' *loaders and stand-ins only*
(``sglang.load``, ``sglang_radix.load``; none of the ``*Target`` classes), makes the
SGLang calls inline, and returns per step what the call returned and SGLang's state read
from its own fields, in SGLang's ids (page 0 is its padding page): each request's
``req_to_token`` slots, its pages (``slot // page_size``), the allocator's free pages
(``get_all_free_pages``) and, with the tree, every node's pages, ``lock_ref`` and the
tree's ``evictable_size()``.
"""

from __future__ import annotations

import itertools
from typing import Any

from .raw import raised, record


def replay_sglang_allocator(ops: list[tuple], num_pages: int, page_size: int,
                            paged: bool) -> list[dict]:
    """``TokenToKVPoolAllocator`` (``paged=False``, page size 1) or
    ``PagedTokenToKVPoolAllocator`` over ``num_pages`` pages, driven as a scheduler
    without a tree: ``alloc`` / ``alloc_extend`` for a prefill, ``alloc`` / ``alloc_decode``
    for a decode token, ``free_segments([(row, 0)])`` at release."""
    import torch

    from . import sglang

    mods = sglang.allocators()
    size = num_pages * page_size
    if paged:
        alloc = mods.PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None,
                                                 False)
    else:
        alloc = mods.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
    rows: dict[int, Any] = {}

    def t(v):
        return torch.tensor(v, dtype=torch.int64)

    def state() -> dict:
        return {"slots": {s: r.tolist() for s, r in rows.items()},
                "pages": {s: [x // page_size for x in r.tolist()[::page_size]]
                          for s, r in rows.items()},
                "lens": {s: len(r) for s, r in rows.items()},
                "free_pages": alloc.get_all_free_pages().tolist(),
                "available_size": int(alloc.available_size()), "num_pages": num_pages}

    out = []
    for op in ops:
        try:
            if op[0] == "allocate":
                seq, n = op[1], op[2]
                if paged:
                    z, lens = t([0]), t([n])
                    got = alloc.alloc_extend(z, z.clone(), lens, lens.clone(), t([-1]), n)
                else:
                    got = alloc.alloc(n)
                if got is not None:
                    rows[seq] = got.clone()
                result = None if got is None else got.tolist()
            elif op[0] == "append_slot":
                row = rows[op[1]]
                if paged:
                    lens = t([len(row) + 1])
                    got = alloc.alloc_decode(lens, lens.clone(), row[-1:].clone())
                else:
                    got = alloc.alloc(1)
                if got is not None:
                    rows[op[1]] = torch.cat((row, got))
                result = None if got is None else got.tolist()
            elif op[0] == "free_seq":
                alloc.free_segments([(rows.pop(op[1]), 0)])
                result = None
            else:
                result = f"raised ValueError: SGLang has no {op[0]}"
        except Exception as exc:  # noqa: BLE001 - recorded, like raw.py
            result = raised(exc)
        out.append(record(op, result, state()))
    return out


def replay_sglang_radix(ops: list[tuple], num_pages: int, page_size: int) -> list[dict]:
    """``RadixCache`` over the allocator SGLang picks for ``page_size`` (token at 1, paged
    above), with a real ``ReqToTokenPool``, driven in the allocation paths' own order:
    match (limit ``n - 1``), lock, ``evict_from_tree_cache``, ``alloc`` / ``alloc_extend``,
    write the row, ``checkpoint``; decode: evict, ``alloc`` / ``alloc_decode``; release:
    ``checkpoint``, ``free_kv_row``, ``unlock``, ``ReqToTokenPool.free``. Token ids are the
    operations' own (or fresh ones)."""
    import torch

    from . import sglang, sglang_radix

    mods = sglang_radix.load()
    mem = sglang_radix.MEM
    allocators = mods[sglang.ALLOCATOR]
    size = num_pages * page_size
    if page_size > 1:
        alloc = allocators.PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu",
                                                       None, False)
    else:
        alloc = allocators.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
    pool = mods[f"{mem}.memory_pool"].ReqToTokenPool(num_pages + 1, size + page_size, "cpu",
                                                     False)
    tree = mods[f"{mem}.radix_cache"].RadixCache(mods[f"{mem}.cache_init_params"].CacheInitParams(
        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
        page_size=page_size))
    RadixKey = mods[f"{mem}.radix_cache"].RadixKey  # noqa: N806
    Match = mods[f"{mem}.base_prefix_cache"].MatchPrefixParams  # noqa: N806
    common = mods[f"{mem}.common"]
    fresh = itertools.count(1 << 20)
    reqs: dict[int, Any] = {}

    def t(v):
        return torch.tensor(v, dtype=torch.int64)

    def row(req):
        return pool.req_to_token[req.kv.req_pool_idx, : len(req)].to(torch.int64)

    def nodes():
        stack = list(tree.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def state() -> dict:
        tree_pages = {}
        for node in nodes():
            if node.value is not None:
                for p in node.value.tolist()[::page_size]:
                    tree_pages[p // page_size] = node.lock_ref
        return {"pages": {s: [x // page_size for x in row(r).tolist()[::page_size]]
                          for s, r in reqs.items()},
                "lens": {s: len(r) for s, r in reqs.items()},
                "tree_pages_lock_ref": dict(sorted(tree_pages.items())),
                "free_pages": alloc.get_all_free_pages().tolist(),
                "evictable_size": int(tree.evictable_size()),
                "available_size": int(alloc.available_size()), "num_pages": num_pages}

    out = []
    for op in ops:
        try:
            if op[0] == "allocate":
                seq, n = op[1], op[2]
                tokens = list(op[3]) if len(op) > 3 else [next(fresh) for _ in range(n)]
                req = sglang_radix.Req(tokens)  # the Req fields the tree reads (stand-in)
                req.kv.req_pool_idx = pool.alloc_rows(1)[0]
                m = tree.match_prefix(Match(key=RadixKey(req.full_untruncated_fill_ids, None,
                                                         limit=n - 1)))
                p = m.device_prefix_len
                req.last_node, req.kv.cache_protected_len = m.last_device_node, p
                prefix = tree.path_device_indices(req.last_node)[:p]
                req.lock = tree.lock(req.last_node)
                if page_size == 1:
                    common.evict_from_tree_cache(tree, n - p)
                    got = alloc.alloc(n - p)
                else:
                    common.evict_from_tree_cache(tree, n - p + page_size)
                    pl, sl = t([p]), t([n])
                    last = t([int(prefix[p - 1]) if p > 0 else -1])
                    got = alloc.alloc_extend(pl, pl.clone(), sl, sl.clone(), last, n - p)
                if got is None:
                    tree.unlock(req.lock)
                    pool.free(req)
                    result = "alloc returned None (after evict_from_tree_cache)"
                else:
                    pool.write((req.kv.req_pool_idx, slice(0, n)),
                               torch.cat((prefix.to(torch.int64), got)).to(torch.int32))
                    tree.checkpoint(req, up_to=n)
                    reqs[seq] = req
                    result = {"matched": p, "new_slots": got.tolist()}
            elif op[0] == "append_slot":
                req = reqs[op[1]]
                length = len(req)
                common.evict_from_tree_cache(tree, page_size)
                if page_size == 1:
                    got = alloc.alloc(1)
                else:
                    lens = t([length + 1])
                    got = alloc.alloc_decode(lens, lens.clone(), row(req)[-1:].clone())
                if got is None:
                    result = "alloc returned None (after evict_from_tree_cache)"
                else:
                    pool.write((req.kv.req_pool_idx, slice(length, length + 1)),
                               got.to(torch.int32))
                    req.output_ids.append(op[2] if len(op) > 2 else next(fresh))
                    result = got.tolist()
            elif op[0] == "free_seq":
                req = reqs.pop(op[1])
                tree.checkpoint(req, up_to=len(req))
                tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, len(req))])
                tree.unlock(req.lock)
                pool.free(req)
                result = None
            else:
                result = f"raised ValueError: SGLang has no {op[0]}"
        except Exception as exc:  # noqa: BLE001 - recorded, like raw.py
            result = raised(exc)
        out.append(record(op, result, state()))
    return out
