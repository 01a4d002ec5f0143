"""A counterexample trace as one self-contained HTML page.

``render_html(trace)`` draws, for the initial state and after every step,
the pool (each block with its refcount; free, held and shared blocks in
different colours), each live sequence's block table (with how full its
last block is) and the free list, as inline SVG. The violating step is
framed in red (``id="violation"``, ``data-violation="true"``) and the block
or sequence the broken rule is about is outlined (``class="hl"``). Only
inline CSS, SVG and a few lines of JS: the page loads nothing from anywhere.

Every string from the trace is HTML-escaped; nothing from it reaches the
script. Large traces and pools are cut to keep the page small (said on it).
"""

from __future__ import annotations

import html

from kvcheck import __version__
from kvcheck.check.model import BLOCK, model_named
from kvcheck.check.trace import Trace
from kvcheck.report.text import rule_text, term_value, terms_line
from kvcheck.spec.state import NULL

MAX_STEPS = 300  # steps drawn; around the violation when there are more
MAX_BLOCKS = 128  # pool cells drawn; beyond it only blocks in use (and the highlighted one)
CELL, GAP, ROW, LABEL = 44, 4, 46, 132

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;
 background:#fafafa;color:#1b1b1b}
header{background:#263238;color:#eceff1;padding:16px 24px}
header h1{font-size:20px;margin:0 0 4px}
header .meta{font-size:13px;color:#b0bec5}
main{padding:16px 24px;max-width:1400px}
.summary{border:3px solid #c62828;background:#ffebee;border-radius:6px;padding:10px 14px;
 margin-bottom:16px}
.summary.ok{border-color:#2e7d32;background:#e8f5e9}
.summary h2{margin:0 0 6px;font-size:17px;color:#b71c1c}
.summary.ok h2{color:#1b5e20}
.summary p{margin:4px 0}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;margin:0 0 12px}
.legend span{display:inline-flex;align-items:center;gap:5px}
.legend i{display:inline-block;width:14px;height:14px;border:1px solid #546e7a;border-radius:2px}
.step{background:#fff;border:1px solid #cfd8dc;border-radius:6px;padding:8px 12px;margin:0 0 10px}
.step h3{font-size:15px;margin:0 0 2px;font-family:ui-monospace,Menlo,Consolas,monospace}
.step .words{margin:0 0 6px;color:#37474f}
.step .state{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;color:#546e7a;
 margin:4px 0 0}
.step.violation{border:4px solid #d32f2f;background:#fff5f5}
.step.violation h3{color:#b71c1c}
.badge{display:inline-block;background:#d32f2f;color:#fff;border-radius:3px;padding:0 6px;
 font-size:12px;margin-left:8px;font-family:system-ui,sans-serif}
.witness{background:#fff;border-left:4px solid #d32f2f;padding:6px 10px;margin:6px 0}
.note{color:#78909c;font-size:12px}
svg text{font-family:ui-monospace,Menlo,Consolas,monospace}
code{background:#eceff1;padding:0 4px;border-radius:3px}
table.terms{border-collapse:collapse;margin:6px 0;font-size:13px}
table.terms td,table.terms th{border:1px solid #cfd8dc;padding:2px 8px;text-align:left}
"""

_JS = """
(function(){var s=[].slice.call(document.querySelectorAll('section.step')),i=-1;
document.addEventListener('keydown',function(e){if(e.key!=='j'&&e.key!=='k')return;
i=Math.max(0,Math.min(s.length-1,i+(e.key==='j'?1:-1)));s[i].scrollIntoView();});})();
"""

FILL = {0: "#e8f5e9", 1: "#bbdefb"}
SHARED, BAD = "#ffcc80", "#d32f2f"


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _n(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fill(ref) -> str:
    if not isinstance(ref, int) or ref < 0:
        return "#e0e0e0"
    return FILL.get(ref, SHARED)


def _block_returned(trace: Trace, op) -> int | None:
    """The first block the operation returned (a result whose role is a block), if any."""
    if op is None:
        return None
    spec = model_named(trace.model).ops.get(op.kind)
    for r in (spec.results if spec is not None else ()):
        value = getattr(op, r.name, None)
        if r.role == BLOCK and isinstance(value, int):
            return value
    return None


def focus(trace: Trace) -> tuple[int | None, int | None]:
    """(block, sequence) the violation is about, whichever are known."""
    v = trace.violation
    if v is None or v.element is None and v.kind not in ("crash", "hang", "malformed"):
        return None, None
    op = trace.ops[v.step - 1] if 1 <= v.step <= len(trace.ops) else None
    if v.kind in ("invariant", "contract"):  # the evidence says what the element is
        if v.subject == "block":
            return v.element, None
        return (_block_returned(trace, op) if v.kind == "contract" else None), v.element
    if v.kind == "data":
        return (v.element, None) if v.subject == "block" else (None, v.element)
    return None, (getattr(op, "seq", None) if op is not None else v.element)


def _svg(state: dict, num_blocks: int, block_size: int, hl_block, hl_seq) -> str:
    refs = state.get("refs", [])
    tables = state.get("tables", {})
    lens = state.get("lens", {})
    free = state.get("free", [])
    used = {b for t in tables.values() for b in t}
    if num_blocks <= MAX_BLOCKS:
        pool = list(range(num_blocks))
    else:
        keep = {b for b, r in enumerate(refs) if r} | used | ({hl_block} - {None})
        pool = sorted(b for b in keep if isinstance(b, int) and 0 <= b < num_blocks)[:MAX_BLOCKS]
    widest = max([len(pool)] + [len(t) for t in tables.values()] + [1])
    shown = ", ".join(map(str, free[:64])) + (" ..." if len(free) > 64 else "")
    free_text = f"[{shown}] ({len(free)} entr{'y' if len(free) == 1 else 'ies'})"
    width = max(LABEL + widest * (CELL + GAP), LABEL + 8 * len(free_text)) + 8
    rows = 1 + len(tables)
    height = rows * ROW + 28
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img">']

    def cell(x, y, b, label, sub, hl, part=None):
        ref = refs[b] if isinstance(b, int) and 0 <= b < len(refs) else None
        cls = ' class="hl"' if hl else ""
        stroke = f'stroke="{BAD}" stroke-width="4"' if hl else 'stroke="#546e7a" stroke-width="1"'
        out.append(f'<g{cls} data-block="{_e(b)}"><rect x="{x}" y="{y}" width="{CELL}" '
                   f'height="{CELL - 8}" rx="3" fill="{_fill(ref)}" {stroke}/>')
        if part is not None:
            w = max(0, min(CELL - 6, round((CELL - 6) * part)))
            out.append(f'<rect x="{x + 3}" y="{y + CELL - 15}" width="{w}" height="4" '
                       f'fill="#455a64"/>')
        out.append(f'<text x="{x + CELL / 2}" y="{y + 16}" text-anchor="middle" '
                   f'font-size="14" font-weight="bold">{_e(label)}</text>')
        if sub:
            out.append(f'<text x="{x + CELL / 2}" y="{y + 29}" text-anchor="middle" '
                       f'font-size="10">{_e(sub)}</text>')
        out.append("</g>")

    y = 4
    out.append(f'<text x="4" y="{y + 22}" font-size="13">pool (refcount)</text>')
    for i, b in enumerate(pool):
        r = refs[b] if b < len(refs) else "?"
        cell(LABEL + i * (CELL + GAP), y, b, b, f"r={r}", b == hl_block)
    if len(pool) < num_blocks:
        out.append(f'<text x="{LABEL + len(pool) * (CELL + GAP)}" y="{y + 22}" font-size="11">'
                   f'+{num_blocks - len(pool)} not drawn</text>')
    for q, table in tables.items():
        y += ROW
        hl_row = hl_seq is not None and q == str(hl_seq)
        n = lens.get(q)
        weight = ' font-weight="bold" fill="#b71c1c"' if hl_row else ""
        tok = f"{n} tok" if isinstance(n, int) else "? tok"
        cls = ' class="hl-seq"' if hl_row else ""
        out.append(f'<g data-seq="{_e(q)}"{cls}>'
                   f'<text x="4" y="{y + 22}" font-size="13"{weight}>seq {_e(q)} · {tok}</text>')
        if hl_row:
            out.append(f'<rect x="1" y="{y - 2}" width="{width - 2}" height="{ROW - 4}" rx="4" '
                       f'fill="none" stroke="{BAD}" stroke-width="2" stroke-dasharray="6 3"/>')
        for i, b in enumerate(table[:widest]):
            part = None
            if isinstance(n, int) and block_size:
                part = max(0, min(block_size, n - i * block_size)) / block_size
            cell(LABEL + i * (CELL + GAP), y, b, "null" if b == NULL else b, f"#{i}",
                 b == hl_block, part)
        out.append("</g>")
    y += ROW
    out.append(f'<text x="4" y="{y + 18}" font-size="13">free list</text>'
               f'<text x="{LABEL}" y="{y + 18}" font-size="13">{_e(free_text)}</text>')
    out.append("</svg>")
    return "".join(out)


def _steps_to_draw(n: int, vstep: int | None) -> list[int]:
    steps = list(range(n + 1))
    if len(steps) <= MAX_STEPS:
        return steps
    end = min(n, (vstep if vstep is not None else n) + 10)
    start = max(0, end - MAX_STEPS + 1)
    return steps[start:end + 1]


def _drawing(m, state, nb: int, bs: int, hl_block, hl_seq) -> str:
    """The pool drawn, if the model's recorded state has one (``Model.pool_of``)."""
    pool = m.pool_of(state) if state is not None else None
    return "" if pool is None else _svg(pool, nb, bs, hl_block, hl_seq)


def _terms_table(terms: list[dict]) -> str:
    """The evidence: each term the broken clause read, with its value in each state."""
    cols = [c for c in ("pre", "post", "state") if any(c in t for t in terms)]
    head = "".join(f"<th>{_e({'pre': 'before', 'post': 'after'}.get(c, c))}</th>" for c in cols)
    rows = "".join("<tr><td><code>" + _e(t["term"]) + "</code></td>"
                   + "".join(f"<td>{_e(term_value(t['term'], t[c]) if c in t else '')}</td>"
                             for c in cols) + "</tr>"
                   for t in terms)
    return (f'<table class="terms"><tr><th>term the rule reads</th>{head}</tr>{rows}</table>'
            f'<p class="note">{_e(terms_line(terms))}</p>')


def render_html(trace: Trace, source: str | None = None) -> str:
    """The page's full text (any model: what its recorded states hold is drawn or listed)."""
    v = trace.violation
    m = model_named(trace.model)
    hl_block, hl_seq = focus(trace)
    nb, bs = trace.num_blocks, trace.block_size
    empty = m.initial_state_json(trace.scope)
    states = trace.states
    title = f"kvcheck counterexample: {trace.target}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1><div class=\"meta\">{_e(m.title)} · "
        f"{_n(nb, 'block')} x {_n(bs, 'slot')}{_e(m.scope_words(trace.scope))} · "
        f"{len(trace.ops)} operation(s) · seed {_e(trace.seed)} · recorded with kvcheck "
        f"{_e(trace.kvcheck_version or '?')} · page by kvcheck {_e(__version__)}</div></header>",
        "<main>",
    ]
    vstate = None
    if v is not None and 1 <= v.step <= len(states):
        vstate = states[v.step - 1]
    if v is not None:
        where = "at the start" if v.step == 0 else f'at <a href="#violation">step {v.step}</a>'
        focus_words = []
        if hl_block is not None:
            focus_words.append(f"block {_e(hl_block)}")
        if hl_seq is not None:
            focus_words.append(f"sequence {_e(hl_seq)}")
        parts.append(
            f'<section class="summary" id="summary"><h2>Violation {where} ({_e(v.kind)}): '
            f"{_e(v.name)}</h2>"
            + (f'<p class="witness"><b>What happened:</b> {_e(v.witness)}</p>' if v.witness else "")
            + (_terms_table(v.terms) if v.terms else "")
            + (f"<p><b>The rule:</b> {_e(rule_text(v.doc))}</p>" if v.doc else "")
            + (f"<p><b>Highlighted:</b> {', '.join(focus_words)}</p>" if focus_words else "")
            + (f"<p><b>State after step {v.step}:</b></p>"
               f"{_drawing(m, vstate, nb, bs, hl_block, hl_seq)}"
               f'<p class="state">{_e(m.state_line(vstate))}</p>' if vstate is not None else "")
            + (f"<p><b>Minimal:</b> {_e(trace.minimality)}</p>" if trace.minimality else "")
            + "</section>")
    else:
        parts.append('<section class="summary ok" id="summary"><h2>No violation recorded</h2>'
                     "</section>")
    replay = f"kvcheck replay {source}" if source else "kvcheck replay TRACE"
    parts.append(f'<p class="note">Replay: <code>{_e(replay)} [--target TARGET]</code> · '
                 "keys j / k step through the steps</p>")
    parts.append(
        '<div class="legend">'
        f'<span><i style="background:{FILL[0]}"></i>free (refcount 0)</span>'
        f'<span><i style="background:{FILL[1]}"></i>held once (refcount 1)</span>'
        f'<span><i style="background:{SHARED}"></i>shared (refcount &gt; 1)</span>'
        f'<span><i style="background:#fff;border:3px solid {BAD}"></i>what the rule is about'
        "</span><span>bar under a table entry: slots used</span></div>")
    drawn = _steps_to_draw(len(trace.ops), v.step if v is not None else None)
    if drawn and drawn[0] > 0:
        parts.append(f'<p class="note">Steps 1-{drawn[0]} not drawn (the trace is long).</p>')
    for i in drawn:
        bad = v is not None and i == v.step
        state = empty if i == 0 else (states[i - 1] if i - 1 < len(states) else None)
        attrs = f'class="step{" violation" if bad else ""}" data-step="{i}"'
        attrs += ' id="violation" data-violation="true"' if bad else f' id="step-{i}"'
        parts.append(f"<section {attrs}>")
        if i == 0:
            parts.append("<h3>0. initial state</h3>")
        else:
            op = trace.ops[i - 1]
            badge = '<span class="badge">VIOLATION</span>' if bad else ""
            parts.append(f"<h3>{i}. {_e(m.describe(op))}{badge}</h3>")
            before = empty if i == 1 else (states[i - 2] if i - 2 < len(states) else None)
            if not (bad and v.kind in ("crash", "hang", "malformed")):
                parts.append(f'<p class="words">{_e(m.narrate(op, before, state, bs))}</p>')
        if bad:
            parts.append(f'<p class="witness"><b>{_e(v.name)}:</b> {_e(v.witness)}</p>')
        if state is not None:
            hb, hs = (hl_block, hl_seq) if bad else (None, None)
            parts.append(_drawing(m, state, nb, bs, hb, hs))
            parts.append(f'<p class="state">{_e(m.state_line(state))}</p>')
        else:
            parts.append('<p class="note">(no state recorded for this step)</p>')
        parts.append("</section>")
    if drawn and drawn[-1] < len(trace.ops):
        parts.append(f'<p class="note">Steps {drawn[-1] + 1}-{len(trace.ops)} not drawn.</p>')
    parts.append(f"</main><script>{_JS}</script></body></html>")
    return "\n".join(parts) + "\n"
