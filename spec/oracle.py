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

Its parts: the narrow precisions' arithmetic (:mod:`.narrow_precision`), the head layouts
(:mod:`.oracle_heads`), which keys a query may see and spec 1.2's checks (:mod:`.oracle_positions`);
what callers use of them is re-exported here.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

# what callers read here is re-exported (noqa: F401)
from .narrow_precision import round_to_bfloat16, round_to_float16, sequential_matmul  # noqa: F401
from .oracle_heads import combine_heads, head_slice, split_heads  # noqa: F401
from .oracle_positions import (CAUSAL_ALIGNMENTS, alibi_bias, allowed_mask,  # noqa: F401
                               cache_positions, check_alibi, check_cache, check_chunk,
                               check_lengths, check_segments, check_softcap, check_window,
                               present, reject, resolve_alignment, structural_allowed,
                               token_positions)

LEGACY_MASK_VALUE = -1e9  # MASK-3: the source document's constant


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


_PRECISIONS: dict[str, tuple[type, Callable[[np.ndarray], np.ndarray]]] = {
    "float64": (np.float64, lambda x: x),
    "float32": (np.float32, lambda x: x),
    "float32-sequential": (np.float32, lambda x: x),
    "float16": (np.float32, round_to_float16),
    "bfloat16": (np.float32, round_to_bfloat16),
}


def rounding(precision: str) -> tuple[type, Callable[[np.ndarray], np.ndarray]]:
    """The working precision ``precision`` (module docstring) as (dtype to compute in, rounding
    applied after every step): the identity for float64 and float32, float16's or bfloat16's
    rounding (held in float32) for those. Raises KeyError for an unknown precision."""
    return _PRECISIONS[precision]


class _Arith:
    """The working precision: ``dtype`` to compute in, ``rnd`` applied after every step.

    ``"float32"`` uses NumPy's float32 matrix product (a blocked BLAS); ``"float32-sequential"`` the
    textbook one, each dot product summed left to right with a rounding after every multiply and
    add. In float16 and bfloat16 products are accumulated in float32 and rounded once, as frameworks
    do for half-precision matmuls.
    """

    def __init__(self, precision: str):
        self.dtype, self.rnd = rounding(precision)
        self.sequential = precision == "float32-sequential"

    def cast(self, x):
        return None if x is None else self.rnd(np.asarray(x, dtype=self.dtype))

    def matmul(self, a, b):
        """a (..., n, d) @ b (..., d, m), or b (d, m)."""
        if not self.sequential:
            if a.ndim > 2 and b.ndim == 2:  # one GEMM over all rows, not one BLAS call per batch item
                return self.rnd((a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[-1:]))
            return self.rnd(a @ b)
        return sequential_matmul(a, b, self.dtype)



def _softmax_rows(logits: np.ndarray, allowed: np.ndarray, ar: _Arith) -> np.ndarray:
    """Softmax over the last axis restricted to ``allowed``; an empty row gives zeros (MASK-9)."""
    allowed = allowed & (logits != -np.inf)
    if allowed.size and allowed.all():  # every key of every row: the rows as they are
        shifted = ar.rnd(logits - ar.rnd(np.max(logits, axis=-1, keepdims=True)))
        e = ar.rnd(np.exp(shifted))
        return ar.rnd(e / ar.rnd(np.sum(e, axis=-1, keepdims=True)))
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
    counted = np.isfinite(logits) & (weights != 0)  # never 0 * -inf at a masked logit
    terms = np.abs(np.where(counted, weights, 0.0) * np.where(counted, logits, 0.0))
    return float(np.max(np.sum(terms, axis=-1), initial=0.0))


