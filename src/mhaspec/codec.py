"""The values of the sealed path's messages, both ways: one codec for the judging process
(:mod:`mhaspec.sealed`) and the backend's (:mod:`mhaspec.backend_host`).

A value travels in a :mod:`mhaspec.wire` header as JSON: ``None``, a string, a bool, an int or a
float as it is; a list as a list; otherwise an object with one tag: ``{"t": [...]}`` a tuple,
``{"d": {...}}`` a dict (string keys), ``{"params": [...]}`` :class:`MHAParams`, ``{"outputs":
{...}}`` :class:`AttentionOutputs`. Arrays are leaves each side reads its own way (``leaf``):
``{"a": i}`` the i-th array of the frame, ``{"h": id, ...}`` an array the backend's process holds.
:func:`encode` walks the containers and hands every other object to ``leaf(x)``, which returns its
tagged object; :func:`decode` walks the containers and hands ``{"h"}`` / ``{"a"}`` objects to
``leaf(obj)``. A value nested deeper than :data:`MAX_DEPTH` or carrying an unknown tag is a
:class:`CodecError`.
"""

from __future__ import annotations

from collections.abc import Callable

from mhaspec.backends import AttentionOutputs, MHAParams

#: the deepest nesting of containers a value may have (the suite's values nest 3 deep)
MAX_DEPTH = 16

PLAIN = (str, bool, int, float)


class CodecError(ValueError):
    """A value that is not one this codec writes (one line)."""


def encode(v, leaf: Callable, depth: int = 0):
    """``v`` as JSON; ``leaf(x)`` encodes each object that is no scalar or container."""
    if depth > MAX_DEPTH:
        raise CodecError(f"a value nested deeper than {MAX_DEPTH}")
    if v is None or isinstance(v, PLAIN):
        return v
    if isinstance(v, AttentionOutputs):
        return {"outputs": {k: encode(x, leaf, depth + 1) for k, x in v._asdict().items()}}
    if isinstance(v, MHAParams):
        return {"params": [encode(x, leaf, depth + 1) for x in v]}
    if isinstance(v, tuple):
        return {"t": [encode(x, leaf, depth + 1) for x in v]}
    if isinstance(v, list):
        return [encode(x, leaf, depth + 1) for x in v]
    if isinstance(v, dict):
        return {"d": {str(k): encode(x, leaf, depth + 1) for k, x in v.items()}}
    return leaf(v)


def decode(v, leaf: Callable, depth: int = 0):
    """The value ``v`` (JSON) stands for; ``leaf(obj)`` decodes each ``{"h"}`` / ``{"a"}``
    object. :class:`CodecError` for anything this codec does not write."""
    if depth > MAX_DEPTH:
        raise CodecError(f"a value nested deeper than {MAX_DEPTH}")
    if v is None or isinstance(v, PLAIN):
        return v
    if isinstance(v, list):
        return [decode(x, leaf, depth + 1) for x in v]
    if not isinstance(v, dict):
        raise CodecError(f"a value of type {type(v).__name__}")
    if "h" in v or "a" in v:
        return leaf(v)
    if len(v) != 1:
        raise CodecError(f"an object with keys {sorted(v)[:5]} (one tag expected)")
    (tag, x), = v.items()
    if tag == "t" and isinstance(x, list):
        return tuple(decode(y, leaf, depth + 1) for y in x)
    if tag == "params" and isinstance(x, list):
        return MHAParams(*(decode(y, leaf, depth + 1) for y in x))
    if tag == "d" and isinstance(x, dict):
        return {str(k): decode(y, leaf, depth + 1) for k, y in x.items()}
    if tag == "outputs" and isinstance(x, dict):
        return AttentionOutputs(**{k: decode(y, leaf, depth + 1) for k, y in x.items()
                                   if k in AttentionOutputs._fields})
    raise CodecError(f"an object tagged {str(tag)[:40]!r}")
