"""``kvcheck report``: the HTML page, rendered by a real headless chromium.

A browser is required, never skipped: a session fixture asks ``scripts/install_chromium.sh``
for one (one already installed: ``$KVCHECK_BROWSER``, chromium or google-chrome on PATH; else
Debian's chromium where this user can install it) and fails with the script's line, saying
why, where there is none.
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from traces_helpers import found_trace

from kvcheck.cli import main

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The browser ``scripts/install_chromium.sh`` names (the last word of its line)."""
    p = subprocess.run(["bash", str(ROOT / "scripts" / "install_chromium.sh")],
                       capture_output=True, text=True, timeout=1200)
    line = (p.stdout.strip().splitlines() or [""])[-1]
    browser = Path(line.split()[-1]) if p.returncode == 0 and line else None
    if browser is None or not browser.is_file():
        pytest.fail(f"no browser for the HTML report test (exit {p.returncode}): "
                    f"{line or p.stderr[-2000:]}", pytrace=False)
    return browser


def _run(chromium: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    profile.mkdir()
    return subprocess.run([str(chromium), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp)


def _report(name: str, tmp: Path) -> tuple[object, Path]:
    trace = found_trace(name)
    tfile, page = tmp / f"{name}.json", tmp / f"{name}.html"
    trace.write(tfile)
    assert main(["report", str(tfile), "-o", str(page)]) == 0
    return trace, page


class _Sections(HTMLParser):
    """Step sections, and what the violating one contains."""

    def __init__(self):
        super().__init__()
        self.steps: list[dict] = []
        self.depth = 0  # inside the violating section
        self.highlighted: list[dict] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "step" in (a.get("class") or "").split():
            self.steps.append(a)
            if a.get("id") == "violation":
                self.depth = 1
                return
        if self.depth:
            if tag == "section":
                self.depth += 1
            if {"hl", "hl-seq"} & set((a.get("class") or "").split()):
                self.highlighted.append(a)

    def handle_endtag(self, tag):
        if self.depth and tag == "section":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


@pytest.mark.parametrize("name", ["cow-full-blocks", "free-without-refcounts"])
def test_dom_shows_the_violation(chromium, tmp_path, name):
    trace, page = _report(name, tmp_path)
    text = page.read_text()
    # self-contained: nothing to fetch (the SVG namespace URI is a name, not a request)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#|data:)""", text)
    assert "@import" not in text and "url(" not in text
    p = _run(chromium, tmp_path, "--dump-dom", page.as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    dom = _Sections()
    dom.feed(p.stdout)
    v = trace.violation
    assert [int(s["data-step"]) for s in dom.steps] == list(range(len(trace.ops) + 1))
    bad = [s for s in dom.steps if s.get("data-violation") == "true"]
    assert len(bad) == 1 and bad[0]["data-step"] == str(v.step) and bad[0]["id"] == "violation"
    assert dom.highlighted, "nothing highlighted in the violating step"
    words = " ".join(dom.text)
    assert "VIOLATION" in words and v.name in words
    if name == "free-without-refcounts":  # a block rule: that block is outlined
        assert any(h.get("data-block") == str(v.element) for h in dom.highlighted)


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what chromium writes) into rows."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, rows, prev = zlib.decompress(idat), [], bytearray(w * bpp)
    stride = w * bpp + 1
    for y in range(h):
        f, line = raw[y * stride], bytearray(raw[y * stride + 1:(y + 1) * stride])
        for i in range(len(line)):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return w, bpp, rows


def test_screenshot_is_drawn_and_highlighted(chromium, tmp_path):
    trace, page = _report("no-copy-on-write", tmp_path)
    shot = tmp_path / "report.png"
    p = _run(chromium, tmp_path, "--window-size=1000,1300", f"--screenshot={shot}", page.as_uri())
    assert p.returncode == 0 and shot.exists(), p.stderr[-2000:]
    w, bpp, rows = _png_pixels(shot)
    colors, red = set(), 0
    for row in rows[::3]:
        for x in range(0, w * bpp, bpp * 3):
            px = row[x:x + 3]
            colors.add(px)
            r, g, b = px
            red += r > 180 and g < 90 and b < 90  # the violation's red frame and outlines
    assert len(colors) > 20, "the screenshot is (nearly) blank"
    assert red > 50, "no red highlight visible"


TESTS = ROOT / "tests"
OTHER_MODELS = {  # model: (command line that finds a bug and writes its trace, what the page says)
    "prefix": (["verify-prefix", f"{TESTS}/prefix/buggy_prefix.py:StaleKeyAfterReuse",
                "--blocks", "8", "--block-size", "2"], "cache"),
    "scheduler": (["verify-scheduler", f"{TESTS}/scheduler/buggy.py:SkipAhead"], "add(seq="),
    "device": (None, None),  # a data-level corpus bug, found through the API below
}


@pytest.mark.parametrize("model", sorted(OTHER_MODELS))
def test_a_trace_of_every_model_is_drawn(chromium, tmp_path, model):
    """The page for a trace of each model, rendered by chromium: every step, the violating one
    marked, the broken rule named."""
    from kvcheck.check.trace import Trace

    argv, says = OTHER_MODELS[model]
    tfile, page = tmp_path / f"{model}.json", tmp_path / f"{model}.html"
    if model == "device":  # the registered store is correct: a corpus bug of the data model
        import sys

        sys.path.insert(0, str(TESTS / "device"))
        from functools import partial

        import device_bugs as bugs

        from kvcheck.verify import verify

        r = verify(partial(bugs.WriteIntoShared, dtype="float16", device="cpu"), 8, 2, ops=300,
                   seed=0, model="device")
        assert not r.ok
        r.trace.write(tfile)
    else:
        assert main([*argv, "--trace-out", str(tfile)]) == 1
    trace = Trace.load(tfile)
    assert trace.model == model
    assert main(["report", str(tfile), "-o", str(page)]) == 0
    p = _run(chromium, tmp_path, "--dump-dom", page.as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    dom = _Sections()
    dom.feed(p.stdout)
    v = trace.violation
    assert [int(s["data-step"]) for s in dom.steps] == list(range(len(trace.ops) + 1))
    bad = [s for s in dom.steps if s.get("data-violation") == "true"]
    assert len(bad) == 1 and bad[0]["data-step"] == str(v.step)
    words = " ".join(dom.text)
    assert "VIOLATION" in words and v.name in words
    if says:
        assert says in p.stdout
