"""A call of an array backend or adapter, validated: its arguments checked (chapter ERR, through
:mod:`.arg_checks`) and gathered into the values the computation takes.

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads, d_k / d_v per-head widths.

:func:`sdpa_call` and :func:`mha_call` validate the two operations (and their backward passes)
for a ``backend``: its ``ops`` describe each array (shape, dtype name), its ``capabilities``
decide what is allowed, and ``library_validates`` (an adapter's, :data:`LEFT_TO_LIBRARY`) names
the clauses whose argument reaches the library unchecked. The masking arguments of a call become
one :class:`MaskArgs`, a multi-head call one :class:`MHACall`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import arg_checks, feature_checks
from ._base import MHAParams
from .arg_checks import Arg
from .feature_checks import Features, KVGeometry

#: clause -> (the argument an adapter may pass to its library unchecked, the capability that
#: needs; ``library_validates``): the clauses whose checks are that one argument's own
LEFT_TO_LIBRARY = {"SOFTCAP-2": ("softcap", "softcap"), "ERR-10": ("scale", "errors"),
                   "GQA-2": ("k", "gqa")}


class MaskArgs(NamedTuple):
    """The arguments of one call that shape its logits, validated, in one value (internal form).

    mask: boolean, broadcastable to (B, h, L_q, L_k), True = may attend, or None;
    bias, legacy_mask: float, broadcastable to (B, h, L_q, L_k), or None;
    key_padding_mask: boolean (B, L_k) or None; causal: None, "top_left" or "bottom_right";
    scale: the logit scale as a float (the default 1/sqrt(d_k) already applied), or a scalar
    tensor inside a compiled function; softcap: the soft-cap c (SOFTCAP-1) as a float or scalar
    tensor, or None; alibi: the ALiBi bias (B, h, L_q, L_k) in the inputs' dtype, or None
    (ALIBI-1; a compiled variant adds it to ``bias``). With a KV cache L_k is L_K = L_past + L_k.
    """

    mask: Any = None
    bias: Any = None
    legacy_mask: Any = None
    key_padding_mask: Any = None
    causal: str | None = None
    scale: Any = None
    softcap: Any = None
    alibi: Any = None


class MHACall(NamedTuple):
    """A validated multi-head call: the parameters as :class:`MHAParams`, ``num_heads`` as an int,
    the masking arguments, g for grouped-query attention (MHA-6) or None, and the spec 1.2
    features (empty for a 1.1 call)."""

    params: MHAParams
    num_heads: int
    masks: MaskArgs
    num_kv_heads: int | None
    features: Features


def left_to_library(backend) -> set[str]:
    """The arguments the backend's ``library_validates`` passes to its op unchecked."""
    return {LEFT_TO_LIBRARY[c][0] for c in getattr(backend, "library_validates", ())}


def arg(backend, op: str, name: str, x) -> Arg | None:
    """``x`` as validation sees it; None stays None. Not an array: ValueError naming it."""
    if x is None:
        return None
    arg_checks.require_array(op, name, x)
    return Arg(name, backend.ops.shape(x), backend.ops.dtype_name(x))


def sdpa_call(backend, op, q, k, v, mask, bias, legacy_mask, key_padding_mask, causal, scale,
              features) -> tuple[MaskArgs, Features, arg_checks.Dims]:
    """Validate an attention call (``scaled_dot_product_attention`` and ``attention_vjp``); q
    (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v)."""
    qa, ka, va = arg(backend, op, "q", q), arg(backend, op, "k", k), arg(backend, op, "v", v)
    dims = arg_checks.sdpa_dims(qa, ka, va, gqa="gqa" in backend.capabilities,
                                grouping="k" not in left_to_library(backend))
    kv = KVGeometry(dims.batch, ka.shape[1], dims.d_k, dims.d_v, f"k with shape {ka.shape}",
                    f"v with shape {va.shape}")
    feats = _features(backend, op, dims, features, qa.dtype, kv, causal)
    arg_checks.check_masks(op, dims, qa.dtype, causal=causal, len_past=feats.len_past,
                           **_mask_args(backend, op, mask, bias, legacy_mask, key_padding_mask))
    masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                     _scale(backend, op, scale, dims.d_k))
    return masks, feats, dims


