"""``mhaspec certify`` against a backend that wants a certificate it did not earn (issue 22).

The backend runs in a process of its own (:mod:`mhaspec.sealed`): it cannot patch the judge, see
the test, hang or crash the run, pass by raising pytest's xfail, or change its claims between the
run and the certificate. Each test builds its backend here, certifies it as a third party would
(``module:attr``, in a subprocess like a user's shell) on one test or one chapter, and names the
behaviour of the old in-process certify it reproduces.

Axis legend: none (the subjects are certificates and processes).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from mhaspec import backend_process, runner

BACKENDS = '''
import ctypes
import itertools
import os
import signal
import time

import numpy as np

from mhaspec.backends.np_backend import NumpyBackend


class Heads(NumpyBackend):
    capabilities = frozenset({"heads"})

    def __init__(self, name):
        super().__init__("batched")
        self.name = name


class RaisesXfail(Heads):
    """Every operation raises pytest's xfail: the old certify counted each as a deviation."""

    def split_heads(self, x, num_heads):
        import pytest

        pytest.xfail("declared deviation: none")


class Shifting(Heads):
    """Claims float64 on cpu and a deviation of HEAD-1 there at first; on later reads three dtypes,
    a CUDA device and no deviation."""

    reads = {"devices": itertools.count(), "dtypes": itertools.count(),
             "deviations_on": itertools.count()}

    def devices(self):
        return {"cpu": None} if next(self.reads["devices"]) == 0 else {"cpu": None, "cuda": None}

    def dtypes(self, device):
        return ("float64",) if next(self.reads["dtypes"]) == 0 else ("float64", "float32", "float16")

    def deviations_on(self, device, dtype):
        return {"HEAD-1": "reads differently"} if next(self.reads["deviations_on"]) == 0 else {}


class OnlyInHarness(Heads):
    """Right only while a conformance test runs (it can see the suite's state of the running test)."""

    def split_heads(self, x, num_heads):
        from mhaspec.conformance import item_state

        out = super().split_heads(x, num_heads)
        return out if item_state.running() is not None else out * 0


class ZeroAttention(NumpyBackend):
    """SDPA output all zeros; the module's import replaced the judge (see below)."""

    capabilities = frozenset({"sdpa", "weights"})

    def __init__(self):
        super().__init__("batched")
        self.name = "zero-attention"

    def scaled_dot_product_attention(self, q, k, v, **kw):
        out, w = super().scaled_dot_product_attention(q, k, v, **kw)
        return out * 0, w


class ClaimsACudaDevice(Heads):
    """A torch backend on a CUDA device (its arrays say so): naming the device is the framework's."""

    framework = "torch"

    def devices(self):
        return {"cuda": None}

    def dtypes(self, device):
        return ("float64",)

    def device_of(self, x):
        return "cuda"


def wrong(member, value):
    """A heads backend whose ``member`` is ``value``."""
    backend = Heads("wrong-types")
    setattr(backend, member, value)
    return backend


def no_devices():
    raise RuntimeError("no devices today")


class Misbehaves(Heads):
    """split_heads misbehaves (see HOW) in the float16 cell only: the other cells must pass."""

    HOW = None

    def split_heads(self, x, num_heads):
        if x.dtype == np.float16:
            if self.HOW == "ignored-alarm":
                signal.signal(signal.SIGALRM, signal.SIG_IGN)
                while True:
                    pass
            if self.HOW == "blocked-signals":  # a C-level wait no signal reaches
                signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))
                time.sleep(3600)
            if self.HOW == "segfault":
                ctypes.string_at(0)
            if self.HOW == "exit":
                os._exit(3)
        return super().split_heads(x, num_heads)

    def to_numpy(self, x):
        if self.HOW == "to-numpy-hang" and x.dtype == np.float16:
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                pass
        return super().to_numpy(x)


def misbehaving(how):
    backend = Misbehaves("misbehaves")
    backend.HOW = how
    return backend


class DiesInAttention(NumpyBackend):
    """Every SDPA call ends its process: the diagnosis after the run meets a dead backend too."""

    capabilities = frozenset({"sdpa", "weights"})

    def __init__(self):
        super().__init__("batched")
        self.name = "dies-in-attention"

    def scaled_dot_product_attention(self, q, k, v, **kw):
        os._exit(3)


class HugeAnswer(Heads):
    """split_heads answers 300 MiB in the float16 cell."""

    def split_heads(self, x, num_heads):
        if x.dtype == np.float16:
            return np.zeros(300 << 20, np.uint8)
        return super().split_heads(x, num_heads)


