"""What a campaign found, kept in its ``--out`` directory: resumable, merged, reported.

The directory holds

* ``campaign.json``: the state (settings, the plan its runs are drawn by, the next run
  number, the tallies, the total coverage, every signature with its shortest trace),
  rewritten atomically after every run, so that a second ``kvcheck campaign`` with the
  same ``--out`` continues where it stopped;
* ``runs.jsonl``: one line per run: its parameters, the command that re-runs it, its
  verdict, operations, seconds, coverage, and its signature if it failed;
* ``traces/<id>.json`` and ``traces/<id>.html``: each signature's shortest trace, in the one
  trace format (``kvcheck replay``, ``kvcheck report``), written as it is found, and its
  page, drawn with the reports;
* ``summary.json``, ``junit.xml`` (one test case per signature) and ``index.html`` (linking
  every trace's page), written at the end of each session.

A *signature* groups violations that are the same bug: the model, the broken clause (its
kind and name, as the spec names it) and the operation kinds of the shrunk trace.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import time
from pathlib import Path

from kvcheck.campaign import coverage as cov
from kvcheck.campaign.plan import PLAN, RunSpec, Settings, show_duration
from kvcheck.check.trace import Trace, TraceError
from kvcheck.errors import UsageError

FORMAT, VERSION = "kvcheck.campaign", 1
SUMMARY_FORMAT = "kvcheck.campaign-summary"
TALLIES = ("started", "completed", "passed", "failed", "cut", "refused", "errors")
SAME = ("target", "model", "seed", "out_of_blocks", "block_manager")  # what a resume must share


def signature(model: str, violation: dict, trace: dict | None) -> tuple[str, str, list[str]]:
    """``(id, text, operation kinds)`` of a failure: the model, the clause, the kinds of the
    shrunk trace's operations."""
    ops = (trace or {}).get("ops", [])
    shrunk = not (trace or {}).get("minimality", "").startswith("not shrunk")
    # an unshrunk trace (the target ended the process) says only what was in flight
    kinds = sorted({op["op"] for op in ops}) if shrunk else [ops[-1]["op"]] if ops else []
    text = f"{model} | {violation['kind']} | {violation['name']} | {'+'.join(kinds) or '-'}"
    slug = re.sub(r"[^a-z0-9]+", "-", violation["name"].lower()).strip("-")[:40] or "violation"
    return f"{slug}-{hashlib.sha1(text.encode()).hexdigest()[:8]}", text, kinds


