"""The clause table: well formed, stable ids, rendered text in step with it."""

import pathlib

import pytest

from mhaspec.spec import load, parse
from mhaspec.spec.render import render_markdown, rendered_filename

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_clause_ids_are_unique_and_belong_to_their_chapter():
    spec = load()
    ids = [c.id for c in spec.clauses]
    assert len(ids) == len(set(ids))
    assert all(c.id.startswith(c.chapter + "-") for c in spec.clauses)


def test_committed_rendering_is_up_to_date():
    spec = load()
    committed = (ROOT / "spec" / rendered_filename(spec)).read_text(encoding="utf-8")
    assert committed == render_markdown(spec), "run `python -m mhaspec.spec` and commit the result"


def test_every_clause_has_an_anchor():
    text = render_markdown(load())
    for clause in load().clauses:
        assert f"{{#{clause.id}}}" in text


MINIMAL = """
[spec]
name = "mhaspec"
version = "9.9"
status = "{status}"
title = "t"
[[chapter]]
id = "A"
title = "a"
[[clause]]
id = "A-1"
chapter = "A"
title = "x"
text = "x"
testable = true
"""


def test_duplicate_clause_id_is_rejected():
    toml = MINIMAL.format(status="draft") + """
[[clause]]
id = "A-1"
chapter = "A"
title = "y"
text = "y"
testable = true
"""
    with pytest.raises(ValueError, match="duplicate clause id 'A-1'"):
        parse(toml)


@pytest.mark.parametrize("status", ["draft", "released"])
def test_status_is_draft_or_released(status):
    spec = parse(MINIMAL.format(status=status))
    assert spec.status == status
    assert spec.is_draft == (status == "draft")


@pytest.mark.parametrize("toml", [MINIMAL.format(status="final"), MINIMAL.format(status="Draft"),
                                  MINIMAL.replace('status = "{status}"\n', "")],
                         ids=["unknown", "wrong-case", "missing"])
def test_other_statuses_are_rejected(toml):
    with pytest.raises(ValueError, match="status must be one of"):
        parse(toml)


def test_a_draft_says_so_in_its_heading_and_a_released_version_does_not():
    draft = render_markdown(parse(MINIMAL.format(status="draft"))).splitlines()
    released = render_markdown(parse(MINIMAL.format(status="released"))).splitlines()
    assert draft[0].endswith("(draft)") and "(draft)" in draft[2]
    assert "draft" not in "\n".join(released)


def test_the_current_version_is_the_1_4_release():
    """1.4 is released (every in-repo backend conforms to it) and frozen: the latest release."""
    spec = load()
    assert (spec.version, spec.status) == ("1.4", "released")
    assert max(FROZEN, key=lambda v: tuple(map(int, v.split(".")))) == "1.4"


def test_new_and_changed_clauses_are_marked_in_the_rendering():
    """``since`` / ``changed`` in the table become "New in 1.3." / "Changed in 1.3." under the
    clause heading; a table without them (every released one) renders no marker."""
    spec = load()
    text = render_markdown(spec)
    marked = [c for c in spec.clauses if c.marker]
    assert {c.id for c in marked} >= {"GRAD-3", "SINK-1", "CONF-1", "LSE-1"}
    for c in marked:
        assert f"{{#{c.id}}}\n\n*{c.marker}*\n\n" in text, c.id
    assert "New in" not in render_markdown(parse(MINIMAL.format(status="released")))


def test_the_conformance_clause_carries_the_rfc_2119_sentence():
    text = load().clause("CONF-1").text
    assert "RFC 2119" in text and "conforms to mhaspec 1.4" in text


def test_released_renderings_are_reproduced_by_the_renderer():
    """The renderer still writes 1.1's frozen text from 1.1's table (marked released)."""
    import subprocess

    old = subprocess.run(["git", "show", "3a51267:spec/clauses.toml"], cwd=ROOT, text=True,
                         capture_output=True)
    if old.returncode:
        pytest.skip(f"1.1's clause table is not in this checkout's history: {old.stderr.strip()}")
    table = old.stdout.replace('version = "1.1"\n', 'version = "1.1"\nstatus = "released"\n')
    frozen = (ROOT / "spec" / "mhaspec-1.1.md").read_text(encoding="utf-8")
    assert render_markdown(parse(table)) == frozen


