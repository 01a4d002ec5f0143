"""Containers that index and journal their own contents, for incremental observation.

The reference prefix cache keeps its free list, evictable list and hash map in these
(drop-in subclasses of ``deque``, ``OrderedDict`` and ``dict``), so the prefix oracle's
fast mode can read one block's place in them in O(1) and learn which blocks changed
since its last read, whatever code (a subclass's bug included) changed them: the index
and the journal are kept by the container's own mutators, not by the allocator's logic.

``journal`` is a set shared by the containers of one allocator: every block whose
membership (or whose keys, for the map) changed is added to it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque


class JournaledDeque(deque):
    """A deque of block ids with a count per block (``counts``) and a change journal."""

    def __init__(self, iterable=(), journal: set | None = None):
        super().__init__(iterable)
        self.counts = Counter(self)
        self.journal = journal if journal is not None else set()
        self.journal.update(self.counts)

    def _add(self, x):
        self.counts[x] += 1
        self.journal.add(x)

    def _sub(self, x):
        c = self.counts[x] - 1
        if c:
            self.counts[x] = c
        else:
            del self.counts[x]
        self.journal.add(x)

    def append(self, x):
        super().append(x)
        self._add(x)

    def appendleft(self, x):
        super().appendleft(x)
        self._add(x)

    def extend(self, xs):
        xs = list(xs)
        super().extend(xs)
        for x in xs:
            self._add(x)

    def extendleft(self, xs):
        xs = list(xs)
        super().extendleft(xs)
        for x in xs:
            self._add(x)

    def insert(self, i, x):
        super().insert(i, x)
        self._add(x)

    def pop(self):
        x = super().pop()
        self._sub(x)
        return x

    def popleft(self):
        x = super().popleft()
        self._sub(x)
        return x

    def remove(self, x):
        super().remove(x)
        self._sub(x)

    def clear(self):
        self.journal.update(self.counts)
        super().clear()
        self.counts.clear()

    def __setitem__(self, i, x):
        old = self[i]
        super().__setitem__(i, x)
        self._sub(old)
        self._add(x)

    def __delitem__(self, i):
        old = self[i]
        super().__delitem__(i)
        self._sub(old)

    def __iadd__(self, xs):
        self.extend(xs)
        return self

    def __copy__(self):
        return type(self)(self, set(self.journal))

    def __deepcopy__(self, memo):
        return type(self)(self, set(self.journal))

    def __reduce__(self):
        return (type(self), (list(self),))


class JournaledOrderedDict(OrderedDict):
    """An ``OrderedDict`` keyed by block id that journals every block added or removed."""

    def __init__(self, journal: set | None = None):
        super().__init__()
        self.journal = journal if journal is not None else set()

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        self.journal.add(k)

    def __delitem__(self, k):
        super().__delitem__(k)
        self.journal.add(k)

    def pop(self, k, *default):
        if k in self:
            self.journal.add(k)
        return super().pop(k, *default)

    def popitem(self, last=True):
        k, v = super().popitem(last)
        self.journal.add(k)
        return k, v

    def setdefault(self, k, default=None):
        if k not in self:
            self.journal.add(k)
        return super().setdefault(k, default)

    def update(self, *args, **kw):
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def clear(self):
        self.journal.update(self)
        super().clear()

    def _copy(self):
        new = type(self)(set(self.journal))
        for k, v in self.items():
            OrderedDict.__setitem__(new, k, v)
        return new

    def __copy__(self):
        return self._copy()

    def __deepcopy__(self, memo):
        return self._copy()

    def __reduce__(self):
        return (_rebuild_ordered, (type(self), list(self.items())))


def _rebuild_ordered(cls, items):
    new = cls()
    for k, v in items:
        OrderedDict.__setitem__(new, k, v)
    return new


class JournaledMap(dict):
    """A key -> block map with the reverse index ``keys_of`` (block -> its keys, in
    insertion order) and a journal of every block that gained or lost a key."""

    def __init__(self, journal: set | None = None):
        super().__init__()
        self.keys_of: dict = {}
        self.journal = journal if journal is not None else set()

    def _drop(self, k, b):
        ks = self.keys_of.get(b)
        if ks is not None:
            try:
                ks.remove(k)
            except ValueError:
                pass
            if not ks:
                del self.keys_of[b]
        self.journal.add(b)

    def __setitem__(self, k, b):
        if k in self:
            self._drop(k, dict.__getitem__(self, k))
        super().__setitem__(k, b)
        self.keys_of.setdefault(b, []).append(k)
        self.journal.add(b)

    def __delitem__(self, k):
        b = dict.__getitem__(self, k)
        super().__delitem__(k)
        self._drop(k, b)

    def pop(self, k, *default):
        if k in self:
            b = super().pop(k)
            self._drop(k, b)
            return b
        return super().pop(k, *default)

    def popitem(self):
        k, b = super().popitem()
        self._drop(k, b)
        return k, b

    def setdefault(self, k, default=None):
        if k not in self:
            self[k] = default
        return dict.__getitem__(self, k)

    def update(self, *args, **kw):
        for k, b in dict(*args, **kw).items():
            self[k] = b

    def clear(self):
        self.journal.update(self.keys_of)
        super().clear()
        self.keys_of.clear()

    def _copy(self):
        new = type(self)(set(self.journal))
        for k, b in self.items():
            new[k] = b
        new.journal = set(self.journal)
        return new

    def __copy__(self):
        return self._copy()

    def __deepcopy__(self, memo):
        return self._copy()

    def __reduce__(self):
        return (_rebuild_map, (type(self), list(self.items())))


def _rebuild_map(cls, items):
    new = cls()
    for k, b in items:
        new[k] = b
    return new
