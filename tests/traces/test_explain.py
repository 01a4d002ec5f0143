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


# -- what applies to the target, in plain values (issue 32, item 5) ----------------------------
TESTS = __import__("pathlib").Path(__file__).resolve().parents[1]


def _found(target: str, **kw):
    from kvcheck.verify import verify

    r = verify(target, shrink_budget=20.0, **kw)
    assert not r.ok, target
    return r.trace


def test_the_rule_says_only_what_applies_to_the_target(corpus_name):
    """A rule speaks of a cyclic window only for an allocator that declares one, and no report
    shows the spec's ``name`` markup."""
    from corpus.buggy import CORPUS

    trace = found_trace(corpus_name)
    v = trace.violation
    if not getattr(CORPUS[corpus_name][0](8, 2), "cyclic_window", 0):
        assert "cyclic" not in (v.doc or ""), v.doc
    assert "``" not in render(trace) and "``" not in render_html(trace)


def test_a_cyclic_target_reads_its_window_in_the_rule():
    trace = _found(f"{TESTS}/corpus/cyclic.py:CyclicTakesEveryBlock")
    v = trace.violation
    assert v.name.startswith("allocate: "), v.name
    assert "Under a cyclic window of W blocks" in v.doc  # the spec's text, for this target
    text = render(trace)
    assert "Under a cyclic window of W blocks (op.cycle)" in text and "``" not in text
    assert "sequence 0's table (none) -> [" in v.witness, v.witness  # not "table no table"


def test_the_terms_it_reads_are_values_never_a_question_mark(corpus_name):
    trace = found_trace(corpus_name)
    line = next((ln for ln in render(trace).splitlines() if "the terms it reads:" in ln), "")
    assert "?" not in line and " -1" not in line and "(-1" not in line, line


def test_a_state_invariant_s_terms_read_their_values():
    trace = _found(f"{TESTS}/corpus/engine.py:SlotsLengthFirst")
    assert trace.violation.kind == "invariant"
    assert "  the terms it reads: impl_length(0) = 2; length(0) = 1" in render(trace)
    page = render_html(trace)
    assert "<td>2</td>" in page and "<td>None</td>" not in page


def test_a_null_entry_reads_null_in_the_terms_and_the_drawing():
    from kvcheck.report.text import terms_line

    trace = found_trace("aliasing-fork")  # the child's entry 0, before the fork: none
    assert "table(1, 0) null -> 0" in render(trace)
    assert "<td>-1</td>" not in render_html(trace)
    assert terms_line([{"term": "tail(2)", "pre": -1, "post": 3},
                       {"term": "ref(3)", "pre": None, "post": 2},
                       {"term": "ref(4)", "pre": -1, "post": None},
                       {"term": "length(5)", "pre": None, "post": None},
                       {"term": "live(1)", "state": True}]) == (
        "tail(2) null -> 3; ref(3) = 2 after; ref(4) = -1 before; live(1) = true")
    from kvcheck.check.evidence import Reading, values
    from kvcheck.spec.state import Snapshot

    s = Snapshot(2, 1, {0: [-1, 1]}, {0: 2}, [0, 1], [0])
    read = [Reading("state", "ref", (-1,), 0), Reading("state", "occurrences", (0, -1), 1),
            Reading("state", "table", (0, 0), -1)]
    assert terms_line(values(read, {"state": s})) == (
        "ref(null) = 0; occurrences(0, null) = 1; table(0, 0) = null")
    window = _found(f"{TESTS}/corpus/window.py:WindowKeepsReference")
    assert any(-1 in t for s in window.states for t in s["tables"].values())
    page = render_html(window)
    assert ">-1<" not in page and ">null<" in page


def test_a_rebase_over_null_entries_narrates_them_null():
    from kvcheck.models.blocks.witness import narrate
    from kvcheck.spec.contracts import Op

    op = Op("rebase", seq=0, child=1)
    after = {"tables": {"0": [-1, 2], "1": [-1, 2]}, "lens": {"0": 2, "1": 2},
             "refs": [0, 0, 2], "free": [0, 1]}
    words = narrate(op, None, after, 1)
    assert "sharing blocks [null, 2]" in words and "-1" not in words, words


def test_an_append_into_a_reserved_block_reads_as_one():
    """append_slot on a sequence holding reserved slots: the witness speaks of the block
    the token goes to (reserved, or partial with reserved blocks after it), never of a
    'full (0 of 4 slots used)' last block; the step reads 'a block it held reserved'."""
    from pathlib import Path

    from kvcheck.models.blocks.witness import narrate
    from kvcheck.spec.contracts import Op

    engine = Path(__file__).resolve().parents[1] / "corpus" / "engine.py"
    past = _found(f"{engine}:AppendSlotPastReservation").violation.witness
    assert "last block 4 was reserved (0 of 4 slots used)" in past, past
    shared = _found(f"{engine}:AppendSlotIntoSharedReservation").violation.witness
    assert "was partial (1 of 2 slots used), with reserved blocks after it" in shared, shared
    assert " (-1 of " not in shared and "full (0 of" not in past
    op = Op("append_slot", seq=0, block=1, offset=0, cow_src=None, outcome="ok")
    before = {"tables": {"0": [0, 1]}, "lens": {"0": 4}, "refs": [1, 1], "free": [2]}
    after = {"tables": {"0": [0, 1]}, "lens": {"0": 5}, "refs": [1, 1], "free": [2]}
    words = narrate(op, before, after, 3)
    assert "puts token #4 in slot 0 of block 1 (a block it held reserved)" in words, words
