"""Every corpus trace reads well: each step in words, and a witness with both numbers."""

from __future__ import annotations

import dataclasses

from traces_helpers import found_trace

from kvcheck.check.trace import Trace
from kvcheck.report.html import render_html
from kvcheck.report.text import render

SAYS = {
    "cow-full-blocks": ["was full", "copied block"],
    "release-before-allocate": ["-> OutOfBlocks failed", "refcount went 2 -> 1",
                                "table entries naming it stayed 2"],
    "free-without-refcounts": ["refcount went 2 -> 0", "table entries naming it went 2 -> 1",
                               "sequence 1 at position 0"],
    "partial-allocate": ["must leave everything unchanged", "the free list went"],
    "fork-without-refcount": ["refcount stayed 1", "table entries naming it went 1 -> 2"],
    "no-copy-on-write": ["shared with sequence", "in place", "can still read it"],
    "aliasing-fork": ["same list object", "sequence 0"],
    "crash-on-fork": ["raised KeyError"],
    "bad-return": ["append_slot returned"],
}


def test_every_step_in_words_and_a_witness(corpus_name):
    trace = found_trace(corpus_name)
    text = render(trace, source="t.json")
    v = trace.violation
    lines = text.splitlines()
    assert lines[0].startswith("Counterexample: ")
    assert sum(line.startswith(">>") for line in lines) == 1
    assert f"VIOLATION at step {v.step} ({v.kind}): {v.name}" in text
    assert "what happened: " in text and "in short: " in text
    assert "kvcheck replay t.json" in text
    assert " fails at " not in v.witness  # never the fallback sentence
    for phrase in SAYS.get(corpus_name, []):
        assert phrase in v.witness, (phrase, v.witness)
    for i in range(1, len(trace.ops) + 1):  # each step: the call, then words / state
        at = next(j for j, line in enumerate(lines) if line[2:].lstrip().startswith(f"{i}. "))
        assert lines[at + 1].startswith("        ")


def test_every_clause_says_what_its_element_is(corpus_name):
    """The element's kind comes from the spec itself (the domain or the operation argument the
    clause names, tagged while the evidence is gathered), never from its name: a block element
    is a pool block, a sequence element one the trace names, and the terms it read are there."""
    v = found_trace(corpus_name).violation
    trace = found_trace(corpus_name)
    if v.kind not in ("contract", "invariant") or v.element is None:
        return
    assert v.subject in ("block", "seq"), (v.name, v.subject)
    if v.subject == "block":
        assert 0 <= v.element < trace.num_blocks
    else:
        assert v.element in {q for o in trace.ops for q in (o.seq, o.child)}
    assert v.terms and all("term" in t for t in v.terms)


def test_traces_without_states_or_violation_render():
    trace = found_trace("cow-full-blocks")
    bare = Trace(trace.target, trace.num_blocks, trace.block_size, trace.ops, trace.violation)
    assert "VIOLATION" in render(bare) and 'id="violation"' in render_html(bare)
    clean = Trace("reference", 4, 2, trace.ops, None)
    assert "VIOLATION" not in render(clean)
    assert "No violation recorded" in render_html(clean)
    huge = Trace("reference", 1_000_000, 2, [], None)  # the page stays small
    assert len(render_html(huge)) < 50_000 and len(render(huge)) < 2_000


def test_html_escapes_everything_from_the_trace():
    trace = found_trace("crash-on-fork")
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    v = dataclasses.replace(trace.violation, witness=evil, name=evil)
    t = Trace(evil, trace.num_blocks, trace.block_size, trace.ops, v, None, trace.states, evil)
    page = render_html(t)
    assert "<script>alert" not in page and "<img" not in page
    assert page.count("<script>") == 1  # only the page's own few lines
