"""Flash-style (chunked, online-softmax) multi-head attention in NumPy, as an mhaspec backend.

Axis legend: B batch, L_q / L_k query / key lengths, h heads, d_k / d_v per-head widths.

Attention takes the queries in blocks of ``block_q`` and, for each, walks the keys in blocks of
``block_k`` keeping per query row the running maximum ``m`` of the logits, the running sum ``l`` of
``exp(logit - m)`` and the unnormalised output ``acc``. When a block raises the maximum, ``l`` and
``acc`` are rescaled by ``exp(m_old - m_new)``. The output is ``acc / l``, or 0 for a row whose
every key is masked (clause MASK-9). Only one (B, h, block_q, block_k) block of logits exists at a
time: the attention weights are never formed, so the backend does not claim ``weights`` and returns
``None`` for them.

float16 inputs are computed in float32 and the result is rounded to float16 (NUM-1, NUM-2).
"""

from __future__ import annotations

import math

import numpy as np

from mhaspec.backends import Backend, MHAParams
from mhaspec.backends.validation import mha_params

from . import validate

LEGACY_MASK_VALUE = -1e9  # MASK-3: the legacy float mask is added to the logits times -1e9


class FlashNumpyBackend(Backend):
    """Memory-efficient attention: online softmax over key blocks, no (L_q, L_k) weights."""

    name = "flash-numpy"
    framework = "numpy"
    capabilities = frozenset({"heads", "sdpa", "mha", "masks", "bias", "scale", "legacy_mask",
                              "causal", "cross", "errors"})
    deviations = {}  # clause id -> reason, for a clause this backend knowingly does not follow

    def __init__(self, block_q: int = 64, block_k: int = 256):
        self.block_q, self.block_k = block_q, block_k

    def framework_version(self) -> str:
        return np.__version__

    def dtypes(self, device: str) -> tuple[str, ...]:
        return validate.FLOATS

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        return np.array(x, dtype=dtype)

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    # -- heads -----------------------------------------------------------------------------------
    def split_heads(self, x, num_heads: int):
        """(B, L, h*d) -> (B, h, L, d)."""
        validate.check_split_heads(x, num_heads)
        b, length, width = x.shape
        return x.reshape(b, length, num_heads, width // num_heads).transpose(0, 2, 1, 3)

    def combine_heads(self, x):
        """(B, h, L, d) -> (B, L, h*d)."""
        validate.check_combine_heads(x)
        b, h, length, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, length, h * d)

    # -- the two operations ----------------------------------------------------------------------
    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None):
        validate.check_sdpa(q, k, v, mask=mask, bias=bias, legacy_mask=legacy_mask,
                            key_padding_mask=key_padding_mask, causal=causal, scale=scale)
        work = np.promote_types(q.dtype, np.float32)
        out = self._attention(q.astype(work), k.astype(work), v.astype(work), mask, bias,
                              legacy_mask, key_padding_mask, causal, scale)
        return out.astype(q.dtype), None

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None):
        p = mha_params(params)  # ValueError naming 'params' for anything else
        validate.check_mha(query, key, value, p, num_heads=num_heads, mask=mask, bias=bias,
                           legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
                           causal=causal, scale=scale)
        work = np.promote_types(query.dtype, np.float32)

        def linear(x, w, b):  # PARAM-1: y = x @ W + b
            y = x.astype(work) @ w.astype(work)
            return y if b is None else y + b.astype(work)

        q = self.split_heads(linear(query, p.w_q, p.b_q), num_heads)
        k = self.split_heads(linear(key, p.w_k, p.b_k), num_heads)
        v = self.split_heads(linear(value, p.w_v, p.b_v), num_heads)
        heads = self._attention(q, k, v, mask, bias, legacy_mask, key_padding_mask, causal, scale)
        return linear(self.combine_heads(heads), p.w_o, p.b_o).astype(query.dtype), None

    # -- the algorithm ---------------------------------------------------------------------------
    def _attention(self, q, k, v, mask, bias, legacy_mask, key_padding_mask, causal, scale):
        """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v), all in the working dtype
        -> output (B, h, L_q, d_v). Masks and bias are validated and broadcast to (B, h, L_q, L_k)."""
        work = q.dtype
        (batch, heads, len_q, d_k), len_k, d_v = q.shape, k.shape[2], v.shape[3]
        full = (batch, heads, len_q, len_k)
        scale = 1.0 / math.sqrt(d_k) if scale is None else float(scale)
        # read-only broadcast views: no (B, h, L_q, L_k) array is allocated
        mask = None if mask is None else np.broadcast_to(mask, full)
        bias = None if bias is None else np.broadcast_to(bias.astype(work), full)
        legacy = None if legacy_mask is None else np.broadcast_to(legacy_mask.astype(work), full)
        kpm = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        offset = 0 if causal == "top_left" else len_k - len_q  # MASK-6, 7: key j <= query i + offset
        out = np.empty((batch, heads, len_q, d_v), work)
        for q0 in range(0, len_q, self.block_q):
            qs = slice(q0, min(q0 + self.block_q, len_q))
            rows = qs.stop - qs.start
            m = np.full((batch, heads, rows, 1), -np.inf, work)  # running maximum
            l = np.zeros((batch, heads, rows, 1), work)  # running sum of exp(logit - m)
            acc = np.zeros((batch, heads, rows, d_v), work)  # running sum of exp(logit - m) v
            for k0 in range(0, len_k, self.block_k):
                ks = slice(k0, min(k0 + self.block_k, len_k))
                s = q[:, :, qs] @ k[:, :, ks].swapaxes(-1, -2) * scale
                if bias is not None:
                    s += bias[..., qs, ks]
                if legacy is not None:
                    s += legacy[..., qs, ks] * LEGACY_MASK_VALUE
                allowed = np.True_
                if mask is not None:
                    allowed = allowed & mask[..., qs, ks]
                if kpm is not None:
                    allowed = allowed & kpm[..., ks]
                if causal is not None:
                    allowed = allowed & (np.arange(ks.start, ks.stop)[None, :]
                                         <= np.arange(qs.start, qs.stop)[:, None] + offset)
                s = np.where(allowed, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
                shift = np.where(np.isfinite(m_new), m_new, 0.0)  # a row with no allowed key yet
                e = np.exp(s - shift)
                rescale = np.exp(m - shift)
                l = l * rescale + e.sum(axis=-1, keepdims=True)
                acc = acc * rescale + e @ v[:, :, ks]
                m = m_new
            out[:, :, qs] = acc / np.where(l > 0, l, 1.0)  # MASK-9: an empty row stays 0
        return out


#: The registered instance. Blocks of 4 make the suite's short sequences (lengths 1 to 8, and 50
#: in the source's example) span several blocks, a partial last one included, so a certificate
#: exercises the rescaling; for real workloads use FlashNumpyBackend() (blocks of 64 x 256).
FLASH = FlashNumpyBackend(block_q=4, block_k=4)
