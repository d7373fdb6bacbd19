"""The float64 oracle: multi-head attention written straight from the equations of the spec.

Axis legend (used in every docstring of the project):
    B batch, L_q query length, L_k key/value length, h heads,
    d_model query width, k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

This module shares no code with any backend on purpose: a reference that copies an implementation
hides the bugs it shares. It loops over batch items and heads and evaluates one head exactly as
``softmax(s Q K^T + beta) V``. It does not validate its input; the conformance suite only feeds it
valid cases.

``precision`` runs the same steps in a lower precision. The tolerance rule (NUM-3) uses that to
measure the error of the naive algorithm in a candidate's dtype: ``"float32"`` (BLAS products) and
``"float32-sequential"`` (left-to-right dot products) run in float32; ``"float16"`` /
``"bfloat16"`` run in float32 and round every intermediate to the narrow type.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

LEGACY_MASK_VALUE = -1e9  # MASK-3: the source document's constant

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


class Params(NamedTuple):
    """Projection parameters in the math layout ``y = x @ W + b`` (PARAM-1).

    w_q (d_model, h*d_k), w_k (k_dim, h*d_k), w_v (v_dim, h*d_v), w_o (h*d_v, d_out);
    biases are 1-D or None (zero).
    """

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    b_q: np.ndarray | None = None
    b_k: np.ndarray | None = None
    b_v: np.ndarray | None = None
    b_o: np.ndarray | None = None


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), out, x)


_PRECISIONS: dict[str, tuple[type, Callable[[np.ndarray], np.ndarray]]] = {
    "float64": (np.float64, lambda x: x),
    "float32": (np.float32, lambda x: x),
    "float32-sequential": (np.float32, lambda x: x),
    "float16": (np.float32, lambda x: np.asarray(x).astype(np.float16).astype(np.float32)),
    "bfloat16": (np.float32, round_to_bfloat16),
}


class _Arith:
    """The working precision: ``dtype`` to compute in, ``rnd`` applied after every step.

    ``"float32"`` uses NumPy's float32 matrix product (a blocked BLAS); ``"float32-sequential"`` the
    textbook one, each dot product summed left to right with a rounding after every multiply and
    add. In float16 and bfloat16 products are accumulated in float32 and rounded once, as frameworks
    do for half-precision matmuls.
    """

    def __init__(self, precision: str):
        self.dtype, self.rnd = _PRECISIONS[precision]
        self.sequential = precision == "float32-sequential"

    def cast(self, x):
        return None if x is None else self.rnd(np.asarray(x, dtype=self.dtype))

    def matmul(self, a, b):
        """a (..., n, d) @ b (..., d, m), or b (d, m)."""
        if not self.sequential:
            if a.ndim > 2 and b.ndim == 2:  # one GEMM over all rows, not one BLAS call per batch item
                return self.rnd((a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[-1:]))
            return self.rnd(a @ b)
        return _sequential_matmul(a, b, self.dtype)


def _sequential_matmul(a, b, dtype) -> np.ndarray:
    """a (..., n, d) @ b (..., d, m) in ``dtype``, each dot product summed left to right with a
    rounding after every multiply and add, vectorised over every axis but d: step j adds the
    outer product of column j of a and row j of b, laid out with the longer of n and m innermost
    (a rounded product does not depend on the order of its factors)."""
    a, b = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    if b.ndim == 2 and a.ndim > 2:  # one right-hand matrix: stack every row of a
        out = _sequential_matmul(a.reshape(-1, a.shape[-1]), b, dtype)
        return out.reshape(a.shape[:-1] + out.shape[-1:])
    a_cols = np.moveaxis(a, -1, 0).copy()  # (d, ..., n)
    b_rows = np.moveaxis(b, -2, 0).copy()  # (d, ..., m)
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, m = a.shape[-2], b.shape[-1]
    transposed = n > m  # then accumulate the product's transpose (..., m, n)
    acc = np.zeros(lead + ((m, n) if transposed else (n, m)), dtype=dtype)
    term = np.empty_like(acc)
    for a_j, b_j in zip(a_cols, b_rows):
        if transposed:
            np.multiply(b_j[..., :, None], a_j[..., None, :], out=term)
        else:
            np.multiply(a_j[..., :, None], b_j[..., None, :], out=term)
        acc += term
    return np.ascontiguousarray(np.swapaxes(acc, -1, -2)) if transposed else acc


def allowed_mask(b: int, h: int, l_q: int, l_k: int, *, mask=None, key_padding_mask=None,
                 causal=None) -> np.ndarray:
    """Boolean (B, h, L_q, L_k): True where every boolean mask permits the pair (MASK-1, 5, 6, 7, 8)."""
    allowed = np.ones((b, h, l_q, l_k), dtype=bool)
    if mask is not None:
        allowed &= np.broadcast_to(np.asarray(mask, dtype=bool), allowed.shape)
    if key_padding_mask is not None:
        allowed &= np.asarray(key_padding_mask, dtype=bool)[:, None, None, :]
    if causal is not None:
        i = np.arange(l_q)[:, None]
        j = np.arange(l_k)[None, :]
        offset = 0 if causal == "top_left" else l_k - l_q
        allowed &= j <= i + offset
    return allowed


def _softmax_rows(logits: np.ndarray, allowed: np.ndarray, ar: _Arith) -> np.ndarray:
    """Softmax over the last axis restricted to ``allowed``; an empty row gives zeros (MASK-9)."""
    allowed = allowed & (logits != -np.inf)
    weights = np.zeros_like(logits)
    counts = np.count_nonzero(allowed, axis=-1)
    # rows with the same number n of allowed keys at once: their allowed logits, packed in key
    # order into an (r, n) array, give each row the same sums as the row alone
    for n in np.unique(counts[counts > 0]):
        rows = np.flatnonzero(counts == n)
        cols = np.nonzero(allowed[rows])[1].reshape(rows.size, n)
        kept = logits[rows[:, None], cols]
        shifted = ar.rnd(kept - ar.rnd(np.max(kept, axis=-1, keepdims=True)))
        e = ar.rnd(np.exp(shifted))
        weights[rows[:, None], cols] = ar.rnd(e / ar.rnd(np.sum(e, axis=-1, keepdims=True)))
    return weights


def _one_head(q, k, v, allowed, additive, scale, ar: _Arith):
    """One head: q (L_q, d_k), k (L_k, d_k), v (L_k, d_v) -> (out (L_q, d_v), weights (L_q, L_k))."""
    logits = ar.rnd(ar.matmul(q, k.T) * ar.dtype(scale))
    for term in additive:
        logits = ar.rnd(logits + term)
    weights = _softmax_rows(logits, allowed, ar)
    return ar.matmul(weights, v), weights, logits


def logit_condition(weights: np.ndarray, logits: np.ndarray) -> float:
    """max over rows of sum_j P_ij |S_ij| (finite logits): NUM-3's softmax condition kappa - 1."""
    terms = np.where(np.isfinite(logits) & (weights != 0), np.abs(weights * logits), 0.0)
    return float(np.max(np.sum(terms, axis=-1), initial=0.0))


