"""The public adapter kit: what a target over an engine needs, from one stable place.

An *engine adapter* is a class whose instances speak the ``Target`` protocol
(``kvcheck.targets.protocol``) over an engine's real allocator objects, and a factory
``make(num_blocks, block_size)`` that builds one; ``kvcheck verify path/to/file.py:make``
(or ``module:make``) checks it. Everything such an adapter needs from kvcheck is here,
re-exported (not copied) from where kvcheck's own adapters get it; the names in
``__all__`` are stable. ``docs/ADAPTERS.md`` ("Writing an adapter") walks through two,
and ``tests/core/test_layers.py`` holds those walkthroughs to this module: they import no
private name of kvcheck.

Running the engine's own code
    ``load(dist, files, stubs, entry)`` executes just the named module files of an engine
    (``Dist``: its distribution, version, top-level package and, with ``root``, the folder
    holding it, e.g. a site-packages) under an isolated name, answering every import those
    files make from ``files``, the ``stubs`` the adapter builds (``StubBuilder``: name each
    stand-in and the reason in the adapter's module docstring) and the ordinary imports;
    nothing named like the engine enters ``sys.modules``. ``Loaded[name]`` is a loaded
    module. ``require(dist)`` is the install folder (``ThirdPartyMissing`` if absent),
    ``is_installed``/``install_dir`` ask without raising; engines kvcheck knows are
    installed by ``kvcheck install ENGINE==VERSION`` into ``$KVCHECK_THIRDPARTY_DIR``
    (``ENV_DIR``) or ``~/.cache/kvcheck/thirdparty``. ``select(key, version)`` is the
    ``Dist`` a known engine's ``TARGET@VERSION`` loads (``None``: the engine installed in
    this environment when its version is in range, else the pinned one; ``PINNED``;
    ``INSTALLED``), ``installed(key)`` the environment's own engine or ``None``.
    ``stub_logger`` is the stand-in for a ``<pkg>.logger`` module; ``takes(function,
    name)`` whether a release's function has a parameter (features are detected by what
    the files have, never by the version string).

Engines kvcheck already knows
    ``kvcheck.engines.vllm_v1``: vLLM v1's ``FILES``, ``STUBS``, the ``Request`` and
    ``RequestStatus`` stand-ins, ``load``, ``build_manager``, ``computed_blocks`` and the
    adapter ``VllmV1Target`` to subclass or wrap (a plugin's behaviour on top of the
    engine's, the engine's operations unchanged).

Outcomes
    ``OutOfBlocks`` (the pool cannot serve the operation now; nothing changed),
    ``Refused`` (declined under a policy the engine declares although blocks are free;
    nothing changed: the spec's ``refused`` contract) and ``MisuseError`` (the caller broke
    an operation's precondition): raise these from an adapter, or answer
    ``is_out_of_blocks(exc)`` / ``is_refusal(exc)`` for the engine's own exceptions
    (``named_out_of_blocks`` / ``named_refusal``: the defaults, by class name).
    ``StandInGap``: raise it from a stand-in asked for what it does not give (a setting, a
    method of a stand-in worker): the run then ends with one line and exit 2, never a FAIL
    blamed on the engine. ``StandIn`` (a base class) and ``Settings`` (a namespace) raise
    it for any attribute they do not define.
    ``admits(op) -> bool`` declares the operations an engine can express only in part (an
    operation it does not admit is never issued, drawn, replayed or explored: say so in
    the adapter's documentation); ``capabilities`` (a subset of ``OPERATIONS``) the
    operations it has at all.

Copies
    An operation that makes the engine's worker copy blocks before the step writes reports
    them: ``append_slot`` returns ``(block, offset, cow_src)``; ``fork``, ``rebase`` and
    ``append_slots`` return a list of ``Copy`` ``(src, dst)`` pairs in the adapter's block
    ids (``copies`` turns the engine's pairs into them; empty or ``None``: none).

Observation (read, never trusted: compared against the spec)
    Every target: ``block_table(seq)``, ``refcount(block)``, ``free_blocks()``,
    ``num_free()``, ``table_identity(seq)``, ``seq_len(seq)`` (``Target``). A prefix cache
    adds ``cache_entries()`` (``(key, block)`` pairs), ``evictable_blocks()`` (cached,
    unreferenced blocks), ``free_list_blocks()`` (free blocks holding no key; optional
    ``num_evictable()``/``num_free_list()``), ``PREFIX_OBSERVATION``; a hybrid pool and a
    tiered cache their own public methods (``docs/hybrid.md``, ``docs/tiers.md``). The
    models read every target, kvcheck's own adapters included, through these methods only.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvcheck.impl.errors import MisuseError, OutOfBlocks, Refused, StandInGap
from kvcheck.impl.thirdparty._loader import (
    ENV_DIR,
    Dist,
    Loaded,
    Settings,
    StandIn,
    StubBuilder,
    ThirdPartyMissing,
    install_dir,
    is_installed,
    load,
    require,
    stub_logger,
    takes,
)
from kvcheck.impl.thirdparty.install import ENGINES, INSTALLED, PINNED, environment, select
from kvcheck.targets.protocol import (
    OPERATIONS,
    SeedAdapter,
    Target,
    named_out_of_blocks,
    named_refusal,
)

PREFIX_OBSERVATION = ("cache_entries", "evictable_blocks", "free_list_blocks")
"""The methods through which the prefix model reads a target's cache (``kvcheck verify-prefix``)."""

Copy = tuple[int, int]
"""One block copy the engine's worker makes before the step writes: ``(src, dst)``."""


def copies(pairs: Iterable[tuple[int, int]] | None, offset: int = 0) -> list[Copy]:
    """The engine's block copies as a ``Target`` reports them: ``(src, dst)`` pairs, each id
    the engine's less ``offset`` (vLLM v1's pool: 1, its null block)."""
    return [(int(src) - offset, int(dst) - offset) for src, dst in pairs or ()]


def installed(key: str) -> Dist | None:
    """The engine ``key`` (a row of ``kvcheck install --list``: ``vllm-v1``...) as installed in
    this Python environment, when its version is one kvcheck's adapter loads; else ``None``."""
    return environment(ENGINES[key])


__all__ = [
    "ENV_DIR", "INSTALLED", "OPERATIONS", "PINNED", "PREFIX_OBSERVATION", "Copy", "Dist",
    "Loaded", "MisuseError", "OutOfBlocks", "Refused", "SeedAdapter", "Settings", "StandIn",
    "StandInGap", "StubBuilder", "Target", "ThirdPartyMissing", "copies", "install_dir",
    "installed", "is_installed", "load",
    "named_out_of_blocks", "named_refusal", "require", "select", "stub_logger", "takes",
]
