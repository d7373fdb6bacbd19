"""Input validation for every backend, in one place (chapter ERR of the spec).

Works on shapes and dtype names only, so it is framework-neutral: each backend describes its arrays
as :class:`Arg` and calls :func:`check_sdpa` / :func:`check_mha` before computing anything. The
spec 1.2 keyword arguments (soft-cap, window, ALiBi, segments, a cache, sinks, lse) are checked by
:mod:`.feature_checks`.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import NamedTuple

import numpy as np

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
CAUSAL_VALUES = (None, "top_left", "bottom_right")
#: The clauses whose every test checks that invalid input is rejected, by checks made here: a
#: backend that runs this validation before calling a library satisfies them whatever the library
#: does with invalid input (an adapter: its certificate says so, ``validated_clauses``). MERGE-6
#: and PAGE-4 (spec 1.4) are checked by ``serving.check_call``, ``check_paged`` and
#: ``check_write``, which every merge_states, paged_attention and write_pages built on this
#: package runs before computing.
REJECTION_CLAUSES = frozenset({*(f"ERR-{i}" for i in range(1, 11)), "GQA-2", "SOFTCAP-2", "WIN-2",
                               "ALIBI-3", "SEG-5", "CACHE-4", "SINK-4", "MERGE-6", "PAGE-4",
                               "CHUNK-2"})


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


def fail(op: str, msg: str) -> None:
    """Raise the ValueError of an invalid input of ``op`` (ERR-1)."""
    raise ValueError(f"{op}: {msg}")


def require_array(op: str, name: str, x) -> None:
    """ValueError naming ``name`` unless ``x`` is an array (has ``.shape`` and ``.dtype``):
    a list, a scalar or None in an array's place."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        fail(op, f"argument '{name}' must be an array with a shape and a dtype (the backend's "
                 f"own, made by its asarray), got {type(x).__name__}")


def check_rank(op: str, arg: Arg, rank: int, layout: str) -> None:
    if len(arg.shape) != rank:
        fail(op, f"argument '{arg.name}' must have rank {rank} {layout}, got shape {arg.shape}")


def _check_floats(op: str, args: list[Arg]) -> None:
    for a in args:
        if a.dtype not in FLOAT_DTYPES:
            fail(op, f"argument '{a.name}' must be floating point ({', '.join(FLOAT_DTYPES)}), "
                     f"got dtype {a.dtype} with shape {a.shape}")
    if len({a.dtype for a in args}) > 1:
        described = ", ".join(f"'{a.name}' {a.dtype} {a.shape}" for a in args)
        fail(op, f"arguments must share one floating dtype, got {described}")


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_masks(op: str, dims: Dims, dtype: str, *, mask: Arg | None = None,
                bias: Arg | None = None, legacy_mask: Arg | None = None,
                key_padding_mask: Arg | None = None, causal=None, len_past: int = 0) -> None:
    """Validate the masking arguments of a call of ``dims`` with inputs of ``dtype``: they address
    (B, h, L_q, L_K) with L_K = ``len_past`` + L_k (a KV cache's keys come first, CACHE-1)."""
    len_k = len_past + dims.len_k
    full = (dims.batch, dims.heads, dims.len_q, len_k)
    for arg, want_bool in ((mask, True), (bias, False), (legacy_mask, False)):
        if arg is None:
            continue
        if want_bool and arg.dtype != "bool":
            fail(op, f"argument '{arg.name}' must be boolean (True = may attend), got dtype "
                     f"{arg.dtype} with shape {arg.shape}; pass a float array as 'bias' instead")
        if not want_bool and arg.dtype not in FLOAT_DTYPES:
            fail(op, f"argument '{arg.name}' must be floating point, got dtype {arg.dtype} "
                     f"with shape {arg.shape}")
        if not _broadcasts(arg.shape, full):
            fail(op, f"argument '{arg.name}' with shape {arg.shape} does not broadcast to "
                     f"(B, h, L_q, L_k) = {full}")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != "bool":
            fail(op, f"argument 'key_padding_mask' must be boolean (True = key present), got "
                     f"dtype {key_padding_mask.dtype} with shape {key_padding_mask.shape}")
        if key_padding_mask.shape != (dims.batch, len_k):
            fail(op, f"argument 'key_padding_mask' must have shape (B, L_k) = "
                     f"{(dims.batch, len_k)}, got {key_padding_mask.shape}")
    if legacy_mask is not None and dtype == "float16":
        fail(op, f"argument 'legacy_mask' with shape {legacy_mask.shape} cannot be used with float16 "
                 "inputs: -1e9 overflows float16 to -inf and 0 * -inf is NaN (spec MASK-4); pass "
                 "mask=(legacy_mask == 0)")
    if causal not in CAUSAL_VALUES:
        fail(op, f"argument 'causal' must be None, 'top_left' or 'bottom_right', got {causal!r}")


