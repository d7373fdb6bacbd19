"""A chunked, online-softmax ("flash-style") NumPy backend whose memory does not grow with L_q * L_k.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

Projections, head split and validation are those of the batched NumPy backend. Attention takes
one batch item and a group of heads at a time (one head when its (L_q, L_k) logits exceed a block),
the queries in blocks of ``block_q`` and the keys in blocks of ``block_k``, keeping per query row a
running maximum ``m``, a running sum ``l`` of ``exp(logit - m)`` and an unnormalised output
``acc``; when a block raises the maximum, ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)``.
The output is ``acc / l`` (0 where the row's allowed set is empty, MASK-9); ``l`` comes out of
the PV matmul as the product with a column of ones appended to v. Only one block of at most
:data:`BLOCK_ELEMENTS` logits exists at a time, and masks are cut into blocks as needed: the causal
mask is never built in full, and key blocks a causal mask blocks entirely are skipped. A block
spans whole heads rather than all heads at once, so its matrix products are few and large (one
BLAS call per head and block: many small calls cost more than their arithmetic when the cores
are busy).

The attention weights are never formed, so this backend does not claim the ``weights`` capability:
both operations return ``None`` for them. float16 inputs are computed in float32 and the result is
rounded to float16.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._base import CAPABILITIES
from ._generic import Algorithm
from .np_backend import NumpyBackend

#: Elements of one logits block (g*block_q*block_k for g heads): 4M, i.e. 16 MiB in float32.
BLOCK_ELEMENTS = 1 << 22
#: The default key block: the longest row of logits a block holds.
BLOCK_K = 4096


class _LazyAllowed(NamedTuple):
    """The boolean masks of a call, kept apart so that a block of them can be built on demand.

    mask broadcastable to (B, h, L_q, L_k) or None; key_padding_mask (B, L_k) or None; causal
    ``None``, or the offset ``L_k - L_q`` ("bottom_right") / 0 ("top_left"): key j is allowed for
    query i iff ``j <= i + offset``.
    """

    mask: np.ndarray | None
    key_padding_mask: np.ndarray | None
    causal_offset: int | None

    def block(self, heads: tuple, qs: slice, ks: slice):
        """The allowed mask for the lead index ``heads`` (see :func:`_cut`), queries ``qs`` and keys
        ``ks``, broadcastable to (g, len(qs), len(ks)), or None when nothing in it is masked."""
        allowed = None if self.mask is None else _cut(self.mask, heads, qs, ks)
        if self.key_padding_mask is not None:
            kpm = _cut(self.key_padding_mask[:, None, None, :], heads, qs, ks)
            allowed = kpm if allowed is None else allowed & kpm
        if self.causal_offset is not None:
            i = np.arange(qs.start, qs.stop)[:, None]
            j = np.arange(ks.start, ks.stop)[None, :]
            if ks.stop - 1 > qs.start + self.causal_offset:  # else the whole block is allowed
                tri = j <= i + self.causal_offset
                allowed = tri if allowed is None else allowed & tri
        return allowed

    def skips(self, qs: slice, ks: slice) -> bool:
        """True when the causal mask blocks every pair of the block."""
        return self.causal_offset is not None and ks.start > qs.stop - 1 + self.causal_offset


def _cut(m, heads: tuple, qs: slice, ks: slice):
    """Block (heads, qs, ks) of an array broadcastable to (..., L_q, L_k); ``heads`` indexes the
    lead axes (integers, then a slice of the last one). Size-1 axes stay whole."""
    m = np.asarray(m)
    m = m.reshape((1,) * (len(heads) + 2 - m.ndim) + m.shape)
    index = tuple((slice(None) if isinstance(i, slice) else 0) if n == 1 else i
                  for i, n in zip(heads, m.shape))
    return m[index + (qs if m.shape[-2] > 1 else slice(None), ks if m.shape[-1] > 1 else slice(None))]


class ChunkedNumpyBackend(NumpyBackend):
    """Batched projections, then attention by key blocks with an online softmax (no weights)."""

    capabilities = CAPABILITIES - {"weights", "grad"}

    def __init__(self, block_q: int | None = None, block_k: int | None = None):
        super().__init__(Algorithm.BATCHED, name="numpy-chunked")
        self.block_q = block_q
        self.block_k = block_k

    def _combine_masks(self, len_q, len_k, like, mask, key_padding_mask, causal):
        if mask is None and key_padding_mask is None and causal is None:
            return None
        offset = None if causal is None else (0 if causal == "top_left" else len_k - len_q)
        return _LazyAllowed(None if mask is None else np.asarray(mask), key_padding_mask, offset)

    def _blocks(self, heads: int, len_q: int, len_k: int) -> tuple[int, int, int]:
        """(block_q, block_k, heads per block) for ``heads`` heads of (L_q, L_k) logits."""
        block_k = self.block_k or min(len_k, BLOCK_K)
        block_q = self.block_q or max(1, min(len_q, BLOCK_ELEMENTS // max(1, block_k)))
        group = max(1, min(heads, BLOCK_ELEMENTS // max(1, block_q * block_k)))
        return block_q, block_k, group

    def _attend(self, q, k, v, allowed, additive, scale):
        """q (..., L_q, d_k), k (..., L_k, d_k), v (..., L_k, d_v) -> (out (..., L_q, d_v), None)."""
        out_dtype = q.dtype
        work = np.promote_types(out_dtype, np.float32)
        len_q, len_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if len_k == 0:
            return np.zeros((*lead, len_q, d_v), dtype=out_dtype), None
        rows = lead or (1,)  # 2-D inputs: one lead item
        q = np.broadcast_to(np.asarray(q, dtype=work), (*rows, len_q, q.shape[-1]))
        k = np.broadcast_to(np.asarray(k, dtype=work), (*rows, len_k, k.shape[-1]))
        k_t = np.swapaxes(k, -1, -2)
        # a column of ones after v makes the PV matmul also return the row sums of the exponentials
        v1 = np.empty((*rows, len_k, d_v + 1), dtype=work)
        v1[..., :d_v] = v
        v1[..., d_v] = 1.0
        additive = [np.asarray(t, dtype=work) for t in additive]
        out = np.empty((*rows, len_q, d_v), dtype=work)
        block_q, block_k, group = self._blocks(rows[-1], len_q, len_k)
        for outer in np.ndindex(*rows[:-1]):
            for h0 in range(0, rows[-1], group):
                heads = (*outer, slice(h0, h0 + group))
                for q0 in range(0, len_q, block_q):
                    qs = slice(q0, min(q0 + block_q, len_q))
                    _attend_rows(q[heads][..., qs, :] * work.type(scale), k_t[heads], v1[heads],
                                 allowed, additive, heads, qs, block_k, out[heads][..., qs, :])
        out = out if lead else out[0]
        return out.astype(out_dtype, copy=False), None


def _attend_rows(q_blk, k_t, v1, allowed, additive, heads: tuple, qs: slice, block_k: int, out):
    """Queries ``qs`` of the heads ``heads`` (see :func:`_cut`), key block by key block: q_blk
    (g, len(qs), d_k) already scaled, k_t (g, d_k, L_k), v1 (g, L_k, d_v + 1) (v and a column of
    ones); ``allowed`` a :class:`_LazyAllowed` or None, ``additive`` the terms added to the
    logits. Writes out (g, len(qs), d_v)."""
    len_k, d_v = k_t.shape[-1], out.shape[-1]
    row_max = np.full((*q_blk.shape[:-1], 1), -np.inf, dtype=q_blk.dtype)
    acc = np.zeros((*q_blk.shape[:-1], d_v + 1), dtype=q_blk.dtype)  # [sum_j p v_j | sum_j p]
    for k0 in range(0, len_k, block_k):
        ks = slice(k0, min(k0 + block_k, len_k))
        if allowed is not None and allowed.skips(qs, ks):
            continue
        logits = np.matmul(q_blk, k_t[..., ks])
        for term in additive:
            logits += _cut(term, heads, qs, ks)
        blk_allowed = None if allowed is None else allowed.block(heads, qs, ks)
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


CHUNKED = ChunkedNumpyBackend()
