"""``mhaspec scoreboard``: the ecosystem table rendered from the certificates in docs/certificates.

Axis legend: none (tables of verdicts).
"""

from __future__ import annotations

import pathlib
import shutil

import pytest

from mhaspec import cli, scoreboard

ROOT = pathlib.Path(__file__).resolve().parents[1]
ORT = ROOT / "docs" / "certificates" / "ort-attention.json"


@pytest.fixture
def one_certificate(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(ORT, certs)
    page = tmp_path / "page.md"
    page.write_text(f"# t\n\n{scoreboard.START}\nold\n{scoreboard.END}\n\nrest\n", encoding="utf-8")
    return certs, page, tmp_path / "assets" / "board.png"


def test_rows_follow_the_certificate(one_certificate):
    certs, _, _ = one_certificate
    rows, chapters, label = scoreboard.read_rows(certs)
    (row,) = rows
    assert row.name == "ort-attention" and row.library == "onnxruntime 1.32.0"
    assert row.verdict == "conforms" and label == "1.2 (draft)"
    assert row.cells["MASK"][0] == "deviation"  # MASK-13 declared, confirmed
    assert any(n.startswith("MASK-13: ") for n in row.cells["MASK"][1])
    assert row.cells["HEAD"][0] == "not-implemented"
    assert row.cells["SDPA"] == ("pass", [f"SDPA-{i}" for i in range(1, 8)])
    assert set(chapters) >= {"SHAPE", "MASK", "NUM", "ERR"}


def test_the_command_writes_the_grid_linked_to_certificates_and_the_image(one_certificate):
    certs, page, image = one_certificate
    assert cli.main(["scoreboard", "--certificates", str(certs), "--page", str(page),
                     "--image", str(image)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith("rest\n")
    assert "| [`ort-attention`](certs/ort-attention.md) | onnxruntime 1.32.0 | conforms |" in text
    assert '[🟡](certs/ort-attention.md "declared deviation: MASK-13: ' in text
    assert "![The scoreboard as an image" in text and "(assets/board.png)" in text
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_edited_certificate_is_refused_in_one_line(one_certificate, capsys):
    certs, page, image = one_certificate
    cert = certs / "ort-attention.json"
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
                     str(page), "--image", str(tmp_path / "assets" / "scoreboard.png")]) == 0
    assert page.read_text(encoding="utf-8") == (ROOT / "docs" / "matrix.md").read_text(
        encoding="utf-8")
