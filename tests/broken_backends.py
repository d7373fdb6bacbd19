"""Plausible wrong implementations of multi-head attention: the suite must reject every one.

Each is the NumPy backend with one mistake, loaded by the tests through
``--backend broken_backends:<NAME>`` exactly as a third-party backend would be. ``EXPECTED`` names
the clause(s) each must fail; the tests assert the suite reports at least one of them as failing.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends.algorithms import Batched, PerHead
from mhaspec.backends.np_backend import NumpyBackend, NumpyOps
from mhaspec.spec import oracle, oracle_serving, oracle_vjp
from oracle_backend import OracleBackend


class _Broken(NumpyBackend):
    """The NumPy backend composed of ``Ops`` (NumPy's operations, or a subclass with a mistake)
    and ``Kernel`` (the batched algorithm, or a subclass with a mistake), or of ``variant``."""

    Kernel = Batched
    Ops = NumpyOps

    def __init__(self, name: str, variant=None):
        super().__init__(self.Kernel() if variant is None else variant, name=name,
                         ops=self.Ops())


class WrongScale(_Broken):
    """Scales logits by 1/d_k instead of 1/sqrt(d_k) (and squares a given scale)."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return super().attend(ops, q, k, v, allowed, additive,
                                  masks._replace(scale=masks.scale * masks.scale), lse)


class SoftmaxOverQueries(_Broken):
    """Normalises over the query axis instead of the key axis."""

    class Ops(_Broken.Ops):
        def max_last(self, x):
            return np.max(x, axis=-2, keepdims=True)

        def sum_last(self, x):
            return np.sum(x, axis=-2, keepdims=True)


class MaskPolarityFlipped(_Broken):
    """Treats True in a boolean mask as 'blocked' (PyTorch nn.MultiheadAttention's convention)."""

    class Kernel(_Broken.Kernel):
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


class HeadsSplitWrongOrder(_Broken):
    """Splits h*d as (d, h) instead of (h, d): heads take interleaved columns."""

    def __init__(self, name: str):
        super().__init__(name, _SplitWrongOrder())


class KeysReshapedWithQueryLength(_Broken):
    """The source's 'efficient' form: reshapes K and V with the query length L_q."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, num_heads, *rest):
            self.len_q = ops.shape(query)[1]
            return super().mha(ops, query, key, value, p, num_heads, *rest)

        def split(self, ops, x, num_heads):
            b, _, width = ops.shape(x)
            x = x.reshape(b, self.len_q, num_heads, width // num_heads)
            return np.transpose(x, (0, 2, 1, 3))


class SilentFloat16(_Broken):
    """Computes every matmul in float16 and casts back: a float32 result with float16 accuracy."""

    class Ops(_Broken.Ops):
        def matmul(self, a, b):
            return np.matmul(a.astype(np.float16), b.astype(np.float16)).astype(a.dtype)


class StaleDeviation(_Broken):
    """Correct, but declares a deviation it does not have: reported as stale."""

    deviations = {"MASK-9": "fully masked rows give NaN (not true: this backend gives 0)"}


class StaleDeviationInFloat32(_Broken):
    """Correct, but declares the same deviation in float32 only (``deviations_on``): stale there,
    while float64 must pass MASK-9 as usual."""

    deviations = StaleDeviation.deviations

    def deviations_on(self, device, dtype):
        return dict(self.deviations) if dtype == "float32" else {}


def _round_mantissa(x, bits: int):
    """``x`` rounded to ``bits`` explicit mantissa bits (round to nearest), in ``x``'s dtype."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), e).astype(x.dtype)


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


class ScaleFromDModel(_Broken):
    """Multi-head attention scales by 1/sqrt(d_model) instead of 1/sqrt(d_k)."""

    def multi_head_attention(self, query, key, value, params, *, num_heads, scale=None, **kw):
        scale = 1.0 / np.sqrt(self.ops.shape(query)[-1]) if scale is None else scale
        return super().multi_head_attention(query, key, value, params, num_heads=num_heads,
                                            scale=scale, **kw)


class ScaleFromDv(_Broken):
    """Scaled dot-product attention's default scale is 1/sqrt(d_v) instead of 1/sqrt(d_k)."""

    def scaled_dot_product_attention(self, q, k, v, *, scale=None, **kw):
        scale = 1.0 / np.sqrt(self.ops.shape(v)[-1]) if scale is None else scale
        return super().scaled_dot_product_attention(q, k, v, scale=scale, **kw)


class ScaleAfterSoftmax(_Broken):
    """Applies the scale to the weights after the softmax instead of to the logits."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            _, weights, _ = super().attend(ops, q, k, v, allowed, additive,
                                           masks._replace(scale=1.0))
            weights = weights * masks.scale
            return np.matmul(weights, v), weights, None


class NoMaxSubtraction(_Broken):
    """Softmax without subtracting the row maximum: exp overflows at large logits (NUM-4)."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return (*_plain_attend(q, k, v, allowed, additive, masks.scale, subtract_max=False),
                    None)


class SoftmaxThenMaskRenormalised(_Broken):
    """Softmax over all keys ignoring the masks, then masked weights zeroed and rows renormalised."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            _, weights, _ = super().attend(ops, q, k, v, None, additive, masks)
            if allowed is not None:
                weights = np.where(allowed, weights, 0.0)
                total = np.sum(weights, axis=-1, keepdims=True)
                weights = weights / np.where(total != 0, total, 1.0)
            return np.matmul(weights, v), weights, None


class FiniteMaskValue(_Broken):
    """Masks with -1e4 instead of -inf: masked keys leak weight at large logits, and fully masked
    rows average V."""

    class Ops(_Broken.Ops):
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


class MaskFilledWithZero(_Broken):
    """Fills masked logits with 0 (masked_fill(mask, 0)) instead of -inf."""

    class Ops(_Broken.Ops):
        def ifill_masked(self, x, allowed):
            np.copyto(x, 0.0, where=np.logical_not(allowed))
            return x


class WeightsBeforeMasking(_Broken):
    """Output is masked, but the returned weights are the softmax before masking."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, _, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            return out, super().attend(ops, q, k, v, None, additive, masks)[1], row_lse


class CausalAlignmentSwapped(_Broken):
    """Treats causal="bottom_right" as "top_left"."""

    class Kernel(_Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            causal = "top_left" if causal == "bottom_right" else causal
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, causal)


class CausalOffByOne(_Broken):
    """Causal mask allows j < i (+ offset) instead of j <= i: the diagonal is masked."""

    class Kernel(_Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            allowed = super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, None)
            if causal is None:
                return allowed
            offset = 0 if causal == "top_left" else len_k - len_q
            tri = np.arange(len_k)[None, :] < np.arange(len_q)[:, None] + offset
            return tri if allowed is None else allowed & tri


class KeyPaddingOnQueryAxis(_Broken):
    """Reshapes the key padding mask to (B, 1, L, 1): it masks query rows instead of key columns
    (and fails to broadcast when L_q != L_k)."""

    class Kernel(_Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            allowed = super().combine_masks(ops, len_q, len_k, like, mask, None, causal)
            if key_padding_mask is None:
                return allowed
            kpm = np.reshape(key_padding_mask, (-1, 1, len_k, 1))
            return kpm if allowed is None else allowed & kpm


class BiasIgnored(_Broken):
    """Drops the additive bias."""

    class Kernel(_Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, None, legacy_mask)


class BiasSubtracted(_Broken):
    """Subtracts the additive bias instead of adding it."""

    class Kernel(_Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, None if bias is None else -bias, legacy_mask)


class BiasBeforeScaling(_Broken):
    """Adds the bias (and legacy mask) to Q K^T before scaling: softmax(scale * (Q K^T + bias))."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            scaled = [t * masks.scale for t in additive]
            return super().attend(ops, q, k, v, allowed, scaled, masks, lse)


class LegacyMaskPolarityFlipped(_Broken):
    """Reads the legacy float mask as 1 = may attend: adds (1 - mask) * -1e9."""

    class Kernel(_Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, bias, None if legacy_mask is None else 1 - legacy_mask)


class LegacyMaskIgnored(_Broken):
    """Drops the legacy float mask."""

    class Kernel(_Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            return super().additive(ops, bias, None)


class FullyMaskedRowsUniform(_Broken):
    """Fills masked logits with the dtype's most negative finite number (a common framework
    idiom): a fully masked row gets uniform weights, so its output is the mean of V."""

    class Ops(_Broken.Ops):
        def ifill_masked(self, x, allowed):
            np.copyto(x, np.finfo(x.dtype).min, where=np.logical_not(allowed))
            return x


class MaskMeanOfVDeclaredBiasZero(FullyMaskedRowsUniform):
    """Declares MASK-9 (a fully masked row gives the mean of V, as Flax and Equinox do) and fills
    boolean-masked logits with the dtype's minimum, while a -inf bias row gives 0 (the guarded
    softmax): the mask and its -inf bias disagree on fully masked rows (MASK-11)."""

    deviations = {"MASK-9": "a fully masked row gives the mean of V (masked logits = finfo.min)"}


class FullyMaskedRowsNaN(_Broken):
    """Textbook softmax with no guard: a fully masked row gives exp(-inf - -inf) = NaN."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            with np.errstate(invalid="ignore", divide="ignore"):
                return (*_plain_attend(q, k, v, allowed, additive, masks.scale), None)


