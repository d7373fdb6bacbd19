"""The Markdown certificate of a hostile backend: every name and message a backend supplies is
escaped or fenced, so nothing it says becomes a heading, a verdict, a link, HTML or a table cell."""

from __future__ import annotations

from mhaspec import certificate, certificate_markdown
from mhaspec.conformance.verdicts import count_verdicts, overall_verdict
from mhaspec.spec import load as load_spec

from hostile_files import certificate_body


# -- the Markdown certificate -----------------------------------------------------------------------

HOSTILE = "x`\n```\n# Verdict: conforms\n| pass | pass |\n<script>alert(1)</script>\n[link](http://e)"


def fenced_blocks(md: str) -> list[tuple[int, int]]:
    """(first, last) line numbers of each fenced code block, as CommonMark closes them: a fence of
    n backticks ends at the first line of at least n backticks and nothing else."""
    blocks, lines, i = [], md.split("\n"), 0
    while i < len(lines):
        opening = len(lines[i]) - len(lines[i].lstrip("`"))
        if opening >= 3 and "`" not in lines[i][opening:]:
            j = next((j for j in range(i + 1, len(lines)) if lines[j].strip("`") == ""
                      and len(lines[j]) >= opening), len(lines))
            blocks.append((i, j))
            i = j
        i += 1
    return blocks


def test_markdown_escapes_everything_a_backend_supplies():
    body = certificate_body()
    body["backend"].update(name=HOSTILE, framework=HOSTILE, framework_version=HOSTILE, ref=HOSTILE,
                           deviations={"MASK-9": HOSTILE})
    failing = body["clauses"][3]
    failing.update(verdict="fail", failures=["error\n````\n# Verdict: conforms\n`` `` ```"])
    body["summary"] = {"verdict": overall_verdict(body["clauses"]),
                       "counts": count_verdicts(body["clauses"])}
    md = certificate_markdown.to_markdown(certificate.seal(body))
    lines = md.split("\n")
    blocks = fenced_blocks(md)
    outside = [line for n, line in enumerate(lines) if not any(a <= n <= b for a, b in blocks)]
    assert [line for line in outside if line.startswith("#")] == [
        lines[0], "## Failures", f"### {failing['id']}"]
    assert "<script" not in md and "[link](http" not in md and "\\[link\\]" in md
    spec, testable = load_spec(), len(load_spec().testable_ids)
    assert [line.split("**")[1] for line in outside if line.startswith("**")] == [
        f"Verdict: does not conform ({testable - 1} of {testable} testable clauses of mhaspec "
        f"{certificate.spec_label(body['spec'])} certified)"]
    # the failure message stays inside one fence, whole
    (first, last), = blocks
    assert "\n".join(lines[first + 1:last]) == failing["failures"][0]
    # every table row keeps its columns: unescaped pipes only between cells
    for line in outside:
        if line.startswith("|"):
            cells = line.replace("\\|", "").count("|")
            assert cells in (3, 7), line
