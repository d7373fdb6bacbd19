"""Spec 1.4's serving step for array backends: merging partial attention states (MERGE).

Axis legend: B batch, h heads, L_q queries, d_v value width, n states merged, T = B * L_q query
tokens (the ``"tokens"`` lse layout).

:func:`merge_states` validates a call (MERGE-6) and merges over the array primitives of
:class:`~.primitives.ArrayPrimitives` (``ops``: any object with them, e.g. an
:class:`~._generic.ArrayBackend`), so every framework shares it: the states' lses are stacked on a
last axis and reduced with their maximum subtracted, a row whose every lse is -inf keeps weight 0
(no ``-inf - -inf``), and a sink is one more term with no value (MERGE-4). float16 and bfloat16
states are merged in float32 and the result rounded once, as the peers' kernels do.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from . import _validate
from ._base import ALL_DTYPES as FLOAT_DTYPES

OP = "merge_states"

#: MERGE-3: convention -> the values the spec defines (an array backend accepts every one)
MERGE_CONVENTIONS: Mapping[str, tuple[str, ...]] = {
    "lse_base": ("e", "2"),
    "empty_lse": ("-inf", "+inf"),
    "lse_layout": ("batch", "tokens"),
}


def merge_states(ops, outputs, lses, *, sinks=None, lse_base: str = "e", empty_lse: str = "-inf",
                 lse_layout: str = "batch"):
    """outputs: n arrays (B, h, L_q, d_v); lses: n arrays (B, h, L_q), or (h, T) with
    ``lse_layout="tokens"``; sinks (h,) or None -> (output (B, h, L_q, d_v), lse in the call's
    conventions) (MERGE-1..4). Invalid input: ValueError naming the argument (MERGE-6)."""
    conventions = {"lse_base": lse_base, "empty_lse": empty_lse, "lse_layout": lse_layout}
    outputs, lses = check_call(ops, outputs, lses, sinks, conventions)
    like = outputs[0]
    b, h, l_q, d_v = ops._shape(like)
    narrow = ops._dtype_name(like) in ("float16", "bfloat16")
    wide = (lambda x: ops._to_float32(x)) if narrow else (lambda x: x)
    outs = [wide(o) for o in outputs]
    nat = [_to_natural(ops, wide(x), b, l_q, conventions) for x in lses]
    if sinks is not None:  # MERGE-4: the sink's term, once, after the states
        zeros = ops._full((b, h, l_q), 0.0, outs[0])
        nat.append(zeros + ops._reshape(wide(ops._cast_like(sinks, like)), (1, h, 1)))
        outs.append(ops._full((b, h, l_q, d_v), 0.0, outs[0]))
    out, lse = _merge(ops, outs, nat, (b, h, l_q, d_v))
    lse = _from_natural(ops, lse, b, h, l_q, conventions)
    if narrow:
        out, lse = ops._cast_like(out, like), ops._cast_like(lse, like)
    return out, lse


def _merge(ops, outs: list, nat: list, shape: tuple[int, int, int, int]):
    """The union of states with natural lses (B, h, L_q), -inf on empty rows: (out, lse)."""
    b, h, l_q, d_v = shape
    n = len(nat)
    stacked = ops._stack(nat, -1)  # (B, h, L_q, n)
    top = ops._max_last(stacked)  # (B, h, L_q, 1); -inf on a row empty in every state
    seen = ops._isfinite(top)
    top = ops._where(seen, top, 0.0)
    weights = ops._exp(stacked - top)  # exp(-inf) = 0 for an empty state's row
    total = ops._sum_last(weights)  # >= 1 on a row some state sees, 0 otherwise
    safe = ops._where(seen, total, 1.0)
    coeff = weights / safe  # (B, h, L_q, n)
    out = ops._matmul(ops._stack(outs, -1), ops._reshape(coeff, (b, h, l_q, n, 1)))
    lse = ops._where(seen, top + ops._log(safe), -math.inf)
    return ops._reshape(out, (b, h, l_q, d_v)), ops._reshape(lse, (b, h, l_q))


def _to_natural(ops, lse, b: int, l_q: int, conventions: Mapping[str, str]):
    """A call's lse (MERGE-3) as LSE-1's: (B, h, L_q), natural, -inf on an empty row."""
    if conventions["lse_layout"] == "tokens":
        h = ops._shape(lse)[0]
        lse = ops._transpose(ops._reshape(lse, (h, b, l_q)), (1, 0, 2))
    if conventions["empty_lse"] == "+inf":
        lse = ops._where(lse != math.inf, lse, -math.inf)
    if conventions["lse_base"] == "2":
        lse = lse * math.log(2.0)
    return lse


def _from_natural(ops, lse, b: int, h: int, l_q: int, conventions: Mapping[str, str]):
    """LSE-1's lse (B, h, L_q) in the call's conventions (inverse of :func:`_to_natural`)."""
    if conventions["lse_base"] == "2":
        lse = lse / math.log(2.0)
    if conventions["empty_lse"] == "+inf":
        lse = ops._where(lse != -math.inf, lse, math.inf)
    if conventions["lse_layout"] == "tokens":
        lse = ops._reshape(ops._transpose(lse, (1, 0, 2)), (h, b * l_q))
    return lse


def check_call(ops, outputs, lses, sinks, conventions: Mapping[str, str]) -> tuple[list, list]:
    """MERGE-6: the call's arrays as lists, or ValueError naming the argument."""
    for name, value in conventions.items():
        if value not in MERGE_CONVENTIONS[name]:
            _validate.fail(OP, f"argument '{name}' must be one of {MERGE_CONVENTIONS[name]}, "
                               f"got {value!r}")
    outputs, lses = _sequence("outputs", outputs), _sequence("lses", lses)
    if len(lses) != len(outputs):
        _validate.fail(OP, f"argument 'lses' must hold one lse per output ({len(outputs)}), "
                           f"got {len(lses)}")
    shape, dtype = _described(ops, "outputs", outputs[0])
    if len(shape) != 4:
        _validate.fail(OP, f"argument 'outputs' must hold rank-4 (B, h, L_q, d_v) arrays, got "
                           f"shape {shape}")
    b, h, l_q, _ = shape
    want = (h, b * l_q) if conventions["lse_layout"] == "tokens" else (b, h, l_q)
    for name, arrays, expected in (("outputs", outputs, shape), ("lses", lses, want)):
        for m, x in enumerate(arrays):
            got, kind = _described(ops, name, x)
            if got != expected:
                _validate.fail(OP, f"argument '{name}' [{m}] must have shape {expected} "
                                   f"(lse_layout={conventions['lse_layout']!r} for outputs "
                                   f"{shape}), got {got}")
            if kind != dtype:
                _validate.fail(OP, f"argument '{name}' [{m}] must have the dtype of outputs[0] "
                                   f"({dtype}), got {kind}")
    if dtype not in FLOAT_DTYPES:
        _validate.fail(OP, f"argument 'outputs' must be floating point, got {dtype}")
    if sinks is not None:
        got, kind = _described(ops, "sinks", sinks)
        if got != (h,):
            _validate.fail(OP, f"argument 'sinks' must have shape (h,) = ({h},), got {got}")
    return outputs, lses


def _sequence(name: str, value) -> list:
    """``value`` as a non-empty list of arrays, or ValueError naming ``name``."""
    if hasattr(value, "shape") or not isinstance(value, (list, tuple)) or not value:
        _validate.fail(OP, f"argument '{name}' must be a non-empty list or tuple of arrays, got "
                           f"{type(value).__name__}")
    return list(value)


def _described(ops, name: str, x) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of an array argument, or ValueError naming it."""
    _validate.require_array(OP, name, x)
    return tuple(ops._shape(x)), ops._dtype_name(x)


def conventions_of(backend) -> dict[str, tuple[str, ...]]:
    """A backend's declared ``merge_conventions`` (MERGE-3), LSE-1's alone when it declares none."""
    declared: Any = getattr(backend, "merge_conventions", None)
    if declared is None:
        return {name: values[:1] for name, values in MERGE_CONVENTIONS.items()}
    return {name: tuple(declared.get(name, values[:1])) for name, values in MERGE_CONVENTIONS.items()}


__all__ = ["MERGE_CONVENTIONS", "check_call", "conventions_of", "merge_states"]
