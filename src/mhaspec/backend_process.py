"""The backend's process as the judging process sees it: started, asked, timed, stopped, restarted.

:class:`BackendProcess` runs :mod:`mhaspec.backend_host` (``python -c`` :data:`HOST_ENTRY`) in a
session of its own, in a fresh working folder, with a scrubbed environment
(:func:`backend_environment`) and two pipes, and :meth:`~BackendProcess.request` sends one :mod:`mhaspec.wire` message and waits for the
answer within a time limit. Past the limit the whole session is killed (``SIGKILL``: a C-level loop
or an ignored ``SIGALRM`` ends too) and :class:`harness.CallTimeout` names the limit; a process that
dies (a segfault, ``os._exit``) raises :class:`BackendDied` naming how it ended. Either way the
next request starts a new process (:attr:`~BackendProcess.restarts` counts them); any other
interruption of a request (the suite's own ``SIGALRM``, Ctrl-C) also kills it, so no answer is ever
read out of step.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from mhaspec import wire
from mhaspec.backends import registered_backends
from mhaspec.backends.call_limit import CallTimeout

#: seconds the backend's process may take to import and load the backend and read its claims
STARTUP_LIMIT = 600.0
#: the most bytes of arrays one answer of the backend's process may hold (the suite's largest
#: answer is a few MiB; the judging process holds about twice what it reads)
MAX_ANSWER = 256 << 20


class BackendDied(BaseException):
    """The backend's process ended during a request (like :class:`CallTimeout`, a
    ``BaseException``: the test fails at once, nothing retries or shrinks the call)."""


class BackendProcess:
    """One backend reference served by a process of its own (started on first use)."""

    def __init__(self, ref: str, *, startup_limit: float = STARTUP_LIMIT,
                 sandbox: bool = False, python: str | None = None) -> None:
        self.ref, self.startup_limit, self.sandbox = ref, startup_limit, sandbox
        self.python = python  # the interpreter that serves the backend (None: the judge's)
        self.proc: subprocess.Popen | None = None
        self.fd_in = self.fd_out = -1  # ours: the process's answers, our requests
        self.generation = 0  # starts so far; arrays of an earlier one are gone
        self.restarts = 0
        self.first: dict = {}
        self.cwd: str | None = None  # the process's own working folder

    def start(self) -> dict:
        """Start the process; returns its first message (``{"claims": ...}`` or ``{"load_error":
        ...}``). Raises :class:`BackendDied` or :class:`CallTimeout` when it sends none."""
        self.stop()
        become_subreaper()
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        self.cwd = tempfile.mkdtemp(prefix="mhaspec-backend-")
        self.proc = subprocess.Popen(
            [*(SANDBOX if self.sandbox else ()), self.python or sys.executable, "-c", HOST_ENTRY],
            stdin=from_parent, pass_fds=(to_parent,),
            cwd=self.cwd, env=backend_environment(), start_new_session=True)
        os.close(from_parent)
        os.close(to_parent)
        self.fd_in, self.fd_out = from_child, to_child
        wire.send(self.fd_out, {"ref": self.ref, "answers": to_parent, "path": local_folder(self.ref)})
        for fd in (from_child, to_child):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.generation += 1
        late = (f"the backend's process sent no claims within {self.startup_limit:g} s of starting; "
                f"it was stopped")
        header, _ = self._answer(time.monotonic() + self.startup_limit, "loading the backend", late)
        self.first = header
        return header

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> None:
        """Start the process again when it is not running (after a hang or a death)."""
        if not self.alive:
            if self.proc is not None:
                self.restarts += 1
            self.start()

    def request(self, header: dict, arrays: list, *, limit: float | None, what: str):
        """Send one request and return the answer (header, arrays). ``limit``: seconds for the
        whole exchange (None: none). The process is (re)started first when it is not running."""
        self.ensure()
        deadline = None if limit is None else time.monotonic() + limit
        late = "" if limit is None else (
            f"{what} did not return within the per-call time limit of {limit:g} s "
            f"(--call-timeout); the backend's process was stopped")
        try:
            wire.send(self.fd_out, header, arrays, deadline)
        except wire.WireTimeout:
            self.stop()
            raise CallTimeout(late) from None
        except wire.WireClosed:
            raise BackendDied(f"{what}: {self._ended()}") from None
        except BaseException:
            self.stop()
            raise
        return self._answer(deadline, what, late)

    def _answer(self, deadline: float | None, what: str, late: str):
        """The next message from the process, by ``deadline`` (:class:`CallTimeout` ``late``)."""
        try:
            answer = wire.receive(self.fd_in, deadline, MAX_ANSWER)
        except wire.WireTimeout:
            self.stop()
            raise CallTimeout(late) from None
        except wire.WireClosed:
            raise BackendDied(f"{what}: {self._ended()}") from None
        except wire.WireError as exc:
            self.stop()
            raise BackendDied(f"{what}: the backend's process sent a broken message ({exc})") from None
        except BaseException:
            self.stop()
            raise
        if deadline is not None and time.monotonic() > deadline:  # the judge was stopped meanwhile
            self.stop()
            raise CallTimeout(late)
        return answer

    def _ended(self) -> str:
        """How the process ended (it is reaped, and the pipes closed)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.stop()
            return "the backend's process closed its pipe and was stopped"
        self.stop()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the backend's process died ({name})"
        return f"the backend's process exited with status {code}"

    def park(self) -> None:
        """Stop the process without counting a restart: the next request starts a fresh one."""
        self.stop()
        self.proc = None

    def stop(self) -> None:
        """Kill the process's session (if running) and every descendant of it that left the
        session (:func:`kill_orphans`), and close the pipes."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        kill_orphans()
        for fd in (self.fd_in, self.fd_out):
            if fd >= 0:
                os.close(fd)
        self.fd_in = self.fd_out = -1
        if self.cwd is not None:
            shutil.rmtree(self.cwd, ignore_errors=True)
            self.cwd = None


#: prctl's PR_SET_CHILD_SUBREAPER (Linux): orphaned descendants are reparented to this process
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux), so that a grandchild of the
    backend's process that detached itself (double fork, ``setsid``) becomes this process's child
    when its parent exits, where :func:`kill_orphans` finds it. False where the system has none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_orphans(rounds: int = 50) -> int:
    """Kill (``SIGKILL``) and reap every child of this process outside its own session: the
    backend's detached descendants reparented here (:func:`become_subreaper`); this process's
    own children share its session. Repeated while killing one orphans more. Returns how many."""
    me, session, killed = os.getpid(), os.getsid(0), 0
    for _ in range(rounds):
        found = [pid for pid, ppid, sid in _processes() if ppid == me and sid != session]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            killed += 1
    return killed


def _processes():
    """(pid, parent pid, session id) of every process ``/proc`` lists (none without ``/proc``)."""
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return
    for name in names:
        try:
            fields = pathlib.Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        yield int(name), int(fields[1]), int(fields[3])


#: the sandbox of ``--sandbox``: user, PID and mount namespaces of its own (util-linux
#: ``unshare``, no privilege needed where the system allows user namespaces); the backend is PID 1
#: of its namespace with a /proc of its own (it sees no process of the judge, can signal none),
#: and the whole namespace dies with it. The filesystem stays as the user's: not read-only.
SANDBOX = ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount",
           "--mount-proc")


def sandbox_problem() -> str | None:
    """Why :data:`SANDBOX` cannot run here (one line), or None when it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    try:
        done = subprocess.run([*SANDBOX, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare failed: {exc}"
    return None if done.returncode == 0 else f"unshare failed: {done.stderr.strip()[:200]}"


#: the backend's process runs this (``python -c``): its ``__main__`` and ``sys.argv`` (``["-c"]``)
#: name no module of the judge; the reference and the answer pipe come as the first message
HOST_ENTRY = "__import__('mhaspec.backend_host').backend_host.main()"

#: the variables the backend's process inherits (and those starting with one of KEEP_PREFIXES):
#: where to find programs, libraries and caches, the locale, and the frameworks' own settings
KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                  "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SYSTEMROOT"})
KEEP_PREFIXES = ("LC_", "XDG_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "XLA_", "JAX_", "TF_", "TORCH",
                 "OMP_", "MKL_", "OPENBLAS_", "KMP_", "HF_", "TRANSFORMERS_", "KERAS_")


def backend_environment(environ=None) -> dict[str, str]:
    """The judge's environment scrubbed for the backend's process: :data:`KEEP` and
    :data:`KEEP_PREFIXES` only, ``PYTHONPATH`` entries made absolute (its cwd is a fresh folder)."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k in KEEP or k.startswith(KEEP_PREFIXES)}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd()
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    return env


def local_folder(ref: str) -> str | None:
    """The judge's current folder when ``ref`` is a ``module:attr`` whose module lies there
    (``NAME.py`` or ``NAME/``, imported from there as ``python -m`` would), else None: the
    backend's process runs in a folder of its own and gets only this one of the judge's."""
    module, sep, _ = ref.partition(":")
    if not sep or ref in registered_backends():
        return None
    top, here = module.split(".")[0], pathlib.Path.cwd()
    return str(here) if (here / f"{top}.py").is_file() or (here / top).is_dir() else None
