"""What the oracle reports when an allocator breaks the spec."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Violation:
    """One broken rule at one step.

    kind: ``invariant`` (a state invariant), ``contract`` (an operation
    contract or step invariant), ``data`` (a sequence read back tokens that
    are not its own), ``crash`` (unexpected exception), ``hang`` (timeout),
    ``malformed`` (unobservable state or a result of the wrong shape).
    ``name`` is the invariant or clause; ``element`` the block or sequence;
    ``witness`` a sentence with the concrete numbers.
    """

    step: int
    kind: str
    name: str
    element: int | None = None
    witness: str = ""
    doc: str = ""
    details: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """What must stay the same for a smaller trace to count as the same bug."""
        return (self.kind, self.name)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Violation:
        return cls(**data)
