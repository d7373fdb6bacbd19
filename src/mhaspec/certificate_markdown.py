"""A certificate as Markdown, for people: :func:`to_markdown` renders one (``mhaspec certify`` writes
it beside the JSON, ``mhaspec verify --markdown`` checks a rendering against it). Every string it
takes from a certificate is escaped (:func:`md_text`, :func:`md_fenced`), so none can add a
heading, a table cell or HTML. Rendering imports neither pytest nor Hypothesis.

The certificate's format (its body, schema, digest and consistency) is :mod:`mhaspec.certificate`.
"""

from __future__ import annotations

import re

from mhaspec import certificate, coverage
from mhaspec.certificate import released_clauses
from mhaspec.conformance.conditions import DIMENSIONS
from mhaspec.conformance.tolerance import format_ratio
from mhaspec.conformance.verdicts import backend_notes, describe_common, verdict_label

_MD_ESCAPES = {c: "\\" + c for c in "\\`*_[]|~"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;",
                                                  "$": "&#36;"}


def md_text(text: object) -> str:
    """``text`` as inline Markdown that renders literally: one line (newlines and other control
    characters become spaces), emphasis, code, links, table cells, HTML and ``$`` (the site's
    LaTeX delimiter) escaped. An underscore
    between two letters or digits (``split_heads``) cannot open or close emphasis and stays as is."""
    line = "".join(c if c.isprintable() else " " for c in str(text))
    return "".join(c if c == "_" and 0 < i < len(line) - 1 and line[i - 1].isalnum()
                   and line[i + 1].isalnum() else _MD_ESCAPES.get(c, c)
                   for i, c in enumerate(line))


