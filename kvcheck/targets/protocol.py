"""The adapter protocol: what the oracle needs from any allocator.

An allocator under test is driven through the operations it offers (the seed's
four at the least: ``kvcheck.spec.contracts.CONTRACTS`` lists every one) and observed
through a handful of read-only queries. The oracle never trusts what it
observes; it only compares it against the spec.

Built-in: ``SeedAdapter`` wraps any *seed-shaped* allocator, i.e. an object
with methods ``allocate/append_slot/fork/free_seq`` and attributes
``tables`` (seq -> its block ids: a list, or an immutable tuple, which can
never alias another sequence's table), ``lens`` (seq -> tokens, optional),
``ref`` (any indexable of refcounts: a list, or a mapping such as a dict or
a defaultdict in which a block it omits has refcount 0) and ``free`` (a
collection of free ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from kvcheck.spec.contracts import CONTRACTS

OPERATIONS = tuple(CONTRACTS)  # the operations the spec has a contract for: a target's methods


@runtime_checkable
class Target(Protocol):
    """An allocator as the oracle sees it.

    ``capabilities`` names the operations it supports (a subset of
    ``OPERATIONS``); the oracle only issues those. ``append_slot`` returns
    ``(block, offset, cow_src)``; ``append_slots(seq, n_tokens, lookahead)``, ``fork`` and
    ``rebase(source, child)`` return the ``(src, dst)`` block copies the caller makes
    before writing (``None`` or empty: none); ``rollback(seq, n_tokens)`` and
    ``preempt(seq)`` return nothing, as does ``drop_behind_window(seq, window)`` (a
    table entry it drops reads as ``None`` or ``spec.state.NULL``). ``allocate`` may
    return the number of prompt tokens it served from the cache (an ``int``: the tokens
    the engine skips computing), which the prefix model checks
    (``kvcheck.spec.prefix.cached_tokens``); anything else is not read. Out-of-blocks is
    signalled by raising an
    exception for which ``is_out_of_blocks`` is true.
    """

    num_blocks: int
    block_size: int
    capabilities: frozenset[str]

    def allocate(self, seq: int, n_tokens: int) -> None: ...
    def append_slot(self, seq: int) -> tuple[int, int, int | None]: ...
    def fork(self, parent: int, child: int) -> None: ...
    def free_seq(self, seq: int) -> None: ...

    def block_table(self, seq: int) -> Sequence[int]:
        """The block ids of ``seq``'s table, in token order."""

    def refcount(self, block: int) -> int:
        """The allocator's own refcount of ``block``."""

    def free_blocks(self) -> Iterable[int]:
        """Every id on the free list, with multiplicity (a duplicate is a bug)."""

    # Optional: ``refcounts() -> Sequence[int]``, every block's refcount in block
    # order, for a cheaper full snapshot (else ``refcount`` is asked per block);
    # ``spelling(method, arg) -> str``, how the allocator's own code names the read
    # ``method(arg)``, for messages (``SeedAdapter``: ``ref[3]`` for ``refcount(3)``);
    # ``admits(op) -> bool``, where an engine can express only part of an operation's
    # precondition (vLLM v1 rolls back only the draft tokens of its last step): an
    # operation it does not admit is never issued (drawn, replayed or explored), so
    # it narrows what is checked and must say so in the adapter's documentation;
    # ``drop_window: int``, the window an engine drops behind by itself before each step
    # (its appends ``admits`` only once that drop is done): the random driver draws
    # ``drop_behind_window`` with it, and ``prove``'s exploration tries it;
    # ``cyclic_window: int``, a sliding window of that many tokens (a multiple of the block
    # size: ``W`` blocks) over which the engine's tables reuse their blocks cyclically
    # (vLLM's BlockSpaceManager v1): only a table's last ``W`` entries hold references, the
    # ones before read as ``None``/``NULL``; the oracle stamps ``W`` on every operation
    # (``Op.cycle``), so allocate takes at most ``W`` blocks and an append at a boundary
    # past the window is checked as the drop behind it, then the append
    # (``spec.contracts.cyclic_pre``); a ``SeedAdapter`` forwards the attribute;
    # ``hidden_table(seq) -> Sequence[int]``, the table as the engine itself holds it where
    # that says more than ``block_table`` (a cyclic window's stale names): exploration keys
    # its states by it too, so states that differ only there are expanded apart;
    # ``retries_refused: bool``, an engine whose scheduler keeps a refused request waiting
    # and tries it again: the prefix model's driver draws a refused allocation again (same
    # id and prompt) as the next allocation.

    def num_free(self) -> int:
        """The allocator's own count of free blocks (cheap). The spec holds it to
        the length of ``free_blocks`` (invariant ``num_free_agrees``)."""

    def table_identity(self, seq: int) -> object | None:
        """The object holding ``seq``'s table: two sequences share a table
        exactly when they return the very same object (``None`` if not
        observable, or if the table cannot be rewritten through another
        sequence, so it never aliases). A hashable value with its own
        equality (an int, a string, a tuple: a handle) is compared by value
        instead: equal handles name one shared table. ``SeedAdapter`` returns
        the table object itself, or ``None`` for an immutable table (a tuple,
        any such value: see ``is_value``)."""

    def seq_len(self, seq: int) -> int | None:
        """The allocator's own token count for ``seq`` (``None`` if not kept)."""

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the allocator's out-of-blocks signal."""

    # Optional: ``is_refusal(exc) -> bool``, whether ``exc`` is a deliberate refusal under
    # a policy the allocator declares (a watermark, blocks held back for sibling beams, a
    # lookahead cap): allowed although blocks are free, but it must change nothing (the
    # ``refused`` contract), and the run goes on. ``SeedAdapter``: an exception whose class
    # is named ``Refused``.