class CombineHeadsWithoutTranspose(_Broken):
    """Combines heads by reshaping (B, h, L, d) straight to (B, L, h*d), without the transpose."""

    def __init__(self, name: str):
        super().__init__(name, _CombineWithoutTranspose())


class _CombineWithoutTranspose(Batched):
    def combine(self, ops, x):
        b, h, length, d = ops.shape(x)
        return np.reshape(x, (b, length, h * d))


class HeadsAveragedAfterOutputBlocks(_Broken):
    """Projects each head by its block of W_o and averages the heads instead of summing them."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, num_heads, *rest):
            out, *rest = super().mha(ops, query, key, value, p, num_heads, *rest)
            b_o = 0 if p.b_o is None else p.b_o
            return ((out - b_o) / num_heads + b_o, *rest)


class MissingOutputBias(_Broken):
    """Never adds the output projection's bias b_o."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            return super().mha(ops, query, key, value, p._replace(b_o=None), *rest)


class KeyBiasUsedForQuery(_Broken):
    """Adds b_k to the query projection instead of b_q."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            return super().mha(ops, query, key, value, p._replace(b_q=p.b_k), *rest)


class TransposedQueryWeight(_Broken):
    """Uses W_q^T (an (out, in) layout read as (in, out)) where W_q is square."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            w_q = p.w_q.T if p.w_q.shape[0] == p.w_q.shape[1] else p.w_q
            return super().mha(ops, query, key, value, p._replace(w_q=w_q), *rest)


class OutputProjectionSkipped(_Broken):
    """Returns the concatenated heads (+ b_o) without multiplying by W_o where the widths allow."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            if p.w_o.shape[0] == p.w_o.shape[1]:
                p = p._replace(w_o=np.eye(p.w_o.shape[0], dtype=p.w_o.dtype))
            return super().mha(ops, query, key, value, p, *rest)


class SilentBfloat16(_Broken):
    """Rounds every matmul's operands to bfloat16 (8 significant bits), computes in float32 and
    casts back: float64 / float32 results with bfloat16 accuracy."""

    class Ops(_Broken.Ops):
        def matmul(self, a, b):
            low = (_round_mantissa(t.astype(np.float32), 7) for t in (a, b))
            return np.matmul(*low).astype(np.result_type(a, b))


class TF32Rounding(_Broken):
    """Rounds every matmul's result to 10 mantissa bits (TF32-like), in float32 and float64."""

    class Ops(_Broken.Ops):
        def matmul(self, a, b):
            return _round_mantissa(np.matmul(a, b), 10)


class SoftmaxOverBatch(_Broken):
    """Normalises over the batch axis (axis 0) instead of the key axis."""

    class Ops(_Broken.Ops):
        def max_last(self, x):
            return np.max(x, axis=0, keepdims=True)

        def sum_last(self, x):
            return np.sum(x, axis=0, keepdims=True)


class WeightsAveragedOverHeads(_Broken):
    """Returns the head-averaged weights (nn.MultiheadAttention's default) for every head."""

    class Kernel(_Broken.Kernel):
        def mha(self, ops, query, key, value, p, *rest):
            out, weights, *rest = super().mha(ops, query, key, value, p, *rest)
            averaged = np.broadcast_to(weights.mean(axis=1, keepdims=True), weights.shape).copy()
            return (out, averaged, *rest)


class BooleanMaskAddedAsMinusInf(_Broken):
    """Applies boolean masks by adding -inf (attn_mask.masked_fill(~m, -inf) then +=): a NaN key
    behind the mask makes its logit NaN + -inf = NaN, which leaks (PyTorch issue 101967)."""

    class Ops(_Broken.Ops):
        def ifill_masked(self, x, allowed):
            return np.add(x, np.where(allowed, 0.0, -np.inf).astype(x.dtype), out=x)


class OutputNanToNum(_Broken):
    """Sanitises the result with nan_to_num: NaN inputs give finite garbage instead of NaN."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, w, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            return np.nan_to_num(out), np.nan_to_num(w), row_lse


class EmptyKeysRejected(_Broken):
    """Takes the row maximum with an empty reduction: L_k = 0 raises instead of giving zeros."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            logits = np.matmul(q, np.swapaxes(k, -1, -2))
            np.max(logits, axis=-1)  # ValueError: zero-size array to reduction operation
            return super().attend(ops, q, k, v, allowed, additive, masks, lse)


class TinyQueriesTreatedAsPadding(_Broken):
    """Treats query rows below the smallest normal number as padding and zeroes their output (a
    "skip empty rows" shortcut): subnormal queries must still attend (their logits are ~0)."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            out, w, row_lse = super().attend(ops, q, k, v, allowed, additive, masks, lse)
            pad = np.max(np.abs(q), axis=-1, keepdims=True) < np.finfo(q.dtype).tiny
            return (np.where(pad, 0, out).astype(out.dtype), np.where(pad, 0, w).astype(w.dtype),
                    row_lse)



class Float32Only(_Broken):
    """Supports float32 alone: float64 is required (NUM-1), so silently not claiming it fails."""

    def dtypes(self, device):
        return ("float32",)


class LegacyOffsetMinus2e9(_Broken):
    """Uses -2e9 as the legacy offset ("any large number will do"): not the source form."""

    class Kernel(_Broken.Kernel):
        def additive(self, ops, bias, legacy_mask):
            terms = [] if bias is None else [bias]
            return terms if legacy_mask is None else [*terms, legacy_mask * -2e9]


class FusedProjectionWhenKeyIsValue(_Broken):
    """Tests only ``key is value`` before taking the fused [W_q | W_k | W_v] projection of the
    query array: with encoder memory as key and value, keys and values come from the query."""

    def __init__(self, name: str):
        super().__init__(name, _FusedWhenKeyIsValue())


class _FusedWhenKeyIsValue(Batched):
    def _project_qkv(self, ops, query, key, value, p):
        if key is value:
            return super()._project_qkv(ops, query, query, query, p)
        return super()._project_qkv(ops, query, key, value, p)

class Float64ThroughFloat32(_Broken):
    """Rounds the scale through float32 in every dtype (ONNX Runtime's float64 Attention does):
    float64 results with errors ~1e-8, float32's size."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            return super().attend(ops, q, k, v, allowed, additive,
                                  masks._replace(scale=float(np.float32(masks.scale))), lse)


