"""Forward-pass mistakes of the NumPy backend, first part: scale, softmax axis, head layout,
precision, masks and biases, and the backends with a stale deviation."""

from __future__ import annotations

import numpy as np

from mhaspec.backends.algorithms import Batched

from .base import Broken


class WrongScale(Broken):
    """Scales logits by 1/d_k instead of 1/sqrt(d_k) (and squares a given scale)."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return super().attend(ops, q, k, v, allowed, additive,
                                  masks._replace(scale=masks.scale * masks.scale), lse)


class SoftmaxOverQueries(Broken):
    """Normalises over the query axis instead of the key axis."""

    class Ops(Broken.Ops):
        def max_last(self, x):
            return np.max(x, axis=-2, keepdims=True)

        def sum_last(self, x):
            return np.sum(x, axis=-2, keepdims=True)


class MaskPolarityFlipped(Broken):
    """Treats True in a boolean mask as 'blocked' (PyTorch nn.MultiheadAttention's convention)."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            return super().combine_masks(ops, len_q, len_k, like,
                                         None if mask is None else ~mask, key_padding_mask,
                                         causal)


class _SplitWrongOrder(Batched):
    def split(self, ops, x, num_heads):
        b, length, width = ops.shape(x)
        return np.transpose(x.reshape(b, length, width // num_heads, num_heads), (0, 3, 1, 2))

    def combine(self, ops, x):
        b, h, length, d = ops.shape(x)
        return np.transpose(x, (0, 2, 3, 1)).reshape(b, length, h * d)


class HeadsSplitWrongOrder(Broken):
    """Splits h*d as (d, h) instead of (h, d): heads take interleaved columns."""

    def __init__(self, name: str):
        super().__init__(name, _SplitWrongOrder())


class KeysReshapedWithQueryLength(Broken):
    """The source's 'efficient' form: reshapes K and V with the query length L_q."""

    class Kernel(Broken.Kernel):
        def mha(self, ops, query, key, value, p, num_heads, *rest):
            self.len_q = ops.shape(query)[1]
            return super().mha(ops, query, key, value, p, num_heads, *rest)

        def split(self, ops, x, num_heads):
            b, _, width = ops.shape(x)
            x = x.reshape(b, self.len_q, num_heads, width // num_heads)
            return np.transpose(x, (0, 2, 1, 3))


class SilentFloat16(Broken):
    """Computes every matmul in float16 and casts back: a float32 result with float16 accuracy."""

    class Ops(Broken.Ops):
        def matmul(self, a, b):
            return np.matmul(a.astype(np.float16), b.astype(np.float16)).astype(a.dtype)


class StaleDeviation(Broken):
    """Correct, but declares a deviation it does not have: reported as stale."""

    deviations = {"MASK-9": "fully masked rows give NaN (not true: this backend gives 0)"}


class StaleDeviationInFloat32(Broken):
    """Correct, but declares the same deviation in float32 only (``deviations_on``): stale there,
    while float64 must pass MASK-9 as usual."""

    deviations = StaleDeviation.deviations

    def deviations_on(self, device, dtype):
        return dict(self.deviations) if dtype == "float32" else {}


def _plain_attend(q, k, v, allowed, additive, scale, *, fill=-np.inf, subtract_max=True):
    """Textbook attention with none of ArrayBackend's guards (fully masked rows, overflow)."""
    logits = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    for term in additive:
        logits = logits + term
    if allowed is not None:
        logits = np.where(allowed, logits, np.asarray(fill, dtype=logits.dtype))
    if subtract_max:
        logits = logits - np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits)
    weights = e / np.sum(e, axis=-1, keepdims=True)
    return np.matmul(weights, v), weights


class ScaleFromDModel(Broken):
    """Multi-head attention scales by 1/sqrt(d_model) instead of 1/sqrt(d_k)."""

    def multi_head_attention(self, query, key, value, params, *, num_heads, scale=None, **kw):
        scale = 1.0 / np.sqrt(self.ops.shape(query)[-1]) if scale is None else scale
        return super().multi_head_attention(query, key, value, params, num_heads=num_heads,
                                            scale=scale, **kw)


class ScaleFromDv(Broken):
    """Scaled dot-product attention's default scale is 1/sqrt(d_v) instead of 1/sqrt(d_k)."""

    def scaled_dot_product_attention(self, q, k, v, *, scale=None, **kw):
        scale = 1.0 / np.sqrt(self.ops.shape(v)[-1]) if scale is None else scale
        return super().scaled_dot_product_attention(q, k, v, scale=scale, **kw)


class ScaleAfterSoftmax(Broken):
    """Applies the scale to the weights after the softmax instead of to the logits."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            _, weights, _ = super().attend(ops, q, k, v, allowed, additive,
                                           masks._replace(scale=1.0))
            weights = weights * masks.scale
            return np.matmul(weights, v), weights, None


class NoMaxSubtraction(Broken):
    """Softmax without subtracting the row maximum: exp overflows at large logits (NUM-4)."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return (*_plain_attend(q, k, v, allowed, additive, masks.scale, subtract_max=False),
                    None)


class SoftmaxThenMaskRenormalised(Broken):
    """Softmax over all keys ignoring the masks, then masked weights zeroed and rows renormalised."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            _, weights, _ = super().attend(ops, q, k, v, None, additive, masks)
            if allowed is not None:
                weights = np.where(allowed, weights, 0.0)
                total = np.sum(weights, axis=-1, keepdims=True)
                weights = weights / np.where(total != 0, total, 1.0)
            return np.matmul(weights, v), weights, None


class FiniteMaskValue(Broken):
    """Masks with -1e4 instead of -inf: masked keys leak weight at large logits, and fully masked
    rows average V."""

    class Ops(Broken.Ops):
        def ifill_masked(self, x, allowed):
            np.copyto(x, -1e4, where=np.logical_not(allowed))
            return x


class FiniteMaskValueZeroRows(FiniteMaskValue):
    """-1e4 instead of -inf, with fully masked rows zeroed explicitly: right on MASK-9, but masked
    keys still take the weight when every allowed logit of a row is below -1e4."""

    class Kernel(FiniteMaskValue.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, w, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            if allowed is not None:
                empty = ~np.broadcast_to(allowed, w.shape).any(axis=-1, keepdims=True)
                w = np.where(empty, 0, w).astype(w.dtype)
                out = np.matmul(w, v)
            return out, w, row_lse


class MaskFilledWithZero(Broken):
    """Fills masked logits with 0 (masked_fill(mask, 0)) instead of -inf."""

    class Ops(Broken.Ops):
        def ifill_masked(self, x, allowed):
            np.copyto(x, 0.0, where=np.logical_not(allowed))
            return x


class WeightsBeforeMasking(Broken):
    """Output is masked, but the returned weights are the softmax before masking."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, _, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            return out, super().attend(ops, q, k, v, None, additive, masks)[1], row_lse


class CausalAlignmentSwapped(Broken):
    """Treats causal="bottom_right" as "top_left"."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            causal = "top_left" if causal == "bottom_right" else causal
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, causal)


class CausalOffByOne(Broken):
    """Causal mask allows j < i (+ offset) instead of j <= i: the diagonal is masked."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            allowed = super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, None)
            if causal is None:
                return allowed
            offset = 0 if causal == "top_left" else len_k - len_q
            tri = np.arange(len_k)[None, :] < np.arange(len_q)[:, None] + offset
            return tri if allowed is None else allowed & tri


class KeyPaddingOnQueryAxis(Broken):
    """Reshapes the key padding mask to (B, 1, L, 1): it masks query rows instead of key columns
    (and fails to broadcast when L_q != L_k)."""

    class Kernel(Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            allowed = super().combine_masks(ops, len_q, len_k, like, mask, None, causal)
            if key_padding_mask is None:
                return allowed
            kpm = np.reshape(key_padding_mask, (-1, 1, len_k, 1))
            return kpm if allowed is None else allowed & kpm


class BiasIgnored(Broken):
    """Drops the additive bias."""

    class Kernel(Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, None, legacy_mask)


class BiasSubtracted(Broken):
    """Subtracts the additive bias instead of adding it."""

    class Kernel(Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, None if bias is None else -bias, legacy_mask)


class BiasBeforeScaling(Broken):
    """Adds the bias (and legacy mask) to Q K^T before scaling: softmax(scale * (Q K^T + bias))."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            scaled = [t * masks.scale for t in additive]
            return super().attend(ops, q, k, v, allowed, scaled, masks, lse)


class LegacyMaskPolarityFlipped(Broken):
    """Reads the legacy float mask as 1 = may attend: adds (1 - mask) * -1e9."""

    class Kernel(Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, bias, None if legacy_mask is None else 1 - legacy_mask)


class LegacyMaskIgnored(Broken):
    """Drops the legacy float mask."""

    class Kernel(Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, bias, None)


class FullyMaskedRowsUniform(Broken):
    """Fills masked logits with the dtype's most negative finite number (a common framework
    idiom): a fully masked row gets uniform weights, so its output is the mean of V."""

    class Ops(Broken.Ops):
        def ifill_masked(self, x, allowed):
            np.copyto(x, np.finfo(x.dtype).min, where=np.logical_not(allowed))
            return x


class MaskMeanOfVDeclaredBiasZero(FullyMaskedRowsUniform):
    """Declares MASK-9 (a fully masked row gives the mean of V, as Flax and Equinox do) and fills
    boolean-masked logits with the dtype's minimum, while a -inf bias row gives 0 (the guarded
    softmax): the mask and its -inf bias disagree on fully masked rows (MASK-11)."""

    deviations = {"MASK-9": "a fully masked row gives the mean of V (masked logits = finfo.min)"}


class FullyMaskedRowsNaN(Broken):
    """Textbook softmax with no guard: a fully masked row gives exp(-inf - -inf) = NaN."""

    class Kernel(Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            with np.errstate(invalid="ignore", divide="ignore"):
                return (*_plain_attend(q, k, v, allowed, additive, masks.scale), None)
