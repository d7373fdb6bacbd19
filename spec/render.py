"""Render the clause table as the Markdown text of the specification (one anchor per clause id)."""

from __future__ import annotations

import re

from . import Erratum, Spec, load


def render_markdown(spec: Spec) -> str:
    """The whole specification as Markdown; each clause heading carries ``{#<clause-id>}``. A
    draft says so in its title and version line (a released version's text is unchanged)."""
    draft = " (draft)" if spec.is_draft else ""
    lines = [f"# {spec.title}{draft}", "",
             f"**{spec.name} {spec.version}{draft}**. Cite a clause as *{spec.name} {spec.version}, "
             f"clause MASK-9*.", "Generated from `spec/clauses.toml`; do not edit by hand.", ""]
    if spec.is_draft:
        lines += [f"This is a draft: its clauses may still change before {spec.version} is "
                  f"released.", ""]
    for n, chapter in enumerate(spec.chapters, start=1):
        lines += [f"## {n}. {chapter.title} ({chapter.id}) {{#{chapter.id}}}", ""]
        if chapter.intro:
            lines += [chapter.intro, ""]
        for clause in (c for c in spec.clauses if c.chapter == chapter.id):
            kind = "" if clause.testable else " *(informative)*"
            lines += [f"### {clause.id}: {clause.title}{kind} {{#{clause.id}}}", ""]
            if clause.marker:  # "New in 1.3." (clauses of a table without since/changed: none)
                lines += [f"*{clause.marker}*", ""]
            lines += [clause.text, ""]
    return "\n".join(lines).rstrip() + "\n"


def rendered_filename(spec: Spec) -> str:
    return f"mhaspec-{spec.version}.md"



def _indented(text: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in text.splitlines())


def render_erratum(erratum: Erratum, *, link: str = "", short: bool = False) -> str:
    """One erratum as an admonition; ``link``: the page listing every erratum; ``short``: a
    pointer to the full text (shown under the first id it applies to)."""
    ref = f"[erratum {erratum.version}-{erratum.id}]({link}#{erratum.anchor})" if link else \
        f"erratum {erratum.version}-{erratum.id}"
    body = (f"See {ref}, under {erratum.applies_to[0]}." if short else
            erratum.text + (f"\n\nThe evidence: {ref}." if link else ""))
    return (f"!!! warning \"Erratum {erratum.version}-{erratum.id} (informative): "
            f"{erratum.title}\"\n{_indented(body)}\n")


def annotate_errata(markdown: str, spec: Spec, *, link: str = "") -> str:
    """``markdown`` (a rendering of ``spec``) with each erratum placed at the end of the block
    (chapter introduction or clause) of every id it applies to; nothing else changes."""
    heading = re.compile(r"^#{2,3} .*\{#(?P<id>[A-Z]+(?:-\d+)?)\}$")
    out: list[str] = []
    pending: list[str] = []
    for line in markdown.splitlines() + [None]:
        m = heading.match(line) if line is not None else True
        if m:
            for note in pending:
                out += [note, ""] if out and out[-1] == "" else ["", note, ""]
            pending = [render_erratum(e, link=link, short=e.applies_to[0] != m["id"])
                       for e in spec.errata_of(m["id"])] if line is not None else []
        if line is not None:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def render_errata(spec: Spec) -> str:
    """Every erratum of the table, each under its own anchor, oldest version first."""
    parts = []
    for e in sorted(spec.errata, key=lambda e: (e.version, e.id)):
        evidence = "".join(f"\n- `{t}`" for t in e.evidence)
        parts.append(f"### {e.version}-{e.id}: {e.title} {{#{e.anchor}}}\n\n*Applies to "
                     f"{spec.name} {e.version}, {', '.join(e.applies_to)}.*\n\n{e.text}\n"
                     + (f"\nEvidence:\n{evidence}\n" if evidence else ""))
    return "\n".join(parts)