class StopsTheJudge(Heads):
    """In the float16 cell, stops its parent (the judge), takes 4 s, answers, and a thread
    continues the judge once the answer is in the pipe: the judge's clock must count those 4 s."""

    def split_heads(self, x, num_heads):
        if x.dtype == np.float16:
            import threading

            judge = os.getppid()
            os.kill(judge, signal.SIGSTOP)
            threading.Timer(5.0, os.kill, (judge, signal.SIGCONT)).start()
            time.sleep(4)
        return super().split_heads(x, num_heads)


def _sees_the_judge():
    """Whether this process sees the judge's environment, folder or entry point."""
    import sys

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return {"environment": "JUDGE_ONLY_SECRET" in os.environ,
            "folder": os.getcwd() == os.path.dirname(os.path.abspath(__file__)),
            "main": "backend_host" in f"{getattr(spec, 'name', '')} {sys.argv}"}


class SeesTheJudge(Heads):
    """Wrong in every cell when it can tell it runs under certify (its ``__main__`` or argv
    name the host), or sees the judge's environment or folder; its name says what it saw."""

    def __init__(self):
        seen = _sees_the_judge()
        super().__init__("sees-" + ("-".join(k for k, v in seen.items() if v) or "nothing"))
        self.certified = any(seen.values())

    def split_heads(self, x, num_heads):
        out = super().split_heads(x, num_heads)
        return out * 0 if self.certified else out


class EditsTheJudge(Heads):
    """Wrong in every cell. Once, when first constructed (in the process that reads its claims),
    it edits the installed judge on disk so that every outcome is recorded as a pass, and (when
    ``restore``) puts the file back at its first operation, after the run has started."""

    EDIT = ('"outcome": outcome,', '"outcome": "pass",')

    def __init__(self, name, restore):
        import importlib.util
        import pathlib

        super().__init__(name)
        self.restore = restore
        folder = importlib.util.find_spec("mhaspec.conformance").submodule_search_locations[0]
        self.target = pathlib.Path(folder) / "results.py"
        self.saved = pathlib.Path(__file__).with_name(f"{name}.saved")
        if pathlib.Path(__file__).parent not in self.target.parents:  # only the test's own copy
            raise RuntimeError(f"refusing to edit {self.target}: not the test's installed copy")
        if not self.saved.exists():
            text = self.target.read_text("utf-8")
            self.saved.write_text(text, "utf-8")
            self.target.write_text(text.replace(*self.EDIT), "utf-8")

    def split_heads(self, x, num_heads):
        if self.restore and self.saved.exists() and self.target.read_text("utf-8") != self.saved.read_text("utf-8"):
            self.target.write_text(self.saved.read_text("utf-8"), "utf-8")
        return super().split_heads(x, num_heads) * 0


class EditsDuringTheRun(EditsTheJudge):
    """The same edit made at its first operation, during the run, after every judge module was
    loaded, and left in place."""

    def __init__(self):
        Heads.__init__(self, "edits-during-the-run")
        import importlib.util
        import pathlib

        folder = importlib.util.find_spec("mhaspec.conformance").submodule_search_locations[0]
        self.target = pathlib.Path(folder) / "results.py"
        if pathlib.Path(__file__).parent not in self.target.parents:  # only the test's own copy
            raise RuntimeError(f"refusing to edit {self.target}: not the test's installed copy")

    def split_heads(self, x, num_heads):
        text = self.target.read_text("utf-8")
        if self.EDIT[0] in text:
            self.target.write_text(text.replace(*self.EDIT), "utf-8")
        return Heads.split_heads(self, x, num_heads) * 0


class LeavesAGrandchild(Heads):
    """Wrong in every cell. Once, when first constructed, it leaves a detached grandchild
    (double fork + setsid, out of certify's process group) that writes its pid and, once certify
    has exited, rewrites the certificate as passing and re-seals it."""

    def __init__(self):
        import pathlib

        super().__init__("leaves-a-grandchild")
        here = pathlib.Path(__file__).parent
        pids = here / "grandchild.pids"
        if pids.exists():
            return
        pids.write_text("", "utf-8")
        judge = os.getppid()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(pids, "a") as f:
                    f.write(f"{os.getpid()}\\n")
                for _ in range(600):  # until certify has exited (at most a minute)
                    if not os.path.exists(f"/proc/{judge}"):
                        break
                    time.sleep(0.1)
                import json

                from mhaspec import certificate

                path = here / "certs" / "leaves-a-grandchild.json"
                body = {k: v for k, v in json.loads(path.read_text("utf-8")).items() if k != "sha256"}
                for c in body["clauses"]:
                    c["verdict"] = "pass" if c["verdict"] == "fail" else c["verdict"]
                path.write_text(json.dumps(certificate.seal(body)), "utf-8")
            os._exit(0)

    def split_heads(self, x, num_heads):
        return super().split_heads(x, num_heads) * 0


