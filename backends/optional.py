"""Adapters for packages that mhaspec does not require: how they say that a package is missing.

An adapter module calls :func:`require` at import; when a package is missing the import fails with
``ImportError("unavailable: <package> not installed: pip install 'mhaspec[<extra>]'")``, which
:func:`mhaspec.backends.load_backend` reports as a :class:`~mhaspec.backends.BackendLoadError`, and
a run over the registered backends leaves the adapter out instead of failing.
"""

from __future__ import annotations

import importlib.util


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (import blocked)
        return False


def require(*modules: str, extra: str) -> None:
    """Raise ImportError naming the first of ``modules`` that is not installed and the extra of
    mhaspec that installs it."""
    for module in modules:
        if not installed(module):
            raise ImportError(f"unavailable: {module} not installed: "
                              f"pip install 'mhaspec[{extra}]'")
