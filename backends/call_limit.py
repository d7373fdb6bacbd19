"""The per-call time limit: a backend call that runs longer than ``seconds`` raises
:class:`CallTimeout`, naming the limit.

In the main thread (pytest and its xdist workers run tests there) the limit is a ``SIGALRM`` timer
(``setitimer``), which interrupts Python code, ``time.sleep`` and blocking waits of the backend;
elsewhere the call runs in a daemon thread joined with the limit (the thread is abandoned, the
caller fails). A call stuck in C code that never returns to the interpreter is only interrupted by
the thread form. :class:`CallTimeout` derives from ``BaseException`` so that neither a backend's
``except Exception`` nor Hypothesis's shrinking (which would repeat the slow call) swallows it.
The suite (:mod:`mhaspec.conformance.cell`) and the sealed path (:mod:`mhaspec.backend_process`)
both raise it.
"""

from __future__ import annotations

import signal
import threading


class CallTimeout(BaseException):
    """A backend call ran past the per-call time limit (see the module docstring)."""


def call_with_limit(fn, seconds: float | None, what: str):
    """``fn()``, raising :class:`CallTimeout` naming ``what`` and the limit after ``seconds``."""
    if not seconds:
        return fn()
    message = (f"{what} did not return within the per-call time limit of {seconds:g} s "
               f"(--mhaspec-call-timeout)")
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            raise CallTimeout(message)

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="mhaspec-call")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise CallTimeout(message)
    if "error" in box:
        raise box["error"]
    return box["value"]