class NotSeedShaped(TypeError):
    """The object lacks what a seed-shaped allocator has (``tables``, ``ref``, ``free``)."""


def is_value(obj: object) -> bool:
    """Whether ``obj`` is a hashable value with its own equality (an int, a string,
    a tuple, a frozen record): equal values are interchangeable, and by Python's
    convention (a hash must not change) such an object is immutable."""
    cls = type(obj)
    return cls.__eq__ is not object.__eq__ and cls.__hash__ is not None


def named_refusal(exc: BaseException) -> bool:
    """Default refusal: any exception whose class (or a base) is named ``Refused``."""
    return any(cls.__name__ == "Refused" for cls in type(exc).__mro__)


def named_out_of_blocks(exc: BaseException) -> bool:
    """Default signal: any exception whose class (or a base) is named ``OutOfBlocks``."""
    return any(cls.__name__ == "OutOfBlocks" for cls in type(exc).__mro__)


# How a seed-shaped allocator's code names each read (``SeedAdapter.spelling``).
_SPELLING = {"block_table": "tables[{}]", "table_identity": "tables[{}]", "refcount": "ref[{}]",
             "free_blocks": "free", "num_free": "len(free)", "seq_len": "lens[{}]"}


class SeedAdapter:
    """Adapts a seed-shaped allocator (see module docstring) to ``Target``."""

    def __init__(
        self,
        impl: object,
        num_blocks: int,
        block_size: int,
        out_of_blocks: type[BaseException] | None = None,
    ):
        missing = [a for a in ("tables", "ref", "free") if not hasattr(impl, a)]
        if missing:
            raise NotSeedShaped(
                f"{type(impl).__name__} is not seed-shaped: missing attribute(s) {', '.join(missing)}"
            )
        self.impl: Any = impl  # seed-shaped (see the module docstring): read by duck typing
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.capabilities = frozenset(op for op in OPERATIONS if callable(getattr(impl, op, None)))
        self._oob = out_of_blocks
        for name in OPERATIONS:  # bound methods: the oracle calls these on its hot path
            setattr(self, name, getattr(impl, name, None))
        window = getattr(impl, "cyclic_window", None)
        if window is not None:  # (a declaration the oracle reads: see Target)
            self.cyclic_window = window
        hidden = getattr(impl, "hidden_table", None)
        if callable(hidden):  # (exploration's key: see Target)
            self.hidden_table = hidden

    def block_table(self, seq: int) -> Sequence[int]:
        table: Sequence[int] = self.impl.tables[seq]
        return table

    def refcount(self, block: int) -> int:
        """``ref[block]``; of a mapping (a dict, a defaultdict), a block it omits
        has refcount 0 (read with ``get``, so observing never inserts one)."""
        ref = self.impl.ref
        if type(ref) is list or not isinstance(ref, Mapping):
            count: int = ref[block]
        else:
            count = ref.get(block, 0)
        return count

    def refcounts(self) -> Sequence[int]:
        """Every block's refcount, in block order (one call for the whole pool)."""
        ref, n = self.impl.ref, self.num_blocks
        if type(ref) is list and len(ref) == n:
            return list(ref)
        if isinstance(ref, Mapping):
            get = ref.get
            return [get(b, 0) for b in range(n)]
        return [ref[b] for b in range(n)]

    def spelling(self, method: str, arg: object = None) -> str:
        """The allocator's own spelling of a read, for messages: ``ref[3]``, ``tables[2]``."""
        return _SPELLING.get(method, method + "()").format(arg)

    def free_blocks(self) -> Iterable[int]:
        free: Iterable[int] = self.impl.free
        return free

    def num_free(self) -> int:
        return len(self.impl.free)

    def table_identity(self, seq: int) -> object | None:
        """The table object itself: a list is compared by identity. An immutable
        table (a tuple, see ``is_value``) cannot be rewritten through another
        sequence, so it never aliases, even when two sequences hold equal (or
        the very same) tuples: no identity (None)."""
        table = self.impl.tables[seq]
        return table if type(table) is list or not is_value(table) else None

    def seq_len(self, seq: int) -> int | None:
        lens = getattr(self.impl, "lens", None)
        return None if lens is None else lens[seq]

    def is_refusal(self, exc: BaseException) -> bool:
        return named_refusal(exc)

    def is_out_of_blocks(self, exc: BaseException) -> bool:
        if self._oob is not None:
            return isinstance(exc, self._oob)
        return named_out_of_blocks(exc)


def is_target(obj: object) -> bool:
    """Whether ``obj`` already speaks the ``Target`` protocol."""
    return all(
        callable(getattr(obj, name, None))
        for name in ("block_table", "refcount", "free_blocks", "num_free", "is_out_of_blocks")
    ) and hasattr(obj, "capabilities")


Factory = Callable[[int, int], Target]