def md_fenced(text: str) -> list[str]:
    """``text`` in a code fence longer than any run of backticks inside it (so it cannot close the
    fence); control characters other than newlines are written as escapes."""
    safe = "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii")
                   for c in text)
    longest = max((len(m) for m in re.findall(r"`+", safe)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, safe, fence]


def process_row(run: dict) -> list[str]:
    """The Markdown row saying where the backend ran (none for a certificate that does not say)."""
    if run.get("backend_process") != "sealed":
        return []
    return [f"| backend process | its own{md_text(certificate.process_details(run))}, sealed from "
            f"the judge; restarted "
            f"{run.get('backend_restarts', 0)} times |"]


def condition_values(conditions: list[str]) -> tuple[str, int, str]:
    """A clause's recorded ``conditions`` (rows ``"dim=value, ..."``, then ``"not implemented:
    ..."``) compactly: ``("dim: v1, v2; dim: ...", rows, "kept-out values")``."""
    rows = [c for c in conditions if not c.startswith("not implemented: ")]
    values: dict[str, list[str]] = {}
    for row in rows:
        for item in row.split(", "):
            dim, _, value = item.partition("=")
            if value not in values.setdefault(dim, []):
                values[dim].append(value)
    def order(dim: str, value: str) -> int:  # the space's order of values, others last
        known = DIMENSIONS.get(dim, ())
        return known.index(value) if value in known else len(known)

    kept_out = [c.removeprefix("not implemented: ") for c in conditions if c not in rows]
    return ("; ".join(f"{d}: {', '.join(sorted(v, key=lambda x: order(d, x)))}"
                      for d, v in values.items()), len(rows), ", ".join(kept_out))


def to_markdown(cert: dict) -> str:
    """A human-readable rendering of a certificate; every string it takes from the certificate is
    escaped (:func:`md_text`, :func:`md_fenced`), so none can add a heading, a table cell or HTML."""
    b = cert["backend"]
    informative = {cid for cid, _, t in released_clauses(cert["spec"]["version"]) or () if not t}
    devices = cert["environment"]["devices"]
    device_names = ", ".join(f"{md_text(d)}: {md_text(v['name'])}" for d, v in devices.items())
    device_dtypes = "; ".join(f"{md_text(d)}: " + ", ".join(v["dtypes"]) for d, v in devices.items())
    hyp = cert["hypothesis"]
    commit = certificate.suite_identity(cert["suite"])
    claimed = ", ".join(md_text(c) for c in b.get("capabilities", [])) or "none"
    lines = [f"# mhaspec certificate: {md_text(b['name'])}", "",
             f"**Verdict: {coverage.headline(cert)}** (suite {md_text(cert['suite']['version'])}, "
             f"{md_text(commit)}), for the capabilities it claims: {claimed}.", "",
             "| | |", "|---|---|",
             f"| covers | {coverage.summary(coverage.of(cert))} |",
             f"| backend | {md_text(b['name'])} ({md_text(b['ref'])}) |",
             f"| framework | {md_text(b['framework'])} {md_text(b['framework_version'])} |",
             f"| devices | {device_names} |",
             f"| dtypes | {device_dtypes} |",
             f"| hypothesis | profile {hyp['profile']}, "
             f"{md_text(hyp['inputs']) if hyp.get('inputs') else 'seed ' + str(hyp['seed'])}, "
             + (f"{hyp['examples']} Hypothesis examples, " if "examples" in hyp else "")
             + f"{hyp['backend_calls']} backend calls |",
             f"| issued | {md_text(cert['issued'])} |",
             *process_row(cert.get("run", {})), "",
             "| clause | title | verdict | worst NUM-3 ratio | runs | ran on |",
             "|---|---|---|---|---|---|"]
    for c in cert["clauses"]:
        ran_on = ", ".join(md_text(x) for x in c["ran_on"])
        if c.get("not_run_on"):
            ran_on += "; NOT RUN on " + ", ".join(md_text(x) for x in c["not_run_on"])
        ratio = "not finite" if c["worst_ratio"] is None else format_ratio(c["worst_ratio"])
        lines.append(f"| {md_text(c['id'])} | {md_text(c['title'])} | "
                     f"{md_text(verdict_label(c, informative))} | {ratio} | {c['runs']} | {ran_on} |")
    notes = backend_notes(cert["clauses"])
    if notes:
        lines += [""] + [f"- {md_text(n)}" for n in notes]
    if b["deviations"]:
        lines += ["", "Declared deviations:", ""]
        lines += [f"- **{md_text(k)}**: {md_text(v)}" for k, v in sorted(b["deviations"].items())]
    groups = cert.get("failure_groups") or []
    if groups:
        run = cert.get("run", {})
        lines += ["", "## Failures by likely cause", ""]
        for g in groups:
            typical = g.get("typical_relative_error")
            by = f", typical relative error {typical:.0e}" if typical is not None else ""
            common = describe_common(g.get("common") or {})
            lines.append(f"- **{md_text(g['cause'])}** {len(g['clauses'])} clauses, {g['tests']} "
                         f"tests on {', '.join(md_text(c) for c in g['cells'])}{by}: "
                         + ", ".join(md_text(c) for c in g["clauses"])
                         + (f"; common to every failing case: {md_text(common)}" if common else ""))
        if run.get("failures_not_shrunk"):
            lines += ["", f"{run['failures_not_shrunk']} failures were not shrunk (shrinking: "
                          f"{md_text(run.get('shrink', ''))}; `--mhaspec-shrink-all` shrinks every one)."]
    ran = [c for c in cert["clauses"] if c.get("conditions")]
    if ran:
        lines += ["", "## Conditions that ran", "",
                  "Per clause, the values of each dimension of its condition space its cases held "
                  "(`conformance/conditions.py`), the number of distinct combinations, and what a "
                  "capability not claimed kept out.", "",
                  "| clause | values | combinations | not implemented |", "|---|---|---|---|"]
        for c in ran:
            values, count, kept_out = condition_values(c["conditions"])
            lines.append(f"| {md_text(c['id'])} | {md_text(values)} | {count} | "
                         f"{md_text(kept_out) or '-'} |")
    failing = [c for c in cert["clauses"] if c["failures"]]
    if failing:
        lines += ["", "## Failures", ""]
        for c in failing:
            for msg in c["failures"]:
                lines += [f"### {md_text(c['id'])}", "", *md_fenced(msg), ""]
    lines += ["", f"SHA-256 of the canonical body: `{cert['sha256']}` (check with `mhaspec verify`)."]
    return "\n".join(lines) + "\n"
