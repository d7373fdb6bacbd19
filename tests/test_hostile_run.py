"""``mhaspec certify`` against a hostile caller, environment or backend (issue 13, items 2-4, 8).

Each test reproduces one way the old ``certify`` could be made to lie or hang: a pytest ini file in
the current directory or ``PYTEST_ADDOPTS`` adding another backend, an extra ``--backend`` after
``--``, a partial selection certified as complete, a backend name that writes outside the output
directory, an output directory that is a file, a backend that never returns, and Hypothesis files
written into the caller's directory. The backends are built here, in the test's own directory, and
certified as a third party would (``module:attr``), each in a subprocess like a user's shell.

Axis legend: none (the subjects are certificates and files).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

#: A backend that claims split_heads / combine_heads only (chapter HEAD): its certificate can pass
#: HEAD-1 and HEAD-2 and nothing else; a certificate with more passes carries another backend's.
BACKENDS = '''
import time

from mhaspec.backends.np_backend import NumpyBackend


class HeadsOnly(NumpyBackend):
    capabilities = frozenset({"heads"})

    def __init__(self, name="heads-only"):
        super().__init__("batched")
        self.name = name


class Hangs(HeadsOnly):
    """split_heads never returns."""

    def split_heads(self, x, num_heads):
        time.sleep(3600)


class SplitsWrong(HeadsOnly):
    """split_heads puts the heads in the wrong order (HEAD-1 fails)."""

    def split_heads(self, x, num_heads):
        return super().split_heads(x, num_heads)[:, ::-1]


HEADS = HeadsOnly()
SPLITS_WRONG = SplitsWrong("splits-wrong")
TWIN = HeadsOnly()  # another reference, the same name
UP_TWO = HeadsOnly("../../escaped")
ABSOLUTE = HeadsOnly(ABSOLUTE_NAME)
HANGS = Hangs("hangs")
'''

#: the clauses a heads-only backend can pass (INPUT-1 through its split_heads / combine_heads test)
HEAD_CLAUSES = {"HEAD-1", "HEAD-2", "INPUT-1"}


@pytest.fixture()
def work(tmp_path) -> pathlib.Path:
    """The user's directory, holding the hostile backends' module."""
    outside = tmp_path / "outside"
    (tmp_path / "hostile.py").write_text(
        BACKENDS.replace("ABSOLUTE_NAME", repr(str(outside / "abs-escaped"))), "utf-8")
    return tmp_path


def certify(cwd: pathlib.Path, ref: str, *args: str, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env = {**base, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", f"hostile:{ref}",
                           "--profile", "ci", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def certificate_of(directory: pathlib.Path, stem: str = "heads-only") -> dict:
    return json.loads((directory / f"{stem}.json").read_text("utf-8"))


def passed(cert: dict) -> set[str]:
    return {c["id"] for c in cert["clauses"] if c["verdict"] == "pass"}


def assert_usage_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


INI_FILES = {
    "pytest.ini": "[pytest]\naddopts = --backend numpy-batched\n",
    "tox.ini": "[pytest]\naddopts = --backend numpy-batched\n",
    "setup.cfg": "[tool:pytest]\naddopts = --backend numpy-batched\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = \"--backend numpy-batched\"\n",
}


@pytest.mark.parametrize("ini", ["pytest.ini", "pyproject.toml"])
def test_an_ini_file_in_the_cwd_cannot_add_a_backend(work, ini):
    """Old: the ini's addopts added numpy-batched, whose passes the heads-only certificate kept."""
    (work / ini).write_text(INI_FILES[ini], "utf-8")
    proc = certify(work, "HEADS", "--output-dir", "certs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cert = certificate_of(work / "certs")
    assert cert["summary"]["verdict"] == "conforms"
    assert passed(cert) == HEAD_CLAUSES
    assert "numpy-batched" not in " ".join(cert["run"]["pytest_args"])
    assert "numpy-batched" not in proc.stdout


def test_pytest_addopts_cannot_add_a_backend(work):
    proc = certify(work, "HEADS", "--output-dir", "certs",
                   env={"PYTEST_ADDOPTS": "--backend numpy-batched"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert passed(certificate_of(work / "certs")) == HEAD_CLAUSES


def test_another_backend_after_the_separator_is_a_usage_error(work):
    """Old: `-- --backend numpy-batched` made the heads-only backend conform with 48 passes."""
    proc = certify(work, "HEADS", "--output-dir", "certs", "--", "--backend", "numpy-batched")
    assert_usage_error(proc, "numpy-batched")
    assert not (work / "certs" / "heads-only.json").exists()


@pytest.mark.parametrize("selection", [["-k", "split_heads"], ["--mhaspec-dtypes", "float64"]],
                         ids=["keyword", "dtypes"])
def test_a_partial_run_is_incomplete_not_conforming(work, selection):
    """Old: HEAD-2 deselected (or float32/float16 left out) still gave "conforms"."""
    proc = certify(work, "HEADS", "--output-dir", "certs", "--", *selection)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cert = certificate_of(work / "certs")
    assert cert["summary"]["verdict"] == "incomplete"
    gaps = {c["id"]: c["not_run_on"] for c in cert["clauses"] if c["not_run_on"]}
    if selection[0] == "-k":
        assert "HEAD-2" in gaps and cert["run"]["selection"]["keyword"] == "split_heads"
    else:
        assert set(gaps["HEAD-1"]) == {"cpu/float32", "cpu/float16"}
        assert all(set(cells) <= {"cpu/float32", "cpu/float16"} for cells in gaps.values())
        assert cert["run"]["selection"]["dtypes"] == "float64"
    assert cert["run"]["pytest_args"][-len(selection) - 4:-4] == selection


@pytest.mark.parametrize("ref", ["UP_TWO", "ABSOLUTE"])
def test_a_backend_name_cannot_write_outside_the_output_dir(work, ref):
    """Old: a name like ../../x or /abs/x chose where the JSON, Markdown and failures went."""
    out = work / "deep" / "er" / "certs"
    proc = certify(work, ref, "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = sorted(p.name for p in out.iterdir())
    stem = "escaped" if ref == "UP_TWO" else "abs-escaped"
    assert any(name.endswith(f"{stem}.json") for name in written), written
    assert not (work / "escaped.json").exists() and not (work / "deep" / "escaped.json").exists()
    assert not (work / "outside").exists()
    cert = json.loads((out / next(n for n in written if n.endswith(".json"))).read_text("utf-8"))
    assert cert["backend"]["name"] == ("../../escaped" if ref == "UP_TWO"
                                       else str(work / "outside" / "abs-escaped"))


def test_an_output_dir_that_is_a_file_fails_before_the_run(work):
    (work / "certs").write_text("a file\n", "utf-8")
    proc = certify(work, "HEADS", "--output-dir", "certs")
    assert_usage_error(proc, "certs", "is a file")
    assert "mhaspec certify:" not in proc.stdout  # the suite did not start


def test_a_certificate_path_that_is_a_directory_fails_before_the_run(work):
    (work / "certs" / "heads-only.json").mkdir(parents=True)
    proc = certify(work, "HEADS", "--output-dir", "certs")
    assert_usage_error(proc, "heads-only.json", "is a directory")
    assert "mhaspec certify:" not in proc.stdout


def test_a_hanging_backend_fails_with_the_time_limit_named(work):
    """Old: certify waited forever on a backend call that never returns."""
    proc = certify(work, "HANGS", "--output-dir", "certs", "--call-timeout", "0.5", timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cert = certificate_of(work / "certs", "hangs")
    assert cert["summary"]["verdict"] == "does not conform"
    assert cert["run"]["call_timeout_s"] == 0.5
    head1 = next(c for c in cert["clauses"] if c["id"] == "HEAD-1")
    assert head1["verdict"] == "fail"
    assert any("per-call time limit of 0.5 s" in m for m in head1["failures"]), head1["failures"]


def test_certify_writes_no_hypothesis_directory_into_the_cwd(work):
    """Old: the Hypothesis example database went to ./.hypothesis of whoever ran certify."""
    proc = certify(work, "HEADS", "--output-dir", "certs", "--profile", "dev")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (work / ".hypothesis").exists()
    assert sorted(p.name for p in work.iterdir() if p.name != "__pycache__") == ["certs", "hostile.py"]


def test_every_conformance_test_calls_the_backend_under_the_time_limit():
    """A test that calls an operation on ``impl.backend`` directly escapes the per-call limit (a
    hanging backend hung certify through INPUT-1's tests so): operations go through ``impl.call``."""
    import re

    from mhaspec import conformance

    direct = re.compile(r"\.backend\.(split_heads|combine_heads|scaled_dot_product_attention|"
                        r"multi_head_attention|mha_vjp)\(")
    suite = pathlib.Path(conformance.__file__).parent
    offenders = [f"{path.name}:{n}" for path in sorted(suite.glob("test_*.py"))
                 for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
                 if direct.search(line)]
    assert not offenders, offenders


def test_a_certificate_names_no_machine_path_and_is_not_replaced_by_a_namesake(work):
    """Old: ``pytest_args`` held the absolute temporary ini and rootdir (and the output folder),
    and a backend of the same name from another module silently overwrote the certificate."""
    proc = certify(work, "HEADS", "--output-dir", str(work / "certs"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = (work / "certs" / "heads-only.json").read_text("utf-8")
    args = json.loads(first)["run"]["pytest_args"]
    assert not [a for a in args if os.path.isabs(a) or str(work) in a or "mhaspec-run-" in a], args
    assert args[-4:] == ["-c", "<tmp>/pytest.ini", "--rootdir", "<suite>"], args
    assert "<output-dir>/heads-only-failures" in args, args
    twin = certify(work, "TWIN", "--output-dir", str(work / "certs"))
    assert_usage_error(twin, "heads-only.json", "hostile:HEADS", "overwrite")
    assert (work / "certs" / "heads-only.json").read_text("utf-8") == first


def test_failed_lines_name_test_files_that_outlive_the_run(work):
    """Old: FAILED lines named the run's temporary directory (``../mhaspec-run-XXXX/test_heads.py``),
    gone after the run; and pointing ``--rootdir`` elsewhere put a machine path into the
    certificate's ``pytest_args``. Both hold now."""
    proc = certify(work, "SPLITS_WRONG", "--output-dir", "certs")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed and "mhaspec-run-" not in proc.stdout, proc.stdout[-3000:]
    for nodeid in failed:
        path = work / nodeid.split("::")[0]
        assert path.name.startswith("test_") and path.is_file(), nodeid
    args = certificate_of(work / "certs", "splits-wrong")["run"]["pytest_args"]
    assert not [a for a in args if os.path.isabs(a) or "mhaspec-run-" in a], args
    assert args[-4:] == ["-c", "<tmp>/pytest.ini", "--rootdir", "<suite>"], args


def test_only_a_certificate_of_the_same_reference_is_replaced(tmp_path):
    from mhaspec import certificate
    from mhaspec.certify import check_not_another_backends
    from mhaspec.usage import UsageError

    path = tmp_path / "b.json"
    check_not_another_backends(path, "pkg:B")  # absent
    path.write_text(json.dumps(certificate.seal({"backend": {"ref": "pkg:B"}})), "utf-8")
    check_not_another_backends(path, "pkg:B")  # the same backend: re-certified, replaced
    with pytest.raises(UsageError, match="certificate of pkg:B"):
        check_not_another_backends(path, "other:B")
    path.write_text("notes of my own", "utf-8")
    with pytest.raises(UsageError, match="not a certificate"):
        check_not_another_backends(path, "pkg:B")


def test_a_name_two_distributions_register_is_refused(tmp_path, monkeypatch):
    """Old: a second distribution registering ``numpy-batched`` won or lost by the order entry
    points were found, silently; now loading the name is a one-line error naming both."""
    from mhaspec import usage

    dist = tmp_path / "shadow_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-backend\nVersion: 1.0\n",
                                   "utf-8")
    (dist / "entry_points.txt").write_text("[mhaspec.backends]\nnumpy-batched = shadow:BACKEND\n",
                                           "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(usage.UsageError) as caught:
        usage.checked_backend("numpy-batched")
    message = str(caught.value)
    assert "registered by more than one distribution" in message and "shadow-backend" in message
    assert "shadow:BACKEND" in message and "\n" not in message


def test_an_installed_file_that_differs_from_its_record_is_named(tmp_path, monkeypatch):
    """A wheel install is checked against its RECORD before the backend starts
    (mhaspec.judge_files.record_mismatches); an editable install, whose RECORD hashes no module,
    gives None."""
    import base64
    import hashlib

    from mhaspec import judge_files

    package = tmp_path / "fakejudge"
    package.mkdir()
    (package / "__init__.py").write_text("KEEP = 1\n", "utf-8")
    (package / "judge.py").write_text("PASS = False\n", "utf-8")

    def hashed(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    dist = tmp_path / "fakejudge-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakejudge\nVersion: 1.0\n", "utf-8")
    (dist / "RECORD").write_text(
        f"fakejudge/__init__.py,sha256={hashed('KEEP = 1' + chr(10))},9\n"
        f"fakejudge/judge.py,sha256={hashed('PASS = False' + chr(10))},13\n"
        "fakejudge-1.0.dist-info/RECORD,,\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert judge_files.record_mismatches("fakejudge") == []
    (package / "judge.py").write_text("PASS = True\n", "utf-8")
    assert judge_files.record_mismatches("fakejudge") == ["fakejudge/judge.py"]
    assert judge_files.record_mismatches("mhaspec") is None  # this checkout: an editable install
