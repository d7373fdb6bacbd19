"""Attention by blocks with an online softmax in NumPy (the kernel of ``numpy-chunked``, forward
and backward share its masks and blocks).

Axis legend: B batch, L_q / L_K lengths, h heads, g key/value heads, d_k / d_v per-head widths.

:func:`blockwise_attention` never forms the (L_q, L_K) logits: per query block it walks the key
blocks keeping a running maximum and sum (:mod:`.np_chunked` describes the algorithm);
:class:`BlockMask` and :class:`Alibi` build a block of the masks and of ALiBi on demand;
:func:`choose_blocks` picks the block sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import positions as positions_

#: Elements of one logits block (g*block_q*block_k for g heads): 4M, i.e. 16 MiB in float32.
BLOCK_ELEMENTS = 1 << 22
#: The default key block: the longest row of logits a block holds.
BLOCK_K = 4096


class BlockMask(NamedTuple):
    """The boolean masks of a call, kept apart so that a block of them can be built on demand.

    mask broadcastable to (B, h, L_q, L_K) or None; key_padding_mask (B, L_K) or None;
    causal_offset ``None``, or the offset ``L_K - L_q`` ("bottom_right") / 0 ("top_left") of a
    call without positions: key j is allowed for query i iff ``j <= i + offset``. ``positions``
    (:class:`~mhaspec.backends.positions.Positions`, with (B, ...) arrays) or None: segments,
    sequence lengths and cache positions, with ``causal`` (compare positions), ``window``
    ((left, right), None = unbounded) and ``chunk`` (C) applied on them (SEG-1, WIN-1, CHUNK-1,
    CACHE-2); without positions ``causal``, ``window`` and ``chunk`` are unused.
    """

    mask: np.ndarray | None = None
    key_padding_mask: np.ndarray | None = None
    causal_offset: int | None = None
    positions: positions_.Positions | None = None
    causal: bool = False
    window: tuple | None = None
    chunk: int | None = None

    def block(self, heads: tuple, qs: slice, ks: slice):
        """The allowed mask for the lead index ``heads`` (see :func:`_cut`), queries ``qs`` and keys
        ``ks``, broadcastable to (g, len(qs), len(ks)), or None when nothing in it is masked."""
        allowed = None if self.mask is None else _cut(self.mask, heads, qs, ks)
        if self.key_padding_mask is not None:
            kpm = _cut(self.key_padding_mask[:, None, None, :], heads, qs, ks)
            allowed = kpm if allowed is None else allowed & kpm
        if self.causal_offset is not None and ks.stop - 1 > qs.start + self.causal_offset:
            # else the whole block is allowed
            i = np.arange(qs.start, qs.stop)[:, None]
            j = np.arange(ks.start, ks.stop)[None, :]
            tri = j <= i + self.causal_offset
            allowed = tri if allowed is None else allowed & tri
        if self.positions is not None:
            item = _batch_item(self.positions, heads)
            structural = positions_.structural_allowed(item, causal=self.causal,
                                                       window=self.window, chunk=self.chunk,
                                                       rows=qs, cols=ks)
            allowed = structural if allowed is None else allowed & structural
        return allowed

    def skips(self, heads: tuple, qs: slice, ks: slice) -> bool:
        """True when the causal mask or the window blocks every pair of the block (decided from
        the block's first and last positions, without building it)."""
        if self.causal_offset is not None and ks.start > qs.stop - 1 + self.causal_offset:
            return True
        if self.positions is None or not (self.causal or self.window is not None):
            return False
        item = _batch_item(self.positions, heads)
        q_pos = item.query_pos[0, qs][item.query_valid[0, qs]]
        k_pos = item.key_pos[0, ks][item.key_valid[0, ks]]
        if q_pos.size == 0 or k_pos.size == 0:
            return True
        first_q, last_q, first_k, last_k = q_pos.min(), q_pos.max(), k_pos.min(), k_pos.max()
        left, right = self.window or (None, None)
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return (right is not None and first_k > last_q + right) or \
            (left is not None and last_k < first_q - left)


class Alibi(NamedTuple):
    """ALiBi (ALIBI-1) cut block by block: ``slopes`` (h,) or (B, h), on ``positions``."""

    slopes: np.ndarray
    positions: positions_.Positions

    def block(self, heads: tuple, qs: slice, ks: slice) -> np.ndarray:
        """(g, len(qs), len(ks)) float64 bias for the lead index ``heads`` = (b, slice of heads)."""
        b, head_slice = heads
        slopes = self.slopes[..., head_slice]
        slopes = slopes[b:b + 1] if slopes.ndim == 2 else slopes
        item = _batch_item(self.positions, heads)
        return positions_.alibi_bias(slopes, item, rows=qs, cols=ks)[0]


def _batch_item(pos: positions_.Positions, heads: tuple) -> positions_.Positions:
    """The positions of batch item ``heads[0]``, each array (1, ...)."""
    b = heads[0]
    return positions_.Positions(*(a[b:b + 1] for a in pos))


def _cut(m, heads: tuple, qs: slice, ks: slice):
    """Block (heads, qs, ks) of an array broadcastable to (..., L_q, L_k); ``heads`` indexes the
    lead axes (integers, then a slice of the last one). Size-1 axes stay whole."""
    m = np.asarray(m)
    m = m.reshape((1,) * (len(heads) + 2 - m.ndim) + m.shape)
    index = tuple((slice(None) if isinstance(i, slice) else 0) if n == 1 else i
                  for i, n in zip(heads, m.shape))
    return m[index + (qs if m.shape[-2] > 1 else slice(None), ks if m.shape[-1] > 1 else slice(None))]


class Blocks(NamedTuple):
    """Block sizes: ``block_q`` queries by ``block_k`` keys, ``group`` heads at a time."""

    block_q: int
    block_k: int
    group: int


def choose_blocks(heads: int, len_q: int, len_k: int, block_q: int | None = None,
                  block_k: int | None = None, *, elements: int | None = None) -> Blocks:
    """Block sizes for ``heads`` heads of (L_q, L_k) logits: at most ``elements`` (default
    :data:`BLOCK_ELEMENTS`) logits per block unless ``block_q`` / ``block_k`` are given."""
    elements = elements or BLOCK_ELEMENTS
    block_k = block_k or min(len_k, BLOCK_K)
    block_q = block_q or max(1, min(len_q, elements // max(1, block_k)))
    group = max(1, min(heads, elements // max(1, block_q * block_k)))
    return Blocks(block_q, block_k, group)


def blockwise_attention(q, k, v, *, scale: float, allowed: BlockMask | None = None,
                        additive=(), alibi: Alibi | None = None, softcap: float | None = None,
                        lse: bool = False, blocks: Blocks | None = None, sinks=None):
    """Attention by blocks with an online softmax, never forming the (L_q, L_K) logits.

    q (..., h, L_q, d_k), k (..., g, L_K, d_k), v (..., g, L_K, d_v) NumPy arrays, g dividing h
    (query head i uses key/value head i // (h / g), GQA-1); ``allowed`` the masks (None: none);
    ``additive`` arrays broadcastable to (..., h, L_q, L_K) added to the logits; ``alibi`` needs
    4-D inputs (B, h, ...), as do positions in ``allowed``. Per block the logits are
    ``c tanh(s q k^T / c)`` (``softcap`` c, SOFTCAP-1), then the additive terms and ALiBi, then
    the masks. Returns (out (..., h, L_q, d_v), lse (..., h, L_q) or None): lse is
    ``log sum_allowed exp(S)`` from the running maximum and sum, -inf for an empty row (LSE-1).
    float16 computes in float32 and rounds both results to float16. ``sinks`` (h,) (spec 1.3,
    SINK-1): each row's running maximum and sum start at the sink (e^0 = 1 under the maximum
    sigma_h), which then joins the denominator and the lse and carries no value.
    """
    out_dtype = q.dtype
    work = np.promote_types(out_dtype, np.float32)
    len_q, len_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]) + q.shape[-3:-2] \
        if q.ndim >= 3 else ()
    rows = lead or (1,)  # 2-D inputs: one lead item
    heads_total, kv_heads = rows[-1], (k.shape[-3] if k.ndim >= 3 else 1)
    repeat = heads_total // kv_heads
    q = np.broadcast_to(np.asarray(q, dtype=work), (*rows, len_q, q.shape[-1]))
    k = np.broadcast_to(np.asarray(k, dtype=work), (*rows[:-1], kv_heads, len_k, k.shape[-1]))
    out = np.zeros((*rows, len_q, d_v), dtype=work)
    row_lse = np.full((*rows, len_q), -np.inf, dtype=work) if lse else None
    if len_k > 0:
        k_t = np.swapaxes(k, -1, -2)
        # a column of ones after v makes the PV matmul also return the row sums of the exponentials
        v1 = np.empty((*rows[:-1], kv_heads, len_k, d_v + 1), dtype=work)
        v1[..., :d_v] = v
        v1[..., d_v] = 1.0
        additive = [np.asarray(t, dtype=work) for t in additive]
        blocks = blocks or choose_blocks(heads_total, len_q, len_k)
        group = blocks.group if repeat == 1 else max(1, blocks.group // repeat) * repeat
        for outer in np.ndindex(*rows[:-1]):
            for h0 in range(0, heads_total, group):
                heads = (*outer, slice(h0, min(h0 + group, heads_total)))
                kv = _kv_heads(heads[-1], repeat)
                k_g, v_g = k_t[outer][kv], v1[outer][kv]
                for q0 in range(0, len_q, blocks.block_q):
                    qs = slice(q0, min(q0 + blocks.block_q, len_q))
                    _attend_rows(q[heads][..., qs, :] * work.type(scale), k_g, v_g, allowed,
                                 additive, alibi, softcap, heads, qs, blocks.block_k,
                                 out[heads][..., qs, :],
                                 None if row_lse is None else row_lse[heads][..., qs], out_dtype,
                                 None if sinks is None else sinks[heads[-1]])
    if not lead:
        out, row_lse = out[0], None if row_lse is None else row_lse[0]
    out = out.astype(out_dtype, copy=False)
    return out, None if row_lse is None else row_lse.astype(out_dtype, copy=False)


def _kv_heads(query_heads: slice, repeat: int):
    """The key/value heads of the query heads ``query_heads`` (GQA-1): a slice when ``repeat``
    is 1 (a view), else the index array ``i // repeat`` (a copy per head group)."""
    if repeat == 1:
        return query_heads
    return np.arange(query_heads.start, query_heads.stop) // repeat


def _attend_rows(q_blk, k_t, v1, allowed, additive, alibi, softcap, heads: tuple, qs: slice,
                 block_k: int, out, row_lse, alibi_dtype, sink=None):
    """Queries ``qs`` of the heads ``heads`` (see :func:`_cut`), key block by key block: q_blk
    (g, len(qs), d_k) already scaled, k_t (g, d_k, L_K), v1 (g, L_K, d_v + 1) (v and a column of
    ones); ``allowed`` a :class:`BlockMask` or None, ``additive`` the terms added to the logits,
    ``alibi`` an :class:`Alibi` or None, added after rounding to ``alibi_dtype``; ``sink`` the
    heads' sink logits (g,) or None. Writes out (g, len(qs), d_v) and, when not None, row_lse
    (g, len(qs))."""
    len_k, d_v = k_t.shape[-1], out.shape[-1]
    row_max = np.full((*q_blk.shape[:-1], 1), -np.inf, dtype=q_blk.dtype)
    acc = np.zeros((*q_blk.shape[:-1], d_v + 1), dtype=q_blk.dtype)  # [sum_j p v_j | sum_j p]
    if sink is not None:  # SINK-1: the sink as the first term, e^(sigma - sigma) = 1, no value
        row_max[...] = np.asarray(sink, dtype=q_blk.dtype).reshape(-1, 1, 1)
        acc[..., d_v] = 1.0
    for k0 in range(0, len_k, block_k):
        ks = slice(k0, min(k0 + block_k, len_k))
        if allowed is not None and allowed.skips(heads, qs, ks):
            continue
        blk_allowed = None if allowed is None else allowed.block(heads, qs, ks)
        if blk_allowed is not None and blk_allowed.dtype == bool and not blk_allowed.any():
            continue
        logits = np.matmul(q_blk, k_t[..., ks])
        if softcap is not None:  # SOFTCAP-1: after the scale, before bias and masks
            c = q_blk.dtype.type(softcap)
            logits /= c
            np.tanh(logits, out=logits)
            logits *= c
        for term in additive:
            logits += _cut(term, heads, qs, ks)
        if alibi is not None:  # in the inputs' dtype, as every backend adds it (ALIBI-1)
            logits += alibi.block(heads, qs, ks).astype(alibi_dtype)
        if blk_allowed is not None:
            np.copyto(logits, -np.inf, where=np.logical_not(blk_allowed))
        new_max = np.maximum(row_max, logits.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(new_max), new_max, 0.0).astype(q_blk.dtype, copy=False)
        logits -= shift
        np.exp(logits, out=logits)
        # rescale what was accumulated under the old maximum (exp(-inf) = 0 before any key)
        acc *= np.exp(row_max - shift)
        acc += np.matmul(logits, v1[..., ks, :])
        row_max = new_max
    total = acc[..., d_v:]
    np.divide(acc[..., :d_v], np.where(total != 0, total, 1.0), out=out)
    if row_lse is not None:  # LSE-1: m + log l, -inf for an empty row
        with np.errstate(divide="ignore"):
            np.add(row_max[..., 0], np.log(total[..., 0]), out=row_lse,
                   where=total[..., 0] != 0)
