"""Adapter for Hugging Face Transformers' gpt-oss attention with its attention sinks:
``hf-gptoss-eager``.

Axis legend: B batch, L_q / L_k lengths, h query heads, g key/value heads, d_k / d_v per-head
widths.

The op is gpt-oss's ``eager_attention_forward(module, query, key, value, attention_mask, scaling,
dropout)`` (``transformers.models.gpt_oss.modeling_gpt_oss``): ``repeat_kv`` repeats each
key/value head ``module.num_key_value_groups`` times, the logits ``query @ key^T * scaling`` get
``attention_mask`` added, ``module.sinks`` (h,) is concatenated as one more logit column, the row
maximum is subtracted, the softmax runs in the input dtype and the sink column is dropped; it
returns the output ``(B, L_q, h, d_v)`` and the weights ``(B, h, L_q, L_k)`` without the sink.
Inputs are validated before anything reaches Transformers. The mapping:

* ``q`` ``(B, h, L_q, d_k)``, ``k``, ``v`` with g heads: as they are (GQA-1); the output is
  transposed back to ``(B, h, L_q, d_v)``; ``scaling``: the spec's scale;
* ``sinks`` (SINK-1): ``module.sinks``, in the inputs' dtype; in ``attention_vjp`` it is the
  autograd primal, so dq, dk, dv and the sinks' gradient (key ``"sinks"``, SINK-3) are torch
  autograd's through the function, the library's own backward;
* a call without ``sinks``: ``module.sinks`` = -inf for every head. The function has no way to
  leave the sink out (it always concatenates ``module.sinks``), and a -inf sink adds
  ``exp(-inf - max) = 0`` to every denominator exactly, so the function then computes spec 1.2's
  softmax itself (its dq, dk, dv too: the column's probability is 0);
* masks: ``attention_mask`` as Transformers builds it for an eager function (0 where a key may be
  attended, ``finfo(dtype).min`` elsewhere, plus ``bias`` and ``legacy_mask * -1e9``;
  :func:`.hf_common.decoder_attention_mask`, the ``mask-form`` convention).

Not claimed: ``lse`` (the function returns none, so GRAD-8's cotangent has nothing to reach),
``softcap`` (gpt-oss has none; the function's ``**kwargs`` would swallow it unused), windows
(``sliding_window`` lives in Transformers' mask functions, not in this function), a KV cache.

Observed with transformers 5.24.0 on torch 2.13 (CPU), calls without sinks (the sink is -inf):

* a fully masked row attends uniformly (``finfo.min`` logits): output the mean of V (MASK-9);
  with a finite sink the same row gives output 0 and weights 0, as SINK-2 says;
* such a row masked by a ``-inf`` bias instead is NaN (every logit and the sink -inf; MASK-11);
* a NaN key behind the mask leaks into every row (NaN + finfo.min is NaN; MASK-13);
* the backward of that NaN row (autograd through the softmax) makes its dq and the dk and dv of
  every key of its batch item and head NaN (GRAD-7), as ``jax.nn.dot_product_attention``'s does.
"""

from __future__ import annotations

import functools
import math

from .optional import require

require("transformers", extra="hf")

from .adapters import MaskArgs  # noqa: E402
from .hf_common import (EAGER_DEVIATIONS, MASK_13, MASK_FORM, TransformersAdapter,  # noqa: E402
                        decoder_attention_mask)
from .optional import torch_module  # noqa: E402


@functools.cache
def _modeling_gpt_oss():
    """Transformers' gpt-oss modeling module; ``eager_attention_forward`` is looked up on it at
    each call."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    return modeling_gpt_oss


class _Layer:
    """What the attention function reads of its layer: the key/value head grouping, the sinks
    (h,), eval mode (no dropout)."""

    def __init__(self, groups: int, sinks):
        self.num_key_value_groups = groups
        self.sinks = sinks
        self.training = False


class GptOssAttention(TransformersAdapter):
    """gpt-oss's eager attention function of Transformers behind the spec's SDPA, its
    ``module.sinks`` the spec's ``sinks``."""

    def __init__(self, name: str, **claims):
        super().__init__(name, "eager", native_op="transformers gpt-oss eager_attention_forward "
                                                  "(module.sinks)", **claims)

    def attention(self, q, k, v, m: MaskArgs):
        """A call without sinks: the function with a -inf sink (no term in any denominator)."""
        torch = torch_module()
        return self.attention_with_sinks(q, k, v, m, torch.full((q.shape[1],), -math.inf,
                                                               dtype=q.dtype, device=q.device))

    def attention_features(self, q, k, v, masks: MaskArgs, features):
        """A call with ``sinks`` (h,): the features folded into ``masks``, the sinks as
        ``module.sinks``; other feature calls take the generic path."""
        if features.sinks is None:
            return NotImplemented
        folded, _ = self.fold_features(q, masks, features, q.shape[2], k.shape[2])
        sinks = torch_module().as_tensor(features.sinks, dtype=q.dtype, device=q.device)
        return self.attention_with_sinks(q, k, v, folded, sinks)

    def attention_with_sinks(self, q, k, v, m: MaskArgs, sinks):
        """q (B, h, L_q, d_k), k and v (B, g, L_k, d), sinks (h,) a tensor -> (output (B, h, L_q,
        d_v), weights (B, h, L_q, L_k)) by the library's function."""
        attention_mask = decoder_attention_mask(self, q.shape[2], k.shape[2], q, m)
        out, weights = _modeling_gpt_oss().eager_attention_forward(
            _Layer(q.shape[1] // k.shape[1], sinks), q, k, v, attention_mask, scaling=m.scale,
            dropout=0.0)
        return out.transpose(1, 2), weights


EAGER = GptOssAttention(
    "hf-gptoss-eager",
    capabilities=frozenset({"sdpa", "mha", "weights", "masks", "bias", "scale", "legacy_mask",
                            "causal", "cross", "errors", "gqa", "sink", "attention_vjp"}),
    deviations={
        **EAGER_DEVIATIONS,
        "MASK-13": MASK_13.format(fill="finfo(dtype).min"),
        "GRAD-7": "without sinks (a -inf sink), a row that a -inf bias empties is NaN (MASK-11), "
                  "and its backward makes that row's dq and the dk and dv of every key of its "
                  "batch item and head NaN, with a zero cotangent on the row too; with a finite "
                  "sink the row is 0 and its gradients exact zeros",
    },
    conventions=MASK_FORM)
