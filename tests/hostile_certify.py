"""The hostile backends of ``mhaspec certify``'s tests, and the helpers that certify them.

``BACKENDS`` is the module each test writes as ``hostile_backends.py`` (the ``work`` fixture);
``certify`` runs ``mhaspec certify`` on one of its names in a subprocess, as a third party would;
``certificate``, ``clause`` and ``output`` read the result; ``installed_copy`` lays out a
project-local copy of mhaspec. Shared by ``test_hostile_backend.py`` (issue 22) and
``test_hostile_backend_same_machine.py`` (issue 36).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

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
        child = os.fork()
        if child == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild:  # the middle process records the grandchild's pid and leaves
                with open(pids, "a") as f:
                    f.write(f"{grandchild}\\n")
                os._exit(0)
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
        os.waitpid(child, 0)  # the pid is on disk before the backend is used (no race with certify)

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


class KILLS_ITS_JUDGE(Heads):  # a class: constructed only in the process that serves it
    """Kills its parent, the judging process that started it, at its first operation."""

    def __init__(self):
        super().__init__("kills-its-judge")

    def split_heads(self, x, num_heads):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)
        return super().split_heads(x, num_heads)


class OWN_INTERPRETER(Heads):  # a class: constructed only in the process that serves it
    """Named by the interpreter that serves it: "own-interpreter" under the test's wrapper script
    (which sets MHASPEC_TEST_WRAPPER), "judges-interpreter" otherwise."""

    def __init__(self):
        super().__init__("own-interpreter" if os.environ.get("MHASPEC_TEST_WRAPPER")
                         else "judges-interpreter")
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


def certificate(cwd: pathlib.Path, stem: str) -> dict:
    return json.loads((cwd / "certs" / f"{stem}.json").read_text("utf-8"))


def clause(cert: dict, cid: str) -> dict:
    return next(c for c in cert["clauses"] if c["id"] == cid)


def output(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


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