def note_head(info: dict | None, weights: np.ndarray, logits: np.ndarray) -> None:
    """Record in ``info`` (None: nothing) the largest over heads of ``logit_condition`` (NUM-3's
    softmax condition) and of ``largest_logit``, max |S_ij| over a head's finite logits, masked
    keys included (NUM-4's magnitude)."""
    if info is None:
        return
    info["logit_condition"] = max(info.get("logit_condition", 0.0), logit_condition(weights, logits))
    finite = np.abs(logits[np.isfinite(logits)])
    info["largest_logit"] = max(info.get("largest_logit", 0.0), float(np.max(finite, initial=0.0)))


def attention(q, k, v, *, mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
              causal=None, scale=None, precision: str = "float64", info: dict | None = None,
              **features):
    """Scaled dot-product attention (SDPA-1..4, MASK-1..9).

    q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v)
    -> (output (B, h, L_q, d_v), weights (B, h, L_q, L_k)), both in the working precision's dtype.
    ``info``, when given, receives ``logit_condition`` and ``largest_logit`` (:func:`note_head`).

    ``features`` are the keyword arguments of spec 1.2 (:data:`FEATURES`: grouped k/v heads,
    ``softcap``, ``window``, ``alignment``, ``alibi_slopes``, segment ids and sequence lengths,
    ``past_key``/``past_value``/``past_lengths``); :func:`attention_result` documents them and
    also returns the log-sum-exp and the present cache. A call without them is the 1.1 oracle.
    """
    if features or np.shape(k)[1] != np.shape(q)[1]:
        return attention_result(q, k, v, mask=mask, bias=bias, legacy_mask=legacy_mask,
                                key_padding_mask=key_padding_mask, causal=causal, scale=scale,
                                precision=precision, info=info, **features)[:2]
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
            note_head(info, weights[bi, hi], logits)
    return out, weights


def _project(x, w, b, cols: slice, ar: _Arith):
    """x (B, L, in) @ w[:, cols] + b[cols] -> (B, L, len(cols)), in the working precision."""
    y = ar.matmul(x, np.ascontiguousarray(w[:, cols]))
    return y if b is None else ar.rnd(y + b[cols])


def _head_counts(p: Params, num_heads: int, num_kv_heads: int | None) -> tuple[int, int, int, int]:
    """(h, g, d_k, d_v) of a multi-head call: g = h without grouping (MHA-6)."""
    g = num_heads if num_kv_heads is None else num_kv_heads
    return num_heads, g, p.w_q.shape[1] // num_heads, p.w_v.shape[1] // g


