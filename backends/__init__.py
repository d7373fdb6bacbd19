"""Backends: the protocol every implementation follows, and the in-repo implementations.

Package ``mhaspec.backends``, folder ``backends/``. It imports no other part of mhaspec: not the
spec's oracle (a reference that shares code hides the bugs it shares), the suite or the commands.

Each framework module (``np_backend``, ``torch_backend``, ``jax_backend``, ``tf_backend``) imports
only its own framework, and only when it is loaded: importing this package imports no framework.
Backends are named ``module:attr`` or by the name they are registered under in the
``mhaspec.backends`` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from ._base import (ALL_DTYPES, CAPABILITIES, FEATURE_ARGUMENTS, OPTIONAL_CAPABILITIES,
                    PROTOCOL_VERSION, AttentionOutputs, Backend, MHAParams, native_byte_order)
from ._generic import Algorithm

__all__ = ["ALL_DTYPES", "CAPABILITIES", "FEATURE_ARGUMENTS", "OPTIONAL_CAPABILITIES",
           "PROTOCOL_VERSION", "Algorithm", "AttentionOutputs", "Backend", "MHAParams",
           "native_byte_order",
           "BackendLoadError", "load_backend", "registered_backends"]

ENTRY_POINT_GROUP = "mhaspec.backends"
REQUIRED_MEMBERS = ("name", "framework", "capabilities", "framework_version", "devices", "dtypes",
                    "asarray", "to_numpy")


class BackendLoadError(ValueError):
    """A backend reference that cannot be loaded or does not follow the protocol."""


def registered_backends() -> dict[str, str]:
    """Name -> ``module:attr`` for every backend in the ``mhaspec.backends`` entry-point group."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_backend(ref: str):
    """Load a backend from ``module:attr`` or a registered name; checks the protocol's members."""
    target = registered_backends().get(ref, ref)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise BackendLoadError(f"backend {ref!r} is neither a registered name nor 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendLoadError(f"backend {ref!r}: cannot import module {module_name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendLoadError(f"backend {ref!r}: module {module_name!r} has no attribute "
                                   f"{attr!r}") from None
    if isinstance(obj, type):
        obj = obj()
    missing = [m for m in REQUIRED_MEMBERS if not hasattr(obj, m)]
    if missing:
        raise BackendLoadError(f"backend {ref!r} is missing protocol members: {', '.join(missing)}")
    unknown = set(obj.capabilities) - CAPABILITIES
    if unknown:
        raise BackendLoadError(f"backend {ref!r} claims unknown capabilities: {sorted(unknown)}")
    return obj
