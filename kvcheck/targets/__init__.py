"""Targets: what kvcheck checks, and how it reaches one without trusting it.

``protocol`` (the ``Target`` protocol and ``SeedAdapter`` for seed-shaped
allocators: a public API that may grow, never break), ``loading`` (a TARGET
string to a built target), ``registry`` (the registered names) and
``observe`` (reading a target's state: anything it raises or returns
malformed becomes an ``ObservationError``, never a crash of kvcheck).
"""
