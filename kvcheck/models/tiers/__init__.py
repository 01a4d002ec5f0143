"""The tiers model: device and host pools, holders that are not sequences, transfers that
complete later, checked against ``kvcheck.spec.tiers`` and every block-manager invariant
per pool."""

from kvcheck.models.tiers.model import MODEL

__all__ = ["MODEL"]
