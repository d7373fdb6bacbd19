"""``mhaspec certify`` against a backend that wants a certificate it did not earn (issue 22).

The backend runs in a process of its own (:mod:`mhaspec.sealed`): it cannot patch the judge, see
the test, hang or crash the run, pass by raising pytest's xfail, or change its claims between the
run and the certificate. Each test builds its backend (in ``hostile_certify.BACKENDS``), certifies
it as a third party would (``module:attr``, in a subprocess like a user's shell) on one test or one
chapter, and names the behaviour of the old in-process certify it reproduces. The attacks of a
process on the judge's machine (issue 36) are in ``test_hostile_backend_same_machine.py``.

Axis legend: none (the subjects are certificates and processes).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from mhaspec import runner

from hostile_certify import HEADS_ONLY, certificate, certify, clause, installed_copy, output
# work: a fixture
from hostile_certify import work  # noqa: F401


#: ``mhaspec certify`` that prints, at exit, the frameworks imported into the judging process
CERTIFY_LISTING_FRAMEWORKS = (
    "-c", "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('judging process imported:', sorted(m for m in ('torch', 'jax', "
    "'tensorflow', 'keras', 'flax', 'transformers', 'onnxruntime') if m in sys.modules)))\n"
    "sys.argv[0] = 'mhaspec'\n"
    "runpy.run_module('mhaspec.cli', run_name='__main__')\n")


def test_a_backend_raising_xfail_fails_and_declares_nothing(work):
    """Old: 'conforms (69 deviation, 2 pass)', exit 0, with no deviation declared."""
    proc = certify(work, "XFAIL", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    cert = certificate(work, "raises-xfail")
    assert clause(cert, "HEAD-1")["verdict"] == "fail"
    assert not any(c["verdict"] == "deviation" for c in cert["clauses"])


def test_a_backend_raising_xfail_fails_in_the_in_process_plugin_too(work, tmp_path):
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(runner.command(runner.suite_args(
        backends=["hostile_backends:XFAIL"], profile="ci", report=report,
        extra=["-k", "test_split_heads_gives"])), cwd=work, env=env, capture_output=True,
        text=True, timeout=300)
    outcomes = {r["outcome"] for r in json.loads(report.read_text("utf-8"))}
    assert outcomes == {"fail"}, (outcomes, output(proc))
    assert proc.returncode == 1


def test_claims_are_read_once_and_used_for_the_run_and_the_certificate(work):
    """Old: claims read again for the certificate: float32/16 and a CUDA device claimed that never
    ran, and a deviation judged while parametrizing missing from the certificate."""
    proc = certify(work, "SHIFTING", "--", *HEADS_ONLY)
    cert = certificate(work, "shifting")
    assert set(cert["environment"]["devices"]) == {"cpu"}, output(proc)
    assert cert["environment"]["devices"]["cpu"]["dtypes"] == ["float64"]
    assert set(cert["backend"]["deviations"]) == {"HEAD-1"}
    assert clause(cert, "HEAD-1")["verdict"] == "stale-deviation"
    assert all(cell == "cpu/float64" for c in cert["clauses"] for cell in c["ran_on"])


def test_the_judging_process_imports_no_framework_to_name_a_device(work):
    """Old: certify imported torch into the judging process to name a torch backend's CUDA device
    (certify.device_name). The name now comes from the backend's process with the other claims."""
    proc = certify(work, "CUDA_TORCH", "--", *HEADS_ONLY, python=CERTIFY_LISTING_FRAMEWORKS)
    assert "judging process imported: []" in proc.stdout, output(proc)  # exit 1: one chapter ran
    cert = certificate(work, "cuda-torch")
    assert set(cert["environment"]["devices"]) == {"cuda"}, output(proc)
    assert cert["environment"]["devices"]["cuda"]["name"]  # torch's GPU name, or "cuda" without one
    assert clause(cert, "HEAD-1")["verdict"] == "pass"


@pytest.mark.parametrize("ref, words", [
    ("PROTOCOL_STR", ["protocol_version", "integer"]), ("FRAMEWORK_INT", ["framework", "string"]),
    ("FLAGS_LIST", ["precision_flags", "mapping"]), ("DEVIATION_INT", ["deviations", "HEAD-1"]),
    ("DEVICES_RAISE", ["devices()", "RuntimeError", "no devices today"]),
    ("DEVIATION_OF_NO_CLAUSE", ["deviations", "NOPE-1", "no clause"]),
    ("DEVICE_WITH_A_SLASH", ["devices()", "cpu/0", "'/'"])])
def test_claims_of_the_wrong_type_are_a_usage_error_before_the_run(work, ref, words):
    """Old: the whole run thrown away with a traceback after it ended."""
    proc = certify(work, ref)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), output(proc)
    assert all(w in lines[0] for w in words), (words, lines[0])
    assert "mhaspec certify:" not in proc.stdout  # the suite did not start


@pytest.mark.parametrize("args, word", [(["--hypothesis-seed=abc"], "--hypothesis-seed"),
                                        (["-p", "xdist", "-n", "2"], "xdist"), (["-n", "2"], "-n")],
                         ids=["seed", "xdist-plugin", "workers"])
