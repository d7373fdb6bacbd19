"""``mhaspec audit CERT``: a re-run with the auditor's seed reproduces a published certificate's
verdicts, and a certificate whose verdict was edited is reported as differing.

Axis legend: none (the audit compares verdicts per clause)."""

from __future__ import annotations

import json
import pathlib

import pytest

from mhaspec import audit, certificate, usage

CERT = pathlib.Path(__file__).parent.parent / "docs" / "certificates" / "torch-sdpa-math.json"


@pytest.fixture(scope="module")
def published():
    """The published certificate of the in-repo torch-sdpa-math adapter and one audit run of it
    (seed 5, 2 examples per test)."""
    pytest.importorskip("torch", reason="the audited backend computes in PyTorch")
    cert = audit.read_certificate(CERT)
    return cert, audit.rerun(cert, seed=5, examples=2)


def test_an_audit_reproduces_every_verdict_of_a_published_certificate(published):
    cert, results = published
    assert audit.differences(cert, results) == []
    ran = {c for r in results if r["outcome"] != "unavailable" for c in r["clauses"]}
    passed = [c["id"] for c in cert["clauses"] if c["verdict"] == "pass"]
    assert passed and set(passed) <= ran  # the audit ran every clause the certificate passed


def test_a_verdict_edited_to_fail_is_reported_as_differing(published, tmp_path, monkeypatch,
                                                           capsys):
    cert, results = published
    body = {k: v for k, v in cert.items() if k != "sha256"}
    clause = next(c for c in body["clauses"] if c["verdict"] == "pass")
    clause["verdict"] = "fail"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(certificate.seal(body)))  # sealed again: a valid certificate
    monkeypatch.setattr(audit, "rerun", lambda *a, **k: results)  # the run above, not a second
    assert audit.main([str(edited), "--seed", "5"]) == 1
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    assert ["clause", "certificate", "audit", "tests", "run"] in rows
    assert [r[:3] for r in rows if r and r[0] == clause["id"]] == [[clause["id"], "fail", "pass"]]
    assert f"1 of {len(cert['clauses'])} clauses differ from the certificate" in out


def test_an_edited_certificate_that_was_not_sealed_again_is_refused(tmp_path):
    cert = json.loads(CERT.read_text())
    cert["clauses"][0]["verdict"] = "fail"
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(cert))
    with pytest.raises(usage.UsageError, match="digest mismatch"):
        audit.main([str(path)])


def test_a_backend_of_another_name_is_refused_before_anything_runs():
    with pytest.raises(usage.UsageError, match="^--backend: numpy-batched is numpy-batched, the "
                                               "certificate is of torch-sdpa-math$"):
        audit.main([str(CERT), "--backend", "numpy-batched"])


def test_a_clause_the_audit_fails_is_shown_with_its_first_failure():
    rows = [("SHAPE-5", "pass", "fail", 2), ("MASK-1", "fail", "pass", 3)]
    results = [{"clauses": ["SHAPE-5"], "outcome": "pass", "test": "test_a[x]", "message": ""},
               {"clauses": ["SHAPE-5"], "outcome": "fail", "test": "test_b[x]",
                "message": "\n[SHAPE-5] x sdpa: did not return within the per-call time limit\nmore"},
               {"clauses": ["MASK-1"], "outcome": "pass", "test": "test_c[x]", "message": ""}]
    assert audit.why(rows, results) == [
        "SHAPE-5: test_b[x]: [SHAPE-5] x sdpa: did not return within the per-call time limit"]
