"""Reference prefix-caching paged block manager.

Same seed API as ``block_manager.BlockManager`` (``allocate``, ``append_slot``,
``fork``, ``free_seq``; ``tables``, ``lens``, ``ref``, ``free``), extended:

``allocate(seq, n_tokens, token_ids=None)``
    Each *full* block of the prompt is named by a key that chains the block's
    tokens with its parent block's key, so a key names the whole prefix up to
    the end of its block. Admission walks the prompt's full blocks from the
    start and, while the key is cached, shares the cached block (refcount + 1;
    an evictable block leaves the LRU) instead of allocating. It stops at the
    first miss, and before the block holding the prompt's last token (that
    token is always computed: a prompt fully in the cache recomputes its last
    block into a fresh block); the remaining blocks are taken fresh. Returns
    the number of prompt tokens served from the cache (a multiple of
    ``block_size``, at most ``n_tokens - 1``).
    Without ``token_ids`` the manager invents fresh, distinct (negative) token
    ids, so nothing ever hits but caching and eviction still happen.
``append_slot(seq, token_id=None)``
    As in the plain manager (new block at a boundary, copy-on-write of a shared
    partial tail, in place otherwise). When the token completes its block, the
    block's key is registered.

Pool, three disjoint places (every block is in exactly one):

``free_list``   deque of blocks with refcount 0 and *no* key
``evictable``   ``OrderedDict`` block -> key, LRU order (oldest first): blocks
                with refcount 0 whose key is still in the cache
in use          refcount > 0 (keyed or not)

``cache`` maps key -> block and ``key_of`` block -> key; a key is registered
only for a full block whose tokens are written (at ``allocate`` for the
prompt's full blocks, at ``append_slot`` for the token that fills a block), so
partial blocks are never cached. If an identical prefix is already cached
under another block, the new block stays unkeyed (one block per key).

A fresh block comes from ``free_list`` first, else the least recently used
evictable block, whose key is removed from the cache *before* it is handed
out. Freeing a sequence releases its blocks tail first, so its deepest
blocks become the least recently used.

``free`` (the seed's free list, and what the structural oracle reads) is a
read-only view of ``free_list`` + ``evictable``: structurally an evictable
block *is* free (refcount 0, may be handed out), so the structural invariants
(``free_list``: on the free list exactly when refcount 0, once) hold
unchanged; ``kvcheck.spec.prefix`` then says how the two parts differ.

Every public method either succeeds or raises (``OutOfBlocks`` /
``MisuseError``) with every structure unchanged, LRU order included.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from .errors import MisuseError, OutOfBlocks
from .journaled import JournaledDeque, JournaledMap, JournaledOrderedDict

ROOT = b"kvcheck-prefix-root"
_OWN_READS: dict[type, bool] = {}  # class -> whether its whole cache reads are the reference's


def block_key(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """Key of a full block: BLAKE2b-128 of the parent's key and the block's tokens."""
    h = hashlib.blake2b(parent if parent is not None else ROOT, digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MisuseError(f"{name} must be a positive integer, got {value!r}")
    return value


class FreeView:
    """Read-only view: the plain free list followed by the evictable blocks."""

    def __init__(self, owner: PrefixCachingBlockManager):
        self._owner = owner

    def __len__(self) -> int:
        return len(self._owner.free_list) + len(self._owner.evictable)

    def __iter__(self) -> Iterator[int]:
        yield from self._owner.free_list
        yield from self._owner.evictable

    def __contains__(self, block: object) -> bool:
        return block in self._owner.evictable or block in self._owner.free_list

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"FreeView({list(self)})"


class PrefixCachingBlockManager:
    """Refcounted paged blocks with hash-chained prefix sharing and an evictable LRU."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = _check_size("num_blocks", num_blocks)
        self.block_size = _check_size("block_size", block_size)
        # (journaled containers: drop-in deque/OrderedDict/dict that index and journal
        # their own contents, for the prefix oracle's incremental observation)
        self.free_list: deque[int] = JournaledDeque(range(num_blocks))
        self.evictable: OrderedDict[int, bytes] = JournaledOrderedDict()
        self.free = FreeView(self)
        self.ref: list[int] = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.cache: dict[bytes, int] = JournaledMap()
        self.key_of: dict[int, bytes] = {}
        self.tokens: dict[int, list[int]] = {}
        self.keys: dict[int, list[bytes]] = {}  # seq -> key of each of its full blocks
        self._invented = itertools.count(-1, -1)

    # -- observation for the prefix oracle ----------------------------------------
    def prefix_key(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """The key this cache gives a full block of ``tokens`` whose parent block's key is
        ``parent`` (None: the first block): what each of its keys means, to the oracle."""
        return block_key(parent, tokens)

    def cache_entries(self) -> list[tuple[bytes, int]]:
        return list(self.cache.items())

    def evictable_blocks(self) -> list[int]:
        return list(self.evictable)

    def num_evictable(self) -> int:
        return len(self.evictable)

    # Incremental observation (optional: the oracle's fast mode), read from the
    # containers' own index and journal, so whatever code changed them is seen.
    # (the reported sizes, num_evictable and num_free_list, are read alike in both modes)
    _WHOLE_READS = ("cache_entries", "evictable_blocks", "free_list_blocks")

    def _journaled(self) -> bool:
        """Whether the block-by-block reads mean what the whole reads do: the containers
        are the journaled ones and the whole reads are this class's own (a subclass that
        reports its cache otherwise is read whole)."""
        cls = type(self)
        own = _OWN_READS.get(cls)
        if own is None:
            own = _OWN_READS[cls] = all(getattr(cls, m) is getattr(PrefixCachingBlockManager, m)
                                        for m in self._WHOLE_READS)
        return (own and type(self.free_list) is JournaledDeque
                and type(self.evictable) is JournaledOrderedDict and type(self.cache) is JournaledMap)

    def cache_changes(self) -> set[int] | None:
        """The blocks whose keys or list membership changed since the last call (None:
        not known, read everything)."""
        if not self._journaled():
            return None
        a, b, c = self.free_list.journal, self.evictable.journal, self.cache.journal
        if not (a or b or c):  # (nothing changed: the usual step)
            return set()
        out = a | b | c
        a.clear()
        b.clear()
        c.clear()
        return out

    def block_cache_state(self, block: int) -> tuple[tuple, int, int]:
        """(the keys naming ``block``, times on the free list, times on the evictable list)."""
        ks = self.cache.keys_of.get(block)
        return (tuple(ks) if ks else (), self.free_list.counts.get(block, 0),
                1 if block in self.evictable else 0)

    def cache_sizes(self) -> tuple[int, int, int]:
        """(cache entries, free-list length, evictable-list length), as held."""
        return len(self.cache), len(self.free_list), len(self.evictable)

    def free_list_blocks(self) -> list[int]:
        return list(self.free_list)

    def num_free_list(self) -> int:
        return len(self.free_list)

    # -- internal -----------------------------------------------------------------
    def _available(self) -> int:
        return len(self.free_list) + len(self.evictable)

    def _take(self) -> int:
        """A fresh block with refcount 1: unkeyed first, else evict the LRU block."""
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, key = self.evictable.popitem(last=False)
            self._uncache(block, key)
        assert self.ref[block] == 0, f"block {block} free with refcount {self.ref[block]}"
        self.ref[block] = 1
        return block

    def _uncache(self, block: int, key: bytes) -> None:
        del self.cache[key]
        del self.key_of[block]

    def _register(self, block: int, key: bytes) -> None:
        if key not in self.cache and block not in self.key_of:
            self.cache[key] = block
            self.key_of[block] = key

    def _share(self, block: int) -> None:
        """A cache hit: one more holder; an evictable block leaves the LRU."""
        if self.ref[block] == 0:
            del self.evictable[block]
        self.ref[block] += 1

    def _release(self, block: int) -> None:
        count = self.ref[block] - 1
        assert count >= 0, f"double free of block {block}"
        self.ref[block] = count
        if count == 0:
            key = self.key_of.get(block)
            if key is None:
                self.free_list.append(block)
            else:
                self.evictable[block] = key

    def _live(self, seq: int) -> list[int]:
        table = self.tables.get(seq)
        if table is None:
            raise MisuseError(f"unknown sequence {seq!r}")
        return table

    def _lookup_limit(self, n_tokens: int) -> int:
        """How many leading full blocks a prompt may take from the cache: those wholly
        within its first n - 1 tokens."""
        return (n_tokens - 1) // self.block_size

    def _prompt_keys(self, tokens: list[int]) -> list[bytes]:
        bs, keys, parent = self.block_size, [], None
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = block_key(parent, tokens[start : start + bs])
            keys.append(parent)
        return keys

    # -- operations -----------------------------------------------------------------
    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        """Give ``seq`` its ceil(n/B) blocks, sharing the longest cached prefix.

        All or nothing; returns the number of tokens served from the cache.
        """
        if seq in self.tables:
            raise MisuseError(f"sequence {seq!r} already exists")
        _check_size("n_tokens", n_tokens)
        if token_ids is None:
            tokens = [next(self._invented) for _ in range(n_tokens)]
        else:
            tokens = list(token_ids)
            if len(tokens) != n_tokens or not all(type(t) is int for t in tokens):
                raise MisuseError(f"token_ids must be {n_tokens} integers")
        keys = self._prompt_keys(tokens)
        hits: list[int] = []
        # Only blocks wholly within the first n - 1 tokens are looked up: the last token is
        # always computed (the engine needs its logits), so on a prompt fully in the cache
        # the last block is recomputed into a fresh block (vLLM v1's max_cache_hit_length).
        for key in keys[: self._lookup_limit(n_tokens)]:
            block = self.cache.get(key)
            if block is None:
                break
            hits.append(block)
        need = -(-n_tokens // self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.ref[b] == 0)
        if need > self._available() - revived:
            raise OutOfBlocks(f"need {need} fresh blocks, {self._available() - revived} free")
        for block in hits:
            self._share(block)
        table = hits + [self._take() for _ in range(need)]
        for i in range(len(hits), len(keys)):
            self._register(table[i], keys[i])
        self.tables[seq] = table
        self.lens[seq] = n_tokens
        self.tokens[seq] = tokens
        self.keys[seq] = keys
        return len(hits) * self.block_size

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        """Reserve the slot for one more token: ``(block, offset, cow_src)``."""
        table = self._live(seq)
        if token_id is not None and type(token_id) is not int:
            raise MisuseError(f"token_id must be an integer, got {token_id!r}")
        n = self.lens[seq]
        offset = n % self.block_size
        cow_src = None
        if offset == 0:
            if not self._available():
                raise OutOfBlocks("no free block for a new tail block")
            table.append(self._take())
        elif self.ref[table[-1]] > 1:
            if not self._available():
                raise OutOfBlocks("no free block for copy-on-write")
            new = self._take()
            cow_src = table[-1]
            self._release(cow_src)
            table[-1] = new
        tok = next(self._invented) if token_id is None else token_id
        tokens = self.tokens[seq]
        tokens.append(tok)
        self.lens[seq] = n + 1
        if offset == self.block_size - 1:  # this token fills the block: register its key
            keys = self.keys[seq]
            key = block_key(keys[-1] if keys else None, tokens[n + 1 - self.block_size :])
            keys.append(key)
            self._register(table[-1], key)
        return table[-1], offset, cow_src

    def fork(self, parent: int, child: int) -> None:
        """``child`` shares every block of ``parent`` (refcount +1 each), own table."""
        table = self._live(parent)
        if child in self.tables:
            raise MisuseError(f"sequence {child!r} already exists")
        for block in table:
            self.ref[block] += 1
        self.tables[child] = list(table)
        self.lens[child] = self.lens[parent]
        self.tokens[child] = list(self.tokens[parent])
        self.keys[child] = list(self.keys[parent])

    def free_seq(self, seq: int) -> None:
        """Drop ``seq``; its blocks lose one reference each, tail first."""
        table = self._live(seq)
        del self.tables[seq], self.lens[seq], self.tokens[seq], self.keys[seq]
        for block in reversed(table):
            self._release(block)


class CommittingPrefixCachingBlockManager(PrefixCachingBlockManager):
    """The reference with the write deferred to a commit: publish after write.

    ``allocate`` schedules the prompt: it hands out the blocks (hits shared at once)
    but publishes no key for the blocks it took for new content, whose KV the
    engine has not computed yet. ``commit(seq)`` says the engine wrote the prompt
    (its forward pass ran): only then are those blocks' keys registered. A
    sequence freed (or preempted) before its commit publishes nothing, so a block
    whose KV was never written is never findable (vLLM PR #43569). Decoding
    (``append_slot``) and ``fork`` come after the commit.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.pending: dict[int, list[tuple[int, bytes]]] = {}  # seq -> (block, key) to publish
        self._staging: list[tuple[int, bytes]] | None = None

    def _register(self, block: int, key: bytes) -> None:
        if self._staging is not None:
            self._staging.append((block, key))  # inside allocate: published at commit
        else:
            super()._register(block, key)

    def allocate(self, seq: int, n_tokens: int, token_ids: Sequence[int] | None = None) -> int:
        self._staging = staged = []
        try:
            got = super().allocate(seq, n_tokens, token_ids)
        finally:
            self._staging = None
        self.pending[seq] = staged
        return got

    def _uncommitted(self, seq: int) -> None:
        if seq in self.pending:
            raise MisuseError(f"sequence {seq!r} is not committed yet (its prompt is unwritten)")

    def commit(self, seq: int) -> None:
        """``seq``'s prompt KV is written: publish its new blocks' keys."""
        self._live(seq)
        staged = self.pending.pop(seq, None)
        if staged is None:
            raise MisuseError(f"sequence {seq!r} is already committed")
        for block, key in staged:
            self._register(block, key)

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        self._uncommitted(seq)
        return super().append_slot(seq, token_id)

    def fork(self, parent: int, child: int) -> None:
        self._uncommitted(parent)
        super().fork(parent, child)

    def free_seq(self, seq: int) -> None:
        super().free_seq(seq)
        self.pending.pop(seq, None)  # freed before its write: nothing is published


class EnginePrefixCachingBlockManager(PrefixCachingBlockManager):
    """The reference prefix cache with the operations engines use beyond the seed's four
    (as ``block_manager.EngineBlockManager``): ``append_slots`` (the slots of several
    tokens, with their ids, and lookahead), ``rollback`` of rejected tokens (their blocks
    kept as reservation), ``rebase`` (beam search) and ``preempt`` (free for recompute).

    The cache stays true to the KV it names through each of them:

    * ``rollback`` leaves a full block partial (its tokens past the new end are gone
      from the sequence, and the next write lands in it in place): every block it makes
      partial loses its key at once, so no key ever names a block about to be rewritten;
    * ``rebase`` drops the child's references (its full blocks keep their keys, the
      content they hold is intact: they become evictable at refcount 0) and shares the
      source's blocks, taking the source's token history and key chain with them, so
      the next block the child fills is keyed by the history whose KV it holds;
    * ``preempt`` is ``free_seq``: the keys of written blocks stay (a recompute of the
      same tokens finds them), nothing unwritten is ever published.

    A table may hold blocks beyond its tokens after a rollback or a lookahead:
    ``len(tables[seq]) == ceil((lens[seq] + reserved) / block_size)``.
    """

    def _unkey_from(self, seq: int, n: int) -> None:
        """Drop the key of every block of seq's table from the one holding token n on."""
        table = self.tables[seq]
        for block in table[n // self.block_size:]:
            key = self.key_of.get(block)
            if key is not None:
                self._uncache(block, key)

    def append_slots(self, seq: int, n_tokens: int, lookahead: int = 0,
                     token_ids: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """Reserve and write the slots of ``n_tokens`` more tokens (``token_ids``), and
        ``lookahead`` slots beyond them, all or nothing: the ``(src, dst)`` copies the caller
        makes before writing. New blocks past the last block; a shared block a new token
        lands in is replaced by a fresh one (copied first if it holds earlier tokens); a
        block the sequence holds alone is written in place. Each block a token fills gets
        its key."""
        table = self._live(seq)
        _check_size("n_tokens", n_tokens)
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise MisuseError(f"lookahead must be a non-negative integer, got {lookahead!r}")
        if token_ids is None:
            new_tokens = [next(self._invented) for _ in range(n_tokens)]
        else:
            new_tokens = list(token_ids)
            if len(new_tokens) != n_tokens or not all(type(t) is int for t in new_tokens):
                raise MisuseError(f"token_ids must be {n_tokens} integers")
        n, bs = self.lens[seq], self.block_size
        first, last = n // bs, (n + n_tokens - 1) // bs
        grow = max(0, -(-(n + n_tokens + lookahead) // bs) - len(table))
        shared = [i for i in range(first, min(last, len(table) - 1) + 1) if self.ref[table[i]] > 1]
        if grow + len(shared) > self._available():
            raise OutOfBlocks(f"need {grow + len(shared)} blocks, {self._available()} free")
        fresh = [self._take() for _ in range(grow + len(shared))]  # allocate before releasing
        copies = []
        for i, new in zip(shared, fresh, strict=False):
            old = table[i]
            self._release(old)
            table[i] = new
            if i == first and n % bs:
                copies.append((old, new))
        table.extend(fresh[len(shared):])
        tokens, keys = self.tokens[seq], self.keys[seq]
        for tok in new_tokens:
            tokens.append(tok)
            if len(tokens) % bs == 0:  # this token fills its block: register the block's key
                key = block_key(keys[-1] if keys else None, tokens[-bs:])
                keys.append(key)
                self._register(table[len(tokens) // bs - 1], key)
        self.lens[seq] = n + n_tokens
        return copies

    def append_slot(self, seq: int, token_id: int | None = None) -> tuple[int, int, int | None]:
        """As the reference's, on a table that may hold reserved slots (a lookahead's, a
        rollback's): the token goes into the block holding slot len, the first reserved
        slot, as ``append_slots`` writes it (a shared block there is replaced by a fresh
        one, copied first if it holds earlier tokens; keyed when the token fills it)."""
        table = self._live(seq)
        n, bs = self.lens[seq], self.block_size
        if len(table) == -(-n // bs):  # nothing reserved past the last token's block
            return super().append_slot(seq, token_id)
        if token_id is not None and type(token_id) is not int:
            raise MisuseError(f"token_id must be an integer, got {token_id!r}")
        copies = self.append_slots(seq, 1, token_ids=None if token_id is None else [token_id])
        return self.tables[seq][n // bs], n % bs, copies[0][0] if copies else None

    def rollback(self, seq: int, n_tokens: int) -> None:
        """Drop the last ``n_tokens`` tokens (at least one stays); their blocks are kept as
        reservation, and every block the rollback makes partial loses its key."""
        self._live(seq)
        _check_size("n_tokens", n_tokens)
        if n_tokens >= self.lens[seq]:
            raise MisuseError(f"rollback of {n_tokens} tokens leaves sequence {seq!r} none")
        left = self.lens[seq] - n_tokens
        self._unkey_from(seq, left)
        self.lens[seq] = left
        del self.tokens[seq][left:]
        del self.keys[seq][left // self.block_size:]

    def rebase(self, source: int, child: int) -> None:
        """Re-point live ``child`` at ``source``'s history: it drops its own blocks and
        shares every block of ``source`` (refcount +1 each), with its tokens and keys."""
        table = self._live(source)
        old = self._live(child)
        if child == source:
            raise MisuseError(f"sequence {child!r} cannot be rebased onto itself")
        for block in table:  # take the new references before dropping the old
            self.ref[block] += 1
        for block in reversed(old):
            self._release(block)
        self.tables[child] = list(table)
        self.lens[child] = self.lens[source]
        self.tokens[child] = list(self.tokens[source])
        self.keys[child] = list(self.keys[source])

    def preempt(self, seq: int) -> None:
        """Preempt ``seq`` for recompute: everything it holds is released, as by free_seq."""
        self.free_seq(seq)
