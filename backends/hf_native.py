"""Adapters for Hugging Face Transformers' BERT self-attention (``BertSelfAttention``) with its
``eager`` and ``sdpa`` attention implementations: ``hf-bert-eager``, ``hf-bert-sdpa``.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model hidden size, d_k per-head width,
d_out output width.

Inputs are validated with :mod:`.arg_checks` (through :class:`~.torch_backend.TorchBackend`'s entry
points) before anything reaches Transformers. One module per call, built from a small config
(nothing is downloaded): ``BertConfig(hidden_size=d_model, num_attention_heads=h,
attention_probs_dropout_prob=0)`` with ``config._attn_implementation`` set to the implementation,
in eval mode and in the inputs' dtype. The mapping:

* parameters: ``query``, ``key``, ``value`` are ``nn.Linear(d_model, d_model)``, which store
  ``(out, in)``: ``weight = W.T``, ``bias = b`` (an absent bias is zero). BERT's self-attention has
  no output projection (``BertSelfOutput`` adds a residual and LayerNorm), so the spec's ``W_o``,
  ``b_o`` are applied by the adapter after the module's attention;
* widths: every projection is ``d_model -> d_model`` (``h*d_k = h*d_v = d_model``,
  ``k_dim = v_dim = d_model``), else ``NotImplementedError``; "cross" is not claimed. The scale is
  the module's ``attention_head_size ** -0.5``; another scale raises ``NotImplementedError``;
* the computation is ``BertSelfAttention.forward`` line for line (``query``/``key``/``value``
  Linear, ``view(B, L, -1, d_k).transpose(1, 2)``, the implementation's attention function from
  ``ALL_ATTENTION_FUNCTIONS`` with ``scaling=module.scaling`` and dropout 0, ``reshape(B, L_q, -1)``)
  with the keys and values projected from ``key`` and ``value`` (as ``BertCrossAttention`` projects
  them from ``encoder_hidden_states``); for self-attention this is the module's own forward
  (checked in tests/test_ecosystem_adapters.py);
* masks: ``eager`` adds ``attention_mask`` to the logits; Transformers builds it as 0 where a key
  may be attended and ``torch.finfo(dtype).min`` elsewhere, and so does the adapter, from the AND
  of ``mask``, ``key_padding_mask`` (``[:, None, None, :]``) and causal, plus ``bias`` and
  ``legacy_mask * -1e9``. ``sdpa`` passes ``attention_mask`` to
  ``torch.nn.functional.scaled_dot_product_attention``: a boolean mask (True = may attend, the
  spec's polarity and what Transformers passes), or with ``bias``/``legacy_mask`` the float
  ``where(allowed, bias, -inf)``. Causal is always an explicit mask, as Transformers' own mask
  functions build it (the ``sdpa`` function's ``is_causal`` path is for decoders with ``L_q > 1``);
* weights: ``eager`` returns the softmax ``(B, h, L_q, L_k)``; ``sdpa`` returns None (not claimed).

Observed with transformers 5.24.0 on torch 2.13 (CPU), reproduced in docs/ecosystem.md:

* both: ``B = 0``, ``L_q = 0`` or ``L_k = 0`` fails: ``BertSelfAttention.forward`` views each
  projection as ``(B, L, -1, d_k)``, and ``-1`` is ambiguous for a tensor of 0 elements
  (``RuntimeError: cannot reshape tensor of 0 elements``; SHAPE-4);
* eager: a fully masked row attends uniformly (``finfo.min`` logits): output the mean of V (MASK-9);
  a NaN key behind the mask leaks into every row (NaN + min is NaN; MASK-13);
* sdpa: a NaN key behind the mask leaks (MASK-13); a NaN query row gives 0 through torch's fused
  CPU kernel (NUM-6).
"""

from __future__ import annotations

import functools

from .optional import require

require("transformers", extra="hf")

from . import layouts  # noqa: E402
from . import masks as mask_forms  # noqa: E402
from ._base import MHAParams  # noqa: E402
from .adapters import PROJECTIONS, MaskArgs  # noqa: E402
from .hf_common import (EAGER_DEVIATIONS, MASK_13, MASK_FORM, SDPA_NUM_6,  # noqa: E402
                        TransformersAdapter)
from .optional import torch_module  # noqa: E402

_SHAPE_4 = ("B = 0, L_q = 0 or L_k = 0 fails: BertSelfAttention.forward views each projection as "
            "(B, L, -1, d_k), and -1 is ambiguous for 0 elements (RuntimeError 'cannot reshape "
            "tensor of 0 elements')")


@functools.cache
def _bert():
    """(BertConfig, BertSelfAttention, ALL_ATTENTION_FUNCTIONS, eager_attention_forward)."""
    from transformers import BertConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert import modeling_bert

    return (BertConfig, modeling_bert.BertSelfAttention, ALL_ATTENTION_FUNCTIONS,
            modeling_bert.eager_attention_forward)


