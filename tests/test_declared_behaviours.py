"""A deviation declared by behaviour (``"behaviour:NAME"`` in ``deviations``): one behaviour that
fails some tests of several clauses (PaddlePaddle's clamped softmax exponent: a blocked key gets
1.6e-28, not 0, in MASK-1/5/6/7/8 and in WIN-1's, CHUNK-1's and SEG-4's checks of which keys a
query attends) is reported as a deviation naming it wherever it shows, within its bound; beyond
the bound, or undeclared, it fails under each clause; declared where it never shows, it is stale
on its home clause. Backends: tests/behaviour_backends.py."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mhaspec import certificate, runner
from mhaspec.backend_host import read_claims
from mhaspec.backends import behaviours, load_backend
from mhaspec.claims import ClaimError, checked
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

import hostile_files

HERE = pathlib.Path(__file__).parent
SHOWS_IN = sorted(behaviours.MASKED_WEIGHTS_NOT_ZERO.shows_in)
#: -k selecting the tests of the clauses the behaviour shows in (and, by substring, MASK-1x)
SELECTED = " or ".join(SHOWS_IN)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def entries(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """backend name -> clause id -> clause entry, from one ci run in float64 of the four."""
    refs = [f"behaviour_backends:{n}" for n in ("CLAMPED", "UNDECLARED", "TOO_HIGH", "EXACT")]
    run = runner.run_subprocess(
        runner.suite_args(backends=refs, profile="ci", dtypes="float64",
                          extra=["-p", "no:xdist", "--tb=no", "-k", SELECTED]),
        cwd=tmp_path_factory.mktemp("behaviours"), env=_env(), timeout=600)
    assert run.results, run.stdout[-3000:] + run.stderr[-3000:]
    spec = load_spec()
    out = {}
    for name in {r["backend"] for r in run.results}:
        results = [r for r in run.results if r["backend"] == name]
        out[name] = {c["id"]: c for c in verdicts.clause_verdicts(results, spec,
                                                                  {"cpu": ["float64"]})}
    return out


def test_a_declared_behaviour_is_a_deviation_of_every_clause_it_shows_in(entries):
    clamped = entries["clamped-declared"]
    assert {c for c, e in clamped.items() if e["verdict"] == "deviation"} == set(SHOWS_IN)
    assert all(clamped[c]["behaviours"] == ["masked-weights-not-zero"] for c in SHOWS_IN)
    assert verdicts.overall_verdict(list(clamped.values())) == verdicts.CONFORMS
    assert not any(e["verdict"] in verdicts.BAD for e in clamped.values())


def test_undeclared_the_same_behaviour_fails_under_each_clause(entries):
    undeclared = entries["clamped-undeclared"]
    assert {c for c, e in undeclared.items() if e["verdict"] == "fail"} == set(SHOWS_IN)


def test_beyond_its_bound_the_declaration_covers_nothing(entries):
    """Clamped at -12 (e^-12 = 6e-6 at a blocked key): MASK-1 and the others fail as undeclared."""
    too_high = entries["clamped-too-high"]
    assert {c for c in SHOWS_IN if too_high[c]["verdict"] == "fail"} == set(SHOWS_IN)
    assert "behaviours" not in too_high["MASK-1"]


def test_a_behaviour_that_shows_nowhere_is_stale_on_its_home_clause(entries):
    exact = entries["exact-declared"]
    assert exact["MASK-1"]["verdict"] == "stale-deviation"
    assert exact["MASK-1"]["stale_on"] == ["cpu/float64"]
    assert {c for c, e in exact.items() if e["verdict"] != "pass" and e["runs"]} == {"MASK-1"}


def test_certify_carries_the_behaviour_and_verify_accepts_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify",
                           "behaviour_backends:CLAMPED", "--profile", "ci", "--output-dir",
                           "certs", "--", "-k", "MASK-1 or WIN-1"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    path = tmp_path / "certs" / "clamped-declared.json"
    assert path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    cert = json.loads(path.read_text("utf-8"))
    by_id = {c["id"]: c for c in cert["clauses"]}
    assert by_id["MASK-1"]["verdict"] == by_id["WIN-1"]["verdict"] == "deviation"
    assert by_id["WIN-1"]["behaviours"] == ["masked-weights-not-zero"]
    assert by_id["MASK-1"]["ran_on"] == ["cpu/float16", "cpu/float32", "cpu/float64"]
    assert cert["summary"]["verdict"] == verdicts.INCOMPLETE  # -k: the other clauses not run
    verified = subprocess.run([sys.executable, "-m", "mhaspec.cli", "verify", str(path)],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _declaring(deviations: dict, verdicts_by_id: dict[str, str]) -> dict:
    body = hostile_files.certificate_body()
    body["backend"]["deviations"] = deviations
    for c in body["clauses"]:
        if c["id"] in verdicts_by_id:
            c["verdict"] = verdicts_by_id[c["id"]]
    body["summary"] = {"verdict": verdicts.overall_verdict(body["clauses"]),
                       "counts": verdicts.count_verdicts(body["clauses"])}
    return body


def test_verify_holds_a_behaviours_deviations_to_the_clauses_it_shows_in():
    key = behaviours.MASKED_WEIGHTS_NOT_ZERO.key
    certificate.check_consistency(_declaring({key: "clamped"}, {"WIN-1": "deviation"}))
    with pytest.raises(certificate.CertificateError, match="SDPA-1"):
        certificate.check_consistency(_declaring({key: "clamped"}, {"SDPA-1": "deviation"}))
    passed = _declaring({key: "clamped"}, {})
    next(c for c in passed["clauses"] if c["id"] == "WIN-1")["behaviours"] = [
        behaviours.MASKED_WEIGHTS_NOT_ZERO.name]
    with pytest.raises(certificate.CertificateError, match="WIN-1 is pass with behaviours"):
        certificate.check_consistency(passed)
    with pytest.raises(certificate.CertificateError, match="behaviour:no-such"):
        certificate.check_consistency(_declaring({"behaviour:no-such": "?"}, {}))


def test_an_unknown_behaviour_is_a_claim_error_naming_the_known_ones():
    raw = {**read_claims(load_backend("numpy-batched")),
           "deviations": {"behaviour:weights-sum-to-0.9": "?"}}
    with pytest.raises(ClaimError) as err:
        checked(raw)
    assert "behaviour:weights-sum-to-0.9" in str(err.value)
    assert behaviours.MASKED_WEIGHTS_NOT_ZERO.key in str(err.value)
    declared = {**raw, "deviations": {behaviours.MASKED_WEIGHTS_NOT_ZERO.key: "clamped"}}
    assert behaviours.MASKED_WEIGHTS_NOT_ZERO.key in checked(declared).deviations


def test_the_outcome_rule():
    assert verdicts.with_behaviours("pass", {"behaviours": ["masked-weights-not-zero"]}) == \
        "deviation"
    assert verdicts.with_behaviours("pass", {"behaviours": []}) == "pass"
    assert verdicts.with_behaviours("fail", {"behaviours": ["masked-weights-not-zero"]}) == "fail"
