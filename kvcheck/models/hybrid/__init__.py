"""The hybrid-pool model: KV-cache groups (full attention, sliding windows) sharing one
pool, checked against ``kvcheck.spec.hybrid`` and every block-manager invariant."""

from kvcheck.models.hybrid.model import MODEL

__all__ = ["MODEL"]
