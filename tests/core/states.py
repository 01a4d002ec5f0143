"""Random concrete states, valid and corrupted, for spec tests."""

import random

from kvcheck.impl.block_manager import BlockManager
from kvcheck.spec.state import Snapshot


class _Obj:
    pass


def reachable(rng: random.Random, num_blocks: int, block_size: int, steps: int, max_tokens: int):
    """A state the reference reaches by random valid operations (seq ids 0..)."""
    bm = BlockManager(num_blocks, block_size)
    nxt = 0
    for _ in range(steps):
        live = list(bm.tables)
        r = rng.random()
        try:
            if not live or r < 0.3:
                if len(live) < 3:
                    bm.allocate(nxt, rng.randint(1, max_tokens // 2))
                    nxt += 1
            elif r < 0.6:
                q = rng.choice(live)
                if bm.lens[q] < max_tokens:
                    bm.append_slot(q)
            elif r < 0.8 and len(live) < 3:
                bm.fork(rng.choice(live), nxt)
                nxt += 1
            else:
                bm.free_seq(rng.choice(live))
        except Exception:  # noqa: BLE001 - OutOfBlocks: try something else
            pass
    idents = {q: _Obj() for q in bm.tables}
    return Snapshot(num_blocks, block_size, bm.tables, bm.lens, bm.ref, bm.free, dict(bm.lens), idents)


def corrupt(rng: random.Random, snap: Snapshot) -> Snapshot:
    """The same state with one thing broken."""
    tables = {q: list(t) for q, t in snap.tables.items()}
    lens = dict(snap.lengths)
    refs = list(snap.refs)
    free = list(snap.free.elements())
    idents = dict(snap.identities)
    n = snap.num_blocks
    kind = rng.randrange(9)
    impl_lens = dict(lens)
    if kind == 0:
        refs[rng.randrange(n)] += rng.choice((-1, 1))
    elif kind == 1 and free:
        free.remove(rng.choice(free))
    elif kind == 2:
        free.append(rng.randrange(n))
    elif kind == 3 and tables:
        q = rng.choice(list(tables))
        if tables[q]:
            tables[q][rng.randrange(len(tables[q]))] = rng.randrange(n)
    elif kind == 4 and lens:
        q = rng.choice(list(lens))
        lens[q] = max(1, lens[q] + rng.choice((-snap.block_size, -1, 1, snap.block_size)))
    elif kind == 5 and len(idents) >= 2:
        a, b = rng.sample(list(idents), 2)
        idents[a] = idents[b]
    elif kind == 6 and tables:
        q = rng.choice(list(tables))
        if tables[q]:
            tables[q].pop()
    elif kind == 7 and tables:
        q = rng.choice(list(tables))
        if tables[q]:
            tables[q][rng.randrange(len(tables[q]))] = rng.choice((-1, n, n + 3))
    elif kind == 8 and lens:
        q = rng.choice(list(lens))
        impl_lens[q] = lens[q] + 1
    elif kind == 8:  # no sequence: miscount the free list instead
        kind = 9
    if kind != 8:
        impl_lens = dict(lens)
    num_free = len(free) + rng.choice((-1, 1)) if kind == 9 else None  # a miscounted list
    return Snapshot(n, snap.block_size, tables, lens, refs, free, impl_lens, idents, num_free)
