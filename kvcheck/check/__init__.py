"""The checker: one engine for every model.

Driving, fast and full checking, the watchdog, replay, shrinking,
exploration, the Hypothesis state machine and the trace format, written
once and used by every model (``kvcheck.models``). A model is data plus a
few functions (``check.model``); the checker knows no domain.
"""
