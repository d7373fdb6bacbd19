"""Open the built documentation site in a real browser (headless Chromium).

Checks the specification page as a reader gets it: the equations are typeset (MathML elements
present, no raw ``$...$`` or TeX commands left in the visible text) and every clause id is an
anchor in the DOM (``spec/#MASK-9``) with its citation line and permanent link; and the scoreboard
(``matrix/``): its grids fit a 1280 px window with no column behind a scroll bar; on a 390 px
phone the display equations and the coverage table fit. Screenshots of
both pages are saved to ``results/docs-browser/`` (``MHASPEC_SCREENSHOT_DIR`` overrides the folder).

Needs ``/usr/bin/chromium`` (Debian: ``apt-get install -y chromium``) and a built site
(``nox -s docs``); without either the tests skip, unless ``MHASPEC_DOCS_BROWSER_REQUIRED=1``
(set by ``nox -s docs_browser``), which turns the skip into a failure.
"""

from __future__ import annotations

import functools
import html.parser
import os
import pathlib
import re
import subprocess
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mhaspec.spec import load

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
CHROMIUM = pathlib.Path(os.environ.get("MHASPEC_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT_DIR = pathlib.Path(os.environ.get("MHASPEC_SCREENSHOT_DIR", ROOT / "results" / "docs-browser"))
REQUIRED = os.environ.get("MHASPEC_DOCS_BROWSER_REQUIRED") == "1"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")

# TeX that would be visible if an equation were left untypeset.
RAW_MATH = re.compile(r"\$\$|\$[^$\s][^$\n]*\$")
TEX_COMMAND = re.compile(r"\\(frac|sqrt|operatorname|mathbb|text|top|qquad|le|ne|in|times|infty|"
                         r"cdot|ldots|beta|pi|max)\b")


def _missing() -> str | None:
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} not found (Debian: apt-get install -y chromium)"
    if not (SITE / "spec" / "index.html").is_file():
        return f"the site is not built ({SITE}/spec/index.html missing; run `nox -s docs`)"
    return None


@pytest.fixture(scope="module")
def site_url():
    reason = _missing()
    if reason:
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="mhaspec-chromium-") as profile:
        proc = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


class _VisibleText(html.parser.HTMLParser):
    """Text a reader sees: everything outside script/style/template and outside MathML."""

    HIDDEN = {"script", "style", "template", "noscript", "math", "head"}

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.HIDDEN:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in self.HIDDEN and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def visible_text(dom: str) -> str:
    parser = _VisibleText()
    parser.feed(dom)
    return "".join(parser.parts)


@pytest.fixture(scope="module")
def spec_dom(site_url) -> str:
    return chromium("--dump-dom", site_url + "spec/").stdout


def test_equations_are_typeset(spec_dom):
    spec = load()
    sources = [c.intro for c in spec.chapters] + [c.text for c in spec.clauses]
    expected = sum(len(re.findall(r"\$\$.+?\$\$|\$[^$\n]+?\$", s, re.S)) for s in sources)
    assert expected > 0
    assert spec_dom.count("<math") >= expected, "fewer MathML elements than equations in the spec"
    assert "<merror" not in spec_dom, "a formula failed to convert"
    text = visible_text(spec_dom)
    assert not RAW_MATH.findall(text), f"raw $...$ left in the page: {RAW_MATH.findall(text)[:5]}"
    assert not TEX_COMMAND.findall(text), f"raw TeX left in the page: {TEX_COMMAND.findall(text)[:5]}"


def test_every_clause_is_an_anchor(spec_dom):
    spec = load()
    assert 'id="MASK-9"' in spec_dom
    missing = [c.id for c in spec.clauses if f'id="{c.id}"' not in spec_dom]
    assert not missing, f"clauses without an anchor: {missing}"


def test_version_in_header(spec_dom):
    assert f"mhaspec {load().version}" in visible_text(spec_dom)


