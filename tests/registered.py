"""The registered backends as the project's tests see them: loaded, or the reason they cannot load
(an adapter whose optional package is missing, e.g. ``unavailable: flax not installed``)."""

from __future__ import annotations

import functools

import pytest

from mhaspec.backends import loadable


@functools.cache
def registered() -> dict[str, object]:
    """name -> loaded backend, or the reason (a string) it cannot load, for every registered one."""
    found = loadable()
    return {name: found.backends.get(name, found.failures.get(name)) for name in
            sorted(found.backends.keys() | found.failures.keys())}


def loaded() -> dict[str, object]:
    """name -> backend for the registered backends that load here."""
    return {n: b for n, b in registered().items() if not isinstance(b, str)}


def unloadable_params() -> list:
    """pytest params, skipped with the reason, for the registered backends that do not load."""
    return [pytest.param(n, marks=pytest.mark.skip(reason=b))
            for n, b in registered().items() if isinstance(b, str)]
