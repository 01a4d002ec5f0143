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
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import tempfile
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
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(got))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # (not kept: the next process compiles it again)
    return got


def define(source: str, filename: str, name: str, namespace: dict | None = None):
    """The function ``name`` that ``source`` defines, run in ``namespace`` (a new one if
    None): the one way generated checks are turned into functions."""
    namespace = {} if namespace is None else namespace
    exec(code(source, filename), namespace)  # noqa: S102 - source generated from the spec's text
    return namespace[name]
