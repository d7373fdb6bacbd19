"""Which keys a query may see, as the float64 oracle reads it: the boolean masks of 1.1
(:func:`allowed_mask`) and spec 1.2's arguments: checks, token positions, ALiBi, windows.

Axis legend: B batch, h heads, g key/value heads, L_q queries, L_k new keys, L_past cached keys,
L_K = L_past + L_k keys after the cache (L_K = L_k without one).

The clauses are in spec/clauses.toml, chapters GQA to LSE. Unlike the 1.1 arguments, the spec 1.2
arguments are checked here: bad ones raise ``ValueError`` naming the argument (:func:`reject`),
because their error clauses are part of the feature's definition. :func:`token_positions` and
:func:`cache_positions` say where every token sits (SEG-3, CACHE-2); :func:`structural_allowed`
is the mask windows, chunks, segments and causal alignment make of them (WIN, CHUNK, SEG, MASK-6)
and :func:`alibi_bias` the bias ALiBi makes (ALIBI-1). :mod:`.oracle` computes with them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


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


class TokenPositions(NamedTuple):
    """Where every token sits (SEG-3, CACHE-2): same_segment (B, L_q, L_K) bool, True where query i
    and key j are valid tokens of one segment; query_pos (B, L_q) and key_pos (B, L_K), the integer
    positions that causal masks, windows and ALiBi compare (the diagonal is query_pos == key_pos)."""

    same_segment: np.ndarray
    query_pos: np.ndarray
    key_pos: np.ndarray


def reject(argument: str, message: str):
    raise ValueError(f"{argument}: {message}")


def _int_array(x, argument: str, shape: tuple[int, ...]) -> np.ndarray:
    """x as an int64 array of exactly ``shape``; a ValueError naming ``argument`` otherwise."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        reject(argument, f"must be an integer array, got dtype {arr.dtype}")
    if arr.shape != shape:
        reject(argument, f"must have shape {shape}, got {arr.shape}")
    return arr.astype(np.int64)


def check_lengths(x, argument: str, b: int, upper: int) -> np.ndarray | None:
    """Per-batch lengths (B,) with 0 <= length <= upper (SEG-2, CACHE-1)."""
    if x is None:
        return None
    arr = _int_array(x, argument, (b,))
    if np.any(arr < 0) or np.any(arr > upper):
        reject(argument, f"lengths must lie in [0, {upper}], got {arr.tolist()}")
    return arr


def check_softcap(softcap) -> float | None:
    """SOFTCAP-2: None or a positive finite number."""
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.number)):
        reject("softcap", f"must be a positive finite number, got {softcap!r}")
    if not (math.isfinite(float(softcap)) and float(softcap) > 0):
        reject("softcap", f"must be a positive finite number, got {softcap!r}")
    return float(softcap)


