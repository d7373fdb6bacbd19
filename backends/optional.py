"""Adapters for packages that mhaspec does not require: how they say that a package is missing.

An adapter module calls :func:`require` at import; when a package is missing the import fails with
``ImportError("unavailable: <package> not installed: pip install 'mhaspec[<extra>]'")``, which
:func:`mhaspec.backends.load_backend` reports as a :class:`~mhaspec.backends.BackendLoadError`, and
a run over the registered backends leaves the adapter out instead of failing.
"""

from __future__ import annotations

import importlib.util


#: Top-level module of a framework (or of the tools' plots) -> the extra of mhaspec installing it.
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "tensorflow": "tensorflow",
          "keras": "tensorflow", "onnx": "onnx", "onnxruntime": "onnx", "flax": "flax",
          "transformers": "hf", "matplotlib": "plots"}


def install_line(module: str) -> str | None:
    """``pip install 'mhaspec[EXTRA]'`` for a missing framework ``module`` (``jax.numpy``: its top
    level), or None when no extra installs it."""
    extra = EXTRAS.get(module.split(".")[0])
    return f"pip install 'mhaspec[{extra}]'" if extra else None


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
