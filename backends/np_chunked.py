"""A chunked, online-softmax ("flash-style") NumPy backend whose memory does not grow with L_q * L_k.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

Projections, head split and validation are those of the batched NumPy backend. Attention walks the
keys in blocks of ``block_k`` (and the queries in blocks of ``block_q``) keeping, per query row, a
running maximum ``m``, a running sum ``l`` of ``exp(logit - m)`` and an unnormalised output
``acc``; when a block raises the maximum, ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)``.
The output is ``acc / l`` (0 where the row's allowed set is empty, MASK-9); ``l`` comes out of
the PV matmul as the product with a column of ones appended to v. Only one
(B, h, block_q, block_k) block of logits exists at a time, and masks are cut into blocks as needed:
the causal mask is never built in full, and key blocks a causal mask blocks entirely are skipped.

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

#: Elements of one logits block (B*h*block_q*block_k): 4M, i.e. 16 MiB in float32.
BLOCK_ELEMENTS = 1 << 22


class _LazyAllowed(NamedTuple):
    """The boolean masks of a call, kept apart so that a block of them can be built on demand.

    mask broadcastable to (B, h, L_q, L_k) or None; key_padding_mask (B, L_k) or None; causal
    ``None``, or the offset ``L_k - L_q`` ("bottom_right") / 0 ("top_left"): key j is allowed for
    query i iff ``j <= i + offset``.
    """

    mask: np.ndarray | None
    key_padding_mask: np.ndarray | None
    causal_offset: int | None

    def block(self, qs: slice, ks: slice):
        """The allowed mask for queries ``qs`` and keys ``ks``, broadcastable to
        (B, h, len(qs), len(ks)), or None when nothing in the block is masked."""
        allowed = None if self.mask is None else _cut(self.mask, qs, ks)
        if self.key_padding_mask is not None:
            kpm = self.key_padding_mask[:, None, None, ks]
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


def _cut(m, qs: slice, ks: slice):
    """Block (qs, ks) of an array broadcastable to (..., L_q, L_k); size-1 axes stay whole."""
    if m.ndim == 1:
        return m[ks] if m.shape[0] > 1 else m
    return m[..., qs if m.shape[-2] > 1 else slice(None), ks if m.shape[-1] > 1 else slice(None)]


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

    def _blocks(self, batch_heads: int, len_q: int, len_k: int) -> tuple[int, int]:
        block_k = self.block_k or min(len_k, 512)
        block_q = self.block_q or max(1, min(len_q, BLOCK_ELEMENTS // max(1, batch_heads * block_k)))
        return block_q, block_k

    def _attend(self, q, k, v, allowed, additive, scale):
        """q (..., L_q, d_k), k (..., L_k, d_k), v (..., L_k, d_v) -> (out (..., L_q, d_v), None)."""
        out_dtype = q.dtype
        work = np.promote_types(out_dtype, np.float32)
        lead, len_q, len_k, d_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
        lead = np.broadcast_shapes(lead, k.shape[:-2], v.shape[:-2])
        if len_k == 0:
            return np.zeros((*lead, len_q, d_v), dtype=out_dtype), None
        # a column of ones after v makes the PV matmul also return the row sums of the exponentials
        q = np.asarray(q, dtype=work)
        k_t = np.swapaxes(np.asarray(k, dtype=work), -1, -2)
        v1 = np.empty((*lead, len_k, d_v + 1), dtype=work)
        v1[..., :d_v] = v
        v1[..., d_v] = 1.0
        additive = [np.asarray(t, dtype=work) for t in additive]
        out = np.empty((*lead, len_q, d_v), dtype=work)
        block_q, block_k = self._blocks(int(np.prod(lead, dtype=np.int64)), len_q, len_k)
        for q0 in range(0, len_q, block_q):
            qs = slice(q0, min(q0 + block_q, len_q))
            q_blk = q[..., qs, :]
            row_max = np.full((*lead, qs.stop - qs.start, 1), -np.inf, dtype=work)
            acc = np.zeros((*lead, qs.stop - qs.start, d_v + 1), dtype=work)  # [sum_j p v_j | sum_j p]
            for k0 in range(0, len_k, block_k):
                ks = slice(k0, min(k0 + block_k, len_k))
                if allowed is not None and allowed.skips(qs, ks):
                    continue
                logits = np.matmul(q_blk, k_t[..., ks])
                logits *= scale
                for term in additive:
                    logits += _cut(term, qs, ks)
                blk_allowed = None if allowed is None else allowed.block(qs, ks)
                if blk_allowed is not None:
                    np.copyto(logits, -np.inf, where=np.logical_not(blk_allowed))
                new_max = np.maximum(row_max, logits.max(axis=-1, keepdims=True))
                shift = np.where(np.isfinite(new_max), new_max, 0.0).astype(work, copy=False)
                logits -= shift
                np.exp(logits, out=logits)
                # rescale what was accumulated under the old maximum (exp(-inf) = 0 before any key)
                acc *= np.exp(row_max - shift)
                acc += np.matmul(logits, v1[..., ks, :])
                row_max = new_max
            total = acc[..., d_v:]
            np.divide(acc[..., :d_v], np.where(total != 0, total, 1.0), out=out[..., qs, :])
        return out.astype(out_dtype, copy=False), None


CHUNKED = ChunkedNumpyBackend()