def check_window(window) -> tuple[int | None, int | None] | None:
    """WIN-2: None or a pair (left, right) of non-negative integers or None."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        reject("window", f"must be a pair (left, right), got {window!r}")
    for side in window:
        if side is None:
            continue
        if isinstance(side, (bool, np.bool_)) or not isinstance(side, (int, np.integer)) or side < 0:
            reject("window", f"each side must be None or a non-negative integer, got {window!r}")
    return tuple(None if s is None else int(s) for s in window)


def check_chunk(chunk) -> int | None:
    """CHUNK-2: None or a positive integer (not a bool)."""
    if chunk is None:
        return None
    if isinstance(chunk, (bool, np.bool_)) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        reject("chunk", f"must be a positive integer, got {chunk!r}")
    return int(chunk)


def check_alibi(alibi_slopes, b: int, h: int) -> np.ndarray | None:
    """ALIBI-3: slopes (h,) or (B, h), finite floats -> (B, h) float64."""
    if alibi_slopes is None:
        return None
    m = np.asarray(alibi_slopes)
    if m.dtype.kind not in "fiu" or m.shape not in ((h,), (b, h)):
        reject("alibi_slopes", f"must be a real array of shape ({h},) or ({b}, {h}) for h={h} "
              f"query heads, got shape {m.shape} and dtype {m.dtype}")
    m = m.astype(np.float64)
    if not np.all(np.isfinite(m)):
        reject("alibi_slopes", "must be finite")
    return np.broadcast_to(m, (b, h))


def resolve_alignment(causal, alignment, *, needs_diagonal: bool, cached: bool) -> str | None:
    """The alignment of every diagonal of the call (WIN-1, ALIBI-1, CACHE-2)."""
    if alignment is not None and alignment not in CAUSAL_ALIGNMENTS:
        reject("alignment", f"must be None, 'top_left' or 'bottom_right', got {alignment!r}")
    if causal is not None and alignment is not None and causal != alignment:
        reject("alignment", f"{alignment!r} contradicts causal={causal!r}")
    diagonal = causal if causal is not None else alignment
    if cached:
        if diagonal == "top_left":
            reject("causal" if causal is not None else "alignment",
                  "a KV cache places query i at position past_length + i (CACHE-2): "
                  "'top_left' is an error with past_key; use 'bottom_right' or None")
        return "bottom_right"
    if needs_diagonal and diagonal is None:
        reject("alignment", "window, chunk and alibi_slopes need a diagonal: pass causal or "
              "alignment ('top_left' or 'bottom_right'); there is no default")
    return diagonal


def _rank_in_segment(ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """ids, valid (L,) -> rank (L,): how many earlier valid tokens share the token's id."""
    rank = np.zeros(ids.shape, dtype=np.int64)
    for i in range(ids.shape[0]):
        rank[i] = np.count_nonzero(valid[:i] & (ids[:i] == ids[i]))
    return rank


def token_positions(b: int, l_q: int, l_k: int, *, alignment: str | None = None,
                    q_segment_ids=None, kv_segment_ids=None, query_seq_lengths=None,
                    key_value_seq_lengths=None) -> TokenPositions:
    """Segments and positions without a cache (SEG-1..3), inputs already checked.

    A token's segment is its id (all 0 without ids); a query i >= query_seq_lengths[b] or a key
    j >= key_value_seq_lengths[b] belongs to no segment. Positions count within the segment: the
    rank r of a token among the valid tokens of its segment in its row. With n_q(s), n_k(s) the
    segment's query and key counts, query_pos = r_q + (0 for top_left, n_k(s) - n_q(s) for
    bottom_right) and key_pos = r_k. Without ids and lengths this is MASK-6/7's i + offset and j.
    """
    q_ids = np.zeros((b, l_q), np.int64) if q_segment_ids is None else q_segment_ids
    k_ids = np.zeros((b, l_k), np.int64) if kv_segment_ids is None else kv_segment_ids
    q_valid = np.ones((b, l_q), bool) if query_seq_lengths is None else \
        np.arange(l_q)[None, :] < np.asarray(query_seq_lengths)[:, None]
    k_valid = np.ones((b, l_k), bool) if key_value_seq_lengths is None else \
        np.arange(l_k)[None, :] < np.asarray(key_value_seq_lengths)[:, None]
    same = (q_ids[:, :, None] == k_ids[:, None, :]) & q_valid[:, :, None] & k_valid[:, None, :]
    query_pos = np.zeros((b, l_q), np.int64)
    key_pos = np.zeros((b, l_k), np.int64)
    for bi in range(b):
        query_pos[bi] = _rank_in_segment(q_ids[bi], q_valid[bi])
        key_pos[bi] = _rank_in_segment(k_ids[bi], k_valid[bi])
        if alignment == "bottom_right":
            for i in range(l_q):
                s = q_ids[bi, i]
                n_q = np.count_nonzero(q_valid[bi] & (q_ids[bi] == s))
                n_k = np.count_nonzero(k_valid[bi] & (k_ids[bi] == s))
                query_pos[bi, i] += n_k - n_q
    return TokenPositions(same, query_pos, key_pos)


def cache_positions(past_lengths, l_past: int, l_q: int, l_k: int) -> TokenPositions:
    """Positions with a KV cache (CACHE-1, CACHE-2): query i of batch item b sits at
    past_lengths[b] + i, present key j at j; present keys j >= past_lengths[b] + L_k are padding."""
    past_lengths = np.asarray(past_lengths, dtype=np.int64)
    b = past_lengths.shape[0]
    l_all = l_past + l_k
    key_pos = np.broadcast_to(np.arange(l_all), (b, l_all))
    valid = key_pos < (past_lengths + l_k)[:, None]
    same = np.broadcast_to(valid[:, None, :], (b, l_q, l_all))
    return TokenPositions(same, past_lengths[:, None] + np.arange(l_q)[None, :], key_pos)


