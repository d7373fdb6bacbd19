"""Input validation for every backend, in one place (chapter ERR of the spec).

Works on shapes and dtype names only, so it is framework-neutral: each backend describes its arrays
as :class:`Arg` and calls :func:`check_sdpa` / :func:`check_mha` before computing anything.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.
"""

from __future__ import annotations

import math
from typing import NamedTuple

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
CAUSAL_VALUES = (None, "top_left", "bottom_right")


class Arg(NamedTuple):
    """An argument as validation sees it: its name, shape and dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


class Dims(NamedTuple):
    """The sizes of one call, after validation."""

    batch: int
    heads: int
    len_q: int
    len_k: int
    d_k: int
    d_v: int


def _fail(op: str, msg: str) -> None:
    raise ValueError(f"{op}: {msg}")


def _check_rank(op: str, arg: Arg, rank: int, layout: str) -> None:
    if len(arg.shape) != rank:
        _fail(op, f"argument '{arg.name}' must have rank {rank} {layout}, got shape {arg.shape}")


def _check_floats(op: str, args: list[Arg]) -> None:
    for a in args:
        if a.dtype not in FLOAT_DTYPES:
            _fail(op, f"argument '{a.name}' must be floating point ({', '.join(FLOAT_DTYPES)}), "
                      f"got dtype {a.dtype} with shape {a.shape}")
    if len({a.dtype for a in args}) > 1:
        described = ", ".join(f"'{a.name}' {a.dtype} {a.shape}" for a in args)
        _fail(op, f"arguments must share one floating dtype, got {described}")


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _check_masks(op: str, dims: Dims, dtype: str, mask: Arg | None, bias: Arg | None,
                 legacy_mask: Arg | None, key_padding_mask: Arg | None, causal) -> None:
    full = (dims.batch, dims.heads, dims.len_q, dims.len_k)
    for arg, want_bool in ((mask, True), (bias, False), (legacy_mask, False)):
        if arg is None:
            continue
        if want_bool and arg.dtype != "bool":
            _fail(op, f"argument '{arg.name}' must be boolean (True = may attend), got dtype "
                      f"{arg.dtype} with shape {arg.shape}; pass a float array as 'bias' instead")
        if not want_bool and arg.dtype not in FLOAT_DTYPES:
            _fail(op, f"argument '{arg.name}' must be floating point, got dtype {arg.dtype} "
                      f"with shape {arg.shape}")
        if not _broadcasts(arg.shape, full):
            _fail(op, f"argument '{arg.name}' with shape {arg.shape} does not broadcast to "
                      f"(B, h, L_q, L_k) = {full}")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != "bool":
            _fail(op, f"argument 'key_padding_mask' must be boolean (True = key present), got "
                      f"dtype {key_padding_mask.dtype} with shape {key_padding_mask.shape}")
        if key_padding_mask.shape != (dims.batch, dims.len_k):
            _fail(op, f"argument 'key_padding_mask' must have shape (B, L_k) = "
                      f"{(dims.batch, dims.len_k)}, got {key_padding_mask.shape}")
    if legacy_mask is not None and dtype == "float16":
        _fail(op, f"argument 'legacy_mask' with shape {legacy_mask.shape} cannot be used with float16 "
                  "inputs: -1e9 overflows float16 to -inf and 0 * -inf is NaN (spec MASK-4); pass "
                  "mask=(legacy_mask == 0)")
    if causal not in CAUSAL_VALUES:
        _fail(op, f"argument 'causal' must be None, 'top_left' or 'bottom_right', got {causal!r}")


def _check_scale(op: str, scale) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or scale <= 0:
        _fail(op, f"argument 'scale' must be a positive finite number, got {scale!r}")


def check_sdpa(q: Arg, k: Arg, v: Arg, *, mask: Arg | None = None, bias: Arg | None = None,
               legacy_mask: Arg | None = None, key_padding_mask: Arg | None = None, causal=None,
               scale=None) -> Dims:
    """Validate scaled_dot_product_attention inputs; q (B, h, L_q, d_k), k (B, h, L_k, d_k),
    v (B, h, L_k, d_v). Returns the call's :class:`Dims`."""
    op = "scaled_dot_product_attention"
    for a in (q, k, v):
        _check_rank(op, a, 4, "(B, h, L, d)")
    _check_floats(op, [q, k, v])
    if not (q.shape[0] == k.shape[0] == v.shape[0]) or not (q.shape[1] == k.shape[1] == v.shape[1]):
        _fail(op, f"arguments 'q', 'k', 'v' must share batch and head axes (B, h), got shapes "
                  f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape[2] != v.shape[2]:
        _fail(op, f"arguments 'k' and 'v' must have the same length L_k (axis 2), got shapes "
                  f"{k.shape} and {v.shape}")
    if q.shape[3] != k.shape[3]:
        _fail(op, f"arguments 'q' and 'k' must have the same width d_k (axis 3), got shapes "
                  f"{q.shape} and {k.shape}")
    dims = Dims(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3])
    _check_masks(op, dims, q.dtype, mask, bias, legacy_mask, key_padding_mask, causal)
    _check_scale(op, scale)
    return dims


