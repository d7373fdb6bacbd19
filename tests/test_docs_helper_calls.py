"""The adapter helpers as the documentation calls them: every call of a helper of
:mod:`mhaspec.backends.masks` written in the docs passes the helper's required keyword-only
arguments (``fill_blocked(allowed, like=q, ...)``), so a reader who copies it gets no TypeError."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

from mhaspec.backends import masks

DOCS = sorted((pathlib.Path(__file__).resolve().parents[1] / "docs").rglob("*.md"))


def required_keywords(fn) -> set[str]:
    """The keyword-only parameters of ``fn`` without a default."""
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.default is p.empty}


HELPERS = {name: required_keywords(fn) for name, fn in vars(masks).items()
           if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == masks.__name__
           and required_keywords(fn)}


def calls(text: str, name: str) -> list[str]:
    """The argument text of each ``name(...)`` call in ``text`` (balanced parentheses); a call
    written ``name(...)`` (arguments elided) is not a call to check."""
    found = []
    for match in re.finditer(rf"\b{name}\(", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i])
                break
    return [args for args in found if args.strip() not in ("...", "")]


def test_some_helper_has_a_required_keyword():
    assert "fill_blocked" in HELPERS and HELPERS["fill_blocked"] == {"like"}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_doc_calls_pass_the_required_keywords(page):
    text = page.read_text("utf-8")
    missing = [f"{name}({args})" for name, needed in HELPERS.items() for args in calls(text, name)
               if any(f"{kw}=" not in args for kw in needed)]
    assert not missing, f"{page.name}: calls without their required keywords: {missing}"