def alibi_bias(slopes, positions: TokenPositions) -> np.ndarray:
    """ALIBI-1: slopes (B, h) -> bias (B, h, L_q, L_K) = -m_h |query_pos_i - key_pos_j|."""
    dist = np.abs(positions.query_pos[:, :, None] - positions.key_pos[:, None, :])
    return -np.asarray(slopes, np.float64)[:, :, None, None] * dist[:, None]


def structural_allowed(positions: TokenPositions, *, causal: bool, window,
                       chunk=None) -> np.ndarray:
    """(B, L_q, L_K) bool: segments AND causal AND window AND chunk, all on positions (SEG-1,
    WIN-1, CHUNK-1). A query's chunk starts at ``start = query_pos - (query_pos mod C)`` (the
    floored remainder, so a negative position falls in the chunk below 0) and holds the keys
    ``start <= key_pos < start + C``."""
    qp = positions.query_pos[:, :, None]
    kp = positions.key_pos[:, None, :]
    allowed = positions.same_segment.copy()
    if causal:
        allowed &= kp <= qp
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= kp >= qp - left
        if right is not None:
            allowed &= kp <= qp + right
    if chunk is not None:
        start = qp - np.mod(qp, chunk)
        allowed &= (kp >= start) & (kp < start + chunk)
    return allowed


def present(past, new, past_lengths) -> np.ndarray:
    """CACHE-1: (B, g, L_past, d), (B, g, L_k, d) -> (B, g, L_past + L_k, d): the valid past,
    then the new entries, then zeros."""
    b, g, l_past, d = past.shape
    out = np.zeros((b, g, l_past + new.shape[2], d), dtype=np.result_type(past, new))
    for bi in range(b):
        p = int(past_lengths[bi])
        out[bi, :, :p] = past[bi, :, :p]
        out[bi, :, p:p + new.shape[2]] = new[bi]
    return out


def check_cache(past_key, past_value, past_lengths, k, v):
    """CACHE-4 -> (past_key, past_value, past_lengths (B,)) or (None, None, None)."""
    if past_key is None and past_value is None:
        if past_lengths is not None:
            reject("past_lengths", "given without past_key and past_value")
        return None, None, None
    if past_key is None or past_value is None:
        reject("past_key" if past_key is None else "past_value",
              "past_key and past_value go together")
    pk, pv = np.asarray(past_key), np.asarray(past_value)
    for name, cache, new_name, new in (("past_key", pk, "k", k), ("past_value", pv, "v", v)):
        if cache.ndim != 4:
            reject(name, f"must be (B, g, L_past, d), got shape {cache.shape}")
        for axis, what in ((0, "batch"), (1, "head"), (3, "width")):
            if cache.shape[axis] != new.shape[axis]:
                reject(name, f"{what} axis {cache.shape[axis]} does not match {new_name}'s "
                      f"{new.shape[axis]} (cache {cache.shape}, {new_name} {new.shape})")
    if pk.shape[2] != pv.shape[2]:
        reject("past_value", f"length {pv.shape[2]} differs from past_key's {pk.shape[2]}")
    l_past = pk.shape[2]
    lengths = check_lengths(past_lengths, "past_lengths", pk.shape[0], l_past)
    return pk, pv, np.full(pk.shape[0], l_past, np.int64) if lengths is None else lengths


def check_segments(q_segment_ids, kv_segment_ids, b, l_q, l_k):
    """SEG-5: both or neither, integer, (B, L_q) and (B, L_k)."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        reject("q_segment_ids" if q_segment_ids is None else "kv_segment_ids",
              "q_segment_ids and kv_segment_ids go together")
    if q_segment_ids is None:
        return None, None
    return (_int_array(q_segment_ids, "q_segment_ids", (b, l_q)),
            _int_array(kv_segment_ids, "kv_segment_ids", (b, l_k)))