def test_inline_math_stays_on_one_line():
    """The site converts ``$...$`` line by line (docs/_hooks): a formula broken across lines would
    be shown as raw TeX (it happened to WIN-3 and ALIBI-1 in the 1.2 draft)."""
    import re

    spec = load()
    broken = []
    for where, text in [(c.id, c.intro or "") for c in spec.chapters] + [(c.id, c.text)
                                                                          for c in spec.clauses]:
        inline = re.sub(r"\$\$.+?\$\$", "", text, flags=re.S)
        broken += [(where, m) for m in re.findall(r"\$[^$]+?\$", inline) if "\n" in m]
    assert not broken, broken


def test_the_input_clause_names_every_operation_and_argument():
    text = load().clause("INPUT-1").text
    for word in ("split_heads", "combine_heads", "scaled dot-product attention",
                 "multi-head attention", "mha_vjp", "`q`", "`k`", "`v`", "`query`", "`key`",
                 "`value`", "`W_q`", "`b_o`", "`mask`", "`bias`", "`legacy_mask`",
                 "`key_padding_mask`", "`cotangent`", "self-attention"):
        assert word in text, word


def test_the_decisions_frameworks_disagree_on_are_clauses():
    ids = {c.id for c in load().clauses}
    assert {"MASK-1", "MASK-3", "MASK-5", "MASK-6", "MASK-7", "MASK-9", "NUM-2", "NUM-3"} <= ids


#: SHA-256 of every released version's frozen rendering (errata policy: never edited in place).
FROZEN = {"1.0": "ec86283ee2ebe6f4721524c5798fcfc4a6b315ce11892a26d602ac45fa2ac33a",
          "1.1": "a34fda1483db99abfd192b2d1d3975f94527738bde3bd1266bfb4007174820fd",
          "1.2": "5fd7ac07e782a6451774424771c136b50fd4c8b525087f5e69a6d93b3eab55d4",
          "1.3": "18d1048c610e86a625017b23c5b20bb8757f6e1772c781ed9ce89c905585eed2",
          "1.4": "b7ee896a76ae171737c54e500261db9d359bc4bbb7142aec028d9f9c6f989981"}


@pytest.mark.parametrize("version", sorted(FROZEN))
def test_released_versions_are_never_edited(version):
    import hashlib

    text = (ROOT / "spec" / f"mhaspec-{version}.md").read_bytes()
    assert hashlib.sha256(text).hexdigest() == FROZEN[version], (
        f"spec/mhaspec-{version}.md was edited after release; make the change in a new version")


@pytest.mark.parametrize("version", sorted(FROZEN))
def test_released_clause_ids_are_kept(version):
    import re

    text = (ROOT / "spec" / f"mhaspec-{version}.md").read_text(encoding="utf-8")
    released = set(re.findall(r"^### ([A-Z]+-\d+):", text, re.M))
    assert released, "no clause headings found"
    assert released <= {c.id for c in load().clauses}, "a released clause id was removed"


# -- erratum notes (errata policy, rule 8)

def test_erratum_notes_leave_the_released_text_as_it_is():
    """The notes are added around the clauses on the site; removing them gives the rendering
    exactly, and each sits after the clause (or chapter introduction) it applies to first."""
    import dataclasses
    import re

    from mhaspec.spec.render import annotate_errata

    spec = load()
    text = render_markdown(spec)
    assert annotate_errata(text, dataclasses.replace(spec, errata=())) == text
    annotated = annotate_errata(text, spec, link="../errata.md")
    stripped = re.sub(r"\n*!!! warning \"Erratum [^\n]*\n(?:(?:    [^\n]*|)\n)*?(?=\S)", "\n\n",
                      annotated)
    assert re.sub(r"\n{3,}", "\n\n", stripped) == re.sub(r"\n{3,}", "\n\n", text)
    for e in spec.errata:
        assert e.version in FROZEN, f"erratum {e.id} names {e.version}, not a released version"
        note = annotated.index(f"{e.title}\"\n    {e.text.splitlines()[0]}")
        heading = annotated.rindex("{#", 0, note)
        assert annotated.startswith(e.applies_to[0] + "}", heading + 2), (e.id, e.applies_to)


def test_erratum_evidence_names_tests_that_exist():
    import ast

    for e in load().errata:
        assert e.evidence, f"erratum {e.id} names no test"
        for ref in e.evidence:
            path, _, name = ref.partition("::")
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, ref


def test_an_erratum_of_an_unknown_clause_is_rejected():
    toml = MINIMAL.format(status="released") + """
[[erratum]]
id = "E1"
version = "9.9"
applies_to = ["B-1"]
title = "t"
text = "t"
"""
    with pytest.raises(ValueError, match="erratum 'E1' applies to unknown"):
        parse(toml)
