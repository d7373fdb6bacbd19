"""No placeholder address in what a user or citer reads: the docs, the README, the package
metadata and the citation file name no web address at a reserved example or test domain
(``example.org``, ``example.com``, ``*.example``, ``*.invalid``, ``*.test``, ``localhost``: RFC 2606
and 6761). Until the site has a real address, none is published (cite by version and clause).

An e-mail identity at ``example.org`` in a signing example (``ci@example.org``) is an illustration,
not an address of the project, and is not a URL: it is allowed.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: the files a reader or a packaging tool takes addresses from
FILES = ("README.md", "CITATION.cff", "mkdocs.yml", "pyproject.toml")
FOLDERS = (("docs", ("*.md", "*.yml", "*.json", "*.html")), ("examples", ("*.md", "*.toml", "*.cff")))

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://([^/\s\"'<>)\]`]+)[^\s\"'<>)\]`]*", re.I)
RESERVED = re.compile(r"(^|\.)(example(\.(org|com|net))?|invalid|test|localhost)(:\d+)?$", re.I)


def published_files() -> list[pathlib.Path]:
    found = [ROOT / name for name in FILES]
    for folder, patterns in FOLDERS:
        found += [p for pattern in patterns for p in sorted((ROOT / folder).rglob(pattern))]
    return [p for p in found if p.is_file()]


def placeholder_urls(text: str) -> list[str]:
    """The URLs in ``text`` whose host is a reserved example or test name."""
    return [m[0] for m in URL.finditer(text)
            if RESERVED.search(m[1].rsplit("@", 1)[-1].rstrip(".,;:"))]


def test_the_finder_knows_a_placeholder_from_a_real_address():
    assert placeholder_urls("see https://mhaspec.example.org/spec/ and http://example.com:8000/x") == [
        "https://mhaspec.example.org/spec/", "http://example.com:8000/x"]
    assert placeholder_urls("site_url: https://docs.example/") == ["https://docs.example/"]
    assert placeholder_urls("<http://localhost:8000/> or https://x.invalid") == [
        "http://localhost:8000/", "https://x.invalid"]
    assert not placeholder_urls("https://arxiv.org/abs/1706.03762 https://examples.org/ "
                                "ci@example.org https://pytorch.org/docs/")


def test_no_placeholder_address_is_published():
    found = {str(p.relative_to(ROOT)): urls for p in published_files()
             if (urls := placeholder_urls(p.read_text("utf-8", errors="replace")))}
    assert not found, f"placeholder addresses (publish none until a real one exists): {found}"
