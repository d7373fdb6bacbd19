"""Adapters for Hugging Face Transformers' decoder attention with its KV cache: ``hf-gemma2-eager``
and ``hf-decoder-sdpa``.

Axis legend: B batch, L_q / L_k lengths, h query heads, g key/value heads, L_past cached keys,
d_k / d_v per-head widths.

The op is Gemma 2's ``eager_attention_forward(module, query, key, value, attention_mask,
dropout, scaling, softcap)`` (``transformers.models.gemma2.modeling_gemma2``; Llama's and
Mistral's are the same function without ``softcap``), and a KV cache is a ``DynamicCache``:
``cache.update(past_key, past_value, 0)`` then ``cache.update(k, v, 0)``, whose result is the
keys and values attended, as a decoder layer does at each step. ``hf-decoder-sdpa`` is the same
with ``ALL_ATTENTION_FUNCTIONS["sdpa"]`` (``sdpa_attention_forward``: torch's
``scaled_dot_product_attention``; no ``softcap``, no weights). Inputs are validated before
anything reaches Transformers. The mapping:

* ``q`` ``(B, h, L_q, d_k)``, ``k``, ``v`` with g heads: as they are; the function repeats each
  key/value head ``h / g`` times (``repeat_kv``, GQA-1) and returns the output as
  ``(B, L_q, h, d_v)``, which the adapter transposes back;
* ``scaling``: the spec's scale; ``softcap``: SOFTCAP-1's cap (``tanh(S / c) * c`` after the
  scale, before the mask), Gemma 2's ``attn_logit_softcapping``;
* masks, eager: ``attention_mask`` is added to the logits; as Transformers builds it
  (``masking_utils``), 0 where a key may be attended and ``torch.finfo(dtype).min`` elsewhere, from
  the AND of ``mask``, ``key_padding_mask`` and causal, plus ``bias`` and ``legacy_mask * -1e9``;
  sdpa: the boolean (True = may attend, as Transformers passes it), or ``where(allowed, bias,
  -inf)`` with a bias, and ``is_causal=False`` always (the function's default is causal when no
  mask is given: ``getattr(module, "is_causal", True)``);
* KV cache (CACHE): the ``DynamicCache`` holds every past entry, ``Concat(past, new)``; per-item
  ``past_lengths`` below L_past go into ``attention_mask`` (:mod:`.cache_layout`), and the weights
  and the cache's keys and values are laid out as CACHE-1's present cache;
* multi-head attention: the spec's projections in PyTorch around the function (no rotary
  embedding: the spec has none; a Gemma 2 layer's projections are plain ``nn.Linear``).

Observed with transformers 5.24.0 on torch 2.13 (CPU), eager (sdpa: MASK-13 and NUM-6 through
torch's fused CPU kernel, as ``hf-bert-sdpa``, and ``B = 0`` or ``L_q = 0`` fails in the
function's final reshape to ``(B, -1, L_q, d_v)``, SHAPE-4):

* a fully masked row attends uniformly (``finfo.min`` logits): output the mean of V (MASK-9);
* a NaN key behind the mask leaks into every row (NaN + finfo.min is NaN; MASK-13);
* the softmax runs in float32 (``softmax(..., dtype=torch.float32)``): float64 is not claimed.
"""

from __future__ import annotations

import functools
import math

from .optional import require

require("transformers", extra="hf")

from ._base import AttentionOutputs  # noqa: E402
from .adapters import MaskArgs  # noqa: E402
from .cache_layout import LibraryCache  # noqa: E402
from .hf_common import (EAGER_DEVIATIONS, MASK_13, MASK_FORM, SDPA_NUM_6,  # noqa: E402
                        TransformersAdapter, decoder_attention_mask)
from .optional import torch_module  # noqa: E402


@functools.cache
def _hf():
    """(DynamicCache, {"eager": Gemma 2's eager_attention_forward, "sdpa": sdpa_attention_forward})."""
    from transformers import DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.gemma2 import modeling_gemma2

    return DynamicCache, {"eager": modeling_gemma2.eager_attention_forward,
                          "sdpa": sdpa_attention_forward}