def mha_call(backend, query, key, value, params, num_heads, mask, bias, legacy_mask,
             key_padding_mask, causal, scale, num_kv_heads, features=None) -> MHACall:
    """Validate a multi-head call (``multi_head_attention`` and ``mha_vjp``): query (B, L_q,
    d_model), key (B, L_k, k_dim), value (B, L_k, v_dim)."""
    op = "multi_head_attention"
    params = checked_params(op, params)
    if num_kv_heads is not None and "gqa" not in backend.capabilities:
        raise NotImplementedError(f"{backend.name}: grouped-query attention (num_kv_heads) is not "
                                  f"supported")
    query_arg = arg(backend, op, "query", query)
    dims = arg_checks.mha_dims(
        query_arg, arg(backend, op, "key", key), arg(backend, op, "value", value),
        {n: arg(backend, op, n, p) for n, p in params._asdict().items()}, num_heads=num_heads,
        num_kv_heads=num_kv_heads)
    g = dims.heads if num_kv_heads is None else arg_checks.as_int(num_kv_heads)
    projected = (dims.batch, g, dims.len_k)
    kv = KVGeometry(dims.batch, g, dims.d_k, dims.d_v,
                    f"the projected keys (B, g, L_k, d_k) = {(*projected, dims.d_k)}",
                    f"the projected values (B, g, L_k, d_v) = {(*projected, dims.d_v)}")
    feats = _features(backend, op, dims, features or {}, query_arg.dtype, kv, causal)
    arg_checks.check_masks(op, dims, query_arg.dtype, causal=causal, len_past=feats.len_past,
                           **_mask_args(backend, op, mask, bias, legacy_mask, key_padding_mask))
    masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                     _scale(backend, op, scale, dims.d_k))
    return MHACall(params, dims.heads, masks, None if num_kv_heads is None else g, feats)


def _mask_args(backend, op: str, mask, bias, legacy_mask, key_padding_mask) -> dict:
    """The mask arrays of a call as validation's keyword arguments."""
    return {n: arg(backend, op, n, x) for n, x in (("mask", mask), ("bias", bias),
                                                   ("legacy_mask", legacy_mask),
                                                   ("key_padding_mask", key_padding_mask))}


def _scale(backend, op: str, scale, d_k: int):
    """The call's logit scale: ``scale`` as given when ERR-10 is left to the library, else
    validated (ERR-10) as a float, or the default 1/sqrt(d_k) (SDPA-2)."""
    if scale is not None and "scale" in left_to_library(backend):
        return scale
    arg_checks.check_scale(op, scale)
    return 1.0 / float(np.sqrt(d_k)) if scale is None else arg_checks.as_real(scale)


def _features(backend, op: str, dims, features: dict, dtype: str, kv: KVGeometry,
              causal) -> Features:
    """The spec 1.2 keyword arguments of a call, validated (``feature_checks.check_features``), but
    those ``library_validates`` leaves to the library: they pass as given."""
    left = {a: features[a] for a in left_to_library(backend) if features.get(a) is not None}
    checked = {n: x for n, x in features.items() if n not in left}
    return feature_checks.check_features(
        op, dims, checked, dtype=dtype, kv=kv, causal=causal, backend=backend,
        describe=lambda name, x: arg(backend, op, name, x))._replace(**left)


def checked_params(op: str, params) -> MHAParams:
    """``params`` as :class:`MHAParams`: a sequence of the four weights and up to four biases."""
    if isinstance(params, (str, bytes)) or not isinstance(params, (tuple, list)) \
            or not 4 <= len(params) <= len(MHAParams._fields):
        arg_checks.fail(op, f"argument 'params' must be MHAParams(w_q, w_k, w_v, w_o[, b_q, b_k, "
                            f"b_v, b_o]), got {type(params).__name__}")
    return MHAParams(*params)
