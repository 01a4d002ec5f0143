"""``deep_copy``: ``copy.deepcopy``'s result, made faster for the plain data allocators hold.

Exploration and shrinking copy the target at every state they branch from
(``explore``: a clone per edge); ``copy.deepcopy`` spends most of that time in one
Python call per element: a refcount list of 32 integers is 33 calls. ``deep_copy``
copies the shapes allocators are made of in one step each, with the same result as
``copy.deepcopy``:

- a ``list``, ``dict`` (keys and values) or ``collections.deque`` whose elements are all
  of an atomic type (``int``, ``str``, ``None``...): one C-level copy;
- a ``tuple`` of atomic elements: itself (as ``copy.deepcopy`` returns it); a ``frozenset``
  of them: a new one built from its elements, as ``copy.deepcopy`` builds it;
- an instance of a plain class (Python classes down to ``object``, no ``__slots__``, no
  ``__deepcopy__``, ``__reduce__``, ``__reduce_ex__``, ``__getstate__``, ``__setstate__``
  or ``__getnewargs__`` of its own, no reduction registered with ``copyreg``):
  ``cls.__new__(cls)`` and its ``__dict__`` copied, as ``copy.deepcopy``'s default
  reduction does;
- a bound method: the same function bound to the copy of its object.

Anything else, and containers holding anything else element by element, go to
``copy.deepcopy`` with the same memo, so sharing and cycles are kept across both: an
object reached twice is copied once. A copy that does not behave like the original is
caught where it matters, by ``explore._copyable``'s faithfulness walk, as before.
"""

from __future__ import annotations

import copy
import copyreg
import types
import weakref
from collections import deque
from types import MethodType

# the types ``copy.deepcopy`` returns as they are (its ``_deepcopy_atomic``)
ATOMIC = frozenset({type(None), int, float, bool, complex, str, bytes, type, range,
                    type(Ellipsis), type(NotImplemented), types.CodeType,
                    types.BuiltinFunctionType, types.FunctionType, weakref.ref, property})
_CUSTOM = ("__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
           "__getnewargs__", "__getnewargs_ex__", "__slots__")
_plain: dict[type, bool] = {}


def is_plain(cls: type) -> bool:
    """Whether ``copy.deepcopy`` copies an instance of ``cls`` by its default reduction:
    a new instance with its ``__dict__`` copied (cached per class)."""
    got = _plain.get(cls)
    if got is None:
        mro = cls.__mro__
        got = (mro[-1] is object and type(cls) is type
               and cls not in copyreg.dispatch_table  # (a reduction registered for it)
               and all(c.__flags__ & (1 << 9)  # Py_TPFLAGS_HEAPTYPE: a class of Python code
                       and not any(name in c.__dict__ for name in _CUSTOM)
                       for c in mro[:-1]))
        _plain[cls] = got
    return got


def deep_copy(x, memo: dict | None = None):
    """``copy.deepcopy(x, memo)``, faster for the shapes the module doc names.

    Every object it copies itself is reachable from ``x`` for the whole call, so unlike
    ``copy.deepcopy`` it need not keep the originals alive in the memo (``copy.deepcopy``
    does, for the temporaries its reductions make, in what it is handed)."""
    if memo is None:
        memo = {}
    cls = type(x)
    if cls in ATOMIC:
        return x
    d = id(x)
    y = memo.get(d, memo)
    if y is not memo:
        return y
    if cls is dict:
        return _dict(x, d, memo)
    if cls is list:
        if _all_atomic(map(type, x)):
            y = x.copy()
        else:
            y = memo[d] = []
            y.extend(e if type(e) in ATOMIC else deep_copy(e, memo) for e in x)
    elif cls is tuple:
        if _all_atomic(map(type, x)):
            return x  # (``copy.deepcopy`` too returns a tuple of what it would not copy)
        return copy.deepcopy(x, memo)
    elif cls is frozenset and _all_atomic(map(type, x)):
        y = frozenset(list(x))  # (a new one, as ``frozenset.__reduce__`` builds it)
    elif cls is deque and _all_atomic(map(type, x)):
        y = deque(x, x.maxlen)
    elif cls is MethodType:
        y = MethodType(x.__func__, deep_copy(x.__self__, memo))
    elif is_plain(cls):
        y = memo[d] = cls.__new__(cls)
        state = x.__dict__
        if state:  # (as ``copy.deepcopy`` copies the state its reduction returns)
            s = id(state)
            got = memo.get(s, memo)
            y.__dict__.update(_dict(state, s, memo) if got is memo else got)
        return y
    else:
        return copy.deepcopy(x, memo)
    memo[d] = y
    return y


def _dict(x: dict, d: int, memo: dict) -> dict:
    """A plain dict's deep copy, memoised under ``d`` (its id)."""
    if _all_atomic(map(type, x.values())) and _all_atomic(map(type, x)):
        y = memo[d] = x.copy()
        return y
    y = memo[d] = {}
    for k, v in x.items():
        y[k if type(k) in ATOMIC else deep_copy(k, memo)] = \
            v if type(v) in ATOMIC else deep_copy(v, memo)
    return y


_all_atomic = ATOMIC.issuperset  # (of an iterable of types: one C-level pass)
