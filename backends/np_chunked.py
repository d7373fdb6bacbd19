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

Spec 1.2 (:func:`blockwise_attention`): per block the logits are soft-capped after the scale and
before bias and masks, ALiBi is added (:func:`positions.alibi_bias` on the block's rows and
columns), and the structural mask (segments, sequence lengths, cache padding, causal and the window
on positions) is built by :func:`positions.structural_allowed` for the block alone; key blocks
that the causal mask or the window leaves empty are skipped. Grouped key/value heads are indexed,
not repeated. The log-sum-exp of a row is ``m + log l`` (-inf when nothing was allowed).

The attention weights are never formed, so this backend does not claim the ``weights`` capability:
both operations return ``None`` for them. float16 inputs are computed in float32 and the result is
rounded to float16.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import positions as positions_
from ._base import CAPABILITIES
from ._generic import MaskArgs
from .algorithms import Batched
from ._validate import Features
from .np_backend import NumpyBackend

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
    sequence lengths and cache positions, with ``causal`` (compare positions) and ``window``
    ((left, right), None = unbounded) applied on them (SEG-1, WIN-1, CACHE-2); without positions
    ``causal`` and ``window`` are unused.
    """

    mask: np.ndarray | None = None
    key_padding_mask: np.ndarray | None = None
    causal_offset: int | None = None
    positions: positions_.Positions | None = None
    causal: bool = False
    window: tuple | None = None

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
                                                       window=self.window, rows=qs, cols=ks)
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


def block_allowed(ops, q, k, masks: MaskArgs):
    """The allowed keys of a call as a :class:`BlockMask` (or None: every key): ``masks.mask``
    where a spec 1.2 call's masks were folded into one, else the 1.1 masking arguments combined."""
    if isinstance(masks.mask, BlockMask):
        return masks.mask
    return ops._allowed(q, k, masks.mask, masks.key_padding_mask, masks.causal)


class Chunked(Batched):
    """The batched algorithm (MHA-2) with attention by blocks (:func:`blockwise_attention`)."""

    def attention(self, ops, q, k, v, masks: MaskArgs, lse: bool = False, sinks=None):
        """q (B, h, L_q, d_k), k (B, g, L_K, d_k), v (B, g, L_K, d_v) -> (out, None, lse or
        None); ``masks.mask`` a :class:`BlockMask` (spec 1.2 calls) or the 1.1 masking
        arguments; ``sinks`` (h,) or None (SINK-1, spec 1.3)."""
        allowed = block_allowed(ops, q, k, masks)
        out, row_lse = blockwise_attention(
            q, k, v, scale=masks.scale, allowed=allowed,
            additive=ops._additive(masks.bias, masks.legacy_mask), alibi=masks.alibi,
            softcap=masks.softcap, lse=bool(lse),
            blocks=ops.blocks_for(q, k, alibi=masks.alibi is not None), sinks=sinks)
        return out, None, row_lse


CHUNKED_ALGORITHM = Chunked()


class ChunkedNumpyBackend(NumpyBackend):
    """Batched projections, then attention by blocks with an online softmax (no weights).

    Spec 1.2: grouped key/value heads (k and v are not repeated), soft-capping, windows, ALiBi,
    segments and sequence lengths, the KV cache and the log-sum-exp, all without forming the
    (L_q, L_K) matrix: the structural mask and ALiBi are built per block from the call's
    :class:`~mhaspec.backends.positions.Positions`.
    """

    capabilities = CAPABILITIES - {"weights", "grad", "bias_grad"}

    def __init__(self, block_q: int | None = None, block_k: int | None = None):
        super().__init__(CHUNKED_ALGORITHM, name="numpy-chunked")
        self.block_q = block_q
        self.block_k = block_k

    def _combine_masks(self, len_q, len_k, like, mask, key_padding_mask, causal):
        if mask is None and key_padding_mask is None and causal is None:
            return None
        offset = None if causal is None else (0 if causal == "top_left" else len_k - len_q)
        return BlockMask(None if mask is None else np.asarray(mask), key_padding_mask, offset)

    def fold_features(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """A call's ``masks`` with every boolean condition in one :class:`BlockMask` (causal on
        positions when keys are removed by position, SEG-3, CACHE-2, WIN-1), ALiBi as an
        :class:`Alibi` and the soft-cap, and the present-cache index as NumPy: nothing of size
        L_q * L_K is built here."""
        pos = feats.positions
        if pos is None and (feats.window is not None or feats.slopes is not None):
            pos = positions_.token_positions(like.shape[0], len_q, len_k,
                                             alignment=feats.diagonal)
        len_all = feats.len_past + len_k
        if feats.structural:
            allowed = BlockMask(None if masks.mask is None else np.asarray(masks.mask),
                                masks.key_padding_mask, None, pos, masks.causal is not None,
                                feats.window)
        else:
            allowed = self._combine_masks(len_q, len_all, None, masks.mask,
                                          masks.key_padding_mask, masks.causal)
        alibi = None if feats.slopes is None else Alibi(feats.slopes, pos)
        index = _present_index(feats, len_k) if feats.cached else None
        return masks._replace(mask=allowed, key_padding_mask=None, causal=None,
                              softcap=feats.softcap, alibi=alibi), index

    # spec 1.3: sinks in the online softmax, the backward pass blockwise from the saved lse
    def _attention_with_sinks(self, q, k, v, masks: MaskArgs, lse: bool, sinks):
        """The sinks (h,) go into the online softmax (each row starts at its sink,
        :func:`blockwise_attention`), not in as one more key: the masks here are per block."""
        return self._algorithm.attention(self, q, k, v, masks, lse, sinks=sinks)

    def _attention_vjp(self, q, k, v, d_output, d_lse, masks, feats, bias_grad):
        from . import np_chunked_vjp  # it builds on this module

        return np_chunked_vjp.attention_vjp(self, q, k, v, d_output, d_lse, masks, feats)

    def blocks_for(self, q, k, *, alibi: bool = False) -> Blocks:
        """The blocks of a call; with ALiBi a quarter of :data:`BLOCK_ELEMENTS` logits in key
        blocks a quarter as long, since a block's bias is built in float64 (three temporaries of
        8 bytes per logit)."""
        block_k = self.block_k or (BLOCK_K // 4 if alibi else None)
        return choose_blocks(q.shape[-3] if q.ndim >= 3 else 1, q.shape[-2], k.shape[-2],
                             self.block_q, block_k,
                             elements=BLOCK_ELEMENTS // 4 if alibi else BLOCK_ELEMENTS)


def _present_index(feats: Features, len_k: int) -> np.ndarray | None:
    """The present-cache index of CACHE-1 (B, L_K), or None for a full cache."""
    if np.all(feats.past_lengths == feats.len_past):
        return None
    return positions_.present_index(feats.past_lengths, feats.len_past, len_k)


CHUNKED = ChunkedNumpyBackend()
