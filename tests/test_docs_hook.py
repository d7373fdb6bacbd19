"""The docs build hook (docs/_hooks/mhaspec_docs.py): citation lines under every clause, and
generated pages marked when they are not of the current spec version.

Axis legend: none (Markdown text).
"""

from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

from mhaspec import generated
from mhaspec.spec import load

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hook():
    pytest.importorskip("latex2mathml", reason="latex2mathml is in the docs dependency group")
    spec = importlib.util.spec_from_file_location("mhaspec_docs_hook",
                                                  DOCS / "_hooks" / "mhaspec_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_clause_of_the_current_page_has_its_citation_and_permanent_link(hook):
    spec = load()
    page = hook.current_spec_page()
    released = any(v == spec.version for v, _ in hook.rendered_versions())
    for clause in spec.clauses:
        line = f"Cite as *mhaspec {spec.version}, clause {clause.id}*"
        if released:
            line += (f" · permanent link: [`spec/{spec.version}/#{clause.id}`]"
                     f"({spec.version}.md#{clause.id})")
        assert f"{{#{clause.id}}}\n\n{line}\n{{: .mh-cite }}" in page, clause.id


def test_a_frozen_page_cites_its_own_version(hook):
    version, path = hook.rendered_versions()[0]
    page = hook.frozen_spec_page(version, path)
    assert f"Cite as *mhaspec {version}, clause MASK-3* · permanent link: " \
           f"[`spec/{version}/#MASK-3`]({version}.md#MASK-3)" in page


def test_a_stale_generated_page_is_marked(hook, tmp_path):
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "matrix.md").write_text(
        generated.marker("1.0") + "\n# Conformance matrix: mhaspec 1.0\n", "utf-8")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="matrix.md"))
    out = hook.on_page_markdown(
        "<!-- mhaspec:if-exists generated/matrix.md -->\n{{content}}\n<!-- mhaspec:else -->\nno\n"
        "<!-- mhaspec:end -->", page, types.SimpleNamespace(docs_dir=str(tmp_path)), None)
    assert out.lstrip().startswith('??? warning "Not current: this table was generated against '
                                   'mhaspec 1.0')
    assert "`nox -s matrix`" in out
