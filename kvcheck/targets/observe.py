"""Reading an allocator's state without trusting it.

Everything read through a ``Target`` is converted to plain ints here; any
exception or malformed value becomes an ``ObservationError`` that the oracle
reports as a violation of the allocator, never a crash of kvcheck. Its message
names the read as the allocator's own code spells it when the target says
(the optional ``spelling(method, arg)``: ``SeedAdapter`` gives ``ref[3]``,
``tables[2]``, ``free``), else as the ``Target`` call (``refcount(3)``).
"""

from __future__ import annotations

from operator import index

from kvcheck.check.watchdog import CONTROL
from kvcheck.errors import what_it_did
from kvcheck.spec.state import NULL, Snapshot
from kvcheck.targets.protocol import SeedAdapter, is_value


class ObservationError(Exception):
    """The allocator could not be observed (it raised, or returned garbage)."""


def spelled(target, method: str, arg: object = None) -> str:
    """How ``target`` names the read ``method(arg)`` in its own terms (for messages)."""
    spelling = getattr(target, "spelling", None)
    if spelling is not None:
        try:
            return str(spelling(method, arg))
        except CONTROL:
            raise
        except BaseException:  # noqa: BLE001 - only a message; fall back to the call
            pass
    return f"{method}()" if arg is None else f"{method}({arg})"


def as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ObservationError(f"{what} is a bool ({value!r}), expected an integer")
    try:
        return index(value)
    except TypeError:
        raise ObservationError(f"{what} is {value!r}, expected an integer") from None


def read_table(target, seq: int, verified: tuple | None = None) -> tuple[int, ...] | None:
    """``seq``'s block table as a tuple of ints, or None if the allocator has no such sequence.

    ``verified``: the table last checked (all ints); an equal table is returned as is."""
    try:
        table = target.block_table(seq)
    except (KeyError, LookupError):
        return None
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001 - the allocator's fault, reported
        raise _raised(target, "block_table", seq, exc) from None
    if table is None:
        return None
    try:
        out = tuple(table)
    except TypeError:
        raise ObservationError(f"{spelled(target, 'block_table', seq)} is {table!r}, not a "
                               f"sequence") from None
    if out == verified:
        return verified
    for b in out:
        if type(b) is not int:
            what = f"an entry of {spelled(target, 'block_table', seq)}"
            # (None: the null placeholder of a position behind a sliding window)
            return tuple(NULL if x is None else as_int(x, what) for x in out)
    return out


def _raised(target, method: str, arg, exc: BaseException) -> ObservationError:
    return ObservationError(f"{spelled(target, method, arg)} {what_it_did(exc)}")


def read_ref(target, block: int) -> int:
    try:
        value = target.refcount(block)
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise _raised(target, "refcount", block, exc) from None
    return value if type(value) is int else as_int(value, spelled(target, "refcount", block))


def read_refs_of(target, blocks) -> dict[int, int]:
    """The refcounts of ``blocks`` (pool ids), as ``{block: refcount}``."""
    try:
        if type(target) is SeedAdapter and type(target.impl.ref) is list:
            ref = target.impl.ref  # (what its refcount(b) reads, without a call per block)
            refs = {b: ref[b] for b in blocks}
        else:
            refcount = target.refcount
            refs = {b: refcount(b) for b in blocks}
    except CONTROL:
        raise
    except BaseException:  # noqa: BLE001 - ask again one by one, to name the block
        return {b: read_ref(target, b) for b in blocks}
    for r in refs.values():
        if type(r) is not int:
            return {b: read_ref(target, b) for b in refs}
    return refs


def read_refs(target, n: int) -> list[int]:
    """Every block's refcount: in one call if the target offers ``refcounts()``.

    When that call fails (it raises, returns too few values or a non-integer),
    the blocks are asked one by one first, so that a read the allocator spells
    itself (``ref[3]``) is named; only if each of those succeeds is the bulk
    call blamed."""
    bulk = getattr(target, "refcounts", None)
    if bulk is None:
        return [read_ref(target, b) for b in range(n)]
    try:
        refs = list(bulk())
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001
        _read_one_by_one(target, n)
        raise ObservationError(f"refcounts() {what_it_did(exc)}") from None
    if len(refs) != n:
        _read_one_by_one(target, n)
        raise ObservationError(f"refcounts() returned {len(refs)} values for {n} blocks")
    if set(map(type, refs)) - {int}:
        _read_one_by_one(target, n)
        refs = [as_int(r, f"refcounts()[{b}]") for b, r in enumerate(refs)]
    return refs