def check_heads(op: str, x: Arg, num_heads=None) -> None:
    """Validate split_heads (x (B, L, h*d), num_heads) or combine_heads (x (B, h, L, d))."""
    if num_heads is None:
        _check_rank(op, x, 4, "(B, h, L, d)")
        return
    _check_rank(op, x, 3, "(B, L, h*d)")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        _fail(op, f"argument 'num_heads' must be a positive integer, got {num_heads!r}")
    if x.shape[2] % num_heads:
        _fail(op, f"argument 'num_heads' = {num_heads} does not divide the last axis of "
                  f"'{x.name}' with shape {x.shape}")


def check_mha(query: Arg, key: Arg, value: Arg, params: dict[str, Arg | None], *, num_heads,
              mask: Arg | None = None, bias: Arg | None = None, legacy_mask: Arg | None = None,
              key_padding_mask: Arg | None = None, causal=None, scale=None,
              num_kv_heads=None) -> Dims:
    """Validate multi_head_attention inputs and parameters (PARAM-1, ERR-2..10, MHA-6).

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim); params maps
    w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o to their :class:`Arg` (biases may be None).
    ``num_kv_heads`` (grouped-query attention, MHA-6) is None or a positive divisor g of
    ``num_heads``; then W_k and W_v have g*d_k and g*d_v columns.
    """
    op = "multi_head_attention"
    for a in (query, key, value):
        _check_rank(op, a, 3, "(B, L, width)")
    weights = [params[n] for n in ("w_q", "w_k", "w_v", "w_o")]
    biases = [params[n] for n in ("b_q", "b_k", "b_v", "b_o") if params.get(n) is not None]
    for w in weights:
        _check_rank(op, w, 2, "(in, out)")
    for b in biases:
        _check_rank(op, b, 1, "(out,)")
    _check_floats(op, [query, key, value, *weights, *biases])
    if not (query.shape[0] == key.shape[0] == value.shape[0]):
        _fail(op, f"arguments 'query', 'key', 'value' must share the batch axis B, got shapes "
                  f"{query.shape}, {key.shape}, {value.shape}")
    if key.shape[1] != value.shape[1]:
        _fail(op, f"arguments 'key' and 'value' must have the same length L_k (axis 1), got shapes "
                  f"{key.shape} and {value.shape}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        _fail(op, f"argument 'num_heads' must be a positive integer, got {num_heads!r}")
    w_q, w_k, w_v, w_o = weights
    if num_kv_heads is not None:
        return _check_gqa(op, query, key, value, params, num_heads, num_kv_heads, mask=mask,
                          bias=bias, legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
                          causal=causal, scale=scale)
    for x, w in ((query, w_q), (key, w_k), (value, w_v)):
        if w.shape[0] != x.shape[2]:
            _fail(op, f"argument '{w.name}' with shape {w.shape} does not fit '{x.name}' with shape "
                      f"{x.shape}: its rows must equal the input width {x.shape[2]}")
    if w_q.shape[1] != w_k.shape[1]:
        _fail(op, f"arguments 'w_q' and 'w_k' must have the same column count h*d_k, got shapes "
                  f"{w_q.shape} and {w_k.shape}")
    for w in (w_q, w_v):
        if w.shape[1] % num_heads:
            _fail(op, f"argument 'num_heads' = {num_heads} does not divide the column count of "
                      f"'{w.name}' with shape {w.shape}")
    if w_o.shape[0] != w_v.shape[1]:
        _fail(op, f"argument 'w_o' with shape {w_o.shape} must have h*d_v = {w_v.shape[1]} rows "
                  f"to match 'w_v' with shape {w_v.shape}")
    for bname, w in (("b_q", w_q), ("b_k", w_k), ("b_v", w_v), ("b_o", w_o)):
        b = params.get(bname)
        if b is not None and b.shape != (w.shape[1],):
            _fail(op, f"argument '{bname}' with shape {b.shape} must have shape ({w.shape[1]},) "
                      f"to match '{w.name}' with shape {w.shape}")
    dims = Dims(query.shape[0], num_heads, query.shape[1], key.shape[1],
                w_q.shape[1] // num_heads, w_v.shape[1] // num_heads)
    _check_masks(op, dims, query.dtype, mask, bias, legacy_mask, key_padding_mask, causal)
    _check_scale(op, scale)
    return dims


def _check_gqa(op: str, query: Arg, key: Arg, value: Arg, params: dict[str, Arg | None],
               num_heads: int, num_kv_heads, **masks) -> Dims:
    """The parameter checks of check_mha with g = ``num_kv_heads`` key/value heads (MHA-6)."""
    g = num_kv_heads
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or num_heads % g:
        _fail(op, f"argument 'num_kv_heads' must be a positive integer dividing num_heads = "
                  f"{num_heads}, got {g!r}")
    w_q, w_k, w_v, w_o = (params[n] for n in ("w_q", "w_k", "w_v", "w_o"))
    for x, w in ((query, w_q), (key, w_k), (value, w_v)):
        if w.shape[0] != x.shape[2]:
            _fail(op, f"argument '{w.name}' with shape {w.shape} does not fit '{x.name}' with shape "
                      f"{x.shape}: its rows must equal the input width {x.shape[2]}")
    if w_q.shape[1] % num_heads:
        _fail(op, f"argument 'num_heads' = {num_heads} does not divide the column count of 'w_q' "
                  f"with shape {w_q.shape}")
    d_k = w_q.shape[1] // num_heads
    if w_k.shape[1] != g * d_k:
        _fail(op, f"argument 'w_k' with shape {w_k.shape} must have num_kv_heads*d_k = {g}*{d_k} "
                  f"columns with num_kv_heads = {g} and 'w_q' with shape {w_q.shape}")
    if w_v.shape[1] % g:
        _fail(op, f"argument 'num_kv_heads' = {g} does not divide the column count of 'w_v' "
                  f"with shape {w_v.shape}")
    d_v = w_v.shape[1] // g
    if w_o.shape[0] != num_heads * d_v:
        _fail(op, f"argument 'w_o' with shape {w_o.shape} must have h*d_v = {num_heads}*{d_v} rows "
                  f"with num_kv_heads = {g} and 'w_v' with shape {w_v.shape}")
    for bname, w in (("b_q", w_q), ("b_k", w_k), ("b_v", w_v), ("b_o", w_o)):
        b = params.get(bname)
        if b is not None and b.shape != (w.shape[1],):
            _fail(op, f"argument '{bname}' with shape {b.shape} must have shape ({w.shape[1]},) "
                      f"to match '{w.name}' with shape {w.shape}")
    dims = Dims(query.shape[0], num_heads, query.shape[1], key.shape[1], d_k, d_v)
    _check_masks(op, dims, query.dtype, masks["mask"], masks["bias"], masks["legacy_mask"],
                 masks["key_padding_mask"], masks["causal"])
    _check_scale(op, masks["scale"])
    return dims