class HFBertSelfAttention(TransformersAdapter):
    """``BertSelfAttention`` with one attention implementation behind the spec's multi-head
    attention; ``implementation``: "eager" or "sdpa"."""

    def __init__(self, name: str, implementation: str, **claims):
        super().__init__(name, implementation, native_op=f"transformers BertSelfAttention "
                         f"(attn_implementation={implementation!r})", **claims)

    def module(self, p: MHAParams, num_heads: int, like):
        """A ``BertSelfAttention`` in eval mode holding ``W_q``, ``W_k``, ``W_v`` and their biases
        (PARAM-1; ``W_o``, ``b_o`` are not part of it)."""
        torch = torch_module()
        config_cls, attention_cls, _, _ = _bert()
        d_model, hd_k = p.w_q.shape
        k_dim, v_dim = p.w_k.shape[0], p.w_v.shape[0]
        hd_v = p.w_v.shape[1]
        if not hd_k == hd_v == k_dim == v_dim == d_model:
            self.unsupported(f"h*d_k = {hd_k}, h*d_v = {hd_v}, k_dim = {k_dim}, v_dim = {v_dim} "
                             f"with d_model = {d_model}: every projection is hidden_size -> "
                             f"hidden_size")
        config = config_cls(hidden_size=d_model, num_attention_heads=num_heads,
                            attention_probs_dropout_prob=0.0)
        config._attn_implementation = self.implementation
        mod = attention_cls(config).to(dtype=like.dtype, device=like.device).eval()
        linear = layouts.to_linear(layouts.with_zero_biases(p))
        with torch.no_grad():
            for module, (weight, bias) in zip((mod.query, mod.key, mod.value), linear):
                module.weight.copy_(weight)
                module.bias.copy_(bias)
        return mod

    def _attention_mask(self, len_q: int, len_k: int, like, masks: MaskArgs):
        """The ``attention_mask`` the implementation's attention function receives, or None."""
        allowed = mask_forms.allowed_mask(len_q, len_k, like=like, mask=masks.mask,
                                          key_padding_mask=masks.key_padding_mask,
                                          causal=masks.causal)
        additive = mask_forms.additive_mask(like=like, bias=masks.bias,
                                            legacy_mask=masks.legacy_mask)
        if allowed is None:
            return additive
        if self.implementation == "eager" and self.translates("mask-form"):
            # 0 / finfo.min, as Transformers builds it
            blocked = mask_forms.fill_blocked(allowed, like=like,
                                              fill=torch_module().finfo(like.dtype).min)
            return blocked if additive is None else additive + blocked
        if additive is None:  # sdpa: the boolean, as Transformers passes it
            return allowed
        return mask_forms.fill_blocked(allowed, like=like, additive=additive)

    def mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs):
        torch = torch_module()
        d_k = p.w_q.shape[1] // num_heads
        if not mask_forms.is_default_scale(masks.scale, d_k):
            self.unsupported(f"scale = {masks.scale!r} (it always uses 1/sqrt(d_k) = "
                              f"{1 / d_k ** 0.5!r})")
        len_q, len_k = query.shape[1], key.shape[1]
        with torch.no_grad():
            mod = self.module(p, num_heads, query)
            attention_mask = self._attention_mask(len_q, len_k, query, masks)
            out, weights = self.attend(mod, query, key, value, attention_mask)
            return PROJECTIONS.linear(self.ops, out, p.w_o, p.b_o), weights

    def attend(self, mod, query, key, value, attention_mask):
        """``BertSelfAttention.forward`` with keys and values projected from ``key`` and
        ``value``: (B, L_q, d_model) attention output before any output projection, weights."""
        _, _, functions, eager = _bert()
        d = mod.attention_head_size
        q = mod.query(query).view(*query.shape[:-1], -1, d).transpose(1, 2)
        k = mod.key(key).view(*key.shape[:-1], -1, d).transpose(1, 2)
        v = mod.value(value).view(*value.shape[:-1], -1, d).transpose(1, 2)
        interface = functions.get_interface(mod.config._attn_implementation, eager)
        out, weights = interface(mod, q, k, v, attention_mask, dropout=0.0, scaling=mod.scaling)
        return out.reshape(*query.shape[:-1], -1).contiguous(), weights


_CAPABILITIES = frozenset({"mha", "masks", "bias", "legacy_mask", "causal", "errors"})

EAGER = HFBertSelfAttention(
    "hf-bert-eager", "eager", capabilities=_CAPABILITIES | {"weights"},
    deviations={**EAGER_DEVIATIONS, "MASK-13": MASK_13.format(fill="finfo(dtype).min"),
                "SHAPE-4": _SHAPE_4},
    conventions=MASK_FORM)
SDPA = HFBertSelfAttention(
    "hf-bert-sdpa", "sdpa", capabilities=_CAPABILITIES,
    deviations={"SHAPE-4": _SHAPE_4, "MASK-13": MASK_13.format(fill="-inf"), "NUM-6": SDPA_NUM_6},
    conventions={})