class BiasMergedWithFinfoMin(_Broken):
    """Merges the masks into a given bias as ``where(allowed, bias, finfo.min)`` (a fill some
    libraries use when a bias is present; without a bias, -inf and the guarded softmax): a fully
    masked row gets uniform weights, the mean of V, only when a bias is present (MASK-9)."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            if not additive or allowed is None:
                return super().attend(ops, q, k, v, allowed, additive, masks, lse)
            merged = np.where(allowed, sum(additive), np.finfo(q.dtype).min).astype(q.dtype)
            return super().attend(ops, q, k, v, None, [merged], masks, lse)


class CausalSkippedForOneQuery(_Broken):
    """Leaves out the causal mask when there is one query ("decoding: the query is the last
    position"): right bottom-right, but top-left's one query must see key 0 only (MASK-6)."""

    class Kernel(_Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask,
                                         None if len_q == 1 else causal)


class KeyPaddingAsFinfoMinBias(_Broken):
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


# -- spec 1.2 features: the oracle-backed reference backend with one mistake each -----------------

class _BrokenFeature(OracleBackend):
    """The reference backend (tests/oracle_backend.py) with one mistake in a spec 1.2 feature."""


class SoftcapAfterTheMask(_BrokenFeature):
    """Caps the logits after masking (masked -inf becomes -c: masked keys get weight e^-c / sum)
    in scaled dot-product attention with boolean masks only (the other features: as specified)."""

    def _attention(self, q, k, v, *, softcap=None, mask=None, key_padding_mask=None, causal=None,
                   bias=None, legacy_mask=None, scale=None, **features):
        plain = softcap is None or any(x is not None for x in features.values()) or (
            mask is None and key_padding_mask is None and causal is None) or k.shape[1] != q.shape[1]
        if plain:
            return super()._attention(q, k, v, softcap=softcap, mask=mask, bias=bias,
                                      legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
                                      causal=causal, scale=scale, **features)
        b, h, l_q, d_k = q.shape
        s = (1.0 / np.sqrt(d_k) if scale is None else scale) * np.matmul(q, np.swapaxes(k, -1, -2))
        for term in (bias, None if legacy_mask is None else legacy_mask * -1e9):
            s = s if term is None else s + term
        allowed = oracle.allowed_mask(b, h, l_q, k.shape[2], mask=mask,
                                      key_padding_mask=key_padding_mask, causal=causal)
        s = softcap * np.tanh(np.where(allowed, s, -np.inf) / softcap)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        weights = (e / e.sum(axis=-1, keepdims=True)).astype(q.dtype)
        lse = (np.log(np.exp(s).sum(axis=-1))).astype(q.dtype)
        return oracle.AttentionResult(np.matmul(weights, v), weights, lse, None, None, None)


class WindowOffByOne(_BrokenFeature):
    """Lets one key too many in on the left of the window (j >= i - left - 1)."""

    def _attention(self, q, k, v, *, window=None, **kw):
        return super()._attention(q, k, v, window=_wider_left(window), **kw)

    def _mha(self, query, key, value, params, *, window=None, **kw):
        return super()._mha(query, key, value, params, window=_wider_left(window), **kw)


def _wider_left(window):
    """(left + 1, right) for a valid window with a bounded left side (others are left for the
    oracle to reject, WIN-2)."""
    if (isinstance(window, tuple) and len(window) == 2 and type(window[0]) is int
            and window[0] >= 0):
        return (window[0] + 1, window[1])
    return window


class ChunkAsWindow(_BrokenFeature):
    """Reads ``chunk=C`` as the sliding window (C - 1, 0): each query sees the C keys up to it
    instead of the keys of its own chunk (CHUNK-3: a chunk is not a window)."""

    def _attention(self, q, k, v, *, chunk=None, window=None, **kw):
        return super()._attention(q, k, v, **_chunk_as_window(chunk, window), **kw)

    def _mha(self, query, key, value, params, *, chunk=None, window=None, **kw):
        return super()._mha(query, key, value, params, **_chunk_as_window(chunk, window), **kw)


def _valid_chunk(chunk) -> bool:
    return type(chunk) is int and chunk >= 1


def _chunk_as_window(chunk, window) -> dict:
    """{window: (C - 1, 0)} for a valid chunk and no window (others left for the oracle)."""
    if _valid_chunk(chunk) and window is None:
        return {"window": (chunk - 1, 0), "chunk": None}
    return {"window": window, "chunk": chunk}


def index_chunks(len_q: int, len_k: int, chunk: int, diagonal, *, truncate: bool = False):
    """(L_q, L_k) bool: chunks on array indices, query i at i (+ L_k - L_q bottom-right); with
    ``truncate`` the chunk index rounds toward zero (C's integer division) instead of down."""
    i = np.arange(len_q)[:, None] + (len_k - len_q if diagonal == "bottom_right" else 0)
    j = np.arange(len_k)[None, :]
    if truncate:
        return np.trunc(i / chunk) == np.trunc(j / chunk)
    return i // chunk == j // chunk


class _ChunkOnIndices(_BrokenFeature):
    """Applies ``chunk`` as a boolean mask on array indices (see :func:`index_chunks`) in calls
    :meth:`applies` to; the other calls are the reference's."""

    truncate = False

    def applies(self, kw) -> bool:
        raise NotImplementedError

    def _folded(self, len_q, len_k, kw):
        chunk = kw.get("chunk")
        if not (_valid_chunk(chunk) and kw.get("past_key") is None and self.applies(kw)):
            return kw
        diagonal = kw.get("causal") or kw.get("alignment")
        if diagonal not in ("top_left", "bottom_right"):
            return kw
        allowed = index_chunks(len_q, len_k, chunk, diagonal, truncate=self.truncate)
        mask = kw.get("mask")
        mask = allowed if mask is None else np.asarray(mask, bool) & allowed
        return {**kw, "chunk": None, "mask": mask,
                "alignment": kw.get("alignment") or kw.get("causal")}

    def _attention(self, q, k, v, **kw):
        return super()._attention(q, k, v, **self._folded(q.shape[2], k.shape[2], kw))

    def _mha(self, query, key, value, params, **kw):
        return super()._mha(query, key, value, params,
                            **self._folded(query.shape[1], key.shape[1], kw))


class ChunksFromThePaddedStart(_ChunkOnIndices):
    """Counts chunks on array indices when segments or lengths are given, not from each
    sequence's first token (Hugging Face's ``_legacy_chunked_overlay``, CHUNK-3)."""

    def applies(self, kw) -> bool:
        return any(kw.get(n) is not None for n in ("q_segment_ids", "kv_segment_ids",
                                                    "query_seq_lengths", "key_value_seq_lengths"))


class ChunkIndexTruncated(_ChunkOnIndices):
    """Takes a query's chunk as its position divided by C rounded toward zero (C's integer
    division): with bottom-right and L_q > L_k, queries at positions -C + 1 .. -1 join chunk 0."""

    truncate = True

    def applies(self, kw) -> bool:
        return not any(kw.get(n) is not None for n in ("q_segment_ids", "kv_segment_ids",
                                                        "query_seq_lengths",
                                                        "key_value_seq_lengths"))


class AlibiSignFlipped(_BrokenFeature):
    """Adds +m |i - j| instead of -m |i - j| (the slopes' sign flipped)."""

    def _attention(self, q, k, v, *, alibi_slopes=None, **kw):
        return super()._attention(q, k, v, alibi_slopes=_negated(alibi_slopes), **kw)

    def _mha(self, query, key, value, params, *, alibi_slopes=None, **kw):
        return super()._mha(query, key, value, params, alibi_slopes=_negated(alibi_slopes), **kw)


def _negated(slopes):
    """-slopes for real slopes (others are left for the oracle to reject, ALIBI-3)."""
    return slopes if slopes is None or np.asarray(slopes).dtype.kind not in "fiu" else -np.asarray(slopes)


def _first_item_ids(kv_segment_ids):
    """Every batch item given batch item 0's key segment ids (ids compared across items)."""
    if kv_segment_ids is None or np.ndim(kv_segment_ids) != 2:
        return kv_segment_ids
    return np.broadcast_to(kv_segment_ids[:1], np.shape(kv_segment_ids)).copy()


class SegmentsAcrossBatch(_BrokenFeature):
    """Compares each query's segment id with batch item 0's key ids (a flattened comparison)."""

    def _attention(self, q, k, v, *, kv_segment_ids=None, **kw):
        return super()._attention(q, k, v, kv_segment_ids=_first_item_ids(kv_segment_ids), **kw)

    def _mha(self, query, key, value, params, *, kv_segment_ids=None, **kw):
        return super()._mha(query, key, value, params,
                            kv_segment_ids=_first_item_ids(kv_segment_ids), **kw)


class CacheOffsetZero(_BrokenFeature):
    """With a cache, places query i at position i instead of past_length + i (causal, window and
    ALiBi top-left on the present cache); the present cache itself is right."""

    def _attention(self, q, k, v, *, past_key=None, past_value=None, past_lengths=None,
                   key_padding_mask=None, causal=None, alignment=None, **kw):
        if past_key is None:
            return super()._attention(q, k, v, past_value=past_value, past_lengths=past_lengths,
                                      key_padding_mask=key_padding_mask, causal=causal,
                                      alignment=alignment, **kw)
        right = super()._attention(q, k, v, past_key=past_key, past_value=past_value,
                                   past_lengths=past_lengths, key_padding_mask=key_padding_mask,
                                   causal=causal, alignment=alignment, **kw)
        b, l_keys = q.shape[0], right.present_key.shape[2]
        valid = np.arange(l_keys)[None, :] < right.present_lengths[:, None]
        if key_padding_mask is not None:
            valid = valid & key_padding_mask
        top_left = "top_left" if causal is not None or alignment is not None or \
            kw.get("window") is not None or kw.get("alibi_slopes") is not None else None
        wrong = super()._attention(q, right.present_key, right.present_value,
                                   key_padding_mask=valid,
                                   causal=None if causal is None else "top_left",
                                   alignment=top_left, **kw)
        return wrong._replace(present_key=right.present_key, present_value=right.present_value,
                              present_lengths=right.present_lengths)


class LseOfTheUnmaskedRow(_BrokenFeature):
    """Returns the log-sum-exp over every key of the row, ignoring masks, segments, causal and
    window (the output is right)."""

    def _attention(self, q, k, v, **kw):
        right = super()._attention(q, k, v, **kw)
        if kw.get("past_key") is not None:
            return right
        loose = {n: x for n, x in kw.items() if n in ("scale", "softcap", "bias", "legacy_mask")}
        return right._replace(lse=super()._attention(q, k, v, **loose).lse)


class Float32SoftmaxInFloat64(_Broken):
    """Computes the attention (logits, softmax, weights times V) in float32 whatever the input
    dtype and casts back: float64 results with float32 accuracy; float32 is right."""

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            low = [np.asarray(t).astype(np.float32) for t in additive]
            out, w, row_lse = super().attend(ops, q.astype(np.float32), k.astype(np.float32),
                                             v.astype(np.float32), allowed, low, masks, lse)
            return out.astype(q.dtype), w.astype(q.dtype), \
                None if row_lse is None else row_lse.astype(q.dtype)


class ValueWidthMustEqualKeyWidth(_Broken):
    """Refuses d_v != d_k (a kernel with one head width): every case with other widths raises."""

    def scaled_dot_product_attention(self, q, k, v, **kw):
        if v.shape[-1] != q.shape[-1]:
            raise ValueError(f"d_v ({v.shape[-1]}) must equal d_k ({q.shape[-1]})")
        return super().scaled_dot_product_attention(q, k, v, **kw)

    class Kernel(_Broken.Kernel):
        def attend(self, ops, q, k, v, allowed, additive, masks, lse=False):
            if v.shape[-1] != q.shape[-1]:
                raise ValueError(f"d_v ({v.shape[-1]}) must equal d_k ({q.shape[-1]})")
            return super().attend(ops, q, k, v, allowed, additive, masks, lse)


WRONG_SCALE = WrongScale("broken-wrong-scale")
FLOAT32_SOFTMAX_IN_FLOAT64 = Float32SoftmaxInFloat64("broken-float32-in-float64")
VALUE_WIDTH_MUST_EQUAL_KEY_WIDTH = ValueWidthMustEqualKeyWidth("broken-dv-must-equal-dk")
SOFTMAX_OVER_QUERIES = SoftmaxOverQueries("broken-softmax-axis")
MASK_POLARITY_FLIPPED = MaskPolarityFlipped("broken-mask-polarity")
HEADS_SPLIT_WRONG_ORDER = HeadsSplitWrongOrder("broken-head-order")
KEYS_RESHAPED_WITH_QUERY_LENGTH = KeysReshapedWithQueryLength("broken-kv-reshape")
SILENT_FLOAT16 = SilentFloat16("broken-silent-fp16")
SCALE_FROM_D_MODEL = ScaleFromDModel("broken-scale-d-model")
SCALE_FROM_D_V = ScaleFromDv("broken-scale-d-v")
SCALE_AFTER_SOFTMAX = ScaleAfterSoftmax("broken-scale-after-softmax")
NO_MAX_SUBTRACTION = NoMaxSubtraction("broken-no-max-subtraction")
SOFTMAX_THEN_MASK_RENORMALISED = SoftmaxThenMaskRenormalised("broken-mask-after-softmax")
FINITE_MASK_VALUE = FiniteMaskValue("broken-mask-minus-1e4")
FINITE_MASK_VALUE_ZERO_ROWS = FiniteMaskValueZeroRows("broken-mask-minus-1e4-zero-rows")
MASK_FILLED_WITH_ZERO = MaskFilledWithZero("broken-mask-fill-zero")
WEIGHTS_BEFORE_MASKING = WeightsBeforeMasking("broken-weights-unmasked")
CAUSAL_ALIGNMENT_SWAPPED = CausalAlignmentSwapped("broken-causal-alignment")
CAUSAL_OFF_BY_ONE = CausalOffByOne("broken-causal-off-by-one")
KEY_PADDING_ON_QUERY_AXIS = KeyPaddingOnQueryAxis("broken-kpm-query-axis")
BIAS_IGNORED = BiasIgnored("broken-bias-ignored")
BIAS_SUBTRACTED = BiasSubtracted("broken-bias-subtracted")
BIAS_BEFORE_SCALING = BiasBeforeScaling("broken-bias-before-scale")
LEGACY_MASK_POLARITY_FLIPPED = LegacyMaskPolarityFlipped("broken-legacy-polarity")
LEGACY_MASK_IGNORED = LegacyMaskIgnored("broken-legacy-ignored")
FULLY_MASKED_ROWS_UNIFORM = FullyMaskedRowsUniform("broken-masked-rows-uniform")
FULLY_MASKED_ROWS_NAN = FullyMaskedRowsNaN("broken-masked-rows-nan")
MASK_MEAN_OF_V_DECLARED_BIAS_ZERO = MaskMeanOfVDeclaredBiasZero("broken-mask-vs-bias-masked-rows")
COMBINE_HEADS_WITHOUT_TRANSPOSE = CombineHeadsWithoutTranspose("broken-combine-no-transpose")
HEADS_AVERAGED_AFTER_OUTPUT_BLOCKS = HeadsAveragedAfterOutputBlocks("broken-heads-averaged")
MISSING_OUTPUT_BIAS = MissingOutputBias("broken-no-output-bias")
KEY_BIAS_USED_FOR_QUERY = KeyBiasUsedForQuery("broken-q-uses-k-bias")
TRANSPOSED_QUERY_WEIGHT = TransposedQueryWeight("broken-w-q-transposed")
OUTPUT_PROJECTION_SKIPPED = OutputProjectionSkipped("broken-no-output-projection")
SILENT_BFLOAT16 = SilentBfloat16("broken-silent-bf16")
TF32_ROUNDING = TF32Rounding("broken-tf32-rounding")
SOFTMAX_OVER_BATCH = SoftmaxOverBatch("broken-softmax-batch-axis")
WEIGHTS_AVERAGED_OVER_HEADS = WeightsAveragedOverHeads("broken-weights-head-mean")
BOOLEAN_MASK_ADDED_AS_MINUS_INF = BooleanMaskAddedAsMinusInf("broken-mask-added-minus-inf")
OUTPUT_NAN_TO_NUM = OutputNanToNum("broken-nan-to-num")
EMPTY_KEYS_REJECTED = EmptyKeysRejected("broken-empty-keys-raise")
TINY_QUERIES_TREATED_AS_PADDING = TinyQueriesTreatedAsPadding("broken-tiny-queries-padding")
FLOAT32_ONLY = Float32Only("broken-float32-only")
LEGACY_OFFSET_MINUS_2E9 = LegacyOffsetMinus2e9("broken-legacy-minus-2e9")
FUSED_PROJECTION_WHEN_KEY_IS_VALUE = FusedProjectionWhenKeyIsValue("broken-fused-kv-alias")
FLOAT64_THROUGH_FLOAT32 = Float64ThroughFloat32("broken-float64-through-float32")
SOFTCAP_AFTER_THE_MASK = SoftcapAfterTheMask("broken-softcap-after-mask")
WINDOW_OFF_BY_ONE = WindowOffByOne("broken-window-off-by-one")
ALIBI_SIGN_FLIPPED = AlibiSignFlipped("broken-alibi-sign")
CHUNK_AS_WINDOW = ChunkAsWindow("broken-chunk-as-window")
CHUNKS_FROM_THE_PADDED_START = ChunksFromThePaddedStart("broken-chunks-from-padded-start")
CHUNK_INDEX_TRUNCATED = ChunkIndexTruncated("broken-chunk-index-truncated")
SEGMENTS_ACROSS_BATCH = SegmentsAcrossBatch("broken-segments-across-batch")
CACHE_OFFSET_ZERO = CacheOffsetZero("broken-cache-offset-zero")
LSE_OF_THE_UNMASKED_ROW = LseOfTheUnmaskedRow("broken-lse-unmasked")
BIAS_MERGED_WITH_FINFO_MIN = BiasMergedWithFinfoMin("broken-bias-merge-finfo-min")
CAUSAL_SKIPPED_FOR_ONE_QUERY = CausalSkippedForOneQuery("broken-causal-skipped-at-decode")
KEY_PADDING_AS_FINFO_MIN_BIAS = KeyPaddingAsFinfoMinBias("broken-kpm-finfo-min")
STALE_DEVIATION = StaleDeviation("stale-deviation")
STALE_DEVIATION_IN_FLOAT32 = StaleDeviationInFloat32("stale-deviation-float32")

#: attribute -> (backend name, clauses of which at least one must be reported failing)
EXPECTED = {
    "WRONG_SCALE": ("broken-wrong-scale", {"SDPA-1", "SDPA-2", "MHA-1"}),
    "FLOAT32_SOFTMAX_IN_FLOAT64": ("broken-float32-in-float64", {"SDPA-1", "NUM-3", "MHA-1"}),
    "VALUE_WIDTH_MUST_EQUAL_KEY_WIDTH": ("broken-dv-must-equal-dk", {"SDPA-3", "MHA-4"}),
    "SOFTMAX_OVER_QUERIES": ("broken-softmax-axis", {"SDPA-1", "SDPA-4", "MHA-1"}),
    "MASK_POLARITY_FLIPPED": ("broken-mask-polarity", {"MASK-1", "MASK-10", "MASK-11"}),
    "HEADS_SPLIT_WRONG_ORDER": ("broken-head-order", {"HEAD-1", "HEAD-2", "MHA-1", "PARAM-2"}),
    "KEYS_RESHAPED_WITH_QUERY_LENGTH": ("broken-kv-reshape", {"MHA-2", "MHA-4"}),
    "SILENT_FLOAT16": ("broken-silent-fp16", {"NUM-2", "NUM-3", "SDPA-1"}),
    "SCALE_FROM_D_MODEL": ("broken-scale-d-model", {"MHA-1", "MHA-2", "MHA-3", "MHA-4", "MHA-5"}),
    "SCALE_FROM_D_V": ("broken-scale-d-v", {"SDPA-2", "SDPA-3"}),
    "SCALE_AFTER_SOFTMAX": ("broken-scale-after-softmax", {"SDPA-1", "SDPA-2", "SDPA-4"}),
    "NO_MAX_SUBTRACTION": ("broken-no-max-subtraction", {"NUM-4"}),
    "SOFTMAX_THEN_MASK_RENORMALISED": ("broken-mask-after-softmax", {"MASK-1", "MASK-8", "NUM-4"}),
    "FINITE_MASK_VALUE": ("broken-mask-minus-1e4", {"MASK-1", "MASK-9", "NUM-4"}),
    "FINITE_MASK_VALUE_ZERO_ROWS": ("broken-mask-minus-1e4-zero-rows", {"MASK-1"}),
    "MASK_FILLED_WITH_ZERO": ("broken-mask-fill-zero", {"MASK-1", "MASK-5", "MASK-6", "MASK-9"}),
    "WEIGHTS_BEFORE_MASKING": ("broken-weights-unmasked", {"MASK-1", "MASK-9", "SDPA-4"}),
    "CAUSAL_ALIGNMENT_SWAPPED": ("broken-causal-alignment", {"MASK-7"}),
    "CAUSAL_OFF_BY_ONE": ("broken-causal-off-by-one", {"MASK-6", "MASK-7"}),
    "KEY_PADDING_ON_QUERY_AXIS": ("broken-kpm-query-axis", {"MASK-5"}),
    "BIAS_IGNORED": ("broken-bias-ignored", {"MASK-2"}),
    "BIAS_SUBTRACTED": ("broken-bias-subtracted", {"MASK-2"}),
    "BIAS_BEFORE_SCALING": ("broken-bias-before-scale", {"MASK-2"}),
    "LEGACY_MASK_POLARITY_FLIPPED": ("broken-legacy-polarity", {"MASK-3"}),
    "LEGACY_MASK_IGNORED": ("broken-legacy-ignored", {"MASK-3"}),
    "FULLY_MASKED_ROWS_UNIFORM": ("broken-masked-rows-uniform", {"MASK-9"}),
    "FULLY_MASKED_ROWS_NAN": ("broken-masked-rows-nan", {"MASK-9"}),
    "MASK_MEAN_OF_V_DECLARED_BIAS_ZERO": ("broken-mask-vs-bias-masked-rows", {"MASK-11"}),
    "COMBINE_HEADS_WITHOUT_TRANSPOSE": ("broken-combine-no-transpose", {"HEAD-2", "MHA-1"}),
    "HEADS_AVERAGED_AFTER_OUTPUT_BLOCKS": ("broken-heads-averaged", {"MHA-1", "MHA-5"}),
    "MISSING_OUTPUT_BIAS": ("broken-no-output-bias", {"MHA-1", "PARAM-1"}),
    "KEY_BIAS_USED_FOR_QUERY": ("broken-q-uses-k-bias", {"MHA-1", "PARAM-1"}),
    "TRANSPOSED_QUERY_WEIGHT": ("broken-w-q-transposed", {"MHA-1", "PARAM-1"}),
    "OUTPUT_PROJECTION_SKIPPED": ("broken-no-output-projection", {"MHA-1", "PARAM-1"}),
    "SILENT_BFLOAT16": ("broken-silent-bf16", {"NUM-2", "NUM-3", "SDPA-1"}),
    "TF32_ROUNDING": ("broken-tf32-rounding", {"NUM-2", "NUM-3", "SDPA-1"}),
    "SOFTMAX_OVER_BATCH": ("broken-softmax-batch-axis", {"SDPA-1", "SDPA-7"}),
    "WEIGHTS_AVERAGED_OVER_HEADS": ("broken-weights-head-mean", {"MHA-1", "SHAPE-2"}),
    "BOOLEAN_MASK_ADDED_AS_MINUS_INF": ("broken-mask-added-minus-inf", {"MASK-13"}),
    "OUTPUT_NAN_TO_NUM": ("broken-nan-to-num", {"NUM-6"}),
    "EMPTY_KEYS_REJECTED": ("broken-empty-keys-raise", {"SHAPE-4"}),
    "TINY_QUERIES_TREATED_AS_PADDING": ("broken-tiny-queries-padding", {"NUM-5"}),
    "FLOAT32_ONLY": ("broken-float32-only", {"NUM-1"}),
    "LEGACY_OFFSET_MINUS_2E9": ("broken-legacy-minus-2e9", {"MASK-3"}),
    "FUSED_PROJECTION_WHEN_KEY_IS_VALUE": ("broken-fused-kv-alias", {"MHA-3", "MHA-4"}),
    "FLOAT64_THROUGH_FLOAT32": ("broken-float64-through-float32", {"NUM-2"}),
    "SOFTCAP_AFTER_THE_MASK": ("broken-softcap-after-mask", {"SOFTCAP-1"}),
    "WINDOW_OFF_BY_ONE": ("broken-window-off-by-one", {"WIN-1"}),
    "CHUNK_AS_WINDOW": ("broken-chunk-as-window", {"CHUNK-1"}),
    "CHUNKS_FROM_THE_PADDED_START": ("broken-chunks-from-padded-start", {"CHUNK-1"}),
    "CHUNK_INDEX_TRUNCATED": ("broken-chunk-index-truncated", {"CHUNK-1"}),
    "ALIBI_SIGN_FLIPPED": ("broken-alibi-sign", {"ALIBI-1"}),
    "SEGMENTS_ACROSS_BATCH": ("broken-segments-across-batch", {"SEG-1"}),
    "CACHE_OFFSET_ZERO": ("broken-cache-offset-zero", {"CACHE-2"}),
    "LSE_OF_THE_UNMASKED_ROW": ("broken-lse-unmasked", {"LSE-1"}),
    "BIAS_MERGED_WITH_FINFO_MIN": ("broken-bias-merge-finfo-min", {"MASK-9"}),
    "CAUSAL_SKIPPED_FOR_ONE_QUERY": ("broken-causal-skipped-at-decode", {"MASK-6"}),
    "KEY_PADDING_AS_FINFO_MIN_BIAS": ("broken-kpm-finfo-min", {"MASK-9"}),
}


# -- backends that write into the caller's arrays (INPUT-1); their results are right --------------

class QueryDoubledInPlace(_Broken):
    """Attention doubles ``q`` in place and halves the scale: exact results, the caller's q
    doubled."""

    def scaled_dot_product_attention(self, q, k, v, *, scale=None, **kw):
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        np.multiply(q, 2, out=q)
        return super().scaled_dot_product_attention(q, k, v, scale=scale / 2, **kw)


class QueryWeightScaledThroughView(_Broken):
    """The per-head algorithm folds the scale into each head's block of W_q and b_q, slices that
    share the caller's buffer, and attends with scale 1: the caller's W_q and b_q are scaled."""

    class Kernel(PerHead):
        def mha(self, ops, query, key, value, p, num_heads, masks, *rest):
            d_k = p.w_q.shape[1] // num_heads
            for i in range(num_heads):
                head = slice(i * d_k, (i + 1) * d_k)
                block = p.w_q[:, head]  # a view
                block *= masks.scale
                if p.b_q is not None:
                    bias = p.b_q[head]
                    bias *= masks.scale
            return super().mha(ops, query, key, value, p, num_heads, masks._replace(scale=1.0),
                               *rest)


class MaskInvertedInPlace(_Broken):
    """Turns the caller's boolean mask into a kernel's polarity (True = blocked) in place and never
    turns it back: the caller's mask is cleared where it allowed and set where it blocked."""

    class Kernel(_Broken.Kernel):
        def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
            if mask is not None:
                blocked = np.logical_not(mask, out=mask)
                mask = np.logical_not(blocked)
            return super().combine_masks(ops, len_q, len_k, like, mask, key_padding_mask, causal)


class PaddedValuesZeroedInPlace(_Broken):
    """Zeroes the value rows of padded keys in place ("they are masked anyway") when value is an
    array of its own: the output is unchanged, the caller's value is not."""

    def multi_head_attention(self, query, key, value, params, *, num_heads, key_padding_mask=None,
                             **kw):
        if key_padding_mask is not None and value is not key and value is not query:
            value[~key_padding_mask] = 0.0
        return super().multi_head_attention(query, key, value, params, num_heads=num_heads,
                                            key_padding_mask=key_padding_mask, **kw)


QUERY_DOUBLED_IN_PLACE = QueryDoubledInPlace("broken-q-doubled-in-place")
QUERY_WEIGHT_SCALED_THROUGH_VIEW = QueryWeightScaledThroughView("broken-w-q-scaled-in-place")
MASK_INVERTED_IN_PLACE = MaskInvertedInPlace("broken-mask-inverted-in-place")
PADDED_VALUES_ZEROED_IN_PLACE = PaddedValuesZeroedInPlace("broken-value-zeroed-in-place")

#: attribute -> (backend name, clauses it must fail): results are right, only INPUT-1 catches them
MODIFIES_INPUTS = {
    "QUERY_DOUBLED_IN_PLACE": ("broken-q-doubled-in-place", {"INPUT-1"}),
    "QUERY_WEIGHT_SCALED_THROUGH_VIEW": ("broken-w-q-scaled-in-place", {"INPUT-1"}),
    "MASK_INVERTED_IN_PLACE": ("broken-mask-inverted-in-place", {"INPUT-1"}),
    "PADDED_VALUES_ZEROED_IN_PLACE": ("broken-value-zeroed-in-place", {"INPUT-1"}),
}


# -- spec 1.3: backward passes and sinks with one mistake each (GRAD-3..9, SINK) ------------------
# Each derives from the oracle-backed reference backend, so the forward pass and every other
# clause stay exact: only the clause of its mistake can fail.

def _scores_and_tanh(q, k, v, kwargs):
    """The oracle's dS (B, h, L_q, L_K) of a call (through a zero full-shape bias and the bias
    gradient, GRAD-9), its weights P, D = rowsum(dO * O) and tanh(X / c) (None without a cap)."""
    d_output, rest = kwargs.pop("d_output"), dict(kwargs)
    p = oracle.attention_problem(q, k, v, **{n: x for n, x in rest.items()
                                             if n not in ("d_lse", "sinks", "bias_grad")})
    full = p.allowed.shape
    bias = np.zeros(full) + (0 if rest.get("bias") is None else rest["bias"])
    res = oracle_vjp.attention_vjp(q, k, v, d_output, **{**rest, "bias": bias, "bias_grad": True})
    fwd = oracle_vjp.attention_with_sinks(q, k, v, sinks=rest.get("sinks"),
                                          **{n: x for n, x in rest.items()
                                             if n not in ("d_lse", "sinks", "bias_grad", "bias")},
                                          bias=bias)
    group = full[1] // p.k.shape[1]
    x = np.einsum("bhqd,bhkd->bhqk", p.q, np.repeat(p.k, group, axis=1)) * p.scale
    tanh = None if p.softcap is None else np.tanh(x / p.softcap)
    d = np.sum(d_output * fwd.output, axis=-1)
    return res, fwd.weights, d, tanh, p


def _grads_from_dx(res, d_x, p):
    """dq and dk (summed over each group) from dX = dS * cap derivative; v's gradient unchanged."""
    b, h, _, len_k = d_x.shape
    g = p.k.shape[1]
    dq = p.scale * np.einsum("bhqk,bhkd->bhqd", d_x, np.repeat(p.k, h // g, axis=1))
    dk = p.scale * np.einsum("bhqk,bhqd->bhkd", d_x, p.q).reshape(b, g, h // g, len_k, -1).sum(2)
    return res._replace(dq=dq, dk=dk)


class _BrokenBackward(OracleBackend):
    """The reference backend whose backward pass (``_vjp``) has one mistake."""


class GroupGradientFirstHeadOnly(_BrokenBackward):
    """dk and dv of each key/value head come from the first query head of its group only."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        group = q.shape[1] // k.shape[1]
        first = (np.arange(q.shape[1]) % group == 0)[None, :, None]
        d_lse = kwargs.get("d_lse")
        only = super()._vjp(q, k, v, d_output * first[..., None], **{
            **kwargs, "d_lse": None if d_lse is None else d_lse * first})
        return super()._vjp(q, k, v, d_output, **kwargs)._replace(dk=only.dk, dv=only.dv)


class SoftcapDerivativeDropped(_BrokenBackward):
    """dX = dS: the soft-cap's 1 - tanh^2 factor is missing (no cache: a cached call is exact)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("softcap") is None or kwargs.get("past_key") is not None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        res, _, _, _, p = _scores_and_tanh(q, k, v, {**kwargs, "d_output": d_output})
        return _grads_from_dx(super()._vjp(q, k, v, d_output, **kwargs), res.d_bias, p)


class WindowWiderInTheBackward(_BrokenBackward):
    """The backward pass recomputes P with the window's left side one key wider (the forward pass
    is right): an off-by-one edge in the backward kernel only."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        window = kwargs.get("window")
        if window is not None:
            left = None if window[0] is None else window[0] + 1
            kwargs = {**kwargs, "window": (left, window[1])}
        return super()._vjp(q, k, v, d_output, **kwargs)


class GradientIntoPaddedKeys(_BrokenBackward):
    """The backward pass ignores key padding and key lengths: padded keys get gradient."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        return super()._vjp(q, k, v, d_output, **{**kwargs, "key_padding_mask": None,
                                                  "key_value_seq_lengths": None})


class DeltaInHalfPrecision(_BrokenBackward):
    """D = rowsum(dO * O) is kept in a float16 buffer (a float32 kernel storing D at half
    precision; no cache: a cached call is exact)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("past_key") is not None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        res, probs, d, tanh, p = _scores_and_tanh(q, k, v, {**kwargs, "d_output": d_output})
        d_s = res.d_bias + probs * (d - d.astype(np.float16))[..., None]
        d_x = d_s if tanh is None else d_s * (1 - tanh ** 2)
        right = super()._vjp(q, k, v, d_output, **kwargs)
        return _grads_from_dx(right, d_x, p)


class LseCotangentIgnored(_BrokenBackward):
    """d_lse is accepted and ignored."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        return super()._vjp(q, k, v, d_output, **{**kwargs, "d_lse": None})


class LseCotangentRefused(_BrokenBackward):
    """A non-zero d_lse raises NotImplementedError (as Pallas splash attention does): no GRAD-8
    gradient, but GRAD-11 conforms (declared_backends declares GRAD-8)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        d_lse = kwargs.get("d_lse")
        if d_lse is not None and np.any(np.asarray(d_lse) != 0):
            raise NotImplementedError("d_lse: a cotangent on the log-sum-exp is not supported")
        return super()._vjp(q, k, v, d_output, **kwargs)


class SinkAddedToEveryLogit(OracleBackend):
    """The sink is added to each logit (the numerator) instead of joining the denominator: the
    softmax ignores it and the lse is shifted by it."""

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)  # validates the sinks (SINK-4)
        sinks = kwargs.pop("sinks", None)
        if sinks is None:
            return res
        res = super()._attention(q, k, v, **kwargs)
        return res._replace(lse=res.lse + np.asarray(sinks)[None, :, None])


class SinkLeftOutOfTheLse(OracleBackend):
    """Output and weights with the sink, the lse without it (the lse of spec 1.2's call)."""

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)
        if kwargs.get("sinks") is None:
            return res
        kwargs.pop("sinks")
        return res._replace(lse=super()._attention(q, k, v, **kwargs).lse)


GROUP_GRADIENT_FIRST_HEAD_ONLY = GroupGradientFirstHeadOnly("broken-gqa-grad-first-head")
SOFTCAP_DERIVATIVE_DROPPED = SoftcapDerivativeDropped("broken-softcap-no-derivative")
WINDOW_WIDER_IN_THE_BACKWARD = WindowWiderInTheBackward("broken-window-backward-off-by-one")
GRADIENT_INTO_PADDED_KEYS = GradientIntoPaddedKeys("broken-grad-into-padded-keys")
DELTA_IN_HALF_PRECISION = DeltaInHalfPrecision("broken-delta-float16")
LSE_COTANGENT_IGNORED = LseCotangentIgnored("broken-dlse-ignored")
SINK_ADDED_TO_EVERY_LOGIT = SinkAddedToEveryLogit("broken-sink-in-numerator")
SINK_LEFT_OUT_OF_THE_LSE = SinkLeftOutOfTheLse("broken-sink-not-in-lse")

EXPECTED.update({
    "GROUP_GRADIENT_FIRST_HEAD_ONLY": ("broken-gqa-grad-first-head", {"GRAD-4"}),
    "SOFTCAP_DERIVATIVE_DROPPED": ("broken-softcap-no-derivative", {"GRAD-5"}),
    "WINDOW_WIDER_IN_THE_BACKWARD": ("broken-window-backward-off-by-one", {"GRAD-6"}),
    "GRADIENT_INTO_PADDED_KEYS": ("broken-grad-into-padded-keys", {"GRAD-7"}),
    "DELTA_IN_HALF_PRECISION": ("broken-delta-float16", {"GRAD-3"}),
    "LSE_COTANGENT_IGNORED": ("broken-dlse-ignored", {"GRAD-8", "GRAD-11"}),
    "SINK_ADDED_TO_EVERY_LOGIT": ("broken-sink-in-numerator", {"SINK-1"}),
    "SINK_LEFT_OUT_OF_THE_LSE": ("broken-sink-not-in-lse", {"SINK-1"}),
})


# -- spec 1.4: merges of partial states with one mistake each (MERGE) -----------------------------

def _unguarded_merge(outputs, natural: list):
    """lse = log sum exp(lse_m), O = sum exp(lse_m - lse) O_m with nothing guarding a row that is
    empty in every state (-inf - -inf = NaN)."""
    with np.errstate(all="ignore"):
        lse = np.log(sum(np.exp(x) for x in natural))
        out = sum(np.exp(x - lse)[..., None] * o for x, o in zip(natural, outputs))
    return out, lse


class MergeNanForEmptyStates(OracleBackend):
    """The weights exp(lse_m - lse) unguarded: two empty states give NaN, not an empty state
    (vLLM PR 28181 / 39148, FlashInfer issue 4051)."""

    def _merge(self, outputs, lses, sinks, conventions):
        b = outputs[0].shape[0]
        natural = [oracle_serving.to_natural(x, batch=b, **conventions) for x in lses]
        if sinks is not None:
            natural.append(np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None],
                                           natural[0].shape))
            outputs = [*outputs, np.zeros_like(outputs[0])]
        out, lse = _unguarded_merge(outputs, natural)
        return out, oracle_serving.from_natural(lse, **conventions)


