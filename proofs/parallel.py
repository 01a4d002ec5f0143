"""Independent Z3 queries answered by several processes at once.

The 1-induction (``kvcheck.proofs.induction``) asks one query per invariant, operation
kind and outcome, each independent of the others. ``Workers(answer, n)`` forks ``n``
worker processes the first time a batch has more than one query (each a copy of this one:
the encodings, the Z3 contexts built, in memory), and ``map(tasks)`` hands them the tasks
one at a time, as each worker finishes its last, returning ``answer(task)`` for every task
in order. A task is a small picklable tuple naming its query; ``answer`` must depend on
the task alone (not on what else the process asked before), so the verdicts are those of
asking in one process: only the time changes.

A worker that dies or answers what cannot be read is dropped and its task answered here;
with ``n`` = 1, no ``fork`` or a single task, everything is answered here. Workers die
with this process (``die_with_parent``) and are ended by ``close``.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Pipe, wait

from kvcheck.check.processes import cores, die_with_parent


class _Worker:
    def __init__(self, answer: Callable):
        self.conn, theirs = Pipe(duplex=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self.conn.close()
            _serve(theirs, answer)
        theirs.close()
        self.task: int | None = None  # the index of the task it is answering

    def end(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _serve(conn, answer: Callable) -> None:
    """A worker: answer each task sent, until the pipe closes; never returns."""
    code = 0
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is the parent's
        while True:
            try:
                task = conn.recv()
            except EOFError:
                break
            conn.send(answer(task))
    except BaseException:  # noqa: BLE001 - the parent answers the task itself
        code = 3
    finally:
        os._exit(code)


class Workers:
    """``answer`` on up to ``workers`` processes (default: one per core)."""

    def __init__(self, answer: Callable, workers: int | None = None):
        self.answer = answer
        self.wanted = cores() if workers is None else max(1, workers)
        self.workers: list[_Worker] | None = None  # forked at the first batch worth it

    def map(self, tasks: list) -> list:
        """``[answer(t) for t in tasks]``, the tasks answered at once where it pays."""
        if len(tasks) < 2 or self.wanted < 2 or not hasattr(os, "fork"):
            return [self.answer(t) for t in tasks]
        if self.workers is None:
            self.workers = []
            for _ in range(min(self.wanted, len(tasks))):
                try:
                    self.workers.append(_Worker(self.answer))
                except OSError:  # no more processes: those there are
                    break
        results: dict[int, object] = {}
        todo = list(range(len(tasks)))[::-1]  # popped from the end: in order
        busy: dict = {}  # connection -> worker
        while todo or busy:
            for w in self.workers:
                if w.task is None and todo:
                    i = todo.pop()
                    try:
                        w.conn.send(tasks[i])
                    except (OSError, pickle.PicklingError, TypeError, AttributeError):
                        results[i] = self.answer(tasks[i])
                        continue
                    w.task, busy[w.conn] = i, w
            if not busy:  # every worker gone: the rest here
                for i in reversed(todo):
                    results[i] = self.answer(tasks[i])
                todo = []
                break
            for conn in wait(list(busy)):
                w = busy.pop(conn)
                i, w.task = w.task, None
                try:
                    results[i] = conn.recv()
                except (EOFError, OSError, pickle.UnpicklingError, AttributeError, TypeError):
                    self.workers.remove(w)
                    w.end()
                    results[i] = self.answer(tasks[i])
        return [results[i] for i in range(len(tasks))]

    def close(self) -> None:
        for w in self.workers or ():
            w.end()
        self.workers = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
