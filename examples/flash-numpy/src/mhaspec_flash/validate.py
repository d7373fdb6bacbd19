"""Input validation (chapter ERR of the spec): a ValueError that names the argument and shows its
shape. Written against the public API only, so this file can be copied with the backend."""

from __future__ import annotations

import math

import numpy as np

from mhaspec.backends import MHAParams

FLOATS = ("float64", "float32", "float16")
CAUSAL = (None, "top_left", "bottom_right")


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _check_arrays(op: str, arrays: dict, rank: dict) -> None:
    """Rank (ERR-3) and one shared floating dtype (ERR-8)."""
    for name, x in arrays.items():
        if x.ndim != rank[name]:
            _fail(op, f"argument '{name}' must have rank {rank[name]}, got shape {x.shape}")
        if x.dtype.name not in FLOATS:
            _fail(op, f"argument '{name}' must be floating point ({', '.join(FLOATS)}), "
                      f"got dtype {x.dtype} with shape {x.shape}")
    if len({x.dtype for x in arrays.values()}) > 1:
        _fail(op, "arguments must share one floating dtype, got "
                  + ", ".join(f"'{n}' {x.dtype} {x.shape}" for n, x in arrays.items()))


def _check_heads(op: str, num_heads, name: str, shape: tuple, axis: int) -> None:
    """num_heads is a positive integer dividing ``shape[axis]`` (ERR-2)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        _fail(op, f"argument 'num_heads' must be a positive integer, got {num_heads!r}")
    if shape[axis] % num_heads:
        _fail(op, f"argument 'num_heads' = {num_heads} does not divide axis {axis} of "
                  f"'{name}' with shape {shape}")


def _check_options(op: str, full: tuple, dtype, mask, bias, legacy_mask, key_padding_mask,
                   causal, scale) -> None:
    """Masks, bias, causal alignment (ERR-7, ERR-9) and scale (ERR-10); full = (B, h, L_q, L_k)."""
    for name, m, boolean in (("mask", mask, True), ("bias", bias, False),
                             ("legacy_mask", legacy_mask, False)):
        if m is None:
            continue
        if not ((m.dtype == bool) if boolean else (m.dtype.name in FLOATS)):
            kind = "boolean (True = may attend)" if boolean else "floating point"
            _fail(op, f"argument '{name}' must be {kind}, got dtype {m.dtype} with shape {m.shape}")
        if m.ndim > 4 or any(s not in (1, t) for s, t in zip(m.shape[::-1], full[::-1])):
            _fail(op, f"argument '{name}' with shape {m.shape} does not broadcast to "
                      f"(B, h, L_q, L_k) = {full}")
    kpm = key_padding_mask
    if kpm is not None and (kpm.dtype != bool or kpm.shape != (full[0], full[3])):
        _fail(op, f"argument 'key_padding_mask' must be boolean with shape (B, L_k) = "
                  f"{(full[0], full[3])}, got dtype {kpm.dtype} with shape {kpm.shape}")
    if legacy_mask is not None and dtype == np.float16:
        _fail(op, f"argument 'legacy_mask' with shape {legacy_mask.shape} cannot be used with "
                  "float16 inputs (MASK-4): pass mask=(legacy_mask == 0)")
    if causal not in CAUSAL:
        _fail(op, f"argument 'causal' must be None, 'top_left' or 'bottom_right', got {causal!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        _fail(op, f"argument 'scale' must be a positive finite number, got {scale!r}")


def check_split_heads(x, num_heads) -> None:
    """x (B, L, h*d) and h dividing h*d (HEAD-1, ERR-2)."""
    if x.ndim != 3:
        _fail("split_heads", f"argument 'x' must have rank 3 (B, L, h*d), got shape {x.shape}")
    _check_heads("split_heads", num_heads, "x", x.shape, 2)


def check_combine_heads(x) -> None:
    """x (B, h, L, d) (HEAD-2)."""
    if x.ndim != 4:
        _fail("combine_heads", f"argument 'x' must have rank 4 (B, h, L, d), got shape {x.shape}")


def check_sdpa(q, k, v, *, mask, bias, legacy_mask, key_padding_mask, causal, scale) -> None:
    """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v)."""
    op = "scaled_dot_product_attention"
    _check_arrays(op, {"q": q, "k": k, "v": v}, {"q": 4, "k": 4, "v": 4})
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        _fail(op, f"arguments 'q', 'k', 'v' must share the axes (B, h), got shapes "
                  f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape[2] != v.shape[2]:
        _fail(op, f"arguments 'k' and 'v' must have the same length L_k, got shapes "
                  f"{k.shape} and {v.shape}")
    if q.shape[3] != k.shape[3]:
        _fail(op, f"arguments 'q' and 'k' must have the same width d_k, got shapes "
                  f"{q.shape} and {k.shape}")
    full = (*q.shape[:3], k.shape[2])
    _check_options(op, full, q.dtype, mask, bias, legacy_mask, key_padding_mask, causal, scale)


def check_mha(query, key, value, p: MHAParams, *, num_heads, mask, bias, legacy_mask,
              key_padding_mask, causal, scale) -> None:
    """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim); p as y = x W + b."""
    op = "multi_head_attention"
    arrays = {"query": query, "key": key, "value": value,
              **{n: a for n, a in p._asdict().items() if a is not None}}
    _check_arrays(op, arrays, {"query": 3, "key": 3, "value": 3, "w_q": 2, "w_k": 2, "w_v": 2,
                               "w_o": 2, "b_q": 1, "b_k": 1, "b_v": 1, "b_o": 1})
    if not (query.shape[0] == key.shape[0] == value.shape[0]):
        _fail(op, f"arguments 'query', 'key', 'value' must share the batch axis B, got shapes "
                  f"{query.shape}, {key.shape}, {value.shape}")
    if key.shape[1] != value.shape[1]:
        _fail(op, f"arguments 'key' and 'value' must have the same length L_k, got shapes "
                  f"{key.shape} and {value.shape}")
    for w, rows, fits in (("w_q", query.shape[2], "query"), ("w_k", key.shape[2], "key"),
                          ("w_v", value.shape[2], "value"), ("w_o", p.w_v.shape[1], "w_v")):
        if arrays[w].shape[0] != rows:
            _fail(op, f"argument '{w}' with shape {arrays[w].shape} must have {rows} rows to "
                      f"fit '{fits}' with shape {arrays[fits].shape}")
    if p.w_k.shape[1] != p.w_q.shape[1]:
        _fail(op, f"arguments 'w_q' and 'w_k' must have the same column count h*d_k, got "
                  f"shapes {p.w_q.shape} and {p.w_k.shape}")
    _check_heads(op, num_heads, "w_q", p.w_q.shape, 1)
    _check_heads(op, num_heads, "w_v", p.w_v.shape, 1)
    for bn, b, w in (("b_q", p.b_q, p.w_q), ("b_k", p.b_k, p.w_k), ("b_v", p.b_v, p.w_v),
                     ("b_o", p.b_o, p.w_o)):
        if b is not None and b.shape != (w.shape[1],):
            _fail(op, f"argument '{bn}' with shape {b.shape} must have shape ({w.shape[1]},)")
    full = (query.shape[0], num_heads, query.shape[1], key.shape[1])
    _check_options(op, full, query.dtype, mask, bias, legacy_mask, key_padding_mask, causal,
                   scale)
