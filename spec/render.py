"""Render the clause table as the Markdown text of the specification (one anchor per clause id)."""

from __future__ import annotations

from . import Spec, load


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
            lines += [f"### {clause.id}: {clause.title}{kind} {{#{clause.id}}}", "", clause.text, ""]
    return "\n".join(lines).rstrip() + "\n"


def rendered_filename(spec: Spec) -> str:
    return f"mhaspec-{spec.version}.md"