def test_screenshot(site_url):
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    out = SCREENSHOT_DIR / "spec-screenshot.png"
    out.unlink(missing_ok=True)
    # A tall window rather than a #fragment (headless screenshots of a fragment URL come out blank):
    # 1280 x 3600 reaches the display equations of chapters PARAM to SDPA.
    chromium("--window-size=1280,3600", f"--screenshot={out}", site_url + "spec/")
    assert out.is_file()
    assert out.stat().st_size > 30_000, "screenshot looks blank"


def test_each_clause_has_its_citation_line_and_permanent_link(spec_dom):
    """A released version's clause links into its frozen page; a draft has no frozen page yet, so
    its citation line has no permanent link."""
    spec = load()
    line = f"Cite as <em>mhaspec {spec.version}, clause MASK-9</em>"
    if spec.is_draft:
        assert line + "</p>" in spec_dom
    else:
        assert (f'{line} · permanent link: <a href="{spec.version}/#MASK-9">'
                f'<code>spec/{spec.version}/#MASK-9</code></a>') in spec_dom


#: Loads a page in a frame of a given width and writes, for each element a selector finds, how
#: far its content is wider than its scroll container (a part cut off or behind a scroll bar).
OVERFLOW_PROBE = """<!doctype html><html><body><iframe id="f" src="{page}" width="{width}"
height="900"></iframe><pre id="out">waiting</pre><script>
document.getElementById("f").onload = function () {{
  var doc = this.contentDocument, rows = [];
  doc.querySelectorAll("{selector}").forEach(function (e) {{
    var box = e.closest(".md-typeset__scrollwrap") || e;
    rows.push(box.scrollWidth - box.clientWidth);
  }});
  document.getElementById("out").textContent = "overflows: " + rows.join(" ");
}};
</script></body></html>"""


def overflows(site_url: str, page: str, width: int, selector: str) -> list[int]:
    """How many pixels each element ``selector`` finds on ``page`` overflows at ``width`` px."""
    probe = SITE / "overflow-probe.html"
    probe.write_text(OVERFLOW_PROBE.format(page=page, width=width, selector=selector),
                     encoding="utf-8")
    try:
        dom = chromium(f"--window-size={width + 30},1000", "--virtual-time-budget=15000",
                       "--dump-dom", site_url + probe.name).stdout
    finally:
        probe.unlink()
    found = re.search(r"overflows: ([^<]*)", dom)
    assert found, "the probe did not report"
    return [int(x) for x in found[1].split()]


def test_the_scoreboard_grids_fit_1280_px(site_url):
    grids = overflows(site_url, "matrix/", 1280, "table:has(a.mh-pass, a.mh-not-implemented)")
    assert grids == [0, 0], grids


def test_the_spec_equations_and_the_coverage_table_fit_a_phone(site_url):
    """390 px: SDPA's display line wraps its three equations, the longest single equation fits,
    and the scoreboard's coverage table fits the column (the grids and the in-repo matrix below it
    scroll sideways: a column a clause, they cannot fit)."""
    equations = overflows(site_url, "spec/", 390, ".mhaspec-math")
    assert len(equations) >= 10 and set(equations) == {0}, equations
    coverage = overflows(site_url, "matrix/", 390, "article table")[0]  # the page's first table
    assert coverage == 0, coverage


def test_scoreboard_screenshot(site_url):
    dom = chromium("--dump-dom", site_url + "matrix/").stdout
    assert 'class="mh-scoreboard"' in dom and "scoreboard.svg" in dom
    assert "Core chapters" in dom and "Optional chapters" in dom
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    out = SCREENSHOT_DIR / "scoreboard-screenshot.png"
    out.unlink(missing_ok=True)
    chromium("--window-size=1280,2800", f"--screenshot={out}", site_url + "matrix/")
    assert out.is_file() and out.stat().st_size > 30_000, "screenshot looks blank"
