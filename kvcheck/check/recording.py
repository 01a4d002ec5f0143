"""The recording re-run: what a run tells, phase by phase and operation by operation, to
the process watching it (``kvcheck.check.watchdog.RECORDER``), so that a run the target
ends can say where; and how the watcher reads those records back.

A record is a dict: ``{"r": "phase", "name": ...}``, ``{"r": "op", "step", "text", "op"}``
before an operation runs, ``{"r": "done", "step", "text", "op"[, "violation"]}`` once it
returned (``violation`` when the run found one there: shrinking it may be what ends the
process). Every target built (phase ``build``) starts a run of its own: the search's,
then each replay while shrinking. The supervisor of ``kvcheck verify``
(``kvcheck.cli.supervise``) and a campaign's watched runs (``kvcheck.campaign.worker``)
both record and read them this way.
"""

from __future__ import annotations

import json


class Recorder:
    """Tells every phase and operation of a run as it happens (``send`` one record);
    ``model``: the operations' model (a function of no arguments returning it may stand
    in, for a model imported only when the first operation is told)."""

    def __init__(self, model):
        self._model = model
        self.step = 0

    def send(self, record: dict) -> None:
        raise NotImplementedError

    @property
    def model(self):
        m = self._model
        return m() if callable(m) and not hasattr(m, "op_to_json") else m

    def phase(self, name: str) -> None:
        if name == "build":  # a new target: a run of its own (the search's, or a replay)
            self.step = 0
        self.send({"r": "phase", "name": name})

    def op(self, op) -> None:
        model = self.model
        self.step += 1
        try:
            req = model.request(op) if op.kind in model.ops else op
            data, text = model.op_to_json(req), model.describe(req)
        except Exception:  # noqa: BLE001 - an operation of another model: its kind is enough
            data, text = None, op.kind
        self.send({"r": "op", "step": self.step, "text": text, "op": data})

    def outcome(self, op, violation) -> None:
        try:
            data = self.model.op_to_json(op)
        except Exception:  # noqa: BLE001 - an operation of another model
            data = None
        record = {"r": "done", "step": self.step, "text": op.kind, "op": data}
        if violation is not None:  # the run found it: shrinking may be what ends the process
            try:
                record["violation"] = json.loads(json.dumps(violation.to_json(), default=repr))
            except Exception:  # noqa: BLE001 - its kind and name are enough
                record["violation"] = {"step": violation.step, "kind": violation.kind,
                                       "name": violation.name}
        self.send(record)


def runs(records: list[dict]) -> list[list[dict]]:
    """The records, one list per target built (each build starts a run: the search's,
    then every replay while shrinking), keeping those with operations."""
    out: list[list[dict]] = [[]]
    for r in records:
        if r["r"] == "phase" and r["name"] == "build":
            out.append([])
        else:
            out[-1].append(r)
    return [run for run in out if any(r["r"] == "op" for r in run)]


def ops_of(run: list[dict], model) -> list:
    """Each operation of one run as requested, then with its outcome once it returned
    (records of operations ``model`` cannot read are passed over)."""
    ops: list = []
    for r in run:
        if r["r"] in ("op", "done") and r.get("op") is not None:
            try:
                op = model.op_from_json(r["op"])
            except Exception:  # noqa: BLE001 - not an operation of this model
                continue
            if r["r"] == "done" and ops:
                ops[-1] = op
            else:
                ops.append(op)
    return ops


def found(run_records: list[list[dict]]) -> dict | None:
    """The violation the search's run recorded, when a later run (a replay while shrinking
    it) is what ended the process; else None."""
    if len(run_records) < 2:
        return None
    return next((r["violation"] for r in run_records[0]
                 if r["r"] == "done" and r.get("violation")), None)