def as_int(value) -> int | None:
    """``value`` as an int when it is an integer: a Python or NumPy integer, or a 0-d integer
    array (anything with ``__index__``); None otherwise (bool, float, arrays of other shapes)."""
    if isinstance(value, bool) or getattr(value, "dtype", None) == bool:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_real(value) -> float | None:
    """``value`` as a float when it is a real number: a Python or NumPy int or float, or a 0-d
    integer or floating NumPy array; None otherwise (bool, complex, other shapes, strings)."""
    if isinstance(value, bool) or getattr(value, "dtype", None) == bool:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind in ("i", "u", "f") and tuple(getattr(value, "shape", (None,))) == ():
        return float(value)
    return None


def check_num_heads(op: str, num_heads) -> int:
    """``num_heads`` as a positive int (a NumPy integer or 0-d integer array is accepted)."""
    h = as_int(num_heads)
    if h is None or h < 1:
        fail(op, f"argument 'num_heads' must be a positive integer, got {num_heads!r}")
    return h


def check_scale(op: str, scale) -> float | None:
    """``scale`` as a float: None (the default) or a positive finite real number (a NumPy scalar
    or 0-d array is accepted)."""
    if scale is None:
        return None
    value = as_real(scale)
    if value is None or not math.isfinite(value) or value <= 0:
        fail(op, f"argument 'scale' must be a positive finite number, got {scale!r}")
    return value


def check_sdpa(q: Arg, k: Arg, v: Arg, *, mask: Arg | None = None, bias: Arg | None = None,
               legacy_mask: Arg | None = None, key_padding_mask: Arg | None = None, causal=None,
               scale=None, gqa: bool = False, len_past: int = 0) -> Dims:
    """Validate scaled_dot_product_attention inputs; q (B, h, L_q, d_k), k (B, h, L_k, d_k),
    v (B, h, L_k, d_v) (k and v with g heads, g dividing h, when ``gqa``: GQA-2). Masks address
    L_past + L_k keys (``len_past``: the length of a validated KV cache, CACHE-1). Returns the
    call's :class:`Dims`."""
    op = "scaled_dot_product_attention"
    dims = sdpa_dims(q, k, v, gqa=gqa)
    check_masks(op, dims, q.dtype, mask=mask, bias=bias, legacy_mask=legacy_mask,
                key_padding_mask=key_padding_mask, causal=causal, len_past=len_past)
    check_scale(op, scale)
    return dims


def sdpa_dims(q: Arg, k: Arg, v: Arg, *, gqa: bool = False, grouping: bool = True) -> Dims:
    """The shapes and dtypes of scaled_dot_product_attention's q, k, v (ERR, GQA-2) as
    :class:`Dims` (``heads`` is q's head count h); masks and scale are not looked at.
    ``grouping`` False (with ``gqa``) leaves GQA-2's head counts unchecked, to a library."""
    op = "scaled_dot_product_attention"
    for a in (q, k, v):
        check_rank(op, a, 4, "(B, h, L, d)")
    _check_floats(op, [q, k, v])
    if not gqa and not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        fail(op, f"arguments 'q', 'k', 'v' must share batch and head axes (B, h), got shapes "
                 f"{q.shape}, {k.shape}, {v.shape}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        fail(op, f"arguments 'q', 'k', 'v' must share the batch axis B, got shapes "
                 f"{q.shape}, {k.shape}, {v.shape}")
    h, g = q.shape[1], k.shape[1]
    if (grouping or not gqa) and (g < 1 or h % g):
        fail(op, f"argument 'k' has {g} key/value heads, which must divide the {h} query heads "
                 f"(GQA-2), got shapes q {q.shape} and k {k.shape}")
    if (grouping or not gqa) and v.shape[1] != g:
        fail(op, f"argument 'v' has {v.shape[1]} heads, which must equal k's {g} (GQA-2), got "
                 f"shapes k {k.shape} and v {v.shape}")
    if k.shape[2] != v.shape[2]:
        fail(op, f"arguments 'k' and 'v' must have the same length L_k (axis 2), got shapes "
                 f"{k.shape} and {v.shape}")
    if q.shape[3] != k.shape[3]:
        fail(op, f"arguments 'q' and 'k' must have the same width d_k (axis 3), got shapes "
                 f"{q.shape} and {k.shape}")
    return Dims(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3])


