"""Compile the spec text into specialised Python check functions.

The oracle's fast mode would otherwise evaluate ``kvcheck.spec`` through the
logic layer clause by clause (generators, connectives, vocabulary methods:
hundreds of Python calls per operation). Here the *same* spec functions are
run once, on symbolic arguments (``tracer``), which records every clause as a
term (``terms``); ``emit`` turns the terms into one straight-line Python
function per operation kind. No invariant or contract is restated: change the
spec and the compiled checks change with it.

The compiled functions answer only "does every clause hold?". When one says
no, the oracle evaluates the spec itself to name the clause and explain it,
and a disagreement between the two is a kvcheck bug (asserted).
"""
