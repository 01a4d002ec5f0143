"""The engine model: an engine core (the engine's own scheduler with its own KV-cache
manager) driven by engine steps whose model output kvcheck generates.

``model`` (operations as data: ``add``, ``abort``, ``step``; the scope; the seeded
driver; shrink moves), ``oracle`` (after every step: every block-level and prefix-cache
invariant on the KV manager's state, the contract of each KV call the scheduler made,
the engine-level properties, liveness), ``loading`` (engine TARGETs). Importing it
registers the model as ``engine``.
"""

from kvcheck.models.engine.model import MODEL, EngineModel, EngineOp, EngineScope

__all__ = ["MODEL", "EngineModel", "EngineOp", "EngineScope"]
