"""Packages that mhaspec does not require: how an adapter says one is missing, and the loaders of
the frameworks (:func:`torch_module`, :func:`jax_module`, :func:`jnp_module`, :func:`tf_module`).

An adapter module calls :func:`require` at import; when a package is missing the import fails with
``ImportError("unavailable: <package> not installed: pip install 'mhaspec[<extra>]'")``, which
:func:`mhaspec.backends.load_backend` reports as a :class:`~mhaspec.backends.BackendLoadError`, and
a run over the registered backends leaves the adapter out instead of failing.
"""

from __future__ import annotations

import functools
import importlib.util
import os


#: Top-level module of a framework (or of the tools' plots) -> the extra of mhaspec installing it.
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "tensorflow": "tensorflow",
          "keras": "tensorflow", "onnx": "onnx", "onnxruntime": "onnx", "flax": "flax",
          "transformers": "hf", "mlx": "mlx", "paddle": "paddle", "tinygrad": "tinygrad",
          "matplotlib": "plots"}


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


# -- the frameworks, imported on first use and set up for the spec's numerics (NUM-2) -----------
def torch_module():
    """``torch``, with TF32 off for CUDA matmuls and convolutions (set again on every call)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


@functools.cache
def jax_module():
    """``jax``, with float64 enabled (``jax_enable_x64``)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def jnp_module():
    """``jax.numpy`` (after :func:`jax_module`)."""
    return jax_module().numpy


@functools.cache
def tf_module():
    """``tensorflow``, quiet (``TF_CPP_MIN_LOG_LEVEL=2`` unless set) and with TF32 off."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(False)
    return tf
