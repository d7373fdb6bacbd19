"""Forward-pass mistakes of the NumPy backend, second part: combining heads, projections,
precision, special values, empty and tiny inputs, and fills that differ with a bias."""

from __future__ import annotations

import numpy as np

from mhaspec.backends.algorithms import Batched

from .base import Broken


def _round_mantissa(x, bits: int):
    """``x`` rounded to ``bits`` explicit mantissa bits (round to nearest), in ``x``'s dtype."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), e).astype(x.dtype)


class CombineHeadsWithoutTranspose(Broken):
    """Combines heads by reshaping (B, h, L, d) straight to (B, L, h*d), without the transpose."""

    def __init__(self, name: str):
        super().__init__(name, _CombineWithoutTranspose())


class _CombineWithoutTranspose(Batched):
    def combine(self, ops, x):
        b, h, length, d = ops.shape(x)
        return np.reshape(x, (b, length, h * d))


class HeadsAveragedAfterOutputBlocks(Broken):
    """Projects each head by its block of W_o and averages the heads instead of summing them."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, num_heads, *rest):
            out, *rest = super().mha(ops, query, key, value, p, num_heads, *rest)
            b_o = 0 if p.b_o is None else p.b_o
            return ((out - b_o) / num_heads + b_o, *rest)


class MissingOutputBias(Broken):
    """Never adds the output projection's bias b_o."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            return super().mha(ops, query, key, value, p._replace(b_o=None), *rest)


class KeyBiasUsedForQuery(Broken):
    """Adds b_k to the query projection instead of b_q."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            return super().mha(ops, query, key, value, p._replace(b_q=p.b_k), *rest)


class TransposedQueryWeight(Broken):
    """Uses W_q^T (an (out, in) layout read as (in, out)) where W_q is square."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            w_q = p.w_q.T if p.w_q.shape[0] == p.w_q.shape[1] else p.w_q
            return super().mha(ops, query, key, value, p._replace(w_q=w_q), *rest)


class OutputProjectionSkipped(Broken):
    """Returns the concatenated heads (+ b_o) without multiplying by W_o where the widths allow."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            if p.w_o.shape[0] == p.w_o.shape[1]:
                p = p._replace(w_o=np.eye(p.w_o.shape[0], dtype=p.w_o.dtype))
            return super().mha(ops, query, key, value, p, *rest)


class SilentBfloat16(Broken):
    """Rounds every matmul's operands to bfloat16 (8 significant bits), computes in float32 and
    casts back: float64 / float32 results with bfloat16 accuracy."""

    class Ops(Broken.Ops):
        def matmul(self, a, b):
            low = (_round_mantissa(t.astype(np.float32), 7) for t in (a, b))
            return np.matmul(*low).astype(np.result_type(a, b))


class TF32Rounding(Broken):
    """Rounds every matmul's result to 10 mantissa bits (TF32-like), in float32 and float64."""

    class Ops(Broken.Ops):
        def matmul(self, a, b):
            return _round_mantissa(np.matmul(a, b), 10)


class SoftmaxOverBatch(Broken):
    """Normalises over the batch axis (axis 0) instead of the key axis."""

    class Ops(Broken.Ops):
        def max_last(self, x):
            return np.max(x, axis=0, keepdims=True)

        def sum_last(self, x):
            return np.sum(x, axis=0, keepdims=True)


class WeightsAveragedOverHeads(Broken):
    """Returns the head-averaged weights (nn.MultiheadAttention's default) for every head."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            out, weights, *rest = super().mha(ops, query, key, value, p, *rest)
            averaged = np.broadcast_to(weights.mean(axis=1, keepdims=True), weights.shape).copy()
            return (out, averaged, *rest)


class BooleanMaskAddedAsMinusInf(Broken):
    """Applies boolean masks by adding -inf (attn_mask.masked_fill(~m, -inf) then +=): a NaN key
    behind the mask makes its logit NaN + -inf = NaN, which leaks (PyTorch issue 101967)."""

    class Ops(Broken.Ops):
        def ifill_masked(self, x, allowed):
            return np.add(x, np.where(allowed, 0.0, -np.inf).astype(x.dtype), out=x)


class OutputNanToNum(Broken):
    """Sanitises the result with nan_to_num: NaN inputs give finite garbage instead of NaN."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, w, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            return np.nan_to_num(out), np.nan_to_num(w), row_lse


class EmptyKeysRejected(Broken):
    """Takes the row maximum with an empty reduction: L_k = 0 raises instead of giving zeros."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            logits = np.matmul(q, np.swapaxes(k, -1, -2))
            np.max(logits, axis=-1)  # ValueError: zero-size array to reduction operation
            return super().attend(ops, q, k, v, allowed, additive, masks, lse)


class TinyQueriesTreatedAsPadding(Broken):
    """Treats query rows below the smallest normal number as padding and zeroes their output (a
    "skip empty rows" shortcut): subnormal queries must still attend (their logits are ~0)."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, w, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            pad = np.max(np.abs(q), axis=-1, keepdims=True) < np.finfo(q.dtype).tiny
            return (np.where(pad, 0, out).astype(out.dtype), np.where(pad, 0, w).astype(w.dtype),
                    row_lse)



