"""The specification, written once: state vocabulary, invariants, contracts.

Evaluated concretely by the runtime oracle (``kvcheck.oracle``),
symbolically by Z3 (``kvcheck.spec.symbolic``, ``kvcheck.proofs``) and as
contracts under CrossHair.
"""

from .contracts import CONTRACTS, Domain, Op, precondition
from .invariants import INVARIANTS, Invariant
from .logic import PY, PyLogic, Z3Logic

__all__ = ["CONTRACTS", "INVARIANTS", "PY", "Domain", "Invariant", "Op", "PyLogic", "Z3Logic",
           "precondition"]
