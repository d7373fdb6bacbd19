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

The kernel (blocks, block masks, the online softmax) is :mod:`.np_blockwise`; this module composes
it into a backend.
"""

from __future__ import annotations

import numpy as np

from . import np_chunked_vjp, positions as positions_
from ._base import CAPABILITIES
from ._generic import MaskArgs
from .feature_checks import Features
from .algorithms import Batched
from .np_backend import NumpyBackend
from .np_blockwise import (BLOCK_ELEMENTS, BLOCK_K, Alibi, BlockMask, Blocks,  # noqa: F401
                           blockwise_attention, choose_blocks)


class Chunked(Batched):
    """The batched algorithm (MHA-2) with attention by blocks (:func:`blockwise_attention`) and
    its masks kept per block; ``block_q`` / ``block_k`` fix the block sizes (None: chosen per
    call, :meth:`blocks_for`)."""

    def __init__(self, block_q: int | None = None, block_k: int | None = None):
        self.block_q = block_q
        self.block_k = block_k

    def attention(self, ops, q, k, v, masks: MaskArgs, lse: bool = False, sinks=None):
        """q (B, h, L_q, d_k), k (B, g, L_K, d_k), v (B, g, L_K, d_v) -> (out, None, lse or
        None); ``masks.mask`` a :class:`BlockMask` (spec 1.2 calls) or the 1.1 masking
        arguments; ``sinks`` (h,) or None (SINK-1, spec 1.3)."""
        allowed = self.block_allowed(ops, q, k, masks)
        out, row_lse = blockwise_attention(
            q, k, v, scale=masks.scale, allowed=allowed,
            additive=self.additive(ops, masks.bias, masks.legacy_mask), alibi=masks.alibi,
            softcap=masks.softcap, lse=bool(lse),
            blocks=self.blocks_for(q, k, alibi=masks.alibi is not None), sinks=sinks)
        return out, None, row_lse

    def attention_with_sinks(self, ops, q, k, v, masks: MaskArgs, lse: bool, sinks, run=None):
        """The sinks (h,) go into the online softmax (each row starts at its sink,
        :func:`blockwise_attention`), not in as one more key: the masks here are per block."""
        return self.attention(ops, q, k, v, masks, lse, sinks=sinks)

    def block_allowed(self, ops, q, k, masks: MaskArgs):
        """The allowed keys of a call as a :class:`BlockMask` (or None: every key):
        ``masks.mask`` where a spec 1.2 call's masks were folded into one, else the 1.1 masking
        arguments combined."""
        if isinstance(masks.mask, BlockMask):
            return masks.mask
        return self.allowed(ops, q, k, masks.mask, masks.key_padding_mask, masks.causal)

    def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
        if mask is None and key_padding_mask is None and causal is None:
            return None
        offset = None if causal is None else (0 if causal == "top_left" else len_k - len_q)
        return BlockMask(None if mask is None else np.asarray(mask), key_padding_mask, offset)

    def fold_features(self, ops, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """A call's ``masks`` with every boolean condition in one :class:`BlockMask` (causal on
        positions when keys are removed by position, SEG-3, CACHE-2, WIN-1), ALiBi as an
        :class:`Alibi` and the soft-cap, and the present-cache index as NumPy: nothing of size
        L_q * L_K is built here."""
        pos = feats.positions
        if pos is None and feats.needs_positions:
            pos = positions_.token_positions(like.shape[0], len_q, len_k,
                                             alignment=feats.diagonal)
        len_all = feats.len_past + len_k
        if feats.structural:
            allowed = BlockMask(None if masks.mask is None else np.asarray(masks.mask),
                                masks.key_padding_mask, None, pos, masks.causal is not None,
                                feats.window, feats.chunk)
        else:
            allowed = self.combine_masks(ops, len_q, len_all, None, masks.mask,
                                         masks.key_padding_mask, masks.causal)
        alibi = None if feats.slopes is None else Alibi(feats.slopes, pos)
        index = _present_index(feats, len_k) if feats.cached else None
        return masks._replace(mask=allowed, key_padding_mask=None, causal=None,
                              softcap=feats.softcap, alibi=alibi), index

    def blocks_for(self, q, k, *, alibi: bool = False) -> Blocks:
        """The blocks of a call; with ALiBi a quarter of :data:`BLOCK_ELEMENTS` logits in key
        blocks a quarter as long, since a block's bias is built in float64 (three temporaries of
        8 bytes per logit)."""
        block_k = self.block_k or (BLOCK_K // 4 if alibi else None)
        return choose_blocks(q.shape[-3] if q.ndim >= 3 else 1, q.shape[-2], k.shape[-2],
                             self.block_q, block_k,
                             elements=BLOCK_ELEMENTS // 4 if alibi else BLOCK_ELEMENTS)


class ChunkedNumpyBackend(NumpyBackend):
    """Batched projections, then attention by blocks with an online softmax (no weights): the
    NumPy operations composed with :class:`Chunked`, and the blockwise backward pass
    (:mod:`.np_chunked_vjp`).

    Spec 1.2: grouped key/value heads (k and v are not repeated), soft-capping, windows, ALiBi,
    segments and sequence lengths, the KV cache and the log-sum-exp, all without forming the
    (L_q, L_K) matrix: the structural mask and ALiBi are built per block from the call's
    :class:`~mhaspec.backends.positions.Positions`.
    """

    capabilities = CAPABILITIES - {"weights", "grad", "bias_grad"}

    def __init__(self, block_q: int | None = None, block_k: int | None = None):
        super().__init__(Chunked(block_q, block_k), name="numpy-chunked")
        self.backward = np_chunked_vjp.attention_vjp
        self.block_q = block_q
        self.block_k = block_k

    def blocks_for(self, q, k, *, alibi: bool = False) -> Blocks:
        """The blocks of a call (:meth:`Chunked.blocks_for`)."""
        return self.algorithm_object.blocks_for(q, k, alibi=alibi)


def _present_index(feats: Features, len_k: int) -> np.ndarray | None:
    """The present-cache index of CACHE-1 (B, L_K), or None for a full cache."""
    if np.all(feats.past_lengths == feats.len_past):
        return None
    return positions_.present_index(feats.past_lengths, feats.len_past, len_k)


CHUNKED = ChunkedNumpyBackend()