def _read_one_by_one(target, n: int) -> None:
    """Read every block's refcount alone: raises ``ObservationError`` at the first
    that cannot be read."""
    for b in range(n):
        read_ref(target, b)


def read_num_free(target) -> int:
    try:
        n = target.num_free()
        return n if type(n) is int else as_int(n, spelled(target, "num_free"))
    except ObservationError:
        raise
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise _raised(target, "num_free", None, exc) from None


def read_free(target) -> list[int]:
    try:
        free = list(target.free_blocks())
    except CONTROL:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise _raised(target, "free_blocks", None, exc) from None
    if set(map(type, free)) - {int}:
        what = f"an entry of {spelled(target, 'free_blocks')}"
        # (None: the null placeholder, which free_list_in_pool says is never on it)
        return [NULL if b is None else as_int(b, what) for b in free]
    return free


_IDENTITY = object()  # (the tag of an Identity's tuple: no value a target returns holds it)


class Identity(tuple):
    """A table's identity: the table object itself, equal only to itself.

    Holding the object keeps it alive, so its ``id`` cannot be handed to a new
    table while the oracle still remembers the old one (raw ``id()`` values
    are reused as soon as an object is freed, which made a new table look
    like an alias of a replaced one). A tuple ``(tag, id(obj))`` whose tag is private:
    hashed and compared at C speed (the fast mode hashes identities every step), equal
    exactly to an ``Identity`` of the same object."""

    def __new__(cls, obj: object):
        self = tuple.__new__(cls, (_IDENTITY, id(obj)))
        self.obj = obj
        return self

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        import copy

        return Identity(copy.deepcopy(self.obj, memo))

    def __reduce__(self):
        return (Identity, (self.obj,))

    def __repr__(self) -> str:
        return f"Identity({type(self.obj).__name__} at {id(self.obj):#x})"


def read_identity(target, seq: int, known: object = None) -> object | None:
    """``seq``'s table identity (None: unknown). A hashable value with its own
    equality (an int, a string, a tuple: e.g. a handle) is used as it is; any
    other object (a list, a table object) is its own identity: ``Identity``.

    ``known``: the identity read last time; when the target hands back the very object
    it stands for, it is returned as it is (equal to a new ``Identity`` of it)."""
    try:
        value = target.table_identity(seq)
    except CONTROL:
        raise
    except BaseException:  # noqa: BLE001 - identity is optional
        return None
    if value is None:
        return None
    if type(known) is Identity and known.obj is value:
        return known
    if is_value(value):
        return value
    return Identity(value)


def read_len(target, seq: int) -> int | None:
    try:
        n = target.seq_len(seq)
    except CONTROL:
        raise
    except BaseException:  # noqa: BLE001 - a length is optional
        return None
    if n is None or type(n) is int:
        return n
    return as_int(n, spelled(target, "seq_len", seq))


def snapshot(target, lengths: dict[int, int], also: tuple = (),
             reserved: dict[int, int] | None = None) -> Snapshot:
    """A complete snapshot of ``target`` for the sequences in ``lengths``
    (the live ones, with the oracle's token counts) and ``also`` (sequences
    that should be gone: if the allocator still has them they appear live
    with length 0). A sequence the allocator lost is absent (not live). ``reserved``: the
    oracle's count of slots each sequence has reserved beyond its tokens.
    """
    n = target.num_blocks
    tables, impl_lengths, idents = {}, {}, {}
    for q in (*lengths, *(a for a in also if a not in lengths)):
        table = read_table(target, q)
        if table is None:
            continue
        tables[q] = table
        impl_lengths[q] = read_len(target, q)
        idents[q] = read_identity(target, q)
    refs = read_refs(target, n)
    return Snapshot(n, target.block_size, tables, lengths, refs, read_free(target), impl_lengths,
                    idents, read_num_free(target), reserved)
