"""The prefix oracle's fast mode: the cache observed and checked where a step touched it.

Where the target's cache view reads one block at a time (``view.incremental``: the
bundled reference's journaled containers, ``impl/journaled.py``), the fast mode keeps a
``Mirror`` of the cache as last verified and, after each step, reads only the blocks
whose keys or list membership changed since the last read (the containers' journal,
kept by their own mutators, whatever code changed them; the per-block reads read the
containers' index, which the same mutators keep, so a block the journal does not name
reads as before). It checks the *touched* blocks: every block the tables of the step's
sequences name before or after it, the blocks the operation returned or copied (what
the contracts mention: the structural step's ``After.blocks``) and the journal's. The
ghost contents (``filled``/``content``) change only on blocks written through a touched
table, refcounts and partial tails only on touched blocks. On those blocks it evaluates
every per-block invariant of ``spec.prefix.PREFIX_INVARIANTS`` (compiled from the
spec's text, ``compiled.touched_invariants``; the spec itself names what broke).
Untouched blocks are unchanged since they were verified.

The global invariant (``pool_sizes``) and everything else are checked by a *full check*
(the full mode's: the whole cache read, every invariant on every block) in a sweep every
``max(1024, 2 x blocks)`` steps (with the structural sweep), at the end, and at once on
any step where the sizes do not add up: the entries, free and evictable blocks the
mirror counts differ from the container sizes the target holds, or the sizes it reports
differ from those it holds. A full check rebuilds the mirror.
"""

from __future__ import annotations

from collections import Counter

from kvcheck.spec import prefix as P


class Mirror(P.PrefixSnapshot):
    """A ``PrefixSnapshot`` kept up to date block by block (same fields, same methods:
    the spec and its compiled form read it as they read a snapshot). ``refs`` is the
    structural oracle's verified ghost; ``filled``/``content`` the prefix ghost's."""

    def __init__(self, snap: P.PrefixSnapshot, structural, ghost, meanings: dict, seqs_partial):
        self.num_blocks = snap.num_blocks
        self.block_size = snap.block_size
        self._s = structural
        self.free_list = Counter(snap.free_list)
        self.evictable = Counter(snap.evictable)
        self._keys = {b: tuple(ks) for b, ks in snap._keys.items()}  # (tuples: as read)
        self.meanings = meanings  # the oracle's bindings (a superset of the cached keys')
        self.filled_map = ghost.filled
        self.content_map = ghost.content
        self._parts = ghost.parts
        self._free_len = snap.free_list_len()
        self._evict_len = snap.evictable_len()
        self.n_entries = len(snap.entries)
        self.n_free = sum(self.free_list.values())
        self.n_evict = sum(self.evictable.values())
        self.pcount: dict = {}  # block -> how many sequences hold it partial
        self.seq_partial: dict = {}
        for q, blocks in seqs_partial:
            self.set_partial(q, blocks)
        self._partial = {b for b, c in self.pcount.items() if c}
        # orphan keys (coverage only): meanings named, and those whose parent is not
        self.named: Counter = Counter()
        self.children: dict = {}
        self.orphans: set = set()
        for ks in self._keys.values():
            for k in ks:
                self._name(meanings.get(k, -1), +1)

    @property
    def refs(self):
        return self._s._state().refs

    @property
    def entries(self) -> list:
        return [(k, b) for b, ks in self._keys.items() for k in ks]

    def set_partial(self, q, blocks) -> None:
        """Sequence q's blocks past its last full block are ``blocks`` (None: q is gone)."""
        sp = self.seq_partial
        if blocks and sp.get(q) == blocks:
            return  # (unchanged: an append within the last block)
        pc = self.pcount
        for b in sp.pop(q, ()):
            c = pc[b] - 1
            if c:
                pc[b] = c
            else:
                del pc[b]
                if hasattr(self, "_partial"):
                    self._partial.discard(b)
        if blocks:
            sp[q] = blocks
            for b in blocks:
                pc[b] = pc.get(b, 0) + 1
                if hasattr(self, "_partial"):
                    self._partial.add(b)

    def block(self, b) -> tuple:
        """(keys, times on the free list, times evictable) as the mirror holds them."""
        return self._keys.get(b, ()), self.free_list.get(b, 0), self.evictable.get(b, 0)

    def set_block(self, b, keys: tuple, on_free: int, on_evict: int) -> tuple:
        """Block b now holds ``keys`` and is that many times on each list; returns
        (whether it had a key, times it was evictable) before."""
        old = self._keys.get(b, ())
        before = (bool(old), self.evictable.get(b, 0))
        if (keys or old) and old != keys:
            for k in old:
                self._name(self.meanings.get(k, -1), -1)
            for k in keys:
                self._name(self.meanings.get(k, -1), +1)
            self.n_entries += len(keys) - len(old)
            if keys:
                self._keys[b] = keys
            else:
                self._keys.pop(b, None)
        counts = self.free_list
        was = counts.get(b, 0)
        if was != on_free:
            self.n_free += on_free - was
            if on_free:
                counts[b] = on_free
            else:
                counts.pop(b)  # (not Counter's own __delitem__, in Python)
        counts = self.evictable
        was = counts.get(b, 0)
        if was != on_evict:
            self.n_evict += on_evict - was
            if on_evict:
                counts[b] = on_evict
            else:
                counts.pop(b)
        return before

    def content_ok(self, b):
        """``PrefixSnapshot.content_ok`` (the common case, one key, without a generator)."""
        c = self.content_map.get(b, -1)
        if c < 0:
            return False
        ks = self._keys.get(b, ())
        if len(ks) == 1:
            return self.meanings.get(ks[0], -1) == c
        meanings = self.meanings
        return all(meanings.get(k, -1) == c for k in ks)

    def _name(self, m: int, d: int) -> None:
        if m < 0:
            return
        named, parts = self.named, self._parts
        c = named[m] + d
        parent = parts[m][0]
        if c > 0:
            named[m] = c
            if c == d:  # newly named
                if parent >= 0:
                    self.children.setdefault(parent, set()).add(m)
                    if not named.get(parent):
                        self.orphans.add(m)
                self.orphans.difference_update(self.children.get(m, ()))
            return
        named.pop(m)  # (not Counter's own __delitem__, in Python)
        self.orphans.discard(m)
        if parent >= 0:
            self.children.get(parent, set()).discard(m)
        self.orphans.update(self.children.get(m, ()))

    def orphaned(self) -> bool:
        return bool(self.orphans)


def partial_blocks(state, q, bs: int) -> tuple:
    """q's table entries past its last full block (the snapshot's ``partial``)."""
    return tuple(state.table_tuple(q)[state.length(q) // bs:])
