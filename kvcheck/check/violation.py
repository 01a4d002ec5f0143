"""What the checker reports when a target breaks the spec: structured data, rendered later.

A violation names the broken rule (``name``: an invariant or a contract
clause, exactly as the spec names it), the element it is about and what kind
of thing that is (``subject``: a block, a sequence), the spec's own terms the
clause reads with their values before and after the step (``terms``, see
``kvcheck.check.evidence``), the rule's wording from the spec's docstring
(``doc``) and a sentence with the concrete numbers (``witness``, which a
model writes from that data). Reporters (``kvcheck.report``) render it as
text, HTML or JSON; nothing downstream matches on clause names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

KINDS = ("invariant", "contract", "data", "crash", "hang", "malformed", "policy", "liveness")


@dataclass
class Violation:
    """One broken rule at one step.

    kind: ``invariant`` (a state invariant), ``contract`` (an operation
    contract or step invariant), ``data`` (a sequence read back tokens that
    are not its own), ``policy`` and ``liveness`` (a scheduler's), ``crash``
    (an unexpected exception, or the target ended the process), ``hang`` (a
    timeout), ``malformed`` (unobservable state or a result of the wrong shape).
    """

    step: int
    kind: str
    name: str
    element: int | None = None
    witness: str = ""
    doc: str = ""
    details: dict = field(default_factory=dict)
    subject: str | None = None  # what element names: "block", "seq" (None: nothing)
    terms: list[dict] = field(default_factory=list)  # [{"term": "ref(3)", "pre": 1, "post": 2}]

    @property
    def key(self) -> tuple[str, str]:
        """What must stay the same for a smaller trace to count as the same bug."""
        return (self.kind, self.name)

    def to_json(self) -> dict:
        d = asdict(self)
        if not d["terms"]:
            del d["terms"]
        if d["subject"] is None:
            del d["subject"]
        return d

    @classmethod
    def from_json(cls, data: dict) -> Violation:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
