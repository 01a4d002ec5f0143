"""The compiled code of generated check functions, kept on disk between processes.

Every kvcheck process generates its check functions from the spec's text (``emit``) and
hands about 200 KB of Python to the interpreter's compiler: 0.05-0.07 s at each start of
a command, a campaign or a test's subprocess on the development machine. ``define(source, filename,
name)`` compiles ``source`` once per machine: the code object is kept, marshalled, under a
name that is the hash of the filename and the source text, for this interpreter's
bytecode version only (``importlib.util.MAGIC_NUMBER``). The key is the text itself, so a
changed spec, compiler or template can never be served stale code: it is other text.

Where: ``$KVCHECK_CODE_CACHE`` if set, else ``~/.cache/kvcheck/code``; ``off`` (or
``0``, or an empty value) compiles every time and writes nothing. A missing, unreadable
or unwritable directory, or a damaged entry, only costs the compile: an entry is written
to a temporary file and renamed into place, so a reader never sees half of one.

Generating the text is the larger part of a start (tracing the spec's clauses: about
0.06 s for the block manager's and the prefix cache's checks). ``generated(parts, make)``
keeps the text ``make()`` returns, under a key of ``parts`` (what it is generated from:
the generator's name and arguments) and a fingerprint of kvcheck's own source files, its
spec included (``fingerprint``: every ``.py`` file's path and bytes, and the interpreter's
version). Any change to any of them is another key, so the text can never be stale; an
argument from outside kvcheck (a model's contract in a user's module, whose file is not
in the fingerprint) makes ``generated`` call ``make`` every time. Each entry ends with the
hash of its text, checked on reading: a damaged one is generated again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import CodeType

ENV = "KVCHECK_CODE_CACHE"
OFF = ("", "0", "off")


def directory() -> Path | None:
    """Where this interpreter's entries are kept (None: the cache is off)."""
    env = os.environ.get(ENV)
    if env is not None:
        if env.strip().lower() in OFF:
            return None
        base = Path(env).expanduser()
    else:
        base = Path.home() / ".cache" / "kvcheck" / "code"
    return base / importlib.util.MAGIC_NUMBER.hex()


def _keep(where: Path, path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed into place);
    a directory that cannot be written keeps nothing."""
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # (not kept: the next process makes it again)


def code(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")``, from the cache when it holds it."""
    where = directory()
    if where is None:
        return compile(source, filename, "exec")
    digest = hashlib.sha256(f"{filename}\0{source}".encode()).hexdigest()
    path = where / digest
    try:
        got = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        got = None
    if type(got) is CodeType and got.co_filename == filename:
        return got
    got = compile(source, filename, "exec")
    _keep(where, path, marshal.dumps(got))
    return got


def roots() -> tuple[str, ...]:
    """The folders of kvcheck's own source: the package, and its spec where that is a folder
    of its own (an editable install maps ``kvcheck.spec`` to ``spec/``)."""
    import kvcheck
    import kvcheck.spec

    found = {os.path.dirname(os.path.abspath(m.__file__)) for m in (kvcheck, kvcheck.spec)}
    return tuple(sorted(r for r in found if not any(r.startswith(o + os.sep) for o in found)))


@cache
def fingerprint(folders: tuple[str, ...] | None = None) -> str | None:
    """A hash of every ``.py`` file under ``folders`` (default: ``roots()``), its path
    within its folder and its bytes, and of this interpreter's version; None if one cannot
    be read (then nothing generated is kept)."""
    h = hashlib.sha256(sys.version.encode())
    try:
        for i, root in enumerate(roots() if folders is None else folders):
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        path = os.path.join(dirpath, name)
                        with open(path, "rb") as f:
                            data = f.read()
                        h.update(f"{i}:{os.path.relpath(path, root)}:{len(data)}\0".encode())
                        h.update(data)
    except OSError:
        return None
    return h.hexdigest()


def ours(obj: object) -> bool:
    """Whether ``obj`` (a class or a function) is defined in kvcheck's own source (so the
    fingerprint covers it)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.abspath(path)
    return any(path.startswith(r + os.sep) for r in roots())


def named(obj: object) -> str | None:
    """``obj`` as a key part: its module and qualified name for a class or function of
    kvcheck's own (``ours``), None for anything else (not to be kept)."""
    if obj is None:
        return "None"
    if ours(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    return None


_END = "\n# kvcheck generated: sha256 "


def generated(parts: tuple, make: Callable[[], str]) -> str:
    """The text ``make()`` generates from ``parts`` (plain values: strings, numbers, None,
    tuples of them; ``named`` for a class or function), made once per machine and kept
    under a key of ``parts`` and ``fingerprint()``. A part that is None (see ``named``), a
    cache that is off or a fingerprint that cannot be taken: ``make()`` every time."""
    where = directory()
    if where is None or None in parts:
        return make()
    mark = fingerprint()
    if mark is None:
        return make()
    key = hashlib.sha256(f"{mark}\0{parts!r}".encode()).hexdigest()
    path = where / f"{key}.py"
    try:
        kept = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        kept = ""
    text, _, digest = kept.rpartition(_END)
    if digest.strip() == hashlib.sha256(text.encode()).hexdigest():
        return text
    text = make()
    _keep(where, path, f"{text}{_END}{hashlib.sha256(text.encode()).hexdigest()}\n".encode())
    return text


def define(source: str, filename: str, name: str, namespace: dict | None = None):
    """The function ``name`` that ``source`` defines, run in ``namespace`` (a new one if
    None): the one way generated checks are turned into functions."""
    namespace = {} if namespace is None else namespace
    exec(code(source, filename), namespace)  # noqa: S102 - source generated from the spec's text
    return namespace[name]
