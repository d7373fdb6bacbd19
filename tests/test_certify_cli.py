"""``mhaspec certify | verify | replay`` end to end, in subprocesses as a user runs them.

The certified backend is the minimal one printed in docs/backends.md (so the page's example is
known to certify); a variant with the wrong default scale gives a failing certificate and the
saved case that ``mhaspec replay`` reruns. Bad input must exit with status 2 and one line on
stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jsonschema
import pytest

from mhaspec import certificate, suite_files
from mhaspec.conformance.verdicts import BACKEND_VERDICTS, CLAUSE_VERDICTS

DOCS_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "backends.md"

WRONG_SCALE = '''
from minimal_backend import MinimalBackend


class WrongScale(MinimalBackend):
    """Divides the logits by d_k instead of sqrt(d_k) (SDPA-1)."""

    name = "wrong-scale"

    def scaled_dot_product_attention(self, q, k, v, **kw):
        kw["scale"] = kw.get("scale") or 1.0 / q.shape[-1]
        return super().scaled_dot_product_attention(q, k, v, **kw)


BACKEND = WrongScale()
'''


def docs_minimal_backend() -> str:
    """The first Python block of the page's "A minimal backend" section."""
    section = DOCS_PAGE.read_text("utf-8").split("\n## A minimal backend", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/backends.md: no python block under '## A minimal backend'"
    return match.group(1)


def mhaspec(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_usage_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    """Exit status 2, exactly one line on stderr naming ``words``, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> pathlib.Path:
    """A directory holding the two backend modules, as a user's project would."""
    path = tmp_path_factory.mktemp("certify")
    (path / "minimal_backend.py").write_text(docs_minimal_backend(), "utf-8")
    (path / "wrong_scale.py").write_text(WRONG_SCALE, "utf-8")
    return path


@pytest.fixture(scope="module")
def certified(work) -> pathlib.Path:
    proc = mhaspec(work, "certify", "minimal_backend:BACKEND", "--profile", "ci",
                   "--output-dir", "certs")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "minimal-numpy conforms" in proc.stdout
    return work / "certs" / "minimal-numpy.json"


def test_certificate_validates_against_the_schema(certified):
    cert = json.loads(certified.read_text("utf-8"))
    jsonschema.validate(cert, certificate.schema())
    assert cert["summary"]["verdict"] == "conforms"
    assert cert["hypothesis"]["profile"] == "ci" and cert["hypothesis"]["seed"] is None
    assert cert["hypothesis"]["inputs"] == "fixed inputs (ci profile)"  # no seed chose them
    # the ci profile runs at most 8 examples per test; the count is of those actually run
    assert 0 < cert["hypothesis"]["examples"] <= 8 * sum(c["runs"] for c in cert["clauses"])
    assert cert["hypothesis"]["backend_calls"] > 0
    assert cert["backend"]["ref"] == "minimal_backend:BACKEND"
    # the suite's own files, identified with or without a git checkout (mhaspec.suite_files)
    assert cert["suite"]["files_sha256"] == suite_files.digest()
    verdicts = {c["id"]: c["verdict"] for c in cert["clauses"]}
    assert verdicts["SDPA-1"] == verdicts["HEAD-1"] == "pass"
    assert verdicts["MASK-1"] == verdicts["MHA-1"] == "not-implemented"  # not claimed: never a pass
    assert set(verdicts.values()) <= set(CLAUSE_VERDICTS)
    assert certified.with_suffix(".md").read_text("utf-8").startswith("# mhaspec certificate: minimal-numpy")


def test_the_schema_allows_exactly_the_verdicts_of_the_verdict_module():
    props = certificate.schema()["properties"]
    clause = props["clauses"]["items"]["properties"]["verdict"]["enum"]
    assert sorted(clause) == sorted(CLAUSE_VERDICTS)
    assert sorted(props["summary"]["properties"]["verdict"]["enum"]) == sorted(BACKEND_VERDICTS)


def test_verify_accepts_the_certificate_and_its_markdown(work, certified):
    proc = mhaspec(work, "verify", str(certified), "--markdown", str(certified.with_suffix(".md")))
    assert proc.returncode == 0, proc.stderr
    assert "certificate for minimal-numpy" in proc.stdout
    for checked in ("integrity:", "consistency:", "markdown:", "authenticity: NOT checked"):
        assert checked in proc.stdout, proc.stdout


def test_the_certificate_is_of_the_current_spec(certified):
    """Certified against the current version (1.4, released), labelled "(draft)" only while the
    current version is a draft."""
    from mhaspec.spec import load

    spec = load()
    cert = json.loads(certified.read_text("utf-8"))
    assert cert["spec"] == {"name": "mhaspec", "version": spec.version, "status": spec.status}
    assert certificate.spec_label(cert["spec"]) == "1.4" + (" (draft)" if spec.is_draft else "")


def test_verify_still_accepts_a_certificate_of_spec_1_1(work):
    """A released version's certificate stays verifiable after the next release: its clauses are
    checked against the frozen rendering spec/mhaspec-1.1.md (the examples/flash-numpy certificate
    as issued on 2026-11-29, kept in tests/data when the example's was re-issued)."""
    example = pathlib.Path(__file__).parent / "data" / "flash-numpy-spec-1.1.json"
    assert json.loads(example.read_text("utf-8"))["spec"]["version"] == "1.1"
    proc = mhaspec(work, "verify", str(example))
    assert proc.returncode == 0, proc.stderr
    assert "conforms on 47 of 52 testable clauses of mhaspec 1.1" in proc.stdout
    assert "consistency: the 53 clauses of spec 1.1" in proc.stdout


def test_verify_rejects_a_copy_with_one_verdict_edited(work, certified):
    cert = json.loads(certified.read_text("utf-8"))
    clause = next(c for c in cert["clauses"] if c["verdict"] == "not-implemented")
    clause["verdict"] = "pass"
    edited = work / "edited.json"
    edited.write_text(json.dumps(cert, indent=1), "utf-8")
    assert_usage_error(mhaspec(work, "verify", str(edited)), "digest mismatch")


def test_verify_rejects_a_certificate_outside_the_schema(work, certified):
    cert = json.loads(certified.read_text("utf-8"))
    cert["clauses"][0]["verdict"] = "mostly"
    edited = work / "bad-verdict.json"
    edited.write_text(json.dumps(cert), "utf-8")
    assert_usage_error(mhaspec(work, "verify", str(edited)), "clauses/0/verdict")


def test_a_failing_backend_gets_a_failing_certificate_and_replayable_cases(work):
    proc = mhaspec(work, "certify", "wrong_scale:BACKEND", "--profile", "ci",
                   "--output-dir", "failing", "--", "--mhaspec-dtypes", "float64", "-k", "test_sdpa")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    cert = json.loads((work / "failing" / "wrong-scale.json").read_text("utf-8"))
    certificate.verify(cert)
    assert cert["summary"]["verdict"] == "does not conform"
    sdpa1 = next(c for c in cert["clauses"] if c["id"] == "SDPA-1")
    assert sdpa1["verdict"] == "fail" and sdpa1["failures"] and sdpa1["ran_on"] == ["cpu/float64"]
    saved = sorted((work / "failing" / "wrong-scale-failures").glob("test_attention_equals*.npz"))
    assert saved, "no failing case saved for replay"
    still = mhaspec(work, "replay", str(saved[0]), "--backend", "wrong_scale:BACKEND")
    assert still.returncode == 1 and "DOES NOT CONFORM" in still.stdout, still.stdout + still.stderr
    fixed = mhaspec(work, "replay", str(saved[0]), "--backend", "minimal_backend:BACKEND")
    assert fixed.returncode == 0 and "conforms" in fixed.stdout, fixed.stdout + fixed.stderr


def test_certify_keeps_a_replayable_sample_of_the_passing_cases(work, certified):
    """One case per passing test, in <output-dir>/NAME-passes (the certificate records that folder
    without a machine's path): a second party replays them and sees the passes, and a wrong backend
    fails on them; an earlier run's sample (and its saved failures) is replaced, never mixed in."""
    cert = json.loads(certified.read_text("utf-8"))
    passes = sorted((work / "certs" / "minimal-numpy-passes").glob("*.npz"))
    passed = sum(c["runs"] for c in cert["clauses"] if c["verdict"] == "pass")
    assert passes and len(passes) <= passed, (len(passes), passed)
    assert "<output-dir>/minimal-numpy-passes" in cert["run"]["pytest_args"]
    sample = next(p for p in passes if p.name.startswith("test_attention_equals")
                  and "float64" in p.name)
    again = mhaspec(work, "replay", str(sample), "--backend", "minimal_backend:BACKEND")
    assert again.returncode == 0 and "conforms" in again.stdout, again.stdout + again.stderr
    wrong = mhaspec(work, "replay", str(sample), "--backend", "wrong_scale:BACKEND")
    assert wrong.returncode == 1 and "DOES NOT CONFORM" in wrong.stdout, wrong.stdout
    strays = [work / "failing" / f"wrong-scale-{kind}" / "from_an_earlier_run.npz"
              for kind in ("passes", "failures")]
    for stray in strays:
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(sample.read_bytes())
    rerun = mhaspec(work, "certify", "wrong_scale:BACKEND", "--profile", "ci", "--output-dir",
                    "failing", "--", "--mhaspec-dtypes", "float64", "-k", "test_sdpa")
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    for stray in strays:  # this run's passing tests (SDPA-3, ...) and failing ones only
        kept = {p.name for p in stray.parent.glob("*.npz")}
        assert kept and stray.name not in kept, (stray.parent.name, kept)


def test_certify_an_unknown_backend_is_a_usage_error(work):
    assert_usage_error(mhaspec(work, "certify", "nosuch:thing", "--output-dir", "unused"), "nosuch")
    assert not (work / "unused").exists()


def test_verify_a_file_that_is_not_json_is_a_usage_error(work):
    bad = work / "not-a-certificate.json"
    bad.write_text("this is not JSON\n", "utf-8")
    assert_usage_error(mhaspec(work, "verify", str(bad)), "cannot read certificate")


def test_replay_a_file_that_is_not_npz_is_a_usage_error(work):
    bad = work / "not-a-case.npz"
    bad.write_text("this is not an npz archive\n", "utf-8")
    assert_usage_error(mhaspec(work, "replay", str(bad), "--backend", "minimal_backend:BACKEND"),
                       "cannot read replay file")


def test_every_case_a_failing_run_saves_is_replayed_on_a_correct_backend(tmp_path, capsys):
    """The harness writes failure files and replay reads them with every check on: each case a
    wrong-scale backend fails (SDPA, grouped heads, masks, extremes, float64 and float32) is
    accepted by the reader and conforms when replayed on numpy-batched."""
    from suite_runner import run_suite

    from mhaspec.conformance import failure_file
    from mhaspec.replay import replay_file

    failures = tmp_path / "failures"
    run_suite(tmp_path, ["broken_backends:WRONG_SCALE"], "--mhaspec-failures", str(failures),
              "-k", "test_sdpa or test_gqa or test_numerics or test_masking")
    saved = sorted(failures.glob("*.npz"))
    assert len(saved) >= 10, saved
    clauses = set()
    for path in saved:
        meta, _ = failure_file.read_case(path)
        clauses.add(meta["clause"])
        assert replay_file(path, backend="numpy-batched", max_bytes=failure_file.DEFAULT_MAX_BYTES) == 0, (
            path, capsys.readouterr().out[-2000:])
    assert {"SDPA-1", "MHA-6"} <= clauses, clauses


class _CellScopedDeviations:
    """A backend that declares one deviation everywhere and another on cpu/float16 only."""

    deviations = {"SHAPE-4": "empty inputs are rejected"}

    def deviations_on(self, device, dtype):
        if dtype != "float16":
            return self.deviations
        return {**self.deviations, "SOFTCAP-1": "a cap above 65504 gives NaN"}


def test_the_certificate_names_deviations_declared_for_some_cells_with_their_cells():
    from mhaspec.certify import declared_deviations

    got = declared_deviations(_CellScopedDeviations(), {"cpu": ["float32", "float16"]})
    assert got == {"SHAPE-4": "empty inputs are rejected",
                   "SOFTCAP-1": "on cpu/float16: a cap above 65504 gives NaN"}
    assert declared_deviations(_CellScopedDeviations(), {"cpu": ["float32"]}) == {
        "SHAPE-4": "empty inputs are rejected"}
