"""CITATION.cff is valid Citation File Format 1.2.0 and agrees with the project metadata.

Validation uses ``cffconvert`` (in the ``docs`` dependency group; ``nox -s docs`` and
``nox -s citation`` install it): its own validator, and a JSON-schema check against the CFF 1.2.0
schema that ships as package data inside ``cffconvert``. Nothing is fetched at test time.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import tomllib
from importlib import resources

import pytest

import mhaspec

ROOT = pathlib.Path(__file__).resolve().parents[1]
CFF = ROOT / "CITATION.cff"

cffconvert = pytest.importorskip(
    "cffconvert", reason="cffconvert is not installed (it is in the 'docs' dependency group; "
                         "run `nox -s citation`)")


@pytest.fixture(scope="module")
def cff_text() -> str:
    return CFF.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def cff(cff_text) -> dict:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(cff_text)


def test_cffconvert_validates(cff_text):
    from cffconvert.cli.create_citation import create_citation

    citation = create_citation(str(CFF), None)
    assert citation.cffversion == "1.2.0"
    citation.validate()  # raises on an invalid file


def test_json_schema_1_2_0(cff):
    import jsonschema

    schema_file = resources.files("cffconvert").joinpath("schemas/1.2.0/schema.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    data = json.loads(json.dumps(cff, default=lambda o: o.isoformat()))  # dates as YAML gives them
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_metadata(cff):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert cff["cff-version"] == "1.2.0"
    assert cff["authors"] == [{"name": "mhaspec developers"}]
    assert str(cff["version"]) == mhaspec.__version__ == "1.4.0"
    assert "version" in project["dynamic"]  # read from mhaspec.__version__
    assert cff["license"] == project["license"] == "Apache-2.0"
    assert cff["date-released"] in (datetime.date(2026, 12, 3), "2026-12-03")
    assert cff["title"].startswith("mhaspec")
    assert "mhaspec 1.4, clause MASK-3" in cff["message"]


def test_references_vaswani(cff):
    titles = {ref["title"]: ref for ref in cff["references"]}
    vaswani = titles["Attention Is All You Need"]
    assert vaswani["year"] == 2017
    assert vaswani["authors"][0]["family-names"] == "Vaswani"


def test_the_site_address_is_the_same_everywhere_or_nowhere(cff):
    """CITATION.cff's url, mkdocs.yml's site_url and the Cite page's BibTeX of mhaspec give one
    address, or none while the site has no published address (each None)."""
    import re

    site_url = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text("utf-8"), re.M)
    cite = (ROOT / "docs" / "cite.md").read_text("utf-8")
    entry = cite[cite.index("@misc{mhaspec"):]
    bibtex = re.search(r"url\s*=\s*\{([^}]+)\}", entry[:entry.index("\n}")])
    addresses = {cff.get("url"), bibtex and bibtex[1], site_url and site_url[1]}
    assert len(addresses) == 1, addresses
    address = addresses.pop()
    assert address is None or address.startswith("https://") and address.endswith("/")