def _write(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all (a rename over the old file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Store:
    """The ``--out`` directory of one campaign (see the module doc)."""

    def __init__(self, out: str | os.PathLike, settings: Settings):
        self.dir = Path(out)
        self.settings = settings
        self.state = {"format": FORMAT, "version": VERSION, "settings": settings.to_json(),
                      "plan": PLAN, "next_run": 0, "runs": dict.fromkeys(TALLIES, 0), "ops": 0,
                      "run_seconds": 0.0, "seconds": 0.0, "coverage": {}, "capabilities": None,
                      "signatures": {}, "sessions": [], "bad_input": None}
        self.resumed = False
        self.previous: dict = {}  # the settings a resumed campaign was saved with
        self.made_dir = False  # this session created the directory itself

    # -- opening ---------------------------------------------------------------------
    def open(self) -> Store:
        """Create the directory, or take up the campaign it holds (``UsageError`` if it
        holds another campaign, or something that is not one)."""
        path = self.dir / "campaign.json"
        if self.dir.exists() and not self.dir.is_dir():
            raise UsageError(f"--out {self.dir}: not a directory")
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UsageError(f"--out {self.dir}: campaign.json cannot be read ({exc}); "
                                 f"use another --out") from None
            if not isinstance(old, dict) or old.get("format") != FORMAT or \
                    old.get("version") != VERSION or not isinstance(old.get("settings"), dict):
                raise UsageError(f"--out {self.dir}: campaign.json is not a kvcheck campaign's "
                                 f"state; use another --out")
            mine, theirs = self.settings.to_json(), old["settings"]
            self.previous = theirs
            for k in SAME:
                if theirs.get(k) != mine[k]:
                    raise UsageError(f"--out {self.dir} holds a campaign with {k} "
                                     f"{theirs.get(k)!r}, not {mine[k]!r}: use another --out "
                                     f"to start a new campaign")
            old["settings"] = mine
            old.setdefault("plan", 1)  # begun before run 0 was the command's defaults
            if old["plan"] not in range(1, PLAN + 1):
                raise UsageError(f"--out {self.dir}: the campaign there draws its runs by plan "
                                 f"{old['plan']!r}, which this kvcheck does not know; use "
                                 f"another --out")
            self.state.update(old)
            self.resumed = True
        else:
            self.made_dir = not self.dir.exists()
            try:
                (self.dir / "traces").mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"--out {self.dir}: cannot create it ({exc.strerror or exc})") \
                    from None
        (self.dir / "traces").mkdir(exist_ok=True)
        try:
            self.save()
        except OSError as exc:
            raise UsageError(f"--out {self.dir}: cannot write there ({exc.strerror or exc})") \
                from None
        return self

    def discard(self) -> None:
        """Remove what this session wrote into a directory it did not resume (a campaign that
        never ran at all: bad input), so that the same ``--out`` serves the corrected command."""
        if self.resumed:
            return
        for name in ("campaign.json", "runs.jsonl", "summary.json", "junit.xml", "index.html",
                     "workers.log"):
            try:
                (self.dir / name).unlink()
            except OSError:
                pass
        for d in (self.dir / "traces", *((self.dir,) if self.made_dir else ())):
            try:
                d.rmdir()  # only when empty
            except OSError:
                pass

    @property
    def plan(self) -> int:
        """How this campaign draws its runs (``kvcheck.campaign.plan.PLAN``)."""
        return self.state["plan"]

    @property
    def next_run(self) -> int:
        return self.state["next_run"]

    def take(self) -> int:
        """The next run's number (counted as started)."""
        n = self.state["next_run"]
        self.state["next_run"] = n + 1
        self.state["runs"]["started"] += 1
        return n

    def save(self) -> None:
        _write(self.dir / "campaign.json", json.dumps(self.state, indent=1) + "\n")

    # -- recording runs --------------------------------------------------------------
    def record(self, spec: RunSpec, result: dict, elapsed: float) -> dict | None:
        """Keep one finished (or cut) run; the signature entry when it failed and is a new
        signature or a shorter trace of one (``new`` says which), else None."""
        st, runs = self.state, self.state["runs"]
        verdict = result.get("verdict", "error")
        line = {"run": spec.run, "verdict": verdict, "ops": result.get("ops", 0),
                "seconds": round(result.get("seconds", 0.0), 3), "shape": spec.describe(),
                "command": spec.command(), "spec": spec.to_json(),
                "coverage": result.get("coverage")}
        for k in ("error", "process", "worker"):
            if result.get(k):
                line[k] = result[k]
        found = None
        if verdict in ("pass", "fail"):
            runs["completed"] += 1
            runs["passed" if verdict == "pass" else "failed"] += 1
            st["ops"] += int(result.get("ops", 0))
            st["run_seconds"] += float(result.get("seconds", 0.0))
            cov.merge(st["coverage"], result.get("coverage"))
            cov.merge_notes(st.setdefault("coverage_notes", {}), result.get("coverage_notes"))
            caps = result.get("capabilities")
            if caps is not None:
                st["capabilities"] = sorted(set(st["capabilities"] or ()) | set(caps))
            if result.get("vacuous"):  # the target's, so every run says the same
                st["vacuous"] = dict(result["vacuous"])
        elif verdict == "cut":
            runs["cut"] += 1
        elif verdict in ("refused", "bad-target"):
            runs["refused"] += 1
            if verdict == "bad-target":
                st["bad_input"] = result.get("error")
            elif st.get("bad_input") is None:
                st["last_refusal"] = result.get("error")
        else:
            runs["errors"] += 1
            st["last_error"] = result.get("error")
        if verdict == "fail" and result.get("violation"):
            found, line["signature"], line["length"] = self._signature(spec, result, elapsed)
        with open(self.dir / "runs.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        self.save()
        return found

    def _signature(self, spec: RunSpec, result: dict, elapsed: float):
        """Count a failure under its signature: (the event to report: a new signature or a
        shorter trace of one, else None; the signature's id; this trace's length)."""
        from kvcheck.check.model import model_named

        v, data = result["violation"], result.get("trace")
        sid, text, kinds = signature(spec.model, v, data)
        sigs = self.state["signatures"]
        entry = sigs.get(sid)
        length = len(data["ops"]) if data else None
        size = None
        if data:
            from kvcheck.check.trace import Trace

            try:
                size = model_named(spec.model).size(Trace.from_json(data).ops)
            except Exception:  # noqa: BLE001 - a trace the format refuses: keep its length
                size = length
        new = entry is None
        if new:
            entry = sigs[sid] = {"id": sid, "signature": text, "model": spec.model,
                                 "kind": v["kind"], "clause": v["name"],
                                 "op_kinds": kinds,
                                 "runs": 0, "first_run": spec.run,
                                 "found_after_s": round(elapsed, 3), "shortest": None}
        entry["runs"] += 1
        best = entry["shortest"]
        better = data is not None and (best is None or best["length"] is None or
                                       (size, length, spec.run) <
                                       (best["size"], best["length"], best["run"]))
        if better or best is None:
            entry["shortest"] = {"run": spec.run, "length": length, "size": size,
                                 "witness": v.get("witness", ""), "command": spec.command(),
                                 "shape": spec.describe(),
                                 "minimality": (data or {}).get("minimality", ""),
                                 "trace": f"traces/{sid}.json" if data else None,
                                 "html": f"traces/{sid}.html" if data else None}
            if data:
                self._write_trace(sid, data)
        event = {**entry, "new": new, "shorter": better and not new, "this_length": length}
        return (event if new or better else None), sid, length

    def _write_trace(self, sid: str, data: dict) -> None:
        """The trace now; its page with the reports (a signature's shortest trace may change
        many times in a session: its page is drawn once, and never delays a finding)."""
        path = self.dir / "traces" / f"{sid}.json"
        try:  # (the target named portably, relative to the campaign's folder where a file)
            text = Trace.from_json(data).dumps_for(path)
        except TraceError:
            text = json.dumps(data, indent=1)
        _write(path, text + "\n")

    def _write_pages(self) -> None:
        """The page of every signature's trace that has none yet, or an older one."""
        for e in self.state["signatures"].values():
            sh = e["shortest"]
            if not sh or not sh.get("trace"):
                continue
            path = self.dir / sh["trace"]
            page_path = path.with_suffix(".html")
            try:
                if page_path.exists() and page_path.stat().st_mtime_ns >= path.stat().st_mtime_ns:
                    continue
            except OSError:
                continue
            from kvcheck.check.trace import Trace
            from kvcheck.report.html import render_html

            try:
                page = render_html(Trace.load(path), source=str(path))
            except Exception as exc:  # noqa: BLE001 - the trace stays; the page says why
                page = f"<!DOCTYPE html><p>no page for this trace: {html.escape(str(exc))}</p>"
            _write(page_path, page)

    # -- sessions and the summary -----------------------------------------------------
    def end_session(self, session: dict) -> None:
        self.state["sessions"].append(session)
        self.state["seconds"] = round(self.state["seconds"] + session["seconds"], 3)
        self.save()

    def interrupted(self) -> bool:
        """Whether the last session was ended by the user (Ctrl-C)."""
        sessions = self.state["sessions"]
        return bool(sessions and sessions[-1].get("interrupted"))

    def verdict(self) -> str:
        """``fail`` (a signature), ``bad-input`` (the target cannot be run at all),
        ``interrupted`` (the last session was cut by Ctrl-C: never a pass), ``error``
        (kvcheck failed in a run), ``incomplete`` (no run completed: inconclusive) or
        ``pass``."""
        st, runs = self.state, self.state["runs"]
        if st["signatures"]:
            return "fail"
        if st.get("bad_input") or (not runs["completed"] and runs["refused"]):
            return "bad-input"
        if self.interrupted():
            return "interrupted"
        if runs["errors"]:
            return "error"
        if not runs["completed"]:
            return "incomplete"
        return "pass"

    def coverage(self) -> dict:
        model = self.settings.model
        if model in cov.NO_CLASSES:
            return {"classes": False, "note": cov.NO_CLASSES[model]}
        total = self.state["coverage"]
        caps = self.state["capabilities"]
        notes = self.state.get("coverage_notes") or {}
        never, impossible, na = cov.warnings(model, total, set(caps) if caps is not None else None,
                                             notes, self.settings.accepts)
        return {"classes": True, "total": {k: total.get(k, 0) for k in cov.classes(model)},
                "never": never, "not_offered": impossible, "not_applicable": na,
                "counterexample": [k for k in notes.get("counterexample", ()) if not total.get(k)]}

    def summary(self) -> dict:
        st = self.state
        seconds = st["seconds"]
        sigs = sorted(st["signatures"].values(), key=lambda e: (e["first_run"], e["id"]))
        out = []
        for e in sigs:
            s = e["shortest"]
            out.append({**{k: e[k] for k in ("id", "signature", "model", "kind", "clause",
                                              "op_kinds", "runs", "first_run", "found_after_s")},
                        "shortest": s,
                        "replay": f"kvcheck replay {self.dir / s['trace']}" if s["trace"] else None,
                        "rerun": s["command"]})
        return {"format": SUMMARY_FORMAT, "version": VERSION, "target": self.settings.target,
                "model": self.settings.model, "seed": self.settings.seed,
                "verdict": self.verdict(), "interrupted": self.interrupted(),
                "runs": dict(st["runs"]), "ops": st["ops"],
                "seconds": seconds,
                "ops_per_second": round(st["ops"] / seconds, 1) if seconds > 0 else 0.0,
                "sessions": st["sessions"], "signatures": out, "coverage": self.coverage(),
                **({"vacuous": st["vacuous"]} if st.get("vacuous") else {}),
                **({"error": st["bad_input"]} if st.get("bad_input") else {}),
                **({"last_refusal": st["last_refusal"]} if st.get("last_refusal") else {}),
                **({"last_error": st["last_error"]} if st.get("last_error") else {})}

    def write_reports(self) -> dict:
        """``summary.json``, ``junit.xml`` and ``index.html``; the summary."""
        self._write_pages()
        s = self.summary()
        _write(self.dir / "summary.json", json.dumps(s, indent=1) + "\n")
        _write(self.dir / "junit.xml", self._junit(s) + "\n")
        _write(self.dir / "index.html", self._index(s))
        return s

    def _junit(self, s: dict) -> str:
        from kvcheck.check.trace import Trace
        from kvcheck.report.junit import Case, Suite, junit_xml
        from kvcheck.report.text import render

        where = f"kvcheck campaign {s['target']}"
        cls = f"kvcheck.campaign.{s['model']}"
        cases = []
        for e in s["signatures"]:
            sh = e["shortest"]
            text = ""
            if sh["trace"]:
                try:
                    text = render(Trace.load(self.dir / sh["trace"]))
                except Exception as exc:  # noqa: BLE001 - the case still fails, saying why
                    text = f"(the trace could not be rendered: {exc})"
            text += (f"\n\nfound in {e['runs']} run(s), first run {e['first_run']}; shortest: "
                     f"run {sh['run']} ({sh['shape']})\nre-run: {sh['command']}\n"
                     + (f"replay: {e['replay']}\n" if e["replay"] else ""))
            cases.append(Case(cls, f"{e['kind']}: {e['clause']} [{'+'.join(e['op_kinds']) or '-'}]",
                              0.0, failure=f"{e['clause']}: {sh['witness']}", failure_type=e["kind"],
                              text=text))
        runs = s["runs"]
        words = (f"{runs['completed']} runs completed ({runs['passed']} passed, {runs['failed']} "
                 f"failed), {runs['cut']} cut, {runs['refused']} refused, {runs['errors']} errors; "
                 f"{s['ops']} checked operations")
        if not cases:
            verdict = s["verdict"]
            if verdict == "pass":
                cases.append(Case(cls, "campaign", s["seconds"], text=words))
            else:  # interrupted, incomplete, error: never shown as passed
                cases.append(Case(cls, "campaign", s["seconds"],
                                  skipped=f"no verdict ({verdict}): {words}"))
        return junit_xml([Suite(where, cases)], name=where)

    def _index(self, s: dict) -> str:
        def e(x) -> str:
            return html.escape(str(x))

        runs = s["runs"]
        rows = []
        for sig in s["signatures"]:
            sh = sig["shortest"]
            link = (f'<a href="{e(sh["html"])}">page</a> · <a href="{e(sh["trace"])}">trace</a>'
                    if sh["html"] else "no trace")
            rows.append(
                f"<tr><td><code>{e(sig['id'])}</code></td><td>{e(sig['kind'])}</td>"
                f"<td>{e(sig['clause'])}</td><td>{e(', '.join(sig['op_kinds']) or '-')}</td>"
                f"<td>{sig['runs']}</td><td>{e(sh['length'] if sh['length'] is not None else '-')}"
                f" (run {sh['run']})</td><td>{link}</td>"
                f"<td><code>{e(sh['command'])}</code></td></tr>")
        c = s["coverage"]
        if c["classes"]:
            crow = "".join(
                ("<tr class=\"never\">" if n == 0 else "<tr>") + f"<td>{e(k)}</td><td>{n}</td><td>"
                + ("not offered by the target" if k in c["not_offered"] else "")
                + (f"not applicable: {e(c['not_applicable'][k])}" if k in c.get(
                    "not_applicable", {}) else "")
                + ("only in a counterexample" if k in c.get("counterexample", ()) else "")
                + ("never occurred" if k in c["never"] else "") + "</td></tr>"
                for k, n in c["total"].items())
            ctext = (f"<table><tr><th>outcome class</th><th>occurred</th><th></th></tr>{crow}"
                     f"</table>")
        else:
            ctext = f"<p>{e(c['note'])}</p>"
        verdict = s["verdict"].upper()
        sigs = ("<table><tr><th>signature</th><th>kind</th><th>clause</th><th>operations</th>"
                "<th>runs</th><th>shortest</th><th>counterexample</th><th>re-run</th></tr>"
                + "".join(rows) + "</table>") if rows else "<p>No violation found.</p>"
        rate = f"{s['ops_per_second']:,.0f}"
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>kvcheck campaign: {e(s['target'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}}th{{background:#f4f4f4}}.never td{{background:#fff3cd}}
.verdict{{font-weight:bold}}.fail{{color:#b00020}}.pass{{color:#1b5e20}}code{{font-size:90%}}</style>
</head><body>
<h1>kvcheck campaign: {e(s['target'])}</h1>
<p class="verdict {e(s['verdict'])}">{e(verdict)}: {len(s['signatures'])} signature(s)</p>
<p>model {e(s['model'])} · seed {s['seed']} · {runs['completed']} runs completed
({runs['passed']} passed, {runs['failed']} failed), {runs['cut']} cut, {runs['refused']} refused,
{runs['errors']} errors · {s['ops']:,} checked operations in {e(show_duration(s['seconds']))}
({e(rate)}/s) over {len(s['sessions'])} session(s)</p>
<h2>Signatures</h2>
{sigs}
<h2>Coverage</h2>
{ctext}
<p><a href="summary.json">summary.json</a> · <a href="junit.xml">junit.xml</a> ·
<a href="runs.jsonl">runs.jsonl</a></p>
</body></html>
"""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
