"""What a verdict covers: "N of M testable clauses", core and the optional chapters, in the
certificate's headline, its Markdown and `mhaspec verify`'s output (issue 22 item 11).

Axis legend: none (tables of verdicts).
"""

from __future__ import annotations

import json

from mhaspec import certificate, certificate_markdown, cli, coverage
from mhaspec.conformance.verdicts import count_verdicts, overall_verdict
from mhaspec.spec import load as load_spec


def body_claiming(capabilities: list[str], passing: set[str]) -> dict:
    """A sealed, consistent certificate whose ``passing`` clauses pass and whose other testable
    clauses are not implemented."""
    spec = load_spec()
    clauses = [{"id": c.id, "title": c.title,
                "verdict": ("pass" if c.id in passing else "not-implemented") if c.testable
                else "not-run",
                "worst_ratio": 0.5 if c.id in passing else 0.0, "runs": int(c.id in passing),
                "ran_on": ["cpu/float64"] if c.id in passing else [], "not_run_on": [],
                "failures": []} for c in spec.clauses]
    return certificate.seal({
        "schema": certificate.SCHEMA_ID,
        "spec": {"name": spec.name, "version": spec.version, "status": spec.status},
        "suite": {"version": "0", "git_commit": None},
        "backend": {"ref": "heads-only", "name": "heads-only", "framework": "numpy",
                    "framework_version": "2.0", "protocol_version": 1,
                    "capabilities": capabilities, "deviations": {}},
        "environment": {"python": "3", "platform": "x", "devices": {
            "cpu": {"name": "x86_64", "dtypes": ["float64"], "precision_flags": {}}}},
        "hypothesis": {"profile": "ci", "seed": 0, "max_examples": 8, "backend_calls": 1},
        "issued": "2026-01-01T00:00:00+00:00", "clauses": clauses,
        "summary": {"verdict": overall_verdict(clauses), "counts": count_verdicts(clauses)}})


def test_a_backend_claiming_only_heads_is_not_given_a_bare_conforms(tmp_path, capsys):
    spec = load_spec()
    cert = body_claiming(["heads"], {"HEAD-1", "HEAD-2"})
    testable = len(spec.testable_ids)
    md = certificate_markdown.to_markdown(cert)
    assert "**Verdict: conforms**" not in md
    label = certificate.spec_label(cert["spec"])  # "1.3 (draft)" while the version is a draft
    assert (f"**Verdict: conforms on 2 of {testable} testable clauses of mhaspec {label}**"
            in md)
    assert "for the capabilities it claims: heads." in md
    assert f"| covers | 2 of {testable} testable clauses; core 2 of " in md
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cert), "utf-8")
    assert cli.main(["verify", str(path)]) == 0
    first, second = capsys.readouterr().out.split("\n")[:2]
    assert first.endswith(f": conforms on 2 of {testable} testable clauses of mhaspec {label}")
    assert second.startswith(f"covers: 2 of {testable} testable clauses; core 2 of ")
    assert second.endswith("claimed capabilities: heads")


def test_core_and_optional_levels():
    spec = load_spec()
    core_ids = {c.id for c in spec.clauses if c.testable
                and not coverage.is_optional(next(ch.title for ch in spec.chapters
                                                  if ch.id == c.chapter))
                and not coverage.is_optional(c.title)}
    everything = body_claiming(["all"], set(spec.testable_ids))
    cov = coverage.of(everything)
    assert cov.certified == cov.testable == len(spec.testable_ids)
    assert cov.core == (len(core_ids), len(core_ids)) and "MHA-6" not in core_ids
    assert cov.levels == ["core", *cov.optional] and {"GRAD", "GQA", "LSE"} <= set(cov.optional)
    without_lse = coverage.of(body_claiming(["all"], set(spec.testable_ids) - {"LSE-2"}))
    assert "LSE" not in without_lse.levels and "core" in without_lse.levels
    assert without_lse.chapters["LSE"] == (1, 2)
    assert ", LSE 1/2" in coverage.summary(without_lse)


def test_a_failing_certificate_names_its_verdict_first():
    spec = load_spec()
    cert = json.loads(json.dumps(body_claiming(["sdpa"], {"SDPA-1", "SDPA-3"})))
    del cert["sha256"]
    next(c for c in cert["clauses"] if c["id"] == "SDPA-3")["verdict"] = "fail"
    cert["summary"] = {"verdict": overall_verdict(cert["clauses"]),
                       "counts": count_verdicts(cert["clauses"])}
    assert coverage.headline(cert) == (f"does not conform (1 of {len(spec.testable_ids)} "
                                       f"testable clauses of mhaspec "
                                       f"{certificate.spec_label(cert['spec'])} certified)")
