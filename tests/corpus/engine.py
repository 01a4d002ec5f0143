"""Buggy allocators for the operations engines use beyond the seed's four.

Each subclasses a reference (``EngineBlockManager``, lazy copy-on-write, or
``EagerForkBlockManager``, a partial tail copied at fork time) and breaks exactly
one thing, a mistake an engine developer makes, named in its docstring's first
line. ``ENGINE`` maps a name to (class, the kind of violation kvcheck must report,
the length of the minimal trace), as ``buggy.CORPUS`` does, and is merged into it.
``LEGAL`` lists allocators that choose differently from the references but within
the spec: kvcheck must pass them.
"""

from kvcheck.impl.block_manager import EagerForkBlockManager, EngineBlockManager
from kvcheck.impl.errors import MisuseError, OutOfBlocks


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- append_slots ---------------------------------------------------------------------
class _Slots(EngineBlockManager):
    """The reference's append_slots in steps, so a bug can change one of them."""

    def _blocks_needed(self, seq, n, n_tokens, lookahead):
        return _cdiv(n + n_tokens + lookahead, self.block_size)

    def _grow(self, seq, n, need):
        return max(0, need - len(self.tables[seq]))

    def _to_replace(self, seq, n, n_tokens):
        """The shared blocks the new tokens land in."""
        table, bs = self.tables[seq], self.block_size
        last = min((n + n_tokens - 1) // bs, len(table) - 1)
        return [i for i in range(n // bs, last + 1) if self.ref[table[i]] > 1]

    def _enough(self, grow, replace):
        return grow + len(replace) <= len(self.free)

    def append_slots(self, seq, n_tokens, lookahead=0):
        table, n, bs = self._live(seq), self.lens[seq], self.block_size
        grow = self._grow(seq, n, self._blocks_needed(seq, n, n_tokens, lookahead))
        replace = self._to_replace(seq, n, n_tokens)
        if not self._enough(grow, replace):
            raise OutOfBlocks(f"need {grow + len(replace)} blocks, {len(self.free)} free")
        fresh = [self._take() for _ in range(grow + len(replace))]
        copies = []
        for i, new in zip(replace, fresh, strict=False):
            old = table[i]
            self._release(old)
            table[i] = new
            if i * bs < n:  # it holds tokens of the sequence: the caller copies them
                copies.append((old, new))
        table.extend(fresh[len(replace):])
        self.lens[seq] = n + n_tokens
        return copies


class SlotsGrowOneByOne(EngineBlockManager):
    """append_slots takes its new blocks one at a time and fails half-way, keeping them."""

    def append_slots(self, seq, n_tokens, lookahead=0):
        table = self._live(seq)
        need = _cdiv(self.lens[seq] + n_tokens + lookahead, self.block_size)
        while len(table) < need:
            if not self.free:
                raise OutOfBlocks("pool exhausted")  # bug: the blocks taken so far stay
            table.append(self._take())
        return super().append_slots(seq, n_tokens, lookahead)


class SlotsLengthFirst(EngineBlockManager):
    """append_slots counts the new tokens into the length before it has found the blocks."""

    def append_slots(self, seq, n_tokens, lookahead=0):
        n = self.lens.get(seq)
        try:
            return super().append_slots(seq, n_tokens, lookahead)
        except OutOfBlocks:
            self.lens[seq] = n + n_tokens  # bug: the length, counted first, stays counted
            raise


class SlotsOobIgnoresCow(_Slots):
    """append_slots checks the free list for its new blocks only, not for its copies."""

    def _enough(self, grow, replace):
        return grow <= len(self.free)  # bug: taking the copies then runs off the free list


class SlotsFloorPlusOne(_Slots):
    """append_slots sizes the table as (tokens + lookahead) // block_size + 1, not the ceiling."""

    def _blocks_needed(self, seq, n, n_tokens, lookahead):
        return (n + n_tokens + lookahead) // self.block_size + 1  # bug: one too many on a boundary


class SlotsIgnoreLookahead(_Slots):
    """append_slots allocates for the new tokens but forgets the lookahead slots."""

    def _blocks_needed(self, seq, n, n_tokens, lookahead):
        return _cdiv(n + n_tokens, self.block_size)  # bug: lookahead dropped


class SlotsLastTokenIsLookahead(_Slots):
    """append_slots counts the last new token's slot as the first lookahead slot (one short)."""

    def _blocks_needed(self, seq, n, n_tokens, lookahead):
        return _cdiv(n + n_tokens - 1 + lookahead, self.block_size)  # bug: off by one


class SlotsRoomForOne(_Slots):
    """append_slots grows only when the last block is full, as if one token were coming."""

    def _blocks_needed(self, seq, n, n_tokens, lookahead):
        table = self.tables[seq]
        if n < len(table) * self.block_size:  # bug: room for one is not room for the chunk
            return len(table)
        return super()._blocks_needed(seq, n, n_tokens, lookahead)


class SlotsCountFromLength(_Slots):
    """append_slots counts its new blocks from the length, ignoring the blocks already reserved."""

    def _grow(self, seq, n, need):
        return max(0, need - _cdiv(n, self.block_size))  # bug: not from the table's length


class SlotsWriteSharedInPlace(_Slots):
    """append_slots writes a shared partial tail in place (no copy-on-write)."""

    def _to_replace(self, seq, n, n_tokens):
        return []  # bug: shared blocks are never replaced


class SlotsCowFirstBlockOnly(_Slots):
    """append_slots replaces only the first new token's block, writing later shared ones in place."""

    def _to_replace(self, seq, n, n_tokens):
        k = n // self.block_size
        table = self.tables[seq]  # bug: only block k is looked at
        return [k] if k < len(table) and self.ref[table[k]] > 1 else []


class SlotsCopyFullBlock(_Slots):
    """append_slots starts copy-on-write at the last old token's block, a full one at a boundary."""

    def _to_replace(self, seq, n, n_tokens):
        table, bs = self.tables[seq], self.block_size
        last = min((n + n_tokens - 1) // bs, len(table) - 1)
        first = (n - 1) // bs  # bug: the block of the last old token, not of the first new one
        return [i for i in range(first, last + 1) if self.ref[table[i]] > 1]


class SlotsCopyUnreported(EngineBlockManager):
    """append_slots replaces a shared partial tail but does not report the copy to make."""

    def append_slots(self, seq, n_tokens, lookahead=0):
        super().append_slots(seq, n_tokens, lookahead)
        return []  # bug: the caller never copies, the new block holds no tokens


class SlotsCopyReversed(EngineBlockManager):
    """append_slots reports its copy as (new, old): the caller copies the wrong way."""

    def append_slots(self, seq, n_tokens, lookahead=0):
        return [(dst, src) for src, dst in super().append_slots(seq, n_tokens, lookahead)]


# -- rollback -------------------------------------------------------------------------
class RollbackFrees(EngineBlockManager):
    """The legal other choice: rollback frees the blocks past the new last token."""

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        table = self.tables[seq]
        keep = _cdiv(self.lens[seq], self.block_size)
        for block in table[keep:]:
            self._release(block)
        del table[keep:]


class RollbackFloor(RollbackFrees):
    """rollback keeps floor(len / block_size) blocks, freeing the partial one still holding tokens."""

    def rollback(self, seq, n_tokens):
        EngineBlockManager.rollback(self, seq, n_tokens)
        table = self.tables[seq]
        keep = max(1, self.lens[seq] // self.block_size)  # bug: floor, not ceiling
        for block in table[keep:]:
            self._release(block)
        del table[keep:]


class RollbackIgnoresRefcount(EngineBlockManager):
    """rollback puts the dropped blocks straight on the free list, ignoring other holders."""

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        table = self.tables[seq]
        keep = _cdiv(self.lens[seq], self.block_size)
        for block in table[keep:]:
            self.ref[block] = 0  # bug: a shared block is freed outright
            self.free.append(block)
        del table[keep:]


class RollbackReleasesKeepsEntry(EngineBlockManager):
    """rollback releases the blocks past the new tail but leaves them in the table."""

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        table = self.tables[seq]
        for block in table[_cdiv(self.lens[seq], self.block_size):]:
            self._release(block)  # bug: the table still names them


class RollbackLeaks(EngineBlockManager):
    """rollback drops the blocks past the new tail from the table without releasing them."""

    def rollback(self, seq, n_tokens):
        super().rollback(seq, n_tokens)
        del self.tables[seq][_cdiv(self.lens[seq], self.block_size):]  # bug: refcounts kept


class RollbackKeepsLength(RollbackFrees):
    """rollback frees the rejected tokens' blocks but never shortens the sequence."""

    def rollback(self, seq, n_tokens):
        n = self.lens[seq]
        super().rollback(seq, n_tokens)
        self.lens[seq] = n  # bug: the length is left as it was


class RollbackSlotsStayWritable(EngineBlockManager):
    """After a rollback, the rolled-back slots are rewritten in place as the sequence's own,
    though a fork since shares their block."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.written: dict[int, int] = {}  # seq -> how far it has written its blocks

    def rollback(self, seq, n_tokens):
        self.written[seq] = max(self.written.get(seq, 0), self.lens.get(seq, 0))
        super().rollback(seq, n_tokens)

    def append_slots(self, seq, n_tokens, lookahead=0):
        table, n, bs = self._live(seq), self.lens[seq], self.block_size
        if n + n_tokens <= self.written.get(seq, 0):  # bug: "slots I wrote before are mine"
            need = _cdiv(n + n_tokens + lookahead, bs)
            if need - len(table) > len(self.free):
                raise OutOfBlocks("no free block for the lookahead")
            table.extend(self._take() for _ in range(max(0, need - len(table))))
            self.lens[seq] = n + n_tokens
            return []
        return super().append_slots(seq, n_tokens, lookahead)

    def free_seq(self, seq):
        super().free_seq(seq)
        self.written.pop(seq, None)


# -- a single-slot append into reserved slots ------------------------------------------
class AppendSlotPastReservation(EngineBlockManager):
    """A single-slot append at a block boundary always takes a fresh block, though the
    sequence holds a reserved block there (a lookahead's, a rollback's): the table grows
    past its reservation, the token lands after the reserved slots."""

    def append_slot(self, seq):
        table, n = self._live(seq), self.lens[seq]
        if n % self.block_size:
            return super().append_slot(seq)
        if not self.free:  # bug: the block reserved at position n // B is not looked at
            raise OutOfBlocks("no free block for a new tail block")
        table.append(self._take())
        self.lens[seq] = n + 1
        return table[-1], 0, None


class AppendSlotIntoSharedReservation(EngineBlockManager):
    """A single-slot append into a reserved slot writes it in place, as "reserved for
    me", though a fork since shares the reserved block: the other table reads the write."""

    def append_slot(self, seq):
        table, n, bs = self._live(seq), self.lens[seq], self.block_size
        k = n // bs
        if len(table) > _cdiv(n, bs) and k < len(table):  # bug: the refcount is not looked at
            self.lens[seq] = n + 1
            return table[k], n % bs, None
        return super().append_slot(seq)


# -- eager fork -----------------------------------------------------------------------
class EagerForkBumpsFirst(EagerForkBlockManager):
    """An eager fork takes the references of the shared blocks before it allocates the copy."""

    def fork(self, parent, child):
        table, n, bs = self._live(parent), self.lens[parent], self.block_size
        if child in self.tables:
            return super().fork(parent, child)
        t = (n - 1) // bs
        for i, block in enumerate(table):
            if n % bs == 0 or i != t:
                self.ref[block] += 1  # bug: left bumped when the copy below runs out of blocks
        copies = self._copy_tail(parent) or []
        self.tables[child] = list(table)
        for _src, dst in copies:
            self.tables[child][t] = dst
        self.lens[child] = n
        return copies


class EagerForkCopiesFull(EagerForkBlockManager):
    """An eager fork copies the parent's last block even when it is full."""

    def _copy_tail(self, source):
        table, n, bs = self.tables[source], self.lens[source], self.block_size
        if not self.free:  # bug: no test that the block is partial
            raise OutOfBlocks("no free block to copy the last block at fork time")
        return [(table[(n - 1) // bs], self._take())]

    def _share(self, source, child):
        table, n, bs = self.tables[source], self.lens[source], self.block_size
        t = (n - 1) // bs
        copies = self._copy_tail(source)
        new = list(table)
        new[t] = copies[0][1]
        for i, block in enumerate(new):
            if i != t:
                self.ref[block] += 1
        return new, copies


class EagerForkCopyUnreported(EagerForkBlockManager):
    """An eager fork gives the child a fresh tail block but does not report the copy."""

    def fork(self, parent, child):
        super().fork(parent, child)
        return []  # bug: nobody copies, the child's tail holds nothing


class EagerForkBumpsCopiedTail(EagerForkBlockManager):
    """An eager fork bumps the refcount of every parent block, the copied tail included."""

    def fork(self, parent, child):
        copies = super().fork(parent, child)
        for src, _dst in copies:
            self.ref[src] += 1  # bug: the child does not hold the parent's tail
        return copies


class EagerForkReleasesParentTail(EagerForkBlockManager):
    """An eager fork treats its copy as a copy-on-write and releases the parent's tail."""

    def fork(self, parent, child):
        copies = super().fork(parent, child)
        for src, _dst in copies:
            self._release(src)  # bug: the parent still holds it
        return copies


class EagerForkCopiesTableEnd(EagerForkBlockManager):
    """An eager fork copies the table's last block (a reserved one) instead of the last token's."""

    def fork(self, parent, child):
        table, n, bs = self._live(parent), self.lens[parent], self.block_size
        if child in self.tables or n % bs == 0:
            return super().fork(parent, child)
        if not self.free:
            raise OutOfBlocks("no free block to copy a partial block at fork time")
        copies = [(table[-1], self._take())]  # bug: table[-1], not table[(n - 1) // bs]
        for block in table[:-1]:
            self.ref[block] += 1
        self.tables[child] = [*table[:-1], copies[0][1]]
        self.lens[child] = n
        return copies


# -- rebase ---------------------------------------------------------------------------
class RebaseLeaks(EngineBlockManager):
    """rebase shares the source's blocks but never releases the child's old ones."""

    def rebase(self, source, child):
        table = self._live(source)
        self._live(child)
        for block in table:
            self.ref[block] += 1
        self.tables[child] = list(table)  # bug: the old table's references are never released
        self.lens[child] = self.lens[source]


class RebaseReleasesNewTable(EngineBlockManager):
    """rebase installs the child's new table first, then releases "the child's table": the new one."""

    def rebase(self, source, child):
        table = self._live(source)
        self._live(child)
        if child == source:
            return super().rebase(source, child)
        for block in table:
            self.ref[block] += 1
        self.tables[child] = list(table)
        for block in self.tables[child]:  # bug: the old table is already gone
            self._release(block)
        self.lens[child] = self.lens[source]


class RebaseDoubleRelease(EngineBlockManager):
    """rebase skips the references of blocks the child already shares, yet releases them."""

    def rebase(self, source, child):
        table = self._live(source)
        old = self._live(child)
        if child == source:
            return super().rebase(source, child)
        for block in table:
            if block not in old:  # "already held: no new reference needed" ...
                self.ref[block] += 1
        for block in old:  # bug: ... but every old reference is still dropped
            self._release(block)
        self.tables[child] = list(table)
        self.lens[child] = self.lens[source]


class RebaseAliases(EngineBlockManager):
    """rebase hands the child the source's table object instead of a copy."""

    def rebase(self, source, child):
        super().rebase(source, child)
        self.tables[child] = self.tables[source]  # bug: one list for two sequences


class EagerRebaseCopiesOwnTail(EagerForkBlockManager):
    """An eager rebase reports the copy of the child's own old tail instead of the source's."""

    def rebase(self, source, child):
        old = list(self._live(child))
        copies = super().rebase(source, child)
        return [(old[-1], dst) for _src, dst in copies]  # bug: the wrong source block


class EagerRebaseReusesSharedTail(EagerForkBlockManager):
    """An eager rebase copies into the child's old last block without checking that nobody else reads it."""

    def rebase(self, source, child):
        table = self._live(source)
        old = self._live(child)
        n, bs = self.lens[source], self.block_size
        if child == source or n % bs == 0:
            return super().rebase(source, child)
        t, dst = (n - 1) // bs, old[-1]  # bug: another sequence may still hold dst
        for block in old:
            self._release(block)
        if self.ref[dst] == 0:
            self.free.remove(dst)
        self.ref[dst] += 1
        new = list(table)
        new[t] = dst
        for i, block in enumerate(new):
            if i != t:
                self.ref[block] += 1
        self.tables[child], self.lens[child] = new, n
        return [(table[t], dst)]


class EagerRebaseReleaseFirst(EagerForkBlockManager):
    """The legal other order: an eager rebase releases the child's blocks first, so its copy
    may land in one of them (and needs no free block when one is released)."""

    def rebase(self, source, child):
        self._live(source)
        old = self._live(child)
        if child == source:
            raise MisuseError(f"sequence {child!r} cannot be rebased onto itself")
        n, bs = self.lens[source], self.block_size
        if n % bs and not self.free and not any(self.ref[b] == old.count(b) for b in old):
            raise OutOfBlocks("no block to copy the partial tail into")
        del self.tables[child]
        for block in old:
            self._release(block)
        self.tables[child], copies = self._share(source, child)
        self.lens[child] = n
        return copies


# -- preempt --------------------------------------------------------------------------
class PreemptKeepsSharedRefs(EngineBlockManager):
    """preempt frees the blocks the sequence holds alone and skips its shared ones."""

    def preempt(self, seq):
        table = self._live(seq)
        for block in table:
            if self.ref[block] == 1:  # bug: a shared block keeps this sequence's reference
                self._release(block)
        del self.tables[seq], self.lens[seq]


class PreemptFreesShared(EngineBlockManager):
    """preempt puts every block of the sequence on the free list, shared ones too."""

    def preempt(self, seq):
        for block in self._live(seq):
            self.ref[block] = 0  # bug: other holders ignored
            self.free.append(block)
        del self.tables[seq], self.lens[seq]


class PreemptKeepsTable(EngineBlockManager):
    """preempt releases the blocks but keeps the sequence's table for its re-admission."""

    def preempt(self, seq):
        table, n = list(self._live(seq)), self.lens[seq]
        self.free_seq(seq)
        self.tables[seq], self.lens[seq] = table, n  # bug: still listed, naming freed blocks


ENGINE = {
    "slots-grow-one-by-one": (SlotsGrowOneByOne, "contract", 2),
    "slots-length-first": (SlotsLengthFirst, "invariant", 2),
    "slots-oob-ignores-cow": (SlotsOobIgnoresCow, "crash", 3),
    "slots-floor-plus-one": (SlotsFloorPlusOne, "contract", 2),
    "slots-ignore-lookahead": (SlotsIgnoreLookahead, "contract", 2),
    "slots-last-token-is-lookahead": (SlotsLastTokenIsLookahead, "contract", 2),
    "slots-room-for-one": (SlotsRoomForOne, "contract", 2),
    "slots-count-from-length": (SlotsCountFromLength, "contract", 3),
    "slots-write-shared-in-place": (SlotsWriteSharedInPlace, "contract", 3),
    "slots-cow-first-block-only": (SlotsCowFirstBlockOnly, "contract", 4),
    "slots-copy-full-block": (SlotsCopyFullBlock, "contract", 3),
    "slots-copy-unreported": (SlotsCopyUnreported, "data", 3),
    "slots-copy-reversed": (SlotsCopyReversed, "data", 3),
    "rollback-floor": (RollbackFloor, "contract", 2),
    "rollback-ignores-refcount": (RollbackIgnoresRefcount, "contract", 3),
    "rollback-releases-keeps-entry": (RollbackReleasesKeepsEntry, "contract", 2),
    "rollback-leaks": (RollbackLeaks, "contract", 2),
    "rollback-keeps-length": (RollbackKeepsLength, "invariant", 2),
    "rollback-slots-stay-writable": (RollbackSlotsStayWritable, "contract", 4),
    "append-slot-past-reservation": (AppendSlotPastReservation, "contract", 3),
    "append-slot-into-shared-reservation": (AppendSlotIntoSharedReservation, "contract", 4),
    "eager-fork-bumps-first": (EagerForkBumpsFirst, "contract", 2),
    "eager-fork-copies-full": (EagerForkCopiesFull, "contract", 2),
    "eager-fork-copy-unreported": (EagerForkCopyUnreported, "data", 2),
    "eager-fork-bumps-copied-tail": (EagerForkBumpsCopiedTail, "contract", 2),
    "eager-fork-releases-parent-tail": (EagerForkReleasesParentTail, "contract", 2),
    "eager-fork-copies-table-end": (EagerForkCopiesTableEnd, "contract", 3),
    "rebase-leaks": (RebaseLeaks, "contract", 3),
    "rebase-releases-new-table": (RebaseReleasesNewTable, "contract", 3),
    "rebase-double-release": (RebaseDoubleRelease, "contract", 3),
    "rebase-aliases": (RebaseAliases, "contract", 3),
    "eager-rebase-copies-own-tail": (EagerRebaseCopiesOwnTail, "data", 3),
    "eager-rebase-reuses-shared-tail": (EagerRebaseReusesSharedTail, "contract", 4),
    "preempt-keeps-shared-refs": (PreemptKeepsSharedRefs, "contract", 3),
    "preempt-frees-shared": (PreemptFreesShared, "contract", 3),
    "preempt-keeps-table": (PreemptKeepsTable, "contract", 2),
}

LEGAL = {
    "rollback-frees": RollbackFrees,
    "slots-in-steps": _Slots,
    "eager-rebase-release-first": EagerRebaseReleaseFirst,
}
