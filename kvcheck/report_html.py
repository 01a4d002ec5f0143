"""A counterexample trace as one self-contained HTML page (placeholder, see below)."""

from __future__ import annotations

import html

from kvcheck.explain import render
from kvcheck.trace import Trace


def render_html(trace: Trace, source: str | None = None) -> str:
    return f"<!doctype html><meta charset=utf-8><pre>{html.escape(render(trace))}</pre>\n"
