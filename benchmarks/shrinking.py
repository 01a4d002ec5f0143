"""Shrinking's focus and the checker's fast copies: what a shrink and an exploration cost
with them and without them, alternated in one run.

A violation ``kvcheck verify`` finds after hundreds of random operations is shrunk by
replaying smaller candidates in full mode. The first candidate is now the run cut to
what its last operation can depend on (``BlocksModel.focus``: its sequences and those
sharing blocks with them); where that fails the same way, the greedy passes start from
it instead of the whole run. Exploration (``kvcheck.check.explore``, which shrinking also
runs to prove a trace shortest) copies the target and the oracle at every edge; the
copies are now made by ``kvcheck.check.copies.deep_copy`` (``copy.deepcopy``'s result, one
C-level copy per container of plain values). *Without* (``focus`` returning None and
``copy.deepcopy`` in the clones, for the session) is the earlier code path exactly.

Two parts, each side timed by this process's CPU time, the two sides alternated
(without, with, with, without, ...) ``--repeat`` times, the best of each side shown:

* ``corpus``: ``verify`` of every corpus entry (``tests/corpus/buggy.py``) at its
  defaults, shrinking on: the seconds to the shrunk counterexample, summed, and the
  entries whose shrink gained most. Both sides must find the same violations (the script
  stops with an error otherwise); the focus may lead a shrink to another trace as short
  (the operations in all are printed);
* ``explore``: a breadth-first exploration of the bundled reference (``--explore-scope``
  blocks, block size, sequences, tokens, depth): operations explored per second (both
  sides must explore as many).

    python3 benchmarks/shrinking.py
    python3 benchmarks/shrinking.py --parts explore --repeat 3
"""

from __future__ import annotations

import copy
import sys
import time

from full_mode import With, alternate, corpus, verify_seconds

from kvcheck.cli.commands.common import OneLineParser, positive_int

CLONES = ("kvcheck.models.blocks.oracle", "kvcheck.models.prefix.oracle",
          "kvcheck.models.hybrid.oracle", "kvcheck.models.scheduler.oracle")


class Without:
    """The session without the focus and with ``copy.deepcopy`` in every clone."""

    def __enter__(self):
        import importlib

        from kvcheck.models.blocks.model import BlocksModel

        self.saved = [(BlocksModel, "focus", BlocksModel.focus)]
        BlocksModel.focus = lambda self, ops: None
        for name in CLONES:
            module = importlib.import_module(name)
            self.saved.append((module, "deep_copy", module.deep_copy))
            module.deep_copy = copy.deepcopy

    def __exit__(self, *exc):
        for owner, name, value in self.saved:
            setattr(owner, name, value)


def explore_rate(scope: tuple) -> tuple[float, str]:
    from kvcheck.models.blocks.runs import Scope, explore
    from kvcheck.targets.loading import resolve

    nb, bs, seqs, tokens, depth = scope
    _, factory = resolve("reference")
    start = time.process_time()
    r = explore(factory, Scope(num_blocks=nb, block_size=bs, seqs=seqs, max_tokens=tokens,
                               depth=depth), timeout=None)
    seconds = time.process_time() - start
    if r.violation is not None or not r.complete:
        sys.exit(f"the reference's exploration did not pass: {r.violation}")
    return r.explored / seconds, f"{r.explored} operations, {r.distinct} states"


def per_entry(entries: list[str]) -> dict:
    """Each entry's CPU seconds on each side (one alternated pair)."""
    got: dict = {}
    for side in (Without, With):
        with side():
            for name in entries:
                got.setdefault(name, {})[side] = verify_seconds([name])[0]
    return got


def main(argv=None) -> int:
    p = OneLineParser(prog="benchmarks/shrinking.py", description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=("corpus", "explore"),
                   default=["corpus", "explore"])
    p.add_argument("--repeat", type=positive_int, default=2)
    p.add_argument("--entries", nargs="+", metavar="ENTRY",
                   help="corpus part: these entries only (default: every one)")
    p.add_argument("--explore-scope", nargs=5, type=positive_int, default=[6, 2, 3, 4, 5],
                   metavar=("BLOCKS", "BLOCK_SIZE", "SEQS", "TOKENS", "DEPTH"),
                   help="explore part: the scope (default: %(default)s)")
    p.add_argument("--top", type=int, default=5,
                   help="corpus part: show the entries whose shrink gained most (default: 5)")
    a = p.parse_args(argv)
    unknown = [e for e in a.entries or () if e not in corpus()]
    if unknown:
        p.error(f"unknown corpus entry {unknown[0]!r}")
    from kvcheck.verify import verify

    verify("reference", 16, 4, 50, 0, mode="full", do_shrink=False)  # warm up (imports, compiles)
    print("part     case                                     without      with   speed-up")
    if "corpus" in a.parts:
        entries = a.entries or sorted(corpus())
        lengths: dict = {}
        old, new = alternate(lambda: verify_seconds(entries, exact=False), a.repeat, False,
                             lengths, without=Without)
        label = "every entry" if not a.entries else f"{len(entries)} entries"
        print(f"corpus   {label + ' at defaults (s)':<40} {old:>9.2f} {new:>9.2f} "
              f"{old / new:>8.2f}x   (shrunk to {lengths[Without]} / {lengths[With]} "
              f"operations in all)", flush=True)
        if a.top > 0:
            got = per_entry(entries)
            gains = sorted(entries, key=lambda e: got[e][With] / got[e][Without])[:a.top]
            for e in gains:
                w, n = got[e][Without], got[e][With]
                print(f"corpus   {e + ' (s)':<40} {w:>9.3f} {n:>9.3f} {w / n:>8.2f}x",
                      flush=True)
    if "explore" in a.parts:
        scope = tuple(a.explore_scope)
        old, new = alternate(lambda: explore_rate(scope), a.repeat, True, without=Without)
        label = "reference {} x {}, {} seqs, {} tokens, depth {}".format(*scope)
        print(f"explore  {label + ' (ops/s)':<40} {old:>9.0f} {new:>9.0f} {new / old:>8.2f}x",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