class Float32Only(Broken):
    """Supports float32 alone: float64 is required (NUM-1), so silently not claiming it fails."""

    def dtypes(self, device):
        return ("float32",)


class LegacyOffsetMinus2e9(Broken):
    """Uses -2e9 as the legacy offset ("any large number will do"): not the source form."""

    class Kernel(Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            terms = [] if bias is None else [bias]
            return terms if legacy_mask is None else [*terms, legacy_mask * -2e9]


class FusedProjectionWhenKeyIsValue(Broken):
    """Tests only ``key is value`` before taking the fused [W_q | W_k | W_v] projection of the
    query array: with encoder memory as key and value, keys and values come from the query."""

    def __init__(self, name: str):
        super().__init__(name, _FusedWhenKeyIsValue())


class _FusedWhenKeyIsValue(Batched):
    def _project_qkv(self, ops, query, key, value, p):
        if key is value:
            return super()._project_qkv(ops, query, query, query, p)
        return super()._project_qkv(ops, query, key, value, p)

class Float64ThroughFloat32(Broken):
    """Rounds the scale through float32 in every dtype (ONNX Runtime's float64 Attention does):
    float64 results with errors ~1e-8, float32's size."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return super().attend(ops, q, k, v, allowed, additive,
                                  masks._replace(scale=float(np.float32(masks.scale))), lse)


class BiasMergedWithFinfoMin(Broken):
    """Merges the masks into a given bias as ``where(allowed, bias, finfo.min)`` (a fill some
    libraries use when a bias is present; without a bias, -inf and the guarded softmax): a fully
    masked row gets uniform weights, the mean of V, only when a bias is present (MASK-9)."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            if not additive or allowed is None:
                return super().attend(ops, q, k, v, allowed, additive, masks, lse)
            merged = np.where(allowed, sum(additive), np.finfo(q.dtype).min).astype(q.dtype)
            return super().attend(ops, q, k, v, None, [merged], masks, lse)


class CausalSkippedForOneQuery(Broken):
    """Leaves out the causal mask when there is one query ("decoding: the query is the last
    position"): right bottom-right, but top-left's one query must see key 0 only (MASK-6)."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask,
                                         None if len_q == 1 else causal)


class KeyPaddingAsFinfoMinBias(Broken):
    """Turns ``key_padding_mask`` into an additive finfo.min at padded keys (an extended
    attention mask): a batch item whose keys are all padded gets the mean of V, not 0 (MASK-9)."""

    def _with_padding(self, like, bias, key_padding_mask):
        if key_padding_mask is None:
            return bias
        fill = np.where(np.asarray(key_padding_mask)[:, None, None, :], 0.0,
                        np.finfo(like.dtype).min).astype(like.dtype)
        return fill if bias is None else bias + fill

    def scaled_dot_product_attention(self, q, k, v, *, key_padding_mask=None, bias=None, **kw):
        return super().scaled_dot_product_attention(
            q, k, v, bias=self._with_padding(q, bias, key_padding_mask), **kw)

    def multi_head_attention(self, query, key, value, params, *, key_padding_mask=None, bias=None,
                             **kw):
        return super().multi_head_attention(
            query, key, value, params, bias=self._with_padding(query, bias, key_padding_mask), **kw)


class Float32SoftmaxInFloat64(Broken):
    """Computes the attention (logits, softmax, weights times V) in float32 whatever the input
    dtype and casts back: float64 results with float32 accuracy; float32 is right."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            low = [np.asarray(t).astype(np.float32) for t in additive]
            out, w, row_lse = super().attend(ops, q.astype(np.float32), k.astype(np.float32),
                                             v.astype(np.float32), allowed, low, masks, lse)
            return out.astype(q.dtype), w.astype(q.dtype), \
                None if row_lse is None else row_lse.astype(q.dtype)


class ValueWidthMustEqualKeyWidth(Broken):
    """Refuses d_v != d_k (a kernel with one head width): every case with other widths raises."""

    def scaled_dot_product_attention(self, q, k, v, **kw):
        if v.shape[-1] != q.shape[-1]:
            raise ValueError(f"d_v ({v.shape[-1]}) must equal d_k ({q.shape[-1]})")
        return super().scaled_dot_product_attention(q, k, v, **kw)

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            if v.shape[-1] != q.shape[-1]:
                raise ValueError(f"d_v ({v.shape[-1]}) must equal d_k ({q.shape[-1]})")
            return super().attend(ops, q, k, v, allowed, additive, masks, lse)