XFAIL = RaisesXfail("raises-xfail")
CUDA_TORCH = ClaimsACudaDevice("cuda-torch")
SHIFTING = Shifting("shifting")
ONLY_IN_HARNESS = OnlyInHarness("only-in-harness")
ZERO = ZeroAttention()
IGNORED_ALARM = misbehaving("ignored-alarm")
BLOCKED_SIGNALS = misbehaving("blocked-signals")
SEGFAULT = misbehaving("segfault")
EXIT = misbehaving("exit")
TO_NUMPY_HANG = misbehaving("to-numpy-hang")
DIES_IN_ATTENTION = DiesInAttention()
HUGE_ANSWER = HugeAnswer("huge-answer")
STOPS_THE_JUDGE = StopsTheJudge("stops-the-judge")
SEES_THE_JUDGE = SeesTheJudge
class EDITS_AND_RESTORES(EditsTheJudge):  # classes: constructed only when certified
    def __init__(self):
        super().__init__("edits-and-restores", restore=True)


class EDITS_THE_JUDGE(EditsTheJudge):
    def __init__(self):
        super().__init__("edits-the-judge", restore=False)


EDITS_DURING_THE_RUN = EditsDuringTheRun
LEAVES_A_GRANDCHILD = LeavesAGrandchild


class SEES_PROCESSES(Heads):
    """Its name says whether it can see the judging process (``mhaspec.cli`` in a ``/proc``
    command line)."""

    def __init__(self):
        seen = False
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    seen = seen or b"mhaspec.cli" in f.read()
            except OSError:
                pass
        super().__init__("sees-the-judge" if seen else "sees-no-judge")
DEVIATION_OF_NO_CLAUSE = wrong("deviations", {"NOPE-1": "a clause that does not exist"})
DEVICE_WITH_A_SLASH = wrong("devices", lambda: {"cpu/0": None})
PROTOCOL_STR = wrong("protocol_version", "1")
FRAMEWORK_INT = wrong("framework", 3)
FLAGS_LIST = wrong("precision_flags", lambda device: ["tf32"])
DEVIATION_INT = wrong("deviations", {"HEAD-1": 1})
DEVICES_RAISE = wrong("devices", no_devices)

# replacing the judge at import: in-process, every comparison then passed
from mhaspec.conformance import tolerance as _tolerance

