"""Backends: the protocol every implementation follows, and the in-repo implementations.

Package ``mhaspec.backends``, folder ``backends/``. It imports no other part of mhaspec: not the
spec's oracle (a reference that shares code hides the bugs it shares), the suite or the commands.

Each framework module (``np_backend``, ``torch_backend``, ``jax_backend``, ``tf_backend``) imports
only its own framework, and only when it is loaded: importing this package imports no framework.
Backends are named ``module:attr`` or by the name they are registered under in the
``mhaspec.backends`` entry-point group.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pathlib
import sys
from importlib.metadata import entry_points
from typing import Any, Iterable, NamedTuple

from ._base import (ALL_DTYPES, CAPABILITIES, FEATURE_ARGUMENTS, OPTIONAL_CAPABILITIES,
                    PROTOCOL_VERSION, AttentionOutputs, Backend, MHAParams, native_byte_order)
from ._generic import Algorithm
from .optional import install_line

__all__ = ["ALL_DTYPES", "CAPABILITIES", "FEATURE_ARGUMENTS", "OPTIONAL_CAPABILITIES",
           "PROTOCOL_VERSION", "Algorithm", "AttentionOutputs", "Backend", "MHAParams",
           "native_byte_order",
           "BackendLoadError", "Loadable", "load_backend", "loadable", "registered_backends"]

ENTRY_POINT_GROUP = "mhaspec.backends"
REQUIRED_MEMBERS = ("name", "framework", "capabilities", "framework_version", "devices", "dtypes",
                    "asarray", "to_numpy")


class BackendLoadError(ValueError):
    """A backend reference that cannot be loaded or does not follow the protocol."""


def registered_backends() -> dict[str, str]:
    """Name -> ``module:attr`` for every backend in the ``mhaspec.backends`` entry-point group."""
    return {name: next(iter(targets)) for name, targets in registrations().items()}


def registrations() -> dict[str, dict[str, str]]:
    """Name -> {``module:attr`` -> the distribution registering it}: a name with more than one
    target is ambiguous (:func:`load_backend` refuses it rather than take the first found)."""
    found: dict[str, dict[str, str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else "?"
        found.setdefault(ep.name, {}).setdefault(ep.value, dist)
    return found


def load_backend(ref: str):
    """Load a backend from ``module:attr`` or a registered name; checks the protocol's members.

    A ``module:attr`` whose module is a file or package in the current folder is imported from
    there, as ``python -m`` would (the folder is appended to ``sys.path``, so it shadows nothing
    installed); a name that is neither registered nor ``module:attr`` gets the closest registered
    names."""
    found = registrations()
    if len(found.get(ref, ())) > 1:
        where = "; ".join(f"{dist}: {target}" for target, dist in found[ref].items())
        raise BackendLoadError(f"backend name {ref!r} is registered by more than one distribution "
                               f"({where}): name the one to use as module:attr")
    registered = {name: next(iter(targets)) for name, targets in found.items()}
    target = registered.get(ref, ref)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        near = difflib.get_close_matches(ref, registered, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        raise BackendLoadError(f"backend {ref!r} is neither a registered name nor 'module:attr' "
                               f"({hint}mhaspec backends lists the registered names)")
    try:
        module = _import_from_here(module_name, local=ref not in registered)
    except ImportError as exc:
        raise BackendLoadError(f"backend {ref!r}: cannot import module {module_name!r}: "
                               f"{exc}{_import_hint(exc, module_name)}") from exc
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


class Loadable(NamedTuple):
    """The backends :func:`loadable` loaded (reference -> backend) and those it could not
    (reference -> the :class:`BackendLoadError`'s message), each in the order asked for."""

    backends: dict[str, Any]
    failures: dict[str, str]


def loadable(refs: Iterable[str] | None = None) -> Loadable:
    """Load every reference of ``refs`` (default: every registered name, sorted) with
    :func:`load_backend`, keeping those that load and, for the others (a framework or package not
    installed, a bad reference), the reason."""
    found = Loadable({}, {})
    for ref in sorted(registered_backends()) if refs is None else refs:
        try:
            found.backends[ref] = load_backend(ref)
        except BackendLoadError as exc:
            found.failures[ref] = str(exc)
    return found


def _import_from_here(module_name: str, *, local: bool):
    """``module_name`` imported; when ``local`` and it is not found on ``sys.path`` but lies in
    the current folder (``NAME.py`` or ``NAME/``), imported from there."""
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = pathlib.Path.cwd()
        if not (local and exc.name == top and os.getcwd() not in sys.path
                and ((here / f"{top}.py").is_file() or (here / top).is_dir())):
            raise
    sys.path.append(os.getcwd())
    return importlib.import_module(module_name)


def _import_hint(exc: ImportError, module_name: str) -> str:
    """What to do about a failed import: the extra that installs a missing framework, or where a
    ``module:attr`` module is looked for."""
    missing = getattr(exc, "name", None)
    if missing and install_line(missing):
        return f" ({install_line(missing)})"
    if missing and missing == module_name.split(".")[0]:
        return (f" (a module:attr backend is imported from the Python path or the current folder: "
                f"run in the folder that holds {missing}.py, or add its folder to PYTHONPATH)")
    return ""