def check_heads(op: str, x: Arg, num_heads=None) -> int | None:
    """Validate split_heads (x (B, L, h*d), num_heads) or combine_heads (x (B, h, L, d)); returns
    ``num_heads`` as an int (None for combine_heads)."""
    if num_heads is None:
        check_rank(op, x, 4, "(B, h, L, d)")
        return None
    check_rank(op, x, 3, "(B, L, h*d)")
    num_heads = check_num_heads(op, num_heads)
    if x.shape[2] % num_heads:
        fail(op, f"argument 'num_heads' = {num_heads} does not divide the last axis of "
                 f"'{x.name}' with shape {x.shape}")
    return num_heads


def check_mha(query: Arg, key: Arg, value: Arg, params: dict[str, Arg | None], *, num_heads,
              mask: Arg | None = None, bias: Arg | None = None, legacy_mask: Arg | None = None,
              key_padding_mask: Arg | None = None, causal=None, scale=None,
              num_kv_heads=None, len_past: int = 0) -> Dims:
    """Validate multi_head_attention inputs and parameters (PARAM-1, ERR-2..10, MHA-6).

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim); params maps
    w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o to their :class:`Arg` (biases may be None).
    ``num_kv_heads`` (grouped-query attention, MHA-6) is None or a positive divisor g of
    ``num_heads``; then W_k and W_v have g*d_k and g*d_v columns. Masks address L_past + L_k keys
    (``len_past``: the length of a validated KV cache, CACHE-1).
    """
    op = "multi_head_attention"
    dims = mha_dims(query, key, value, params, num_heads=num_heads, num_kv_heads=num_kv_heads)
    check_masks(op, dims, query.dtype, mask=mask, bias=bias, legacy_mask=legacy_mask,
                key_padding_mask=key_padding_mask, causal=causal, len_past=len_past)
    check_scale(op, scale)
    return dims


def mha_dims(query: Arg, key: Arg, value: Arg, params: dict[str, Arg | None], *, num_heads,
             num_kv_heads=None) -> Dims:
    """The shapes and dtypes of multi_head_attention's inputs and parameters as :class:`Dims`
    (``heads`` is h, d_k / d_v the per-head widths); masks and scale are not looked at."""
    op = "multi_head_attention"
    for a in (query, key, value):
        check_rank(op, a, 3, "(B, L, width)")
    weights = [params[n] for n in ("w_q", "w_k", "w_v", "w_o")]
    biases = [params[n] for n in ("b_q", "b_k", "b_v", "b_o") if params.get(n) is not None]
    for w in weights:
        check_rank(op, w, 2, "(in, out)")
    for b in biases:
        check_rank(op, b, 1, "(out,)")
    _check_floats(op, [query, key, value, *weights, *biases])
    if not (query.shape[0] == key.shape[0] == value.shape[0]):
        fail(op, f"arguments 'query', 'key', 'value' must share the batch axis B, got shapes "
                 f"{query.shape}, {key.shape}, {value.shape}")
    if key.shape[1] != value.shape[1]:
        fail(op, f"arguments 'key' and 'value' must have the same length L_k (axis 1), got shapes "
                 f"{key.shape} and {value.shape}")
    num_heads = check_num_heads(op, num_heads)
    g = num_heads if num_kv_heads is None else _check_kv_heads(op, num_kv_heads, num_heads)
    w_q, w_k, w_v, w_o = weights
    for x, w in ((query, w_q), (key, w_k), (value, w_v)):
        if w.shape[0] != x.shape[2]:
            fail(op, f"argument '{w.name}' with shape {w.shape} does not fit '{x.name}' with shape "
                     f"{x.shape}: its rows must equal the input width {x.shape[2]}")
    if num_kv_heads is None:
        d_k, d_v = _head_widths(op, w_q, w_k, w_v, w_o, num_heads)
    else:
        d_k, d_v = _grouped_head_widths(op, w_q, w_k, w_v, w_o, num_heads, g)
    for bname, w in (("b_q", w_q), ("b_k", w_k), ("b_v", w_v), ("b_o", w_o)):
        b = params.get(bname)
        if b is not None and b.shape != (w.shape[1],):
            fail(op, f"argument '{bname}' with shape {b.shape} must have shape ({w.shape[1]},) "
                     f"to match '{w.name}' with shape {w.shape}")
    return Dims(query.shape[0], num_heads, query.shape[1], key.shape[1], d_k, d_v)


