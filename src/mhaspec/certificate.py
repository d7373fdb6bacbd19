"""Certificates: what a conformance run found, per clause, in a form others can check.

A certificate is JSON (validated by ``certificate.schema.json``, shipped with the package) with a
SHA-256 of its canonical body, so an edited copy is detected by :func:`verify`; and Markdown for
people. The body is canonical JSON: keys sorted, no whitespace, UTF-8.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

SCHEMA_ID = "mhaspec-certificate/1"
VERDICTS = ("pass", "fail", "deviation", "stale-deviation", "not-implemented", "not-run")


class CertificateError(ValueError):
    """A certificate that is malformed, fails its schema or whose digest does not match."""


def schema() -> dict:
    return json.loads(resources.files("mhaspec").joinpath("certificate.schema.json").read_text("utf-8"))


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal(body: dict) -> dict:
    """The certificate: ``body`` plus ``sha256`` of its canonical form."""
    return {**body, "sha256": hashlib.sha256(canonical(body)).hexdigest()}


def verify(cert: Any) -> dict:
    """Check schema and digest; returns the certificate or raises :class:`CertificateError`."""
    import jsonschema

    try:
        jsonschema.validate(cert, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise CertificateError(f"certificate does not match {SCHEMA_ID} at {where}: {exc.message}") from None
    body = {k: v for k, v in cert.items() if k != "sha256"}
    digest = hashlib.sha256(canonical(body)).hexdigest()
    if digest != cert["sha256"]:
        raise CertificateError(f"certificate digest mismatch: recorded {cert['sha256'][:16]}..., "
                               f"content hashes to {digest[:16]}...: it was edited after sealing")
    return cert


def clause_verdicts(results: list[dict], spec, claimed_dtypes: dict[str, list[str]]) -> list[dict]:
    """One entry per spec clause from the plugin's results (see ``--mhaspec-report``)."""
    from mhaspec.conformance.plugin import summarize

    table = summarize(results)
    out = []
    for clause in spec.clauses:
        cells = [cell for (b, c), cell in table.items() if c == clause.id]
        runs = [r for r in results if clause.id in r["clauses"]]
        failures = [r["message"] for r in runs if r["outcome"] in ("fail", "stale-deviation")
                    and r.get("message")]
        if not clause.testable:
            verdict = "not-run"
        elif not cells:
            verdict = "not-run"
        else:
            outcomes = {r["outcome"] for r in runs if r["outcome"] != "unavailable"}
            verdict = next((v for v in ("fail", "stale-deviation", "deviation", "pass",
                                        "not-implemented") if v in outcomes), "not-run")
        out.append({
            "id": clause.id, "title": clause.title, "verdict": verdict,
            "worst_ratio": max((c["ratio"] for c in cells), default=0.0),
            "runs": sum(c["runs"] for c in cells),
            "ran_on": sorted({f"{r['device']}/{r['dtype']}" for r in runs
                              if r["outcome"] not in ("unavailable", "not-implemented")}),
            "failures": failures[:3],
        })
    return out


def to_markdown(cert: dict) -> str:
    """A human-readable rendering of a certificate."""
    b = cert["backend"]
    devices = cert["environment"]["devices"]
    device_names = ", ".join(f"{d}: {v['name']}" for d, v in devices.items())
    device_dtypes = "; ".join(f"{d}: " + ", ".join(v["dtypes"]) for d, v in devices.items())
    hyp = cert["hypothesis"]
    lines = [f"# mhaspec certificate: {b['name']}", "",
             f"**Verdict: {cert['summary']['verdict']}** against {cert['spec']['name']} "
             f"{cert['spec']['version']} (suite {cert['suite']['version']}, commit "
             f"{cert['suite']['git_commit'] or 'unknown'}).", "",
             "| | |", "|---|---|",
             f"| backend | `{b['name']}` ({b['ref']}) |",
             f"| framework | {b['framework']} {b['framework_version']} |",
             f"| devices | {device_names} |",
             f"| dtypes | {device_dtypes} |",
             f"| hypothesis | profile {hyp['profile']}, seed {hyp['seed']}, "
             + (f"{hyp['examples']} Hypothesis examples, " if "examples" in hyp else "")
             + f"{hyp['backend_calls']} backend calls |",
             f"| issued | {cert['issued']} |", "",
             "| clause | title | verdict | worst NUM-3 ratio | runs | ran on |",
             "|---|---|---|---|---|---|"]
    for c in cert["clauses"]:
        lines.append(f"| {c['id']} | {c['title']} | {c['verdict']} | {c['worst_ratio']:.2f} | "
                     f"{c['runs']} | {', '.join(c['ran_on'])} |")
    if b["deviations"]:
        lines += ["", "Declared deviations:", ""]
        lines += [f"- **{k}**: {v}" for k, v in sorted(b["deviations"].items())]
    failing = [c for c in cert["clauses"] if c["failures"]]
    if failing:
        lines += ["", "## Failures", ""]
        for c in failing:
            for msg in c["failures"]:
                lines += [f"### {c['id']}", "", "```", msg, "```", ""]
    lines += ["", f"SHA-256 of the canonical body: `{cert['sha256']}` (check with `mhaspec verify`)."]
    return "\n".join(lines) + "\n"
