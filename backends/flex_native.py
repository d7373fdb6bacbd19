"""Adapter for PyTorch's FlexAttention, ``torch.nn.attention.flex_attention.flex_attention``
(eager, CPU and CUDA): ``torch-flex``.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

Inputs are validated with :mod:`.arg_checks` (through :class:`~.torch_backend.TorchBackend`'s entry
points) before anything reaches torch. FlexAttention takes the spec's layout ``(B, h, L, d)`` with
``d_v != d_k`` and a ``scale``; everything else is expressed through its two callbacks:

* ``block_mask`` (``create_block_mask(mask_mod, B, h, L_q, L_k)``): ``mask_mod(b, h, q_idx,
  kv_idx)`` returns True where the query may attend (the spec's polarity): the AND of ``mask``
  (expanded to ``(B, h, L_q, L_k)`` and indexed), ``key_padding_mask[b, kv_idx]`` and the causal
  condition ``kv_idx <= q_idx + offset`` (offset 0 top-left, ``L_k - L_q`` bottom-right);
* ``score_mod(score, b, h, q_idx, kv_idx)`` receives the scaled logit and returns it plus
  ``bias`` and ``legacy_mask * -1e9`` at that index;
* spec 1.2: ``k``, ``v`` with g heads use ``enable_gqa=True`` (GQA-1); the soft-cap is
  ``c * tanh(score / c)`` in ``score_mod`` before the additive terms (SOFTCAP-1); windows, segments
  and sequence lengths (a structural mask from :mod:`.positions`) join the ``mask_mod`` table and
  the ALiBi bias (also from :mod:`.positions`) the ``score_mod`` table; the log-sum-exp (LSE-1) is
  the op's own, ``return_aux=AuxRequest(lse=True)`` (:meth:`FlexAttention.attention_with_lse`).
  No KV cache (not claimed);
* the op returns no attention weights: ``None``, and "weights" is not claimed.

It is called without ``torch.compile`` (the unfused path that materialises the scores: the one that
runs on a CPU without a compiler toolchain); the warning it prints about that is silenced.

Observed with torch 2.13 on CPU: a fully masked row gives 0 (MASK-9 holds, with the block mask and
with ``-inf`` from ``score_mod``); a NaN key behind the block mask does not leak (MASK-13 holds); a
NaN query row gives NaN (NUM-6 holds); ``L_k = 0`` raises ``IndexError`` ("max(): Expected
reduction dim 3 to have non-zero size"), with or without a block mask (declared against SHAPE-4;
``B = 0`` and ``L_q = 0`` give empty results). Its backward raises
``NotImplementedError("FlexAttention does not support backward on CPU. ...")`` (under
``torch.compile`` too), so neither "grad" nor spec 1.3's "attention_vjp" is claimed: capabilities
are per backend, and its CUDA backward is unrun here.
"""

from __future__ import annotations

import warnings

from . import masks as mask_forms
from .adapters import MaskArgs, TorchAdapter

_EAGER_WARNING = "flex_attention called without torch.compile"


class FlexAttention(TorchAdapter):
    """``flex_attention`` (eager) behind the spec's SDPA."""

    framework = "torch"
    native_op = "torch.nn.attention.flex_attention.flex_attention (eager)"
    # no "grad", no "attention_vjp": "FlexAttention does not support backward on CPU"
    # (NotImplementedError, torch 2.13)
    capabilities = frozenset({"sdpa", "masks", "bias", "scale", "causal", "legacy_mask", "errors",
                              "gqa", "softcap", "window", "alibi", "segments", "lse"})
    deviations = {
        "SHAPE-4": "L_k = 0 raises IndexError ('max(): Expected reduction dim 3 to have non-zero "
                   "size'), with or without a block mask (B = 0 and L_q = 0 give empty results)",
    }
    #: it takes the spec's layout, polarity and alignment as they are: nothing to translate
    conventions: dict = {}

    def __init__(self, name: str = "torch-flex"):
        super().__init__(name)

    def attention(self, q, k, v, masks: MaskArgs):
        out, _ = self._flex(q, k, v, masks, lse=False)
        return out, None

    def attention_with_lse(self, q, k, v, masks: MaskArgs):
        """The op's own lse (``return_aux=AuxRequest(lse=True)``): (output, None, lse (B, h, L_q))."""
        out, row_lse = self._flex(q, k, v, masks, lse=True)
        return out, None, row_lse

    def _flex(self, q, k, v, masks: MaskArgs, *, lse: bool):
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> (output (B, h, L_q, d_v),
        lse (B, h, L_q) or None): one flex_attention call."""
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

        b, h, len_q, _ = q.shape
        len_k = k.shape[2]
        full = (b, h, len_q, len_k)
        allowed = mask_forms.allowed_mask(len_q, len_k, like=q, mask=masks.mask,
                                          key_padding_mask=masks.key_padding_mask)
        additive = mask_forms.additive_mask(like=q, bias=masks.bias, legacy_mask=masks.legacy_mask)
        alibi = getattr(masks, "alibi", None)
        if alibi is not None:
            additive = alibi if additive is None else additive + alibi
        kwargs = {}
        if allowed is not None or masks.causal is not None:
            kwargs["block_mask"] = create_block_mask(self._mask_mod(allowed, masks.causal, full,
                                                                    q.device),
                                                     b, h, len_q, len_k, device=q.device.type)
        score_mod = self._score_mod(additive, getattr(masks, "softcap", None), full)
        if score_mod is not None:
            kwargs["score_mod"] = score_mod
        if k.shape[1] != h:
            kwargs["enable_gqa"] = True  # query head i uses key/value head i // (h / g) (GQA-1)
        if lse:
            kwargs["return_aux"] = AuxRequest(lse=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EAGER_WARNING)
            result = flex_attention(q, k, v, scale=masks.scale, **kwargs)
        if lse:
            out, aux = result
            return out, aux.lse
        return result, None

    @staticmethod
    def _score_mod(additive, softcap, full):
        """``score_mod(score, b, h, q_idx, kv_idx)`` of the scaled logit: ``c tanh(score / c)``
        with a soft-cap c (SOFTCAP-1), then plus ``additive`` (bias, legacy mask, ALiBi) at the
        index; None when there is neither."""
        if additive is None and softcap is None:
            return None
        table = None if additive is None else additive.expand(*full).contiguous()

        def score_mod(score, bi, hi, qi, ki):
            if softcap is not None:
                score = softcap * (score / softcap).tanh()
            return score if table is None else score + table[bi, hi, qi, ki]

        return score_mod

    @staticmethod
    def _mask_mod(allowed, causal, full, device):
        """``mask_mod(b, h, q_idx, kv_idx)``: ``allowed`` (rank 4 or None) at the index AND the
        causal condition ``kv_idx <= q_idx + offset`` (offset 0 top-left, L_k - L_q bottom-right)."""
        import torch

        # Captured values are what TorchDynamo (which flex_attention runs itself through) guards
        # on: the offset as a tensor and the table laid out contiguously, not an int and a view
        # with broadcast strides, recompile less (212 -> 141 in one float32 cell of the ci profile)
        offset = torch.tensor(0 if causal != "bottom_right" else full[3] - full[2], device=device)
        table = None if allowed is None else allowed.expand(*full).contiguous()

        def mask_mod(bi, hi, qi, ki):
            if causal is None:
                return table[bi, hi, qi, ki]
            ok = ki <= qi + offset
            return ok if table is None else ok & table[bi, hi, qi, ki]

        return mask_mod


FLEX = FlexAttention("torch-flex")
