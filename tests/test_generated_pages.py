"""Generated pages name their spec version, and the site marks the ones that are not current.

Axis legend: none (Markdown text).
"""

from __future__ import annotations

import pathlib
import re

import pytest

from mhaspec import errors_table, generated, soak
from mhaspec.spec import SPEC_VERSION

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = sorted((DOCS / "generated").glob("*.md"))


@pytest.mark.parametrize("page", GENERATED, ids=lambda p: p.name)
def test_every_generated_page_names_its_spec_version(page):
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!-- mhaspec:generated spec="), f"{page.name}: no marker on line 1"
    assert generated.version_of(text) is not None
    assert page.name in generated.REGENERATE


def test_a_current_page_is_shown_under_its_version_and_a_stale_one_collapsed_under_a_warning():
    table = "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    current = generated.include(generated.marker(SPEC_VERSION) + "\n" + table, SPEC_VERSION, "cmd")
    assert current.startswith(f"*Generated against mhaspec {SPEC_VERSION}.*") and table in current
    stale = generated.include(generated.marker("1.0") + "\n" + table, SPEC_VERSION, "nox -s x")
    head, *body = stale.split("\n")
    assert head == (f'??? warning "Not current: this table was generated against mhaspec 1.0; '
                    f'the current version is {SPEC_VERSION}"')
    assert "`nox -s x`" in body[0]
    assert all(line.startswith("    ") or not line for line in body)  # all inside the block
    unmarked = generated.include(table, SPEC_VERSION, "cmd")
    assert unmarked.startswith('??? warning "Not current: this table names no spec version')


def test_the_generators_write_the_marker():
    assert errors_table.render().split("\n")[0] == generated.marker(SPEC_VERSION)
    summary = {"elapsed_s": 1.0, "rounds": [], "profile": "certify", "by_backend_dtype": {},
               "failures": [], "target_examples": 1, "spec_version": SPEC_VERSION}
    assert soak.markdown(summary).split("\n")[0] == generated.marker(SPEC_VERSION)
    for module in ("src/mhaspec/matrix.py", "src/mhaspec/bench/__main__.py"):
        assert "generated.marker(" in (ROOT / module).read_text("utf-8"), module


def test_generated_pages_are_included_only_through_the_version_check():
    """Pages include docs/generated/*.md only with the hook's if-exists directive (which passes
    them through :func:`generated.include`), never by a plain link."""
    for page in DOCS.rglob("*.md"):
        if "generated" in page.parts:
            continue
        text = page.read_text(encoding="utf-8")
        linked = re.findall(r"\]\((?:\.\./)*generated/[^)]*\.md\)", text)
        assert not linked, f"{page}: links a generated page directly: {linked}"


def test_the_matrix_names_the_registered_backends_a_run_left_out():
    from mhaspec import matrix
    from mhaspec.backends import load_backend

    backend = load_backend("numpy-batched")
    results = [{"backend": "numpy-batched", "device": "cpu", "dtype": "float64",
                "clauses": ["SDPA-1"], "outcome": "pass", "test": "t", "nodeid": "t", "ratios": {},
                "duration": 0.5}]
    page = matrix.render(results, {backend.name: backend}, None, "ci",
                         left_out=["jax-jit", "torch-flex"])
    assert page.split("\n")[0] == generated.marker(SPEC_VERSION)
    assert ("**Not in this run**: 2 registered backends (not chosen with `--backend`, or their "
            "framework not installed where it ran): `jax-jit`, `torch-flex`.") in page
    assert "Not in this run" not in matrix.render(results, {backend.name: backend}, None, "ci")