def attention(q, k, v, *, mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
              causal=None, scale=None, precision: str = "float64", info: dict | None = None):
    """Scaled dot-product attention (SDPA-1..4, MASK-1..9).

    q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v)
    -> (output (B, h, L_q, d_v), weights (B, h, L_q, L_k)), both in the working precision's dtype.
    ``info``, when given, receives ``logit_condition`` (the largest over heads, see NUM-3).
    """
    ar = _Arith(precision)
    q, k, v = ar.cast(q), ar.cast(k), ar.cast(v)
    b, h, l_q, d_k = q.shape
    l_k = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    full = (b, h, l_q, l_k)
    allowed = allowed_mask(b, h, l_q, l_k, mask=mask, key_padding_mask=key_padding_mask, causal=causal)
    additive = []
    if bias is not None:
        additive.append(np.broadcast_to(ar.cast(bias), full))
    if legacy_mask is not None:
        additive.append(np.broadcast_to(ar.rnd(ar.cast(legacy_mask) * ar.dtype(LEGACY_MASK_VALUE)), full))
    out = np.zeros((b, h, l_q, v.shape[3]), dtype=ar.dtype)
    weights = np.zeros(full, dtype=ar.dtype)
    for bi in range(b):
        for hi in range(h):
            out[bi, hi], weights[bi, hi], logits = _one_head(
                q[bi, hi], k[bi, hi], v[bi, hi], allowed[bi, hi],
                [t[bi, hi] for t in additive], scale, ar)
            if info is not None:
                info["logit_condition"] = max(info.get("logit_condition", 0.0),
                                              logit_condition(weights[bi, hi], logits))
    return out, weights