def _check_kv_heads(op: str, num_kv_heads, num_heads: int) -> int:
    """``num_kv_heads`` g as an int: a positive divisor of ``num_heads`` (MHA-6)."""
    g = as_int(num_kv_heads)
    if g is None or g < 1 or num_heads % g:
        fail(op, f"argument 'num_kv_heads' must be a positive integer dividing num_heads = "
                 f"{num_heads}, got {num_kv_heads!r}")
    return g


def _head_widths(op: str, w_q: Arg, w_k: Arg, w_v: Arg, w_o: Arg, h: int) -> tuple[int, int]:
    """(d_k, d_v) of multi-head attention: W_q, W_k (., h*d_k), W_v (., h*d_v), W_o (h*d_v, .)."""
    if w_q.shape[1] != w_k.shape[1]:
        fail(op, f"arguments 'w_q' and 'w_k' must have the same column count h*d_k, got shapes "
                 f"{w_q.shape} and {w_k.shape}")
    for w in (w_q, w_v):
        _per_head_width(op, w, h, "num_heads")
    if w_o.shape[0] != w_v.shape[1]:
        fail(op, f"argument 'w_o' with shape {w_o.shape} must have h*d_v = {w_v.shape[1]} rows "
                 f"to match 'w_v' with shape {w_v.shape}")
    return w_q.shape[1] // h, w_v.shape[1] // h


def _per_head_width(op: str, w: Arg, heads: int, argument: str) -> int:
    """The per-head width of ``w``'s columns shared by ``heads`` heads (the value of
    ``argument``), which must divide them."""
    if w.shape[1] % heads:
        fail(op, f"argument '{argument}' = {heads} does not divide the column count of "
                 f"'{w.name}' with shape {w.shape}")
    return w.shape[1] // heads


def _grouped_head_widths(op: str, w_q: Arg, w_k: Arg, w_v: Arg, w_o: Arg, h: int,
                         g: int) -> tuple[int, int]:
    """(d_k, d_v) of grouped-query attention (MHA-6): W_q (., h*d_k), W_k (., g*d_k),
    W_v (., g*d_v), W_o (h*d_v, .)."""
    d_k = _per_head_width(op, w_q, h, "num_heads")
    if w_k.shape[1] != g * d_k:
        fail(op, f"argument 'w_k' with shape {w_k.shape} must have num_kv_heads*d_k = {g}*{d_k} "
                 f"columns with num_kv_heads = {g} and 'w_q' with shape {w_q.shape}")
    d_v = _per_head_width(op, w_v, g, "num_kv_heads")
    if w_o.shape[0] != h * d_v:
        fail(op, f"argument 'w_o' with shape {w_o.shape} must have h*d_v = {h}*{d_v} rows "
                 f"with num_kv_heads = {g} and 'w_v' with shape {w_v.shape}")
    return d_k, d_v


def check_cotangents(op: str, dims: Dims, d_output: Arg, d_lse: Arg | None, heads: int, *,
                     bias_grad, bias, backend) -> None:
    """GRAD-3, GRAD-8, GRAD-9 (spec 1.3): d_output (B, h, L_q, d_v) and d_lse (B, h, L_q) of the
    inputs' float dtypes; ``d_lse`` needs "lse", ``bias_grad=True`` needs "bias_grad" and a bias."""
    want = (dims.batch, heads, dims.len_q, dims.d_v)
    if d_output.shape != want or d_output.dtype not in FLOAT_DTYPES:
        fail(op, f"argument 'd_output' must be a float array of the output's shape (B, h, L_q, "
                 f"d_v) = {want}, got shape {d_output.shape} and dtype {d_output.dtype}")
    if d_lse is not None:
        if "lse" not in backend.capabilities:
            fail(op, f"argument 'd_lse': {backend.name} does not compute the log-sum-exp "
                     f"(capability 'lse' not claimed)")
        if d_lse.shape != want[:3] or d_lse.dtype not in FLOAT_DTYPES:
            fail(op, f"argument 'd_lse' must be a float array of shape (B, h, L_q) = {want[:3]}, "
                     f"got shape {d_lse.shape} and dtype {d_lse.dtype}")
    if not isinstance(bias_grad, (bool, np.bool_)):
        fail(op, f"argument 'bias_grad' must be True or False, got {bias_grad!r}")
    if bias_grad and "bias_grad" not in backend.capabilities:
        raise NotImplementedError(f"{backend.name}: attention_vjp with bias_grad=True "
                                  f"(capability 'bias_grad') is not supported")
    if bias_grad and bias is None:
        fail(op, "argument 'bias_grad': the gradient of a bias is asked for, but no bias is given")
