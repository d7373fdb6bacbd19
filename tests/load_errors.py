"""The one-line error of loading a backend in a fresh interpreter, where a setup line first hides
what the backend needs (a package, a file)."""

from __future__ import annotations

import subprocess
import sys


def load_error_line(ref: str, setup: str) -> str:
    """Run ``setup``, then ``load_backend(ref)``, in a child Python; the one line its
    ``BackendLoadError`` printed (asserted to be exactly one)."""
    code = (f"{setup}\n"
            "from mhaspec.backends import BackendLoadError, load_backend\n"
            f"try:\n    load_backend({ref!r})\n"
            "except BackendLoadError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    return lines[0]
