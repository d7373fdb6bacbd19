"""Input validation of chapter ERR, public for third-party backends.

Describe each array as :class:`Arg` (its name, shape and dtype name: nothing framework-specific)
and call :func:`check_sdpa`, :func:`check_mha` or :func:`check_heads` before computing anything
(:func:`mha_params` first for the ``params`` of multi-head attention).
Every invalid input the spec lists raises ``ValueError`` naming the argument and showing the shapes
(ERR-1), exactly as the in-repo backends do. :func:`arg` builds an :class:`Arg` from any array with
``.shape`` and ``.dtype``.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.
"""

from __future__ import annotations

from .arg_checks import (CAUSAL_VALUES, FLOAT_DTYPES, REJECTION_CLAUSES, Arg, Dims,
                         check_heads, check_mha, check_sdpa, require_array)
from .feature_checks import Features
from .calls import MHAParams, checked_params

__all__ = ["Arg", "Dims", "CAUSAL_VALUES", "FLOAT_DTYPES", "Features", "REJECTION_CLAUSES", "arg",
           "check_heads", "check_mha", "check_sdpa", "mha_params"]


def arg(name: str, x, *, op: str = "validation") -> Arg | None:
    """``x`` (any array with ``.shape`` and ``.dtype``) as an :class:`Arg`; None stays None.
    Anything else (a list, a scalar) raises ValueError naming ``name``, prefixed by ``op``."""
    if x is None:
        return None
    require_array(op, name, x)
    dtype = getattr(x.dtype, "name", None) or str(x.dtype).removeprefix("torch.")
    return Arg(name, tuple(int(n) for n in x.shape), dtype)


def mha_params(params, *, op: str = "multi_head_attention") -> MHAParams:
    """``params`` as :class:`~mhaspec.backends.MHAParams` (a sequence of the four weights and up
    to four biases); anything else (None, a string, a number, too few or too many entries) raises
    ValueError naming ``params``, prefixed by ``op``."""
    return checked_params(op, params)