class MergeBase2AsNatural(OracleBackend):
    """A base-2 lse merged as a natural one (FlashInfer issue 2113, sglang 35045)."""

    def _merge(self, outputs, lses, sinks, conventions):
        return super()._merge(outputs, lses, sinks, {**conventions, "lse_base": "e"})


class MergeSinkInEveryState(OracleBackend):
    """The sink joins every state's denominator before the merge: counted n times (MERGE-4)."""

    def _merge(self, outputs, lses, sinks, conventions):
        if sinks is None:
            return super()._merge(outputs, lses, sinks, conventions)
        sunk = [super(MergeSinkInEveryState, self)._merge([o], [x], sinks, conventions)
                for o, x in zip(outputs, lses)]
        return super()._merge([o for o, _ in sunk], [x for _, x in sunk], None, conventions)


MERGE_NAN_FOR_EMPTY_STATES = MergeNanForEmptyStates("broken-merge-nan-empty")
MERGE_BASE_2_AS_NATURAL = MergeBase2AsNatural("broken-merge-base2-as-natural")
MERGE_SINK_IN_EVERY_STATE = MergeSinkInEveryState("broken-merge-sink-every-state")

EXPECTED.update({
    "MERGE_NAN_FOR_EMPTY_STATES": ("broken-merge-nan-empty", {"MERGE-2"}),
    "MERGE_BASE_2_AS_NATURAL": ("broken-merge-base2-as-natural", {"MERGE-3"}),
    "MERGE_SINK_IN_EVERY_STATE": ("broken-merge-sink-every-state", {"MERGE-4"}),
})


