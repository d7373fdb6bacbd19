"""``mhaspec scoreboard``: the ecosystem table rendered from the certificates in docs/certificates.

Axis legend: none (tables of verdicts).
"""

from __future__ import annotations

import html.parser
import json
import pathlib
import shutil
from xml.etree import ElementTree

import pytest

from mhaspec import certificate, cli, scoreboard
from mhaspec.spec import load as load_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
SDPA_MATH = ROOT / "docs" / "certificates" / "torch-sdpa-math.json"
#: ort-attention's certificate issued against the 1.2 draft, before 1.2 was released (kept as a
#: fixture: the published one has been re-issued)
DRAFT = ROOT / "tests" / "data" / "draft-1.2" / "ort-attention.json"


@pytest.fixture
def one_certificate(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(SDPA_MATH, certs)
    page = tmp_path / "page.md"
    page.write_text(f"# t\n\n{scoreboard.START}\nthe previous section\n{scoreboard.END}\n\nrest\n", encoding="utf-8")
    return certs, page, tmp_path / "assets" / "board.svg"


def test_rows_follow_the_certificate(one_certificate):
    certs, _, _ = one_certificate
    board = scoreboard.read_rows(certs)
    (row,) = board.rows
    chapters = board.chapters
    assert row.name == "torch-sdpa-math" and row.library == "torch 2.13.0+cpu"
    version = json.loads(SDPA_MATH.read_text("utf-8"))["spec"]["version"]  # 1.4 since its reissue
    assert row.verdict == "conforms" and board.label == version and board.superseded == []
    assert row.cells["MASK"][0] == "deviation"  # MASK-13 declared, confirmed
    assert any(n.startswith("MASK-13: ") for n in row.cells["MASK"][1])
    assert row.cells["HEAD"][0] == "not-implemented"
    assert row.cells["SDPA"] == ("pass", ["SDPA-1", "SDPA-2", "SDPA-3", "SDPA-5", "SDPA-6", "SDPA-7"])
    assert row.cells["GQA"] == ("pass", ["GQA-1", "GQA-2"])
    assert set(chapters) >= {"SHAPE", "MASK", "NUM", "ERR", "GQA", "LSE"}
    assert "GRAD" in board.optional and "LSE" in board.optional and "MASK" in board.core


def test_a_row_says_how_much_of_the_spec_it_covers(one_certificate):
    """N of M testable clauses, core N of M, the optional chapters attained: from the clauses."""
    certs, _, _ = one_certificate
    (row,) = scoreboard.read_rows(certs).rows
    cert = json.loads(SDPA_MATH.read_text("utf-8"))
    certified = [c["id"] for c in cert["clauses"] if c["verdict"] in ("pass", "deviation")]
    testable = [cid for cid, _, t in certificate.released_clauses(cert["spec"]["version"]) if t]
    assert row.coverage.certified == len(certified) and row.coverage.testable == len(testable)
    assert row.coverage.deviations == cert["summary"]["counts"]["deviation"]
    # SDPA only: no HEAD, no MHA, so not core; no softcap, window or lse, so not all of GRAD
    assert row.coverage.levels == ["GQA"]
    assert row.coverage.chapters["SDPA"] == (6, 7) and str(row.coverage.chapters["SDPA"]) == "6/7"


def test_rows_are_sorted_by_library(tmp_path):
    certs = tmp_path / "certs"
    shutil.copytree(ROOT / "docs" / "certificates", certs,
                    ignore=shutil.ignore_patterns("*-failures"))
    rows = scoreboard.read_rows(certs).rows
    assert len(rows) > 3
    assert [r.library.casefold() for r in rows] == sorted(r.library.casefold() for r in rows)


def test_a_certificate_of_a_draft_since_released_is_listed_not_gridded(one_certificate):
    """Its digest is checked, but its clauses (the draft's, kept nowhere) cannot be: it is named
    below the grid, to be re-issued, and `mhaspec verify` says so."""
    certs, page, image = one_certificate
    shutil.copy(DRAFT, certs)
    board = scoreboard.read_rows(certs)
    version = json.loads(SDPA_MATH.read_text("utf-8"))["spec"]["version"]
    assert [r.name for r in board.rows] == ["torch-sdpa-math"] and board.label == version
    assert [(s.name, s.label, s.markdown) for s in board.superseded] == [
        ("ort-attention", "1.2 (draft)", "ort-attention.md")]
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "| [ort-attention]" not in text
    assert "Not in the grid: certificates issued against a draft that has since been released" in text
    assert "[ort-attention](certs/ort-attention.md) (1.2 (draft), issued 2026-11-30)" in text


def test_verify_asks_to_reissue_a_certificate_of_a_draft_since_released(capsys):
    assert cli.main(["verify", str(DRAFT)]) != 0
    err = capsys.readouterr().err
    assert "issued against the 1.2 draft, and 1.2 has since been released" in err


def test_the_command_writes_the_grid_linked_to_certificates_and_the_image(one_certificate):
    certs, page, image = one_certificate
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "the previous section" not in text and text.endswith("rest\n")
    assert "| [torch-sdpa-math](certs/torch-sdpa-math.md) | torch 2.13.0+cpu | conforms | " in text
    assert '[dev. 12/12](certs/torch-sdpa-math.md "a declared deviation, confirmed by the suite: ' \
           'MASK-13: ' in text
    assert '[pass 6/7](certs/torch-sdpa-math.md "every clause run passed: SDPA-1; SDPA-2' in text
    assert "### Core chapters" in text and "### Optional chapters" in text
    cert = json.loads(SDPA_MATH.read_text("utf-8"))
    assert f"Inputs: torch-sdpa-math ({scoreboard.inputs_of(cert)})." in text
    # the picture leads the section, with its title, and opens full size
    first = text.split(scoreboard.START)[1].lstrip().splitlines()[0]
    version, profile = cert["spec"]["version"], cert["hypothesis"]["profile"]
    assert first.startswith(f"[![mhaspec {version} conformance scoreboard: profile {profile}, CPU, "
                            "certificates issued 20") and "](assets/board.svg)](assets/board.svg " in first
    svg = image.read_text("utf-8")
    assert svg.startswith("<?xml") and "<svg" in svg


def test_a_certificate_names_the_inputs_it_was_certified_on():
    hypothesis = {"profile": "certify", "seed": 123}
    assert scoreboard.inputs_of({"hypothesis": hypothesis}) == "certify profile, seed 123"
    hypothesis = {"profile": "ci", "seed": None, "inputs": "fixed inputs (ci profile)"}
    assert scoreboard.inputs_of({"hypothesis": hypothesis}) == "ci profile, fixed inputs"


def test_an_edited_certificate_is_refused_in_one_line(one_certificate, capsys):
    certs, page, image = one_certificate
    cert = certs / "torch-sdpa-math.json"
    cert.write_text(cert.read_text(encoding="utf-8").replace('"conforms"', '"does not conform"'),
                    encoding="utf-8")
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a valid certificate" in err


def test_a_page_without_markers_is_refused(one_certificate, capsys):
    certs, page, image = one_certificate
    page.write_text("# no markers\n", encoding="utf-8")
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 2
    assert "markers" in capsys.readouterr().err


def test_the_published_page_is_the_rendering_of_the_published_certificates(tmp_path):
    """docs/matrix.md's scoreboard is what `mhaspec scoreboard` renders from docs/certificates."""
    page = tmp_path / "matrix.md"
    shutil.copy(ROOT / "docs" / "matrix.md", page)
    shutil.copytree(ROOT / "docs" / "certificates", tmp_path / "certificates",
                    ignore=shutil.ignore_patterns("*-failures"))
    assert cli.main(["scoreboard", "--certificates", str(tmp_path / "certificates"), "--page",
                     str(page), "--image", str(tmp_path / "assets" / "scoreboard.svg")]) == 0
    assert page.read_text(encoding="utf-8") == (ROOT / "docs" / "matrix.md").read_text(
        encoding="utf-8")


#: What a re-sealed certificate may carry in every string the scoreboard shows.
HOSTILE = ('evil<img src=x onerror=alert(1)><script>alert(2)</script> | extra | cells |\n'
           '# heading\n$\\frac{1}{2}$ `code` [link](http://e) "quote" (paren')


class _Html(html.parser.HTMLParser):
    """Elements, table rows (cells per row) and text of rendered HTML."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1

    def handle_data(self, data):
        self.text.append(data)


def test_certificate_strings_are_escaped_in_every_renderer(one_certificate):
    """A certificate that verifies (re-sealed) with HTML, table pipes, a heading, newlines, math
    and links in its backend strings adds no element, cell or heading to the page, and no text
    to the picture (drawn as paths)."""
    markdown = pytest.importorskip("markdown")
    certs, page, image = one_certificate
    cert = json.loads((certs / "torch-sdpa-math.json").read_text("utf-8"))
    del cert["sha256"]
    cert["backend"].update(name=HOSTILE, framework=HOSTILE, framework_version=HOSTILE, ref=HOSTILE)
    cert["backend"]["deviations"] = {k: HOSTILE for k in cert["backend"]["deviations"]}
    (certs / "torch-sdpa-math.json").write_text(json.dumps(certificate.seal(cert)), "utf-8")
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    section = text.split(scoreboard.START)[1].split(scoreboard.END)[0]
    assert all(not line.startswith("#") or line.startswith("### ") for line in section.split("\n"))
    parsed = _Html()
    parsed.feed(markdown.markdown(section, extensions=["tables", "attr_list"]))
    assert {tag for tag, _ in parsed.tags} <= {"a", "p", "img", "em", "strong", "h3", "table",
                                               "thead", "tbody", "tr", "th", "td", "code"}
    assert [a["src"] for tag, a in parsed.tags if tag == "img"] == ["assets/board.svg"]
    assert not any(k.startswith("on") for _, a in parsed.tags for k in a)
    assert not any(a.get("href", "").startswith("http") for _, a in parsed.tags)
    # every row has the cells of its header: 1 + 6 (coverage), 1 + core, 1 + optional
    board = scoreboard.read_rows(certs)
    assert parsed.rows == [6, 6] + [len(board.core) + 1] * 2 + [len(board.optional) + 1] * 2
    # the strings are shown, literally, in the text and in the tooltips
    assert HOSTILE.replace("\n", " ") in "".join(parsed.text)
    titles = [a["title"] for tag, a in parsed.tags
              if tag == "a" and "MASK-13" in a.get("title", "")]
    assert titles and all(HOSTILE.replace("\n", " ") in t for t in titles)
    # the picture: glyphs drawn as paths (the strings only in escaped XML comments), no script
    elements = list(ElementTree.parse(image).getroot().iter())
    tags = {el.tag.rsplit("}", 1)[-1] for el in elements}
    assert "path" in tags and not tags & {"script", "text", "foreignObject", "a", "image"}
    assert not any(k.startswith("on") for el in elements for k in el.attrib)
