"""The backend's process as the judging process sees it: started, asked, timed, stopped, restarted.

:class:`BackendProcess` runs ``python -m mhaspec.backend_host`` in a session of its own with two
pipes, and :meth:`~BackendProcess.request` sends one :mod:`mhaspec.wire` message and waits for the
answer within a time limit. Past the limit the whole session is killed (``SIGKILL``: a C-level loop
or an ignored ``SIGALRM`` ends too) and :class:`harness.CallTimeout` names the limit; a process that
dies (a segfault, ``os._exit``) raises :class:`BackendDied` naming how it ended. Either way the
next request starts a new process (:attr:`~BackendProcess.restarts` counts them); any other
interruption of a request (the suite's own ``SIGALRM``, Ctrl-C) also kills it, so no answer is ever
read out of step.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

from mhaspec import wire
from mhaspec.backends.call_limit import CallTimeout

#: seconds the backend's process may take to import and load the backend and read its claims
STARTUP_LIMIT = 600.0


class BackendDied(BaseException):
    """The backend's process ended during a request (like :class:`CallTimeout`, a
    ``BaseException``: the test fails at once, nothing retries or shrinks the call)."""


class BackendProcess:
    """One backend reference served by a process of its own (started on first use)."""

    def __init__(self, ref: str, *, startup_limit: float = STARTUP_LIMIT) -> None:
        self.ref, self.startup_limit = ref, startup_limit
        self.proc: subprocess.Popen | None = None
        self.fd_in = self.fd_out = -1  # ours: the process's answers, our requests
        self.generation = 0  # starts so far; arrays of an earlier one are gone
        self.restarts = 0
        self.first: dict = {}

    def start(self) -> dict:
        """Start the process; returns its first message (``{"claims": ...}`` or ``{"load_error":
        ...}``). Raises :class:`BackendDied` or :class:`CallTimeout` when it sends none."""
        self.stop()
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mhaspec.backend_host", self.ref, str(from_parent), str(to_parent)],
            pass_fds=(from_parent, to_parent), stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(from_parent)
        os.close(to_parent)
        self.fd_in, self.fd_out = from_child, to_child
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
            return wire.receive(self.fd_in, deadline)
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

    def stop(self) -> None:
        """Kill the process's session (if running) and close the pipes."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for fd in (self.fd_in, self.fd_out):
            if fd >= 0:
                os.close(fd)
        self.fd_in = self.fd_out = -1