def split_heads(x, num_heads: int):
    """HEAD-1, written element by element: (B, L, h*d) -> (B, h, L, d)."""
    x = np.asarray(x)
    b, length, width = x.shape
    d = width // num_heads
    y = np.empty((b, num_heads, length, d), dtype=x.dtype)
    for i in range(num_heads):
        for j in range(d):
            y[:, i, :, j] = x[:, :, i * d + j]
    return y


def combine_heads(y):
    """HEAD-2: (B, h, L, d) -> (B, L, h*d), the concatenation of the heads along the last axis."""
    y = np.asarray(y)
    return np.concatenate([y[:, i] for i in range(y.shape[1])], axis=-1)


def _project(x, w, b, cols: slice, ar: _Arith):
    """x (B, L, in) @ w[:, cols] + b[cols] -> (B, L, len(cols)), in the working precision."""
    y = ar.matmul(x, np.ascontiguousarray(w[:, cols]))
    return y if b is None else ar.rnd(y + b[cols])


def multi_head_attention(query, key, value, params: Params, *, num_heads: int, mask=None, bias=None,
                         legacy_mask=None, key_padding_mask=None, causal=None, scale=None,
                         precision: str = "float64", num_kv_heads: int | None = None,
                         info: dict | None = None):
    """Multi-head attention by its per-head definition (MHA-1, PARAM-1, PARAM-2).

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim)
    -> (output (B, L_q, d_out), weights (B, h, L_q, L_k)).

    ``num_kv_heads`` (MHA-6, grouped-query attention): ``g`` key/value heads, ``g`` dividing ``h``;
    ``w_k`` has ``g*d_k`` and ``w_v`` ``g*d_v`` columns, and query head ``i`` uses key/value head
    ``i // (h / g)``. None means ``g = h``.
    """
    ar = _Arith(precision)
    query, key, value = ar.cast(query), ar.cast(key), ar.cast(value)
    p = Params(*(ar.cast(t) for t in params))
    h = num_heads
    g = h if num_kv_heads is None else num_kv_heads
    d_k = p.w_q.shape[1] // h
    d_v = p.w_v.shape[1] // g
    heads, weights = [], []
    for i in range(h):
        j = i // (h // g)  # the key/value head of query head i (MHA-6); j = i without grouping
        q_cols, k_cols = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k)
        v_cols = slice(j * d_v, (j + 1) * d_v)
        q_i = _project(query, p.w_q, p.b_q, q_cols, ar)[:, None]
        k_i = _project(key, p.w_k, p.b_k, k_cols, ar)[:, None]
        v_i = _project(value, p.w_v, p.b_v, v_cols, ar)[:, None]
        head_masks = {name: _head_slice(m, i)
                      for name, m in (("mask", mask), ("bias", bias), ("legacy_mask", legacy_mask))}
        out_i, w_i = attention(q_i, k_i, v_i, key_padding_mask=key_padding_mask, causal=causal,
                               scale=scale, precision=precision, info=info, **head_masks)
        heads.append(out_i[:, 0])
        weights.append(w_i[:, 0])
    concat = np.concatenate(heads, axis=-1)
    out = ar.matmul(concat, p.w_o)
    if p.b_o is not None:
        out = ar.rnd(out + p.b_o)
    return out, np.stack(weights, axis=1)


def _head_slice(m, i: int):
    """The part of a mask/bias broadcastable to (B, h, L_q, L_k) that applies to head i, keeping a
    size-1 head axis: (..., h or 1, L_q, L_k) -> (B or 1, 1, L_q or 1, L_k or 1)."""
    if m is None:
        return None
    m = np.asarray(m)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    return m[:, i:i + 1] if m.shape[1] > 1 else m