def test_pytest_arguments_certify_cannot_honour_are_a_usage_error_before_the_run(work, args, word):
    """Old: a seed 'abc' threw the run away with a traceback after it ended; `-p xdist -n 2` ran the
    backend inside pytest-xdist's workers, next to the judge."""
    proc = certify(work, "SHIFTING", "--", *args)
    assert proc.returncode == 2 and word in proc.stderr, output(proc)
    assert len(proc.stderr.strip().splitlines()) == 1, output(proc)
    assert "mhaspec certify:" not in proc.stdout


def test_a_conftest_above_the_installed_package_is_not_loaded(work):
    """Old: a conftest.py in an ancestor directory of the installed package (a project root over
    its .venv) joined the run; one that turns failures into passes made a failing backend conform."""
    flip = ("import pytest\n\n@pytest.hookimpl(wrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    report = yield\n    report.outcome = 'passed'\n    return report\n")
    (work / "conftest.py").write_text(flip, "utf-8")
    site = installed_copy(work / ".venv" / "site")
    proc = certify(work, "ONLY_IN_HARNESS", "--", *HEADS_ONLY, path=site)
    assert proc.returncode == 1, output(proc)
    assert clause(certificate(work, "only-in-harness"), "HEAD-1")["verdict"] == "fail"


def test_an_installed_pytest_plugin_is_not_loaded_into_certify(work):
    """Old: pytest auto-loaded every installed ``pytest11`` entry point into the judging process; a
    package installed beside the backend that turns failures into passes made it conform."""
    site = work / "site"
    dist = site / "report_flipper-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: report-flipper\nVersion: 1.0\n",
                                   "utf-8")
    (dist / "entry_points.txt").write_text("[pytest11]\nflipper = report_flipper\n", "utf-8")
    (site / "report_flipper.py").write_text(
        "import pytest\n\n@pytest.hookimpl(wrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    report = yield\n    report.outcome = 'passed'\n    return report\n", "utf-8")
    proc = certify(work, "ONLY_IN_HARNESS", "--", *HEADS_ONLY, path=site)
    assert proc.returncode == 1, output(proc)
    assert clause(certificate(work, "only-in-harness"), "HEAD-1")["verdict"] == "fail"


def test_in_process_certify_runs_pytest_without_conftest_files():
    """The suite ships no conftest.py, so --noconftest loses nothing of its own."""
    from mhaspec import conformance

    assert not list(pathlib.Path(conformance.__file__).parent.rglob("conftest.py"))


def test_a_backend_that_replaces_the_judge_at_import_does_not_conform(work):
    """Old: 'conforms (71 pass)' and a valid verify: the import ran in the judging process."""
    proc = certify(work, "ZERO", "--", "-k", "test_attention_equals_softmax")
    assert proc.returncode == 1, output(proc)
    assert clause(certificate(work, "zero-attention"), "SDPA-1")["verdict"] == "fail"


def test_a_backend_cannot_see_the_test_it_is_in(work):
    """Old: right only while a test item was set, it conformed; replay showed it does not."""
    proc = certify(work, "ONLY_IN_HARNESS", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    assert clause(certificate(work, "only-in-harness"), "HEAD-1")["verdict"] == "fail"


@pytest.mark.parametrize("ref, words", [
    ("IGNORED_ALARM", ["per-call time limit of 1.5 s"]),
    ("BLOCKED_SIGNALS", ["per-call time limit of 1.5 s"]),
    ("TO_NUMPY_HANG", ["per-call time limit of 1.5 s"]),
    ("SEGFAULT", ["died (SIGSEGV)"]),
    ("EXIT", ["exited with status 3"])])
def test_a_hang_or_a_crash_fails_that_call_and_the_run_goes_on(work, ref, words):
    """Old: an ignored SIGALRM or a C-level wait hung certify for ever, a segfault or os._exit
    ended it with no certificate. Now the float16 cell fails with the cause named, the backend's
    process is restarted and the float32 and float64 cells pass."""
    proc = certify(work, ref, "--call-timeout", "1.5", "--", *HEADS_ONLY, timeout=240)
    assert proc.returncode == 1, output(proc)
    cert = certificate(work, "misbehaves")
    head1 = clause(cert, "HEAD-1")
    assert head1["verdict"] == "fail", head1
    assert all(any(w in m for w in words) for m in head1["failures"]), head1["failures"]
    assert cert["run"]["backend_restarts"] >= 1
    assert cert["run"]["backend_process"] == "sealed"
    assert all("float16" in m for m in head1["failures"]), head1["failures"]
    assert set(head1["ran_on"]) == {"cpu/float64", "cpu/float32", "cpu/float16"}


def test_a_backend_that_dies_in_the_diagnosis_still_gets_a_certificate(work):
    """Old: the diagnosis after the run met BackendDied (a BaseException past its ``except
    Exception``): a traceback and no certificate."""
    proc = certify(work, "DIES_IN_ATTENTION", "--", "-k", "test_attention_equals_softmax")
    assert proc.returncode == 1, output(proc)
    cert = certificate(work, "dies-in-attention")
    assert clause(cert, "SDPA-1")["verdict"] == "fail"
    assert "no diagnosis: the checks raised BackendDied" in proc.stdout, output(proc)