# -- spec 1.4: paged caches with one mistake each (PAGE) -------------------------------------------

class PageIndexOffByOne(OracleBackend):
    """Reads key j from page ``block_table[b, j // S] + 1``: the neighbouring page."""

    def _paged(self, q, k_pages, v_pages, block_table, *rest):
        return super()._paged(q, k_pages, v_pages, (block_table + 1) % k_pages.shape[0], *rest)


class StaleSlotRead(OracleBackend):
    """Attends every slot of an item's pages, the slots past its length included."""

    def _paged(self, q, k_pages, v_pages, block_table, seq_lens, *rest):
        size = k_pages.shape[1]
        return super()._paged(q, k_pages, v_pages, block_table, -(-seq_lens // size) * size,
                              *rest)


class WriteToTheNextSlot(OracleBackend):
    """Writes token n at slot ``slot_mapping[n] + 1``."""

    def _write(self, k_pages, v_pages, k, v, slots):
        return super()._write(k_pages, v_pages, k, v, (slots + 1) % (k_pages.shape[0] *
                                                                     k_pages.shape[1]))


PAGE_INDEX_OFF_BY_ONE = PageIndexOffByOne("broken-page-index-off-by-one")
STALE_SLOT_READ = StaleSlotRead("broken-page-stale-slot-read")
WRITE_TO_THE_NEXT_SLOT = WriteToTheNextSlot("broken-page-write-next-slot")

EXPECTED.update({
    "PAGE_INDEX_OFF_BY_ONE": ("broken-page-index-off-by-one", {"PAGE-1"}),
    "STALE_SLOT_READ": ("broken-page-stale-slot-read", {"PAGE-2"}),
    "WRITE_TO_THE_NEXT_SLOT": ("broken-page-write-next-slot", {"PAGE-3"}),
})


# -- spec 1.4: holes of 1.3's suite (INPUT-1 in the backward, grouped sinks, broadcast bias, WIN/ALIBI) -
# Each derives from the oracle-backed reference backend: one mistake, every other clause exact.

class QueryScaledInPlaceInTheBackward(OracleBackend):
    """attention_vjp folds the scale into q in place (``q *= scale``, as kernels that pre-scale
    the queries do) after computing right gradients: the caller's q is scaled (INPUT-1)."""

    def attention_vjp(self, q, k, v, d_output, **kwargs) -> dict:
        grads = super().attention_vjp(q, k, v, d_output, **kwargs)
        scale = kwargs.get("scale")
        np.multiply(q, 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale, out=q)
        return grads


def _sinks_by_kv_head(sinks, q, k):
    """sinks (h,) read at each query head's key/value head index (i // (h/g)) instead of at i."""
    if sinks is None or np.ndim(sinks) != 1 or np.ndim(q) != 4 or np.ndim(k) != 4:
        return sinks
    h, g = q.shape[1], k.shape[1]
    if not (0 < g <= h and h % g == 0 and len(sinks) == h):
        return sinks  # left for validation to reject (SINK-4, GQA-2)
    return np.asarray(sinks)[np.arange(h) // (h // g)]


class SinkIndexedByKvHead(OracleBackend):
    """Reads each query head's sink at its key/value head's index (sinks[i // (h/g)]): right
    without grouped heads, wrong for every head of a group but the first with them."""

    def _attention(self, q, k, v, **kwargs):
        if kwargs.get("sinks") is not None:
            kwargs = {**kwargs, "sinks": _sinks_by_kv_head(kwargs["sinks"], q, k)}
        return super()._attention(q, k, v, **kwargs)

    def _vjp(self, q, k, v, d_output, **kwargs):
        if kwargs.get("sinks") is not None:
            kwargs = {**kwargs, "sinks": _sinks_by_kv_head(kwargs["sinks"], q, k)}
        return super()._vjp(q, k, v, d_output, **kwargs)


class BiasGradientNotReduced(OracleBackend):
    """d_bias of a broadcast bias is the full-shape gradient's first entry along each broadcast
    axis (a kernel writing d_bias per (batch, head, query) into a buffer of the bias's shape:
    the last write wins) instead of its sum over those axes (GRAD-9)."""

    def _vjp(self, q, k, v, d_output, **kwargs):
        bias = kwargs.get("bias")
        if not kwargs.get("bias_grad") or bias is None:
            return super()._vjp(q, k, v, d_output, **kwargs)
        shape = np.shape(bias)
        full = (q.shape[0], q.shape[1], q.shape[2], shape[-1])
        res = super()._vjp(q, k, v, d_output, **{**kwargs, "bias": np.broadcast_to(bias, full)})
        d = res.d_bias
        pad = (1,) * (4 - len(shape)) + tuple(shape)
        for axis, n in enumerate(pad):
            if n == 1 and d.shape[axis] != 1:
                d = d[(slice(None),) * axis + (slice(0, 1),)]
        return res._replace(d_bias=d.reshape(shape))


QUERY_SCALED_IN_PLACE_IN_THE_BACKWARD = QueryScaledInPlaceInTheBackward(
    "broken-vjp-scales-q-in-place")
SINK_INDEXED_BY_KV_HEAD = SinkIndexedByKvHead("broken-sink-by-kv-head")
BIAS_GRADIENT_NOT_REDUCED = BiasGradientNotReduced("broken-d-bias-not-reduced")

#: attribute -> (backend name, clauses it must fail) under the ci profile (spec 1.4's holes)
HOLES_OF_1_3 = {
    "QUERY_SCALED_IN_PLACE_IN_THE_BACKWARD": ("broken-vjp-scales-q-in-place", {"INPUT-1"}),
    "SINK_INDEXED_BY_KV_HEAD": ("broken-sink-by-kv-head", {"SINK-1", "SINK-3"}),
    "BIAS_GRADIENT_NOT_REDUCED": ("broken-d-bias-not-reduced", {"GRAD-9"}),
}


# -- spec 1.4: DET-1 (determinism) -----------------------------------------------------------------

def _one_ulp_at_the_largest(x, nudge: bool):
    """``x`` (a copy) with its largest-magnitude entry moved one ulp away from zero when ``nudge``
    (zeros, NaNs and empty arrays as they are)."""
    x = np.array(x, copy=True)
    if nudge and x.size and np.isfinite(x).any():
        i = int(np.nanargmax(np.where(np.isfinite(x), np.abs(x), -1.0)))
        if x.flat[i] != 0:
            x.flat[i] = np.nextafter(x.flat[i], np.sign(x.flat[i]) * np.inf)
    return x


class RunToRunNoise(OracleBackend):
    """Exact but for one ulp at the largest entry of the output and of dq on every other call (an
    accumulation whose order varies from run to run, as atomic adds give): within NUM-3 and GRAD-1
    everywhere, but two calls on the same inputs differ (DET-1)."""

    def __init__(self, name: str):
        super().__init__(name)
        self._calls = 0

    def _nudge(self) -> bool:
        self._calls += 1
        return self._calls % 2 == 0

    def _attention(self, q, k, v, **kwargs):
        res = super()._attention(q, k, v, **kwargs)
        return res._replace(output=_one_ulp_at_the_largest(res.output, self._nudge()))

    def _mha(self, query, key, value, params, **kwargs):
        res = super()._mha(query, key, value, params, **kwargs)
        return res._replace(output=_one_ulp_at_the_largest(res.output, self._nudge()))

    def _vjp(self, q, k, v, d_output, **kwargs):
        res = super()._vjp(q, k, v, d_output, **kwargs)
        return res._replace(dq=_one_ulp_at_the_largest(res.dq, self._nudge()))


RUN_TO_RUN_NOISE = RunToRunNoise("broken-run-to-run-noise")
HOLES_OF_1_3["RUN_TO_RUN_NOISE"] = ("broken-run-to-run-noise", {"DET-1"})


# -- spec 1.4: window and ALiBi mistakes of kinds real kernels shipped (WIN-1, ALIBI-1) -----------

def _window_args(kw: dict, q, k) -> dict:
    """The call's window, alignment and causal as plain values (the oracle rejects the invalid)."""
    return {"window": kw.get("window"), "alignment": kw.get("alignment"), "causal": kw.get("causal")}


class _WindowOrAlibiMistake(_BrokenFeature):
    """The reference backend with :meth:`_fix` rewriting the keyword arguments of every call."""

    def _fix(self, q, k, kw: dict) -> dict:
        return kw

    def _attention(self, q, k, v, **kw):
        return super()._attention(q, k, v, **self._fix(q, k, kw))

    def _vjp(self, q, k, v, d_output, **kw):
        return super()._vjp(q, k, v, d_output, **self._fix(q, k, kw))

    def _mha(self, query, key, value, params, **kw):
        return super()._mha(query, key, value, params, **self._fix(query, key, kw))


def _valid_window(window) -> bool:
    return (isinstance(window, tuple) and len(window) == 2
            and all(s is None or (type(s) is int and s >= 0) for s in window))


class WindowRightIgnoredWhenLeftUnbounded(_WindowOrAlibiMistake):
    """A window whose left side is unbounded is causal when its right side is 0 and no window at
    all otherwise (FlashAttention 2 maps (-1, 0) to its causal flag; a kernel that then switches
    local masking on only for ``left >= 0``): (None, r > 0) lets in every key right of r."""

    def _fix(self, q, k, kw):
        window = kw.get("window")
        if _valid_window(window) and window[0] is None and window[1] not in (0, None):
            return {**kw, "window": None}
        return kw


class WindowTopLeftWhenBottomRight(_WindowOrAlibiMistake):
    """A left-only window (right side unbounded, a "sliding window" of the last keys) measured from
    the top-left diagonal (p_q(i) = i) although the call's alignment is bottom-right and no causal
    mask is given (a sliding-window kernel that forgets the offset L_k - L_q): wrong whenever
    L_q != L_k, right for every other window."""

    def _fix(self, q, k, kw):
        window = kw.get("window")
        if (_valid_window(window) and window[0] is not None and window[1] is None
                and kw.get("causal") is None and kw.get("alignment") == "bottom_right"
                and kw.get("past_key") is None):
            return {**kw, "alignment": "top_left"}
        return kw


class AlibiPerBatchSlopesOfFirstItem(_WindowOrAlibiMistake):
    """Slopes of shape (B, h) read as (h,): every batch item gets item 0's slopes (a kernel whose
    slope stride over the batch is 0)."""

    def _fix(self, q, k, kw):
        slopes = kw.get("alibi_slopes")
        if slopes is not None and np.ndim(slopes) == 2 and np.asarray(slopes).dtype.kind == "f":
            return {**kw, "alibi_slopes": np.broadcast_to(np.asarray(slopes)[:1],
                                                          np.shape(slopes)).copy()}
        return kw


class AlibiSignedDistance(_WindowOrAlibiMistake):
    """Adds -m (p_q(i) - p_k(j)) without the absolute value (the causal form used everywhere):
    right under a causal mask, but future keys get +m |i - j| (their penalty's sign flipped)."""

    def _attention(self, q, k, v, **kw):
        slopes = kw.get("alibi_slopes")
        if (slopes is None or kw.get("causal") is not None or kw.get("past_key") is not None
                or np.asarray(slopes).dtype.kind != "f"):
            return super()._attention(q, k, v, **kw)
        h, len_q, len_k = q.shape[1], q.shape[2], k.shape[2]
        shift = len_k - len_q if kw.get("alignment", "bottom_right") != "top_left" else 0
        distance = (np.arange(len_q)[:, None] + shift) - np.arange(len_k)[None, :]
        m = np.asarray(slopes, dtype=np.float64).reshape(-1, h)[:, :, None, None]
        signed = -m * distance  # the right term is -m |distance|
        extra = signed + m * np.abs(distance)  # what the mistake adds to the right bias
        bias = kw.get("bias")
        return super()._attention(q, k, v, **{**kw, "bias": extra if bias is None else bias + extra})


WINDOW_RIGHT_IGNORED_WHEN_LEFT_UNBOUNDED = WindowRightIgnoredWhenLeftUnbounded(
    "broken-window-left-none-no-window")
WINDOW_TOP_LEFT_WHEN_BOTTOM_RIGHT = WindowTopLeftWhenBottomRight("broken-window-top-left")
ALIBI_PER_BATCH_SLOPES_OF_FIRST_ITEM = AlibiPerBatchSlopesOfFirstItem(
    "broken-alibi-batch-slopes-item-0")
ALIBI_SIGNED_DISTANCE = AlibiSignedDistance("broken-alibi-signed-distance")

#: attribute -> (backend name, clauses it must fail) under the ci profile (spec 1.4's 5f)
WINDOW_AND_ALIBI = {
    "WINDOW_RIGHT_IGNORED_WHEN_LEFT_UNBOUNDED": ("broken-window-left-none-no-window", {"WIN-1"}),
    "WINDOW_TOP_LEFT_WHEN_BOTTOM_RIGHT": ("broken-window-top-left", {"WIN-1"}),
    "ALIBI_PER_BATCH_SLOPES_OF_FIRST_ITEM": ("broken-alibi-batch-slopes-item-0", {"ALIBI-1"}),
    "ALIBI_SIGNED_DISTANCE": ("broken-alibi-signed-distance", {"ALIBI-1"}),
}