class _Module:
    """What the attention function reads of its layer: the key/value head grouping, eval mode."""

    def __init__(self, groups: int, head_dim: int):
        self.num_key_value_groups = groups
        self.head_dim = head_dim
        self.training = False
        self.is_causal = False


class HFDecoderAttention(LibraryCache, TransformersAdapter):
    """A decoder attention function of Transformers (``implementation``: "eager" or "sdpa"), with
    a ``DynamicCache``, behind the spec's SDPA."""

    def __init__(self, name: str, implementation: str, **claims):
        function = ("Gemma 2 eager_attention_forward" if implementation == "eager"
                    else "sdpa_attention_forward")
        super().__init__(name, implementation,
                         native_op=f"transformers {function} with a DynamicCache", **claims)

    def attention(self, q, k, v, m: MaskArgs):
        mask = decoder_attention_mask(self, q.shape[2], k.shape[2], q, m)
        return self._function(q, k, v, m, mask)

    def _function(self, q, k, v, m: MaskArgs, attention_mask):
        """The attention function -> (output (B, h, L_q, d_v), weights or None)."""
        function = _hf()[1][self.implementation]
        extra = ({"softcap": None if m.softcap is None else float(m.softcap)}
                 if self.implementation == "eager" else {"is_causal": False})
        with torch_module().no_grad():
            out, weights = function(_Module(q.shape[1] // k.shape[1], q.shape[3]), q, k, v,
                                    attention_mask, dropout=0.0, scaling=m.scale, **extra)
        return out.transpose(1, 2), weights

    # -- KV cache (CACHE): a DynamicCache (calls reach it through LibraryCache) ----------------
    def cached_attention(self, q, k, v, m: MaskArgs, past_key, past_value, index):
        """The function over a ``DynamicCache`` holding ``past_key`` (B, g, L_past, d_k) and
        ``past_value``, updated with ``k``, ``v``; ``m`` over CACHE-1's layout, ``index`` (B, L_K)
        NumPy or None (a full cache) -> :class:`AttentionOutputs` without lse."""
        dynamic_cache, _ = _hf()
        cache = dynamic_cache()
        cache.update(past_key, past_value, 0)
        keys, values = cache.update(k, v, 0)
        attention_mask = decoder_attention_mask(self, q.shape[2], keys.shape[2], q, m)
        if attention_mask is not None:
            blocked = (False if attention_mask.dtype == torch_module().bool else
                       torch_module().finfo(q.dtype).min if self.implementation == "eager"
                       else -math.inf)
            attention_mask = self.to_library_layout(attention_mask, index, blocked)
        out, weights = self._function(q, keys, values, m, attention_mask)
        weights, keys, values = self.from_library_layout(weights, keys, values, index)
        return AttentionOutputs(out, weights, None, keys, values)


_CAPABILITIES = frozenset({"sdpa", "mha", "masks", "bias", "scale", "legacy_mask", "causal",
                           "cross", "errors", "gqa", "kv_cache"})

EAGER = HFDecoderAttention(
    "hf-gemma2-eager", "eager", capabilities=_CAPABILITIES | {"weights", "softcap"},
    deviations={
        **EAGER_DEVIATIONS,
        "MASK-13": MASK_13.format(fill="finfo(dtype).min"),
        "NUM-1": "float64 is not supported: the softmax runs in float32 "
                 "(softmax(..., dtype=torch.float32)), so float64 is not claimed",
    },
    conventions=MASK_FORM, dtypes=("float32", "float16", "bfloat16"))
SDPA = HFDecoderAttention(
    "hf-decoder-sdpa", "sdpa", capabilities=_CAPABILITIES,
    deviations={
        "MASK-13": MASK_13.format(fill="-inf"),
        "NUM-6": SDPA_NUM_6,
        "SHAPE-4": "B = 0 or L_q = 0 fails: sdpa_attention_forward reshapes its output to (B, -1, "
                   "L_q, d_v), and -1 is ambiguous for 0 elements (RuntimeError 'cannot reshape "
                   "tensor of 0 elements'); L_k = 0 gives zeros",
    },
    conventions={})
