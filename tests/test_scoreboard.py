"""``mhaspec scoreboard``: the ecosystem table rendered from the certificates in docs/certificates.

Axis legend: none (tables of verdicts).
"""

from __future__ import annotations

import pathlib
import shutil

import pytest

from mhaspec import cli, scoreboard

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
    page.write_text(f"# t\n\n{scoreboard.START}\nold\n{scoreboard.END}\n\nrest\n", encoding="utf-8")
    return certs, page, tmp_path / "assets" / "board.png"


def test_rows_follow_the_certificate(one_certificate):
    certs, _, _ = one_certificate
    rows, chapters, label, superseded = scoreboard.read_rows(certs)
    (row,) = rows
    assert row.name == "torch-sdpa-math" and row.library == "torch 2.13.0+cpu"
    assert row.verdict == "conforms" and label == "1.2" and superseded == []
    assert row.cells["MASK"][0] == "deviation"  # MASK-13 declared, confirmed
    assert any(n.startswith("MASK-13: ") for n in row.cells["MASK"][1])
    assert row.cells["HEAD"][0] == "not-implemented"
    assert row.cells["SDPA"] == ("pass", ["SDPA-1", "SDPA-3", "SDPA-5", "SDPA-6", "SDPA-7"])
    assert row.cells["GQA"] == ("pass", ["GQA-1", "GQA-2"])
    assert set(chapters) >= {"SHAPE", "MASK", "NUM", "ERR", "GQA", "LSE"}


def test_a_certificate_of_a_draft_since_released_is_listed_not_gridded(one_certificate):
    """Its digest is checked, but its clauses (the draft's, kept nowhere) cannot be: it is named
    below the grid, to be re-issued, and `mhaspec verify` says so."""
    certs, page, image = one_certificate
    shutil.copy(DRAFT, certs)
    rows, _, label, superseded = scoreboard.read_rows(certs)
    assert [r.name for r in rows] == ["torch-sdpa-math"] and label == "1.2"
    assert [(s.name, s.label, s.markdown) for s in superseded] == [
        ("ort-attention", "1.2 (draft)", "ort-attention.md")]
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "| [`ort-attention`]" not in text
    assert "Not in the grid: certificates issued against a draft that has since been released" in text
    assert "[`ort-attention`](certs/ort-attention.md) (1.2 (draft), issued 2026-11-30)" in text


def test_verify_asks_to_reissue_a_certificate_of_a_draft_since_released(capsys):
    assert cli.main(["verify", str(DRAFT)]) != 0
    err = capsys.readouterr().err
    assert "issued against the 1.2 draft, and 1.2 has since been released" in err


def test_the_command_writes_the_grid_linked_to_certificates_and_the_image(one_certificate):
    certs, page, image = one_certificate
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith("rest\n")
    assert "| [`torch-sdpa-math`](certs/torch-sdpa-math.md) | torch 2.13.0+cpu | conforms |" in text
    assert '[🟡](certs/torch-sdpa-math.md "declared deviation: MASK-13: ' in text
    assert "![The scoreboard as an image" in text and "(assets/board.png)" in text
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
