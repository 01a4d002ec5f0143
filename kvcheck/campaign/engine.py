"""What an engine target accepts: learnt once, when a campaign of the engine model starts.

An engine target refuses some settings (``kvcheck verify-engine`` says so in one line and
exits 2): nano-vllm has no speculative decoding, no priority scheduling, no prefix caching
off and no block size 1; vLLM v0 drives no speculative decoding, and an old release's
chunked prefill is not modelled with prefix caching; a vLLM v1 release before 0.8.0 takes no
drafts, one before 0.9.2 no priority; an engine that admits a prompt whole (nano-vllm, v0
without chunked prefill) refuses a max_model_len above the token budget. A campaign never
draws a run the target refuses (``kvcheck.campaign.plan.accepted``), so before its first run
it builds the target at verify-engine's defaults with each drawable value alone
(``plan.ENGINE``, and a max_model_len within and above the budget) and keeps the values the
target accepted (``Settings.accepts``, saved with the campaign: a resumed campaign draws
the same runs without learning again), and whether it admits a request whole (it declares
``longest_request``: its prompt and output must fit the budget, or max_model_len).

Building runs target code, which the campaign's own process never runs: ``learn`` builds in
a forked child. Only the target's own refusal (``TargetError`` from
``kvcheck.models.engine.loading.build``) counts as a refusal; a target that cannot be
imported, refuses verify-engine's defaults with prefix caching on and off, hangs or ends the
child is bad input (``UsageError``, one line), never a different draw: the values drawn do
not depend on time.
"""

from __future__ import annotations

import os
import signal
import sys

from kvcheck.campaign.plan import ENGINE, RUN, Settings

PER_BUILD = 5.0  # seconds beyond twice the timeout a build may take before the child is killed


def probes() -> list[tuple[str, object, dict]]:
    """``(setting, value, scope changes)``: each build the probe makes beyond the base (a
    budget with at most as many sequences, as a run draws them)."""
    d = RUN["engine"]
    out: list[tuple[str, object, dict]] = []
    for name, values in ENGINE.items():
        for v in values:
            change = {name: v}
            if name == "budget":
                change["max_seqs"] = min(d["max_seqs"], v)
            elif name == "max_seqs":
                change["budget"] = max(d["budget"], v)
            out.append((name, v, change))
    out.append(("max_model_len", "within", {"max_model_len": d["budget"]}))
    out.append(("max_model_len", "any", {"max_model_len": 2 * d["budget"]}))
    return out


def probe(target: str, timeout: float | None, beat=lambda: None) -> dict:
    """In this process: the settings ``target`` accepts (``Settings.accepts``); ``beat()``
    is called before each build. ``UsageError`` where the target cannot be run at all."""
    import dataclasses

    from kvcheck.check.watchdog import OperationTimeout, Watchdog
    from kvcheck.errors import UsageError
    from kvcheck.models.engine.loading import build, resolve
    from kvcheck.models.engine.model import EngineScope
    from kvcheck.targets.loading import TargetError

    d = RUN["engine"]
    base = EngineScope(d["num_blocks"], d["block_size"], d["budget"], d["max_seqs"])

    built = []  # the last target built (only the base's is read: ``whole``)

    def builds(scope) -> bool:
        beat()
        try:
            with Watchdog(timeout):
                built[:] = [build(factory, scope)]
        except TargetError:
            return False
        return True

    try:
        beat()
        with Watchdog(timeout):
            resolved = resolve(target)
        if resolved is None:
            raise UsageError(f"{target}: not an engine target")
        factory = resolved[1]
        if not builds(base):
            base = dataclasses.replace(base, caching=False)
            if not builds(base):
                with Watchdog(timeout):
                    build(factory, dataclasses.replace(base, caching=True))  # its own words
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    except OperationTimeout as exc:
        raise UsageError(f"building {target} to learn what it accepts {exc}") from None
    # an engine that admits a request whole (neither chunks a prefill nor stops a request
    # at a length) declares the longest it takes (``kvcheck.models.engine.model.fits``)
    whole = bool(getattr(built[-1], "longest_request", 0))
    accepts: dict = {name: [] for name in ENGINE}
    model_len = []
    for name, value, change in probes():
        if not builds(dataclasses.replace(base, **change)):
            continue
        if name == "max_model_len":
            model_len.append(value)
        else:
            accepts[name].append(value)
    accepts["max_model_len"] = "any" if "any" in model_len else (
        "within" if model_len else "none")
    for name in ENGINE:
        if not accepts[name]:
            raise UsageError(f"{target} refuses every {name} a campaign draws "
                             f"({', '.join(map(str, ENGINE[name]))}) at verify-engine's defaults")
    accepts["whole"] = whole
    return accepts


def _child(conn, target: str, timeout: float | None, log: str | None) -> None:
    code = 0
    try:
        from kvcheck.check.processes import die_with_parent

        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the campaign's Ctrl-C is the parent's
        fd = os.open(log or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)  # the target's output goes to the log
        os.dup2(fd, 2)
        from kvcheck.errors import UsageError, describe_exception

        try:
            conn.send(("accepts", probe(target, timeout, lambda: conn.send(("beat", None)))))
        except UsageError as exc:
            conn.send(("error", str(exc)))
        except Exception as exc:  # noqa: BLE001 - a bug in kvcheck: one line, never a traceback
            conn.send(("error", f"internal error while learning what {target} accepts: "
                                f"{describe_exception(exc)}"))
        conn.close()
    except BaseException:  # noqa: BLE001 - the parent sees no answer
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def learn(settings: Settings, log: str | None = None) -> dict:
    """The settings the campaign's target accepts, learnt in a forked child (its output
    appended to ``log``); ``UsageError`` (one line) where it cannot be learnt."""
    import multiprocessing

    from kvcheck.errors import UsageError

    ctx = multiprocessing.get_context("fork")
    conn, w = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    proc = ctx.Process(target=_child, args=(w, settings.target, settings.timeout, log),
                       daemon=True)
    proc.start()
    w.close()
    wait = 2 * (settings.timeout or 10.0) + PER_BUILD
    try:
        while True:
            if not conn.poll(wait):
                proc.kill()
                raise UsageError(f"building {settings.target} to learn what it accepts: no "
                                 f"answer within {wait:g} s (twice the timeout plus "
                                 f"{PER_BUILD:g} s); the child was killed")
            try:
                kind, data = conn.recv()
            except (EOFError, OSError):
                proc.join()
                raise UsageError(f"building {settings.target} to learn what it accepts ended "
                                 f"the process (exit status {proc.exitcode})") from None
            if kind == "accepts":
                return data
            if kind == "error":
                raise UsageError(data)
    finally:
        conn.close()
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
