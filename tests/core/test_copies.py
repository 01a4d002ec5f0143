"""``kvcheck.check.copies.deep_copy`` gives what ``copy.deepcopy`` gives.

Object graphs of the shapes allocators hold (lists, dicts, deques, tuples, sets, plain
objects, bound methods) and of shapes it hands to ``copy.deepcopy`` (slotted objects,
objects with their own ``__deepcopy__`` or ``__getstate__``, dict subclasses), with
sharing and cycles: both copies have the same shape, the same sharing, and nothing
mutable of the original."""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict, deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcheck.check.copies import ATOMIC, deep_copy, is_plain


class Plain:
    def method(self):
        return self


class PlainChild(Plain):
    pass


class Slotted:
    __slots__ = ("a", "b")


class OwnCopy:
    """Copies itself unfaithfully (drops ``dropped``): ``deep_copy`` must do as
    ``copy.deepcopy`` does, i.e. call it."""

    def __deepcopy__(self, memo):
        new = OwnCopy()
        new.kept = copy.deepcopy(self.kept, memo)
        return new


class OwnState:
    def __getstate__(self):
        return {"only": self.__dict__.get("x")}

    def __setstate__(self, state):
        self.__dict__.update(state)


def shape(x, seen=None):
    """``x`` as nested tuples, every mutable object numbered by first visit (so equal
    shapes mean equal values and equal sharing)."""
    if seen is None:
        seen = {}
    if type(x) in ATOMIC:
        return ("atom", repr(x))
    if id(x) in seen:
        return ("seen", seen[id(x)])
    seen[id(x)] = len(seen)
    name = type(x).__name__
    if isinstance(x, dict):
        return (name, tuple((shape(k, seen), shape(v, seen)) for k, v in x.items()))
    if isinstance(x, (list, tuple, deque)):
        return (name, tuple(shape(e, seen) for e in x))
    if isinstance(x, (set, frozenset)):
        return (name, tuple(sorted(repr(shape(e, {})) for e in x)))
    if hasattr(x, "__func__"):
        return (name, x.__func__.__name__, shape(x.__self__, seen))
    if isinstance(x, Slotted):
        return (name, tuple(shape(getattr(x, a, None), seen) for a in Slotted.__slots__))
    return (name, shape(vars(x), seen))


def mutables(x, out=None):
    """Every mutable object reachable from ``x``, by id."""
    if out is None:
        out = {}
    if type(x) in ATOMIC or id(x) in out:
        return out
    if isinstance(x, (tuple, frozenset)):
        for e in x:
            mutables(e, out)
        return out
    out[id(x)] = x
    if isinstance(x, dict):
        for k, v in x.items():
            mutables(k, out)
            mutables(v, out)
    elif isinstance(x, (list, deque, set)):
        for e in x:
            mutables(e, out)
    elif hasattr(x, "__func__"):
        mutables(x.__self__, out)
    elif isinstance(x, Slotted):
        for a in Slotted.__slots__:
            mutables(getattr(x, a, None), out)
    elif hasattr(x, "__dict__"):
        mutables(vars(x), out)
    return out


atoms = st.one_of(st.none(), st.integers(-3, 40), st.booleans(), st.text(max_size=3),
                  st.floats(allow_nan=False), st.just(int), st.just(len))


@st.composite
def graphs(draw):
    """A graph with sharing and cycles: containers filled from a pool of earlier ones."""
    pool = []

    def some():
        if pool and draw(st.booleans()):
            return draw(st.sampled_from(pool))
        return draw(atoms)

    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["list", "dict", "deque", "tuple", "set", "frozenset",
                                     "plain", "child", "slotted", "own", "state", "method",
                                     "counter", "ordered"]))
        n = draw(st.integers(0, 4))
        if kind == "list":
            x = [some() for _ in range(n)]
        elif kind == "dict":
            x = {draw(atoms.filter(lambda a: a == a)): some() for _ in range(n)}
        elif kind == "deque":
            x = deque((some() for _ in range(n)), draw(st.sampled_from([None, 8])))
        elif kind == "tuple":
            x = tuple(some() for _ in range(n))
        elif kind in ("set", "frozenset"):
            elements = [draw(st.integers(0, 9)) for _ in range(n)]
            x = set(elements) if kind == "set" else frozenset(elements)
        elif kind in ("plain", "child"):
            x = Plain() if kind == "plain" else PlainChild()
            for i in range(n):
                setattr(x, f"f{i}", some())
        elif kind == "slotted":
            x = Slotted()
            x.a = some()
        elif kind == "own":
            x = OwnCopy()
            x.kept, x.dropped = some(), some()
        elif kind == "state":
            x = OwnState()
            x.x, x.y = some(), some()
        elif kind == "method":
            owners = [p for p in pool if isinstance(p, Plain)]
            x = (draw(st.sampled_from(owners)) if owners else Plain()).method
        elif kind == "counter":
            x = Counter({i: some() for i in range(n)})
        else:
            x = OrderedDict((i, some()) for i in range(n))
        pool.append(x)
        # a cycle now and then: an earlier list or plain object points back at this one
        for p in pool[:-1]:
            if isinstance(p, list) and draw(st.integers(0, 5)) == 0:
                p.append(x)
            elif type(p) is Plain and draw(st.integers(0, 5)) == 0:
                p.back = x
    return pool


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_deep_copy_is_deepcopy(pool):
    root = list(pool)
    expected, got = copy.deepcopy(root), deep_copy(root)
    assert shape(got) == shape(expected)
    original = mutables(root)
    shared = [x for i, x in mutables(got).items() if i in original]
    assert shared == [], f"the copy shares mutable objects with the original: {shared!r}"


def test_an_allocator_copies_whole_and_apart():
    """The reference's adapter: the copy runs apart from the original."""
    from kvcheck.targets.loading import build, resolve

    _, factory = resolve("reference")
    target = build(factory, 8, 2)
    target.allocate(0, 3)
    twin = deep_copy(target)
    assert twin.allocate.__self__ is twin.impl  # (bound methods follow the copy)
    twin.allocate(1, 4)
    twin.fork(0, 2)
    assert 1 not in target.impl.tables and 2 not in target.impl.tables
    assert shape(deep_copy(target)) == shape(copy.deepcopy(target))


def test_plain_classes():
    assert is_plain(Plain) and is_plain(PlainChild)
    for cls in (Slotted, OwnCopy, OwnState, Counter, OrderedDict, dict, list, ValueError):
        assert not is_plain(cls), cls


def test_a_reduction_registered_with_copyreg_is_used(monkeypatch):
    """A class whose instances copy through a ``copyreg`` reduction is not plain: the
    reduction runs, as under ``copy.deepcopy``."""
    import copyreg

    class Registered:
        pass

    monkeypatch.setitem(copyreg.dispatch_table, Registered, lambda obj: (Plain, ()))
    x = Registered()
    assert type(copy.deepcopy(x)) is Plain and type(deep_copy(x)) is Plain


def test_atomic_types_are_deepcopys():
    """``ATOMIC`` is what ``copy.deepcopy`` returns unchanged (its private table)."""
    assert ATOMIC == {t for t, f in copy._deepcopy_dispatch.items()
                      if f is copy._deepcopy_atomic}
