"""Where every token sits: segments, sequence lengths, KV-cache positions (spec 1.2, NumPy).

Axis legend: B batch, h query heads, L_q queries, L_k new keys, L_past cached keys, L_K = L_past +
L_k keys attended (L_k without a cache).

Segment ids, sequence lengths and cache lengths are integer data the backends never differentiate,
so every backend computes the structural mask (segments AND causal AND window AND chunk, SEG-1,
SEG-3, WIN-1, CHUNK-1, CACHE-2) and the ALiBi bias (ALIBI-1) here in NumPy and moves the result to
its device.
The blockwise forms (``rows``, ``cols``) let a chunked kernel build one block at a time without
forming the (L_q, L_K) matrix. Arguments are validated by the caller (``arg_checks``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

ALL = slice(None)


class Positions(NamedTuple):
    """Per-token segment and position (SEG-3, CACHE-2).

    query_segment (B, L_q), key_segment (B, L_K): int64 segment of each token; query_valid (B, L_q),
    key_valid (B, L_K): False for a token that belongs to no segment (past a sequence length, or
    cache padding); query_pos (B, L_q), key_pos (B, L_K): the integer positions that causal masks,
    windows and ALiBi compare (query i and key j are on the diagonal when the positions are equal).
    """

    query_segment: np.ndarray
    key_segment: np.ndarray
    query_valid: np.ndarray
    key_valid: np.ndarray
    query_pos: np.ndarray
    key_pos: np.ndarray


def _valid(lengths, b: int, length: int) -> np.ndarray:
    """(B,) lengths or None -> (B, L) bool: token t is valid iff t < lengths[b]."""
    if lengths is None:
        return np.ones((b, length), bool)
    return np.arange(length)[None, :] < np.asarray(lengths, np.int64).reshape(b, 1)


def _ranks_and_counts(ids: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, dict]:
    """ids, valid (L,) -> (rank (L,), {segment id: valid count}): the rank of a token is the number
    of earlier valid tokens with its id (sort by id, stable, then a running count per group)."""
    order = np.argsort(ids, kind="stable")
    s, v = ids[order], valid[order].astype(np.int64)
    before = np.cumsum(v) - v  # valid tokens before each sorted one
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if s.size else np.zeros(0, np.int64)
    group = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1 if s.size else np.zeros(0, np.int64)
    rank = np.empty_like(before)
    rank[order] = before - before[starts][group]
    ends = np.r_[starts[1:], s.size]
    counts = {int(s[a]): int(v[a:e].sum()) for a, e in zip(starts, ends)}
    return rank, counts


def token_positions(b: int, l_q: int, l_k: int, *, alignment: str | None = None,
                    q_segment_ids=None, kv_segment_ids=None, query_seq_lengths=None,
                    key_value_seq_lengths=None) -> Positions:
    """Segments and positions without a cache (SEG-1, SEG-2, SEG-3).

    ``q_segment_ids`` (B, L_q) / ``kv_segment_ids`` (B, L_k) integers (all 0 when None);
    ``query_seq_lengths`` / ``key_value_seq_lengths`` (B,) or None. A token's position is its rank
    among the valid tokens of its segment; with ``alignment="bottom_right"`` a query's position is
    shifted by n_k(s) - n_q(s), its segment's valid key count minus its valid query count. Without
    ids and lengths: query i at i (+ L_k - L_q bottom-right), key j at j (MASK-6, MASK-7).
    """
    q_ids = np.zeros((b, l_q), np.int64) if q_segment_ids is None else \
        np.asarray(q_segment_ids).astype(np.int64)
    k_ids = np.zeros((b, l_k), np.int64) if kv_segment_ids is None else \
        np.asarray(kv_segment_ids).astype(np.int64)
    q_valid, k_valid = _valid(query_seq_lengths, b, l_q), _valid(key_value_seq_lengths, b, l_k)
    query_pos = np.zeros((b, l_q), np.int64)
    key_pos = np.zeros((b, l_k), np.int64)
    for bi in range(b):
        query_pos[bi], n_q = _ranks_and_counts(q_ids[bi], q_valid[bi])
        key_pos[bi], n_k = _ranks_and_counts(k_ids[bi], k_valid[bi])
        if alignment == "bottom_right":
            query_pos[bi] += np.array([n_k.get(int(s), 0) - n_q[int(s)] for s in q_ids[bi]],
                                      np.int64).reshape(l_q)
    return Positions(q_ids, k_ids, q_valid, k_valid, query_pos, key_pos)


def cache_positions(past_lengths, l_past: int, l_q: int, l_k: int) -> Positions:
    """Positions with a KV cache (CACHE-1, CACHE-2): query i of item b at past_lengths[b] + i,
    present key j at j; present keys j >= past_lengths[b] + L_k are padding (not valid)."""
    past_lengths = np.asarray(past_lengths, np.int64).reshape(-1)
    b, l_all = past_lengths.shape[0], l_past + l_k
    key_pos = np.broadcast_to(np.arange(l_all, dtype=np.int64), (b, l_all))
    return Positions(np.zeros((b, l_q), np.int64), np.zeros((b, l_all), np.int64),
                     np.ones((b, l_q), bool), key_pos < (past_lengths + l_k)[:, None],
                     past_lengths[:, None] + np.arange(l_q, dtype=np.int64)[None, :], key_pos)


def present_index(past_lengths, l_past: int, l_k: int) -> np.ndarray:
    """(B, L_K) int64 indices into ``concat([past, new, zero], axis=key)`` (length L_past + L_k + 1)
    that lay out the present cache of CACHE-1: the valid past, the new keys, then the zero slot."""
    past_lengths = np.asarray(past_lengths, np.int64).reshape(-1, 1)
    j = np.arange(l_past + l_k, dtype=np.int64)[None, :]
    new = l_past + (j - past_lengths)
    return np.where(j < past_lengths, j,
                    np.where(j < past_lengths + l_k, new, l_past + l_k))


def structural_allowed(pos: Positions, *, causal: bool, window=None, chunk=None,
                       rows: slice = ALL, cols: slice = ALL) -> np.ndarray:
    """(B, L_q', L_K') bool for queries ``rows`` and keys ``cols``: same segment, both valid, and
    (with ``causal``) key_pos <= query_pos, and (with ``window=(left, right)``, None = unbounded)
    query_pos - left <= key_pos <= query_pos + right, and (with ``chunk`` C) floor(query_pos / C)
    == floor(key_pos / C) (SEG-1, MASK-6/7 on positions, WIN-1, CHUNK-1)."""
    qp, kp = pos.query_pos[:, rows, None], pos.key_pos[:, None, cols]
    allowed = (pos.query_segment[:, rows, None] == pos.key_segment[:, None, cols]) \
        & pos.query_valid[:, rows, None] & pos.key_valid[:, None, cols]
    if causal:
        allowed &= kp <= qp
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= kp >= qp - left
        if right is not None:
            allowed &= kp <= qp + right
    if chunk is not None:
        allowed &= np.floor_divide(kp, chunk) == np.floor_divide(qp, chunk)
    return allowed


def alibi_bias(slopes, pos: Positions, *, rows: slice = ALL, cols: slice = ALL) -> np.ndarray:
    """ALIBI-1: slopes (h,) or (B, h) -> float64 bias (B, h, L_q', L_K') = -m |query_pos - key_pos|."""
    slopes = np.asarray(slopes, np.float64)
    b = pos.query_pos.shape[0]
    slopes = np.broadcast_to(slopes, (b, slopes.shape[-1]))
    dist = np.abs(pos.query_pos[:, rows, None] - pos.key_pos[:, None, cols]).astype(np.float64)
    return -slopes[:, :, None, None] * dist[:, None]
