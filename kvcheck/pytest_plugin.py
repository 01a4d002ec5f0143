"""kvcheck inside a user's own pytest suite (issue 35 §2): the ``kvcheck_verify`` fixture.

Registered through the ``pytest11`` entry point (``kvcheck``), so installing kvcheck is
enough::

    def test_my_allocator(kvcheck_verify):
        result = kvcheck_verify("myproject.alloc:MyBlockManager", blocks=16, ops=5_000)
        assert result.ops == 5_000   # (PASS: the result, for more assertions)

``kvcheck_verify(target, blocks=..., block_size=..., ops=..., seed=..., model=..., **kw)``
runs kvcheck's own checker (``kvcheck.verify.verify``: its seeded driver, its shrinker and
its explanation, the same as ``kvcheck verify``). On a FAIL it writes the shrunk trace and
fails the test with the explained counterexample, the seed and the commands that rerun
and replay it; a run that did not finish is never a pass. Keyword arguments beyond these
go to ``verify`` (``timeout``, ``out_of_blocks``, ``allow``, ``scope`` ...).

Options (each overrides the test's own value):

    --kvcheck-ops N          operations per run
    --kvcheck-seed N         the driver's seed (default: the test's, else 0: runs are
                             derandomised, the same on every machine); printed in the
                             report header and in every failure
    --kvcheck-trace-dir DIR  where failing runs' traces go (default: .kvcheck/traces under
                             pytest's rootdir)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvcheck", "kvcheck: model-checking KV-cache block managers")
    group.addoption("--kvcheck-ops", type=int, default=None, metavar="N",
                    help="operations per kvcheck_verify run (overrides the test's)")
    group.addoption("--kvcheck-seed", type=int, default=None, metavar="N",
                    help="the seed of every kvcheck_verify run (overrides the test's; default "
                         "the test's, else 0)")
    group.addoption("--kvcheck-trace-dir", default=None, metavar="DIR",
                    help="where kvcheck_verify writes a failing run's trace (default: "
                         ".kvcheck/traces under the rootdir)")


def pytest_report_header(config) -> str | None:
    seed, ops = config.getoption("kvcheck_seed"), config.getoption("kvcheck_ops")
    if seed is None and ops is None and config.getoption("kvcheck_trace_dir") is None:
        return None
    words = [f"seed {seed}" if seed is not None else "each test's seed (default 0)"]
    if ops is not None:
        words.append(f"{ops} operations per run")
    return f"kvcheck: {', '.join(words)}; traces in {_trace_dir(config)}"


def _trace_dir(config) -> Path:
    given = config.getoption("kvcheck_trace_dir")
    return Path(given) if given else Path(config.rootpath) / ".kvcheck" / "traces"


def _file_name(nodeid: str, seed: int, n: int) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[-120:] or "test"
    return f"{stem}-seed{seed}" + (f"-{n}" if n else "") + ".json"


@pytest.fixture
def kvcheck_verify(request):
    """Run ``kvcheck.verify.verify`` on a target; fail the test with the shrunk, explained
    counterexample (the trace written) on a FAIL. Returns the ``Result`` of a PASS."""
    config = request.config
    calls = [0]

    def run(target, *, blocks: int | None = None, block_size: int | None = None,
            ops: int | None = None, seed: int | None = None, model: str = "blocks", **kw):
        from kvcheck import defaults
        from kvcheck.report.text import render
        from kvcheck.targets.loading import TargetError
        from kvcheck.verify import verify

        run_defaults = defaults.RUN.get(model, defaults.RUN["blocks"])
        seed = config.getoption("kvcheck_seed") if config.getoption("kvcheck_seed") is not None \
            else (defaults.SEED if seed is None else seed)
        ops = config.getoption("kvcheck_ops") or ops or run_defaults.get("ops", 10_000)
        blocks = blocks or run_defaults["num_blocks"]
        block_size = block_size or run_defaults["block_size"]
        try:
            result = verify(target, blocks, block_size, ops, seed, model=model, **kw)
        except TargetError as exc:
            pytest.fail(f"kvcheck: bad target: {exc}", pytrace=False)
        request.node.user_properties.append(("kvcheck_seed", seed))
        if result.verdict == "pass" and result.ops < ops and kw.get("deadline") is not None:
            pytest.fail(f"kvcheck: INCONCLUSIVE: {result.ops} of {ops} operations ran before "
                        f"the deadline on {target} (seed {seed}): not a pass", pytrace=False)
        if result.verdict == "pass":
            return result
        trace = result.trace
        where = _trace_dir(config)
        path = where / _file_name(request.node.nodeid, seed, calls[0])
        calls[0] += 1
        written = ""
        try:
            where.mkdir(parents=True, exist_ok=True)
            trace.write(path)
            written = str(path)
        except OSError as exc:
            note = f"(the trace could not be written to {path}: {exc.strerror or exc})"
        text = render(trace, source=written or None)
        rerun = f"pytest {request.node.nodeid} --kvcheck-seed {seed}"
        tail = [f"kvcheck: FAIL on {target} at seed {seed} ({result.original_length} operations, "
                f"shrunk to {len(trace.ops)})",
                f"  rerun:  {rerun}"]
        if not written:  # (render says how to replay a written trace)
            tail.append(f"  {note}")
        pytest.fail(text + "\n" + "\n".join(tail), pytrace=False)

    return run
