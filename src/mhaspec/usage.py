"""What every ``mhaspec`` command shares for talking to its user.

* :class:`UsageError`: bad input from the user; the command line prints it as one line on stderr
  and exits with status 2 (no traceback).
* :class:`ArgumentParser`: argparse with one-line errors (``mhaspec: error: ...``, status 2)
  instead of the multi-line usage block.
* :func:`printable`: a string from a file or a backend, safe to print on a terminal.
* :func:`checked_backend`: a backend for a command, every failure of its own code a usage error.
* :func:`writable_dir`, :func:`writable_file`: outputs checked before a long run starts.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
from typing import NoReturn

from mhaspec.backends import BackendLoadError, load_backend
from mhaspec.backends.optional import install_line


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr (status 2), naming the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"mhaspec: error: {self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: object) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def printable(text: object, limit: int = 200) -> str:
    """``text`` with control characters (terminal escape codes, newlines) written as escapes, and
    cut at ``limit`` characters: what a file or a backend names can then not drive the terminal."""
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                  for c in str(text))
    return out if len(out) <= limit else out[:limit] + "..."


def at_least(low: int):
    """An argparse ``type``: an integer of at least ``low`` (``--cases -1`` is one line, exit 2)."""
    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    count.__name__ = f"integer >= {low}"
    return count


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a positive finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def read_json(path, what: str):
    """The JSON in file ``path``: a :class:`UsageError` naming ``what`` when it cannot be read or
    parsed."""
    import json

    try:
        return json.loads(pathlib.Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"cannot read {what} {printable(path)}: {one_line(reason)}") from None


def fail(message: str) -> NoReturn:
    """Print ``message`` as a usage error and exit with status 2 (for a tool's ``main``)."""
    print(f"mhaspec: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)


def checked_backend(ref: str):
    """The backend ``ref`` names (registered name or ``module:attr``), with its framework version
    read once; any failure -- an import that raises, a constructor or ``framework_version()``
    that raises, a protocol member missing -- is a :class:`UsageError` naming the backend."""
    try:
        backend = load_backend(ref)
    except BackendLoadError as exc:
        raise UsageError(one_line(exc)) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the backend's own code failed
        raise UsageError(f"backend {printable(ref)} failed to load: {type(exc).__name__}: "
                         f"{printable(one_line(exc))}") from None
    try:
        str(backend.framework_version())
    except ImportError as exc:
        raise UsageError(f"backend {printable(ref)} needs {printable(exc.name or exc)}, which is "
                         f"not installed{install_hint(exc.name)}") from None
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"backend {printable(ref)}: framework_version() raised "
                         f"{type(exc).__name__}: {printable(one_line(exc))}") from None
    return backend


def install_hint(module: str | None) -> str:
    """``": pip install 'mhaspec[EXTRA]'"`` for a missing ``module`` an extra installs, else ""."""
    line = install_line(module) if module else None
    return f": {line}" if line else ""


def writable_dir(path) -> pathlib.Path:
    """``path`` as a directory this process can write into (created when missing), checked before
    any long run; a :class:`UsageError` when it is a file, cannot be created or is read-only."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output directory {printable(path)} is a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(f"output directory {printable(path)} is not writable: "
                         f"{one_line(exc.strerror or exc)}") from None
    return path


def writable_file(path) -> pathlib.Path:
    """``path`` as a file this process may write (its directory must exist): a
    :class:`UsageError` when it is a directory or its directory is not writable."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UsageError(f"output file {printable(path)} is a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"output file {printable(path)} is not writable")
    writable_dir(path.parent)
    return path


def read_bounded(path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path`` (a file, a pipe, a device), at most ``max_bytes`` of them: a
    :class:`UsageError` naming ``what`` when it is longer, a directory or unreadable."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {printable(path)} is a directory")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {printable(path)}: "
                         f"{one_line(exc.strerror or exc)}") from None
    if len(data) > max_bytes:
        raise UsageError(f"{what} {printable(path)} is over the limit of {max_bytes} bytes "
                         f"(raise it with --max-bytes)")
    return data