_tolerance.judge = lambda *a, **k: _tolerance.Comparison(True, 0.0, 1.0, 0.0, 0.0, None)
'''

#: the heads chapter's tests (HEAD-1, HEAD-2 and INPUT-1's split/combine test): a cheap selection
HEADS_ONLY = ("-k", "split_heads")


@pytest.fixture()
def work(tmp_path) -> pathlib.Path:
    (tmp_path / "hostile_backends.py").write_text(BACKENDS, "utf-8")
    return tmp_path


def certify(cwd: pathlib.Path, ref: str, *args: str, timeout: float = 300, path=None,
            python: tuple[str, ...] = ("-m", "mhaspec.cli"), extra_env: dict | None = None):
    """``mhaspec certify`` of ``hostile_backends:ref`` in ``cwd`` (``path``: first on PYTHONPATH;
    ``python``: what runs the command line, ``-m mhaspec.cli`` or a ``-c`` script around it;
    ``extra_env``: variables added to the judge's environment)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | (extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([*([str(path)] if path else []), str(cwd),
                                         os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *python, "certify", f"hostile_backends:{ref}",
                           "--profile", "ci", "--output-dir", "certs", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


#: ``mhaspec certify`` that prints, at exit, the frameworks imported into the judging process
CERTIFY_LISTING_FRAMEWORKS = (
    "-c", "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('judging process imported:', sorted(m for m in ('torch', 'jax', "
    "'tensorflow', 'keras', 'flax', 'transformers', 'onnxruntime') if m in sys.modules)))\n"
    "sys.argv[0] = 'mhaspec'\n"
    "runpy.run_module('mhaspec.cli', run_name='__main__')\n")


def certificate(cwd: pathlib.Path, stem: str) -> dict:
    return json.loads((cwd / "certs" / f"{stem}.json").read_text("utf-8"))


def clause(cert: dict, cid: str) -> dict:
    return next(c for c in cert["clauses"] if c["id"] == cid)


def output(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


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


def installed_copy(site: pathlib.Path) -> pathlib.Path:
    """A copy of the installed mhaspec package in ``site`` (first on PYTHONPATH, it is imported
    instead of the installed one: the layout of a project-local virtual environment)."""
    import importlib

    import mhaspec

    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(pathlib.Path(mhaspec.__file__).parent, site / "mhaspec", ignore=skip)
    for sub in ("spec", "backends", "conformance"):
        source = pathlib.Path(importlib.import_module(f"mhaspec.{sub}").__file__).parent
        shutil.copytree(source, site / "mhaspec" / sub, ignore=skip, dirs_exist_ok=True)
    return site


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


def test_an_answer_past_the_cap_fails_that_call_unread(work):
    """Old: any answer up to 4 GiB was read (the judge holding about twice that)."""
    proc = certify(work, "HUGE_ANSWER", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    head1 = clause(certificate(work, "huge-answer"), "HEAD-1")
    assert head1["verdict"] == "fail"
    assert all("at most 256 MiB" in m and "float16" in m for m in head1["failures"]), head1


def test_stopping_the_judge_does_not_stop_its_clock(work):
    """Old: the judge, stopped by SIGSTOP while the backend took 4 s, found the answer waiting
    when continued and passed a call 2.5 times past its limit."""
    proc = certify(work, "STOPS_THE_JUDGE", "--call-timeout", "1.5", "--", *HEADS_ONLY)
    assert proc.returncode == 1, output(proc)
    head1 = clause(certificate(work, "stops-the-judge"), "HEAD-1")
    assert head1["verdict"] == "fail", head1
    assert all("per-call time limit of 1.5 s" in m and "float16" in m
               for m in head1["failures"]), head1["failures"]


def test_the_backend_sees_neither_the_judges_environment_nor_folder_nor_entry(work):
    """Old: the backend's process inherited the judge's environment and working folder and ran
    as ``python -m mhaspec.backend_host``: one ``if`` on any of them told it it was certified
    (issue 36, attack 5). Detection of the host is still possible by other means (its modules,
    its pipes); the certificate and docs/certificates.md say so, and the audit re-run answers it."""
    env_proc = certify(work, "SEES_THE_JUDGE", "--", *HEADS_ONLY, extra_env={"JUDGE_ONLY_SECRET": "1"})
    assert (work / "certs" / "sees-nothing.json").is_file(), (
        sorted(p.name for p in (work / "certs").iterdir()), output(env_proc))
    assert clause(certificate(work, "sees-nothing"), "HEAD-1")["verdict"] == "pass"


FLIP_REPORTS = ("import pytest\n\n@pytest.hookimpl(wrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n"
                "    report = yield\n    report.outcome = 'passed'\n    return report\n")


def test_pytest_plugins_in_the_environment_is_refused(work):
    """Old: ``PYTEST_PLUGINS=flipper`` loaded a plugin into the judging process that turned every
    failure into a pass: a backend wrong in every cell conformed (issue 36, attack 4)."""
    (work / "flipper.py").write_text(FLIP_REPORTS, "utf-8")
    proc = certify(work, "ONLY_IN_HARNESS", "--", *HEADS_ONLY, extra_env={"PYTEST_PLUGINS": "flipper"})
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "PYTEST_PLUGINS" in lines[0], output(proc)
    assert not (work / "certs" / "only-in-harness.json").exists()


def test_a_seed_with_the_fixed_inputs_of_ci_is_refused(work):
    """Old: ``--profile ci --seed 7`` ran the same derandomized inputs as any other seed and the
    certificate named seed 7: a backend that memorised the ci inputs conformed under every seed
    (issue 36, attack 6). Now a seed there is a one-line usage error and a ci certificate says
    "fixed inputs (ci profile)" instead of a seed."""
    for args in (["--seed", "7"], ["--", "--hypothesis-seed=7"]):
        proc = certify(work, "SHIFTING", *args)
        assert proc.returncode == 2, output(proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--seed has no effect with --profile ci" in lines[0], output(proc)
    proc = certify(work, "SHIFTING", "--", *HEADS_ONLY)
    hypothesis = certificate(work, "shifting")["hypothesis"]
    assert hypothesis["seed"] is None and hypothesis["inputs"] == "fixed inputs (ci profile)", output(proc)
    assert "fixed inputs (ci profile)" in (work / "certs" / "shifting.md").read_text("utf-8")


@pytest.mark.parametrize("ref, stem, when", [
    ("EDITS_AND_RESTORES", "edits-and-restores", "found after collection"),
    ("EDITS_THE_JUDGE", "edits-the-judge", "found after collection"),
    ("EDITS_DURING_THE_RUN", "edits-during-the-run", "found after the run")])
def test_an_edit_of_the_installed_judge_fails_certify_loudly(work, ref, stem, when):
    """Old: the backend's process edited the installed ``conformance/results.py`` before the judge
    imported it (after the claims) and restored it during the run: every outcome a pass, a
    "conforms" with no trace (issue 36, attack 1). Now every judge module is imported and every
    judge file hashed before the backend starts; no backend process runs while pytest collects,
    so an edit made at the start is still there after collection, and one made during the run is
    there after it: a one-line error naming the file, and no certificate."""
    site = installed_copy(work / ".venv" / "site")
    proc = certify(work, ref, "--", *HEADS_ONLY, path=site)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "changed while the backend ran" in lines[0], output(proc)
    assert f"({when})" in lines[0] and "results.py" in lines[0] and "no certificate" in lines[0]
    assert not (work / "certs" / f"{stem}.json").exists()


def test_a_detached_grandchild_does_not_outlive_certify(work):
    """Old: a grandchild of the backend's process (double fork + setsid, outside the process group
    certify kills) lived on and re-sealed a passing certificate after certify exited (issue 36,
    attack 2). Now certify is the subreaper of the backend's descendants and kills every one of
    them before it writes the certificate."""
    import time

    proc = certify(work, "LEAVES_A_GRANDCHILD", "--", *HEADS_ONLY)
    pids = [int(p) for p in (work / "grandchild.pids").read_text("utf-8").split()]
    try:
        time.sleep(3)
        alive = [p for p in pids if running(p)]
        assert pids and not alive, (pids, alive, output(proc))
        assert clause(certificate(work, "leaves-a-grandchild"), "HEAD-1")["verdict"] == "fail"
    finally:
        for p in pids:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_pth_file_that_patches_the_judge_is_named_on_the_certificate(work):
    """Old: a ``.pth`` file in site-packages (which a backend's wheel can ship) ran code in the
    judging process at start-up, patched the judge and left no trace: a backend answering zeros
    passed SDPA-1 (issue 36, attack 3). Python runs it before mhaspec gets control, so certify
    cannot stop it; the certificate now lists every ``.pth`` file that runs code, with its hash
    (``run.startup_code``), and verify prints them."""
    import sysconfig
    import venv

    env_dir = work / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "link.pth").write_text(f"import site; site.addsitedir({ours!r})\n", "utf-8")
    (site / "judge_patch.py").write_text(
        "import sys\n\ndef _hook(event, args):\n"
        "    if event == 'import' and args[0] == 'mhaspec.conformance.harness':\n"
        "        t = sys.modules.get('mhaspec.conformance.tolerance')\n"
        "        if t is not None and not getattr(t, 'patched', False):\n"
        "            t.patched = True\n"
        "            t.judge = lambda *a, **k: t.Comparison(True, 0.0, 1.0, 0.0, 0.0, None)\n\n"
        "sys.addaudithook(_hook)\n", "utf-8")
    (site / "zz_judge_patch.pth").write_text("import judge_patch\n", "utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(work)
    proc = subprocess.run([str(python), "-m", "mhaspec.cli", "certify", "hostile_backends:ZERO",
                           "--profile", "ci", "--output-dir", "certs", "--", "-k",
                           "test_attention_equals_softmax"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    cert = certificate(work, "zero-attention")
    startup = cert["run"]["startup_code"]
    assert any("zz_judge_patch.pth sha256:" in line for line in startup), (startup, output(proc))
    verified = subprocess.run([str(python), "-m", "mhaspec.cli", "verify", "certs/zero-attention.json"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert "zz_judge_patch.pth" in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.skipif(backend_process.sandbox_problem() is not None,
                    reason="no user namespaces here (unshare)")
def test_a_sandboxed_backend_sees_no_process_of_the_judge(work):
    """Unsandboxed, the backend's process finds the judge in /proc (its command line, and so its
    /proc entry: environment, working folder, memory where allowed); with --sandbox it is PID 1 of
    a namespace of its own and sees none, and the certificate says which it was."""
    plain = certify(work, "SEES_PROCESSES", "--", *HEADS_ONLY)
    assert (work / "certs" / "sees-the-judge.json").is_file(), output(plain)
    assert certificate(work, "sees-the-judge")["run"]["sandbox"].startswith("not sandboxed")
    boxed = certify(work, "SEES_PROCESSES", "--sandbox", "--", *HEADS_ONLY)
    assert (work / "certs" / "sees-no-judge.json").is_file(), output(boxed)
    assert certificate(work, "sees-no-judge")["run"]["sandbox"].startswith("sandboxed")
