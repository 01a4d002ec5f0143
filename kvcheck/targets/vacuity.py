"""Which checks a verdict could not have made for a target: its vacuous invariants.

A target may declare ``vacuous``: a mapping from an invariant's name (``spec/invariants.py``,
``spec/prefix.py``) to why it holds by construction for this target (SGLang keeps no
refcounts: the adapter derives a page's count from the request rows naming it, so
``refcount_conservation`` cannot fail). Besides those, every contract of an operation
the target does not offer (``capabilities``) is vacuous: it is never issued (the
operations of the block-manager model, or those the target names as its model's in
``operations``: a tiers target's). The verdict
(text and ``--json``) lists both, so a PASS never reads as more than was checked.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvcheck.targets.protocol import OPERATIONS


def known_invariants() -> frozenset[str]:
    from kvcheck.spec.invariants import INVARIANTS
    from kvcheck.spec.prefix import PREFIX_INVARIANTS

    return frozenset(inv.name for inv in (*INVARIANTS, *PREFIX_INVARIANTS))


def declared(target: object) -> dict[str, str]:
    """The target's own ``vacuous`` mapping, each name checked against the spec's
    (``TargetError``, bad input, names one the spec does not have: a typo must not pass
    for a declaration)."""
    from kvcheck.targets.loading import TargetError

    decl = getattr(target, "vacuous", None)
    if not decl:
        return {}
    if not isinstance(decl, Mapping):
        raise TargetError(f"{type(target).__name__}.vacuous must map invariant names to reasons")
    known = known_invariants()
    for name in decl:
        if name not in known:
            raise TargetError(f"{type(target).__name__}.vacuous names {name!r}, which is no "
                              "invariant of the spec")
    return {str(k): str(v) for k, v in decl.items()}


NOT_OFFERED = "not offered by this target (never issued)"


def vacuous(target: object) -> dict[str, str]:
    """Everything vacuous for ``target``: its declared invariants, then the contracts of
    the operations it does not offer. Empty for a target that declares nothing (the
    not-offered operations are then already documented by its capabilities alone)."""
    out = declared(target)
    if not out:
        return {}
    caps = getattr(target, "capabilities", frozenset())
    for op in getattr(target, "operations", OPERATIONS):
        if op not in caps:
            out[op] = NOT_OFFERED
    return out


def of_result(result) -> dict[str, str]:
    """``vacuous`` for the target a ``kvcheck.verify.Result`` ran on ({} if unknown)."""
    state = getattr(result, "state", None)
    target = getattr(state, "target", None)
    return vacuous(target) if target is not None else {}


def line(vac: Mapping[str, str]) -> str:
    """One line for the text verdict."""
    ops = [k for k in vac if vac[k] == NOT_OFFERED]
    inv = [k for k in vac if k not in ops]
    parts = [f"{k} ({vac[k]})" for k in inv]
    if ops:
        parts.append(f"the contracts of {', '.join(ops)} (not offered)")
    return "VACUOUS for this target: " + "; ".join(parts)
