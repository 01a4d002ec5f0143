"""The models: one per kind of component kvcheck checks.

``blocks`` (a paged block manager), ``prefix`` (a prefix-caching one),
``scheduler`` (a scheduler over a block manager) and ``device`` (a store
holding real K/V data). Each binds the spec's text (``kvcheck.spec``) to its
targets: operations as data, observation, ghost and shadow state, drivers
and shrink moves. The checker (``kvcheck.check``) runs them all.
"""