def multi_head_attention(query, key, value, params: Params, *, num_heads: int, mask=None, bias=None,
                         legacy_mask=None, key_padding_mask=None, causal=None, scale=None,
                         precision: str = "float64", num_kv_heads: int | None = None,
                         info: dict | None = None, **features):
    """Multi-head attention by its per-head definition (MHA-1, PARAM-1, PARAM-2).

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim)
    -> (output (B, L_q, d_out), weights (B, h, L_q, L_k)).

    ``num_kv_heads`` (MHA-6, grouped-query attention): ``g`` key/value heads, ``g`` dividing ``h``;
    ``w_k`` has ``g*d_k`` and ``w_v`` ``g*d_v`` columns, and query head ``i`` uses key/value head
    ``i // (h / g)``. None means ``g = h``.

    ``features``: the spec 1.2 keyword arguments (:data:`FEATURES`), see
    :func:`multi_head_attention_result`, which also returns the log-sum-exp and the present cache.
    """
    if features:
        return multi_head_attention_result(
            query, key, value, params, num_heads=num_heads, mask=mask, bias=bias,
            legacy_mask=legacy_mask, key_padding_mask=key_padding_mask, causal=causal, scale=scale,
            precision=precision, num_kv_heads=num_kv_heads, info=info, **features)[:2]
    ar = _Arith(precision)
    query, key, value = ar.cast(query), ar.cast(key), ar.cast(value)
    p = Params(*(ar.cast(t) for t in params))
    h, g, d_k, d_v = _head_counts(p, num_heads, num_kv_heads)
    heads, weights = [], []
    for i in range(h):
        j = i // (h // g)  # the key/value head of query head i (MHA-6); j = i without grouping
        q_cols, k_cols = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k)
        v_cols = slice(j * d_v, (j + 1) * d_v)
        q_i = _project(query, p.w_q, p.b_q, q_cols, ar)[:, None]
        k_i = _project(key, p.w_k, p.b_k, k_cols, ar)[:, None]
        v_i = _project(value, p.w_v, p.b_v, v_cols, ar)[:, None]
        head_masks = {name: head_slice(m, i)
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


# ---------------------------------------------------------------- spec 1.2 features
#
# Clauses: spec/clauses.toml, chapters GQA to LSE. Extra axis legend: g key/value heads (g divides h),
# L_past cached keys, L_K = L_past + L_k keys after the cache (L_K = L_k without one).
# Unlike the 1.1 arguments, the spec 1.2 arguments are checked (spec/oracle_positions.py, with the
# token positions, windows and ALiBi): bad ones raise ValueError naming the argument, because their
# error clauses are part of the feature's definition.

#: The keyword arguments of spec 1.2 accepted by :func:`attention` and :func:`attention_result`.
FEATURES = ("softcap", "window", "chunk", "alignment", "alibi_slopes", "q_segment_ids",
            "kv_segment_ids", "query_seq_lengths", "key_value_seq_lengths", "past_key",
            "past_value", "past_lengths")


class AttentionResult(NamedTuple):
    """Everything :func:`attention_result` computes (the working precision's dtype).

    output (B, h, L_q, d_v); weights (B, h, L_q, L_K); lse (B, h, L_q), -inf for a fully masked row
    (LSE-1); present_key (B, g, L_K, d_k), present_value (B, g, L_K, d_v) and present_lengths (B,)
    (CACHE-1), all three None without a cache.
    """

    output: np.ndarray
    weights: np.ndarray
    lse: np.ndarray
    present_key: np.ndarray | None
    present_value: np.ndarray | None
    present_lengths: np.ndarray | None


def _row_logsumexp(logits: np.ndarray, allowed: np.ndarray, ar: _Arith) -> np.ndarray:
    """LSE-1: log sum_j exp(S_ij) over the allowed set of each row; -inf for an empty row."""
    allowed = allowed & (logits != -np.inf)
    lse = np.full(logits.shape[0], -np.inf, dtype=ar.dtype)
    counts = np.count_nonzero(allowed, axis=-1)
    # rows with the same number n of allowed keys at once, as in _softmax_rows
    for n in np.unique(counts[counts > 0]):
        rows = np.flatnonzero(counts == n)
        cols = np.nonzero(allowed[rows])[1].reshape(rows.size, n)
        kept = logits[rows[:, None], cols]
        m = ar.rnd(np.max(kept, axis=-1, keepdims=True))
        total = ar.rnd(np.sum(ar.rnd(np.exp(ar.rnd(kept - m))), axis=-1, keepdims=True))
        lse[rows] = ar.rnd(m + ar.rnd(np.log(total)))[:, 0]
    return lse


def _capped_head(q, k, v, allowed, additive, scale, softcap, ar: _Arith):
    """One head with soft-capping (SOFTCAP-1): S = c tanh(s q k^T / c) + additive terms.
    q (L_q, d_k), k (L_K, d_k), v (L_K, d_v) -> (out, weights, logits, lse)."""
    logits = ar.rnd(ar.matmul(q, k.T) * ar.dtype(scale))
    if softcap is not None:
        c = ar.dtype(softcap)
        logits = ar.rnd(c * ar.rnd(np.tanh(ar.rnd(logits / c))))
    for term in additive:
        logits = ar.rnd(logits + term)
    weights = _softmax_rows(logits, allowed, ar)
    return ar.matmul(weights, v), weights, logits, _row_logsumexp(logits, allowed, ar)


class AttentionProblem(NamedTuple):
    """A checked :func:`attention_result` call built up to its logits, in the working precision.

    q (B, h, L_q, d_k); k (B, g, L_K, d_k) and v (B, g, L_K, d_v), the keys and values attended
    (the present cache with one); allowed (B, h, L_q, L_K) bool, every mask, segment, causal and
    window rule at once; additive: the terms added after soft-capping, each (B, h, L_q, L_K)
    (bias, legacy mask * -1e9, ALiBi); scale; softcap (None = off); past_lengths (B,) or None
    without a cache. Axis legend as in :func:`attention_result`.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    allowed: np.ndarray
    additive: tuple[np.ndarray, ...]
    scale: float
    softcap: float | None
    past_lengths: np.ndarray | None


def attention_problem(q, k, v, *, mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                      causal=None, scale=None, precision: str = "float64", softcap=None, window=None,
                      chunk=None, alignment=None, alibi_slopes=None, q_segment_ids=None,
                      kv_segment_ids=None, query_seq_lengths=None, key_value_seq_lengths=None,
                      past_key=None, past_value=None, past_lengths=None) -> AttentionProblem:
    """The arguments of :func:`attention_result` checked and turned into an :class:`AttentionProblem`
    (allowed set, additive terms, present cache): what every head of the call needs. Invalid new
    arguments raise ValueError naming the argument (GQA-2, SOFTCAP-2, WIN-2, ALIBI-3, SEG-5, CACHE-4).
    """
    ar = _Arith(precision)
    q, k, v = ar.cast(q), ar.cast(k), ar.cast(v)
    b, h, l_q, d_k = q.shape
    g = k.shape[1]
    if g < 1 or h % g != 0:
        reject("k", f"{g} key/value heads must divide the {h} query heads (q {q.shape}, k {k.shape})")
    if v.shape[1] != g:
        reject("v", f"{v.shape[1]} heads differ from k's {g} (k {k.shape}, v {v.shape})")
    softcap = check_softcap(softcap)
    window = check_window(window)
    chunk = check_chunk(chunk)
    slopes = check_alibi(alibi_slopes, b, h)
    past_key, past_value, past_lengths = check_cache(past_key, past_value, past_lengths, k, v)
    cached = past_key is not None
    if causal is not None and causal not in CAUSAL_ALIGNMENTS:
        reject("causal", f"must be None, 'top_left' or 'bottom_right', got {causal!r}")
    diagonal = resolve_alignment(causal, alignment, cached=cached,
                                  needs_diagonal=window is not None or chunk is not None
                                  or slopes is not None)
    q_ids, k_ids = check_segments(q_segment_ids, kv_segment_ids, b, l_q, k.shape[2])
    q_len = check_lengths(query_seq_lengths, "query_seq_lengths", b, l_q)
    kv_len = check_lengths(key_value_seq_lengths, "key_value_seq_lengths", b, k.shape[2])
    if cached and not (q_ids is None and q_len is None and kv_len is None):
        reject("past_key", "a KV cache does not combine with segment ids or sequence lengths "
              "(past_lengths gives the valid cache per batch item)")
    if cached:
        l_past = past_key.shape[2]
        positions = cache_positions(past_lengths, l_past, l_q, k.shape[2])
        k_all = present(ar.cast(past_key), k, past_lengths)
        v_all = present(ar.cast(past_value), v, past_lengths)
    else:
        positions = token_positions(b, l_q, k.shape[2], alignment=diagonal, q_segment_ids=q_ids,
                                    kv_segment_ids=k_ids, query_seq_lengths=q_len,
                                    key_value_seq_lengths=kv_len)
        k_all, v_all = k, v
    l_all = k_all.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    full = (b, h, l_q, l_all)
    allowed = allowed_mask(b, h, l_q, l_all, mask=mask, key_padding_mask=key_padding_mask)
    allowed &= structural_allowed(positions, causal=causal is not None, window=window,
                                  chunk=chunk)[:, None]
    additive = []
    if bias is not None:
        additive.append(np.broadcast_to(ar.cast(bias), full))
    if legacy_mask is not None:
        additive.append(np.broadcast_to(ar.rnd(ar.cast(legacy_mask) * ar.dtype(LEGACY_MASK_VALUE)), full))
    if slopes is not None:
        additive.append(ar.cast(alibi_bias(slopes, positions)))
    return AttentionProblem(q, k_all, v_all, allowed, tuple(additive), scale, softcap,
                            past_lengths if cached else None)


def attention_result(q, k, v, *, mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                     causal=None, scale=None, precision: str = "float64", info: dict | None = None,
                     softcap=None, window=None, chunk=None, alignment=None, alibi_slopes=None,
                     q_segment_ids=None, kv_segment_ids=None, query_seq_lengths=None,
                     key_value_seq_lengths=None, past_key=None, past_value=None,
                     past_lengths=None) -> AttentionResult:
    """Scaled dot-product attention with the features of spec 1.2 (clauses in brackets).

    q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> :class:`AttentionResult`.
    Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
    keys, L_K = L_past + L_k keys attended (L_k without a cache), d_k / d_v per-head widths.

    Per head, with every step in the working precision::

        S = c tanh(s q k^T / c) + bias + legacy_mask * -1e9 + alibi      (SOFTCAP-1, ALIBI-1)
        allowed = mask AND key_padding_mask AND segments AND causal AND window AND chunk
        P = softmax over the allowed set (MASK-9: an empty row is 0), output = P v,
        lse = log sum_{allowed} exp(S) (-inf for an empty row)           (LSE-1)

    - grouped heads (GQA-1): g divides h; query head i uses key/value head ``i // (h // g)``.
    - ``softcap`` c > 0 (SOFTCAP-1): applied after the scale and before bias and masks (capping
      after them would turn a masked -inf into the finite -c and leak weight to masked keys).
    - ``window=(left, right)`` (WIN-1), either side None = unbounded: key j is visible to query i
      iff ``query_pos - left <= key_pos <= query_pos + right``.
    - ``chunk`` C >= 1 (CHUNK-1, spec 1.4): key j is visible to query i iff both positions lie in
      one chunk of C positions: ``floor(query_pos / C) == floor(key_pos / C)``.
    - ``alignment``: the diagonal of window, chunk and ALiBi when ``causal`` is None (WIN-1); it
      must equal ``causal`` when both are given. Positions: :func:`token_positions`.
    - ``alibi_slopes`` (h,) or (B, h) (ALIBI-1): adds ``-m_h |query_pos - key_pos|``.
    - ``q_segment_ids`` (B, L_q), ``kv_segment_ids`` (B, L_k) integers (SEG-1): attend only where
      equal; ``query_seq_lengths``, ``key_value_seq_lengths`` (B,) (SEG-2): tokens at or past the
      length belong to no segment. Causal, window and ALiBi count positions within the segment
      (SEG-3).
    - ``past_key`` (B, g, L_past, d_k), ``past_value`` (B, g, L_past, d_v), ``past_lengths`` (B,)
      (default L_past) (CACHE-1, CACHE-2): the present cache is the valid past, the new k / v and
      zero padding; query i sits at position ``past_lengths[b] + i``, so causal (which must be
      None or "bottom_right") allows present key j iff ``j <= past_lengths[b] + i``. Masks, bias
      and key_padding_mask have the present cache's key axis L_K.
    Invalid new arguments raise ValueError naming the argument (GQA-2, SOFTCAP-2, WIN-2, ALIBI-3,
    SEG-5, CACHE-4, CHUNK-2).
    """
    problem = attention_problem(
        q, k, v, mask=mask, bias=bias, legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
        causal=causal, scale=scale, precision=precision, softcap=softcap, window=window,
        chunk=chunk, alignment=alignment, alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, past_key=past_key, past_value=past_value,
        past_lengths=past_lengths)
    ar = _Arith(precision)
    q, k_all, v_all, allowed, additive, scale, softcap, past_lengths = problem
    b, h, l_q, _ = q.shape
    g = k_all.shape[1]
    out = np.zeros((b, h, l_q, v_all.shape[3]), dtype=ar.dtype)
    weights = np.zeros(allowed.shape, dtype=ar.dtype)
    lse = np.zeros((b, h, l_q), dtype=ar.dtype)
    group = h // g
    for bi in range(b):
        for hi in range(h):
            kv = hi // group  # the key/value head of query head hi (GQA-1)
            out[bi, hi], weights[bi, hi], logits, lse[bi, hi] = _capped_head(
                q[bi, hi], k_all[bi, kv], v_all[bi, kv], allowed[bi, hi],
                [t[bi, hi] for t in additive], scale, softcap, ar)
            note_head(info, weights[bi, hi], logits)
    if past_lengths is None:
        return AttentionResult(out, weights, lse, None, None, None)
    return AttentionResult(out, weights, lse, k_all, v_all, past_lengths + np.shape(k)[2])


def merge_by_lse(out_a, lse_a, out_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """LSE-2: combine attention over two disjoint key sets from their outputs (..., L_q, d_v) and
    log-sum-exps (..., L_q): weights exp(lse_x - lse) with lse = logaddexp(lse_a, lse_b); rows
    empty in both stay 0 with lse -inf."""
    lse = np.logaddexp(lse_a, lse_b)
    empty = lse == -np.inf
    safe = np.where(empty, 0.0, lse)
    wa = np.where(empty, 0.0, np.exp(lse_a - safe))[..., None]
    wb = np.where(empty, 0.0, np.exp(lse_b - safe))[..., None]
    return wa * out_a + wb * out_b, lse


def multi_head_attention_result(query, key, value, params: Params, *, num_heads: int,
                                num_kv_heads: int | None = None, precision: str = "float64",
                                **attention_kwargs) -> AttentionResult:
    """Multi-head attention with the features of spec 1.2 (MHA-1, MHA-6 and chapters GQA to LSE).

    query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) -> :class:`AttentionResult`
    with output (B, L_q, d_out), weights (B, h, L_q, L_K), lse (B, h, L_q) and, with a cache, the
    present cache of *projected* keys (B, g, L_K, d_k) and values (B, g, L_K, d_v).

    Head i is :func:`attention_result` of the column blocks of the projections (PARAM-2): query
    block i, key/value block ``i // (h / g)``; ``attention_kwargs`` are those of
    :func:`attention_result` (masks, scale, ``info`` and every spec 1.2 feature), with
    ``past_key`` (B, g, L_past, d_k) and ``past_value`` (B, g, L_past, d_v) holding projected keys
    and values, as a decoder keeps them. ``alibi_slopes`` has one slope per query head.
    """
    ar = _Arith(precision)
    query, key, value = ar.cast(query), ar.cast(key), ar.cast(value)
    p = Params(*(ar.cast(t) for t in params))
    h, g, d_k, d_v = _head_counts(p, num_heads, num_kv_heads)

    def heads(x, w, b, n, d):  # PARAM-2: block i of x @ w + b -> (B, n, L, d)
        return np.stack([_project(x, w, b, slice(i * d, (i + 1) * d), ar) for i in range(n)], axis=1)

    res = attention_result(heads(query, p.w_q, p.b_q, h, d_k), heads(key, p.w_k, p.b_k, g, d_k),
                           heads(value, p.w_v, p.b_v, g, d_v), precision=precision,
                           **attention_kwargs)
    out = ar.matmul(combine_heads(res.output), p.w_o)
    if p.b_o is not None:
        out = ar.rnd(out + p.b_o)
    return res._replace(output=out)
