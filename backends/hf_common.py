"""What the Transformers adapters share: one constructor, the version, and the declarations they
make alike (:mod:`.hf_native`'s BERT self-attention, :mod:`.hf_decoder`'s decoder attention).

An adapter names its attention ``implementation`` ("eager" or "sdpa"), the op for the certificate,
and what it claims, deviates from and translates; :class:`TransformersAdapter` stores them once.
:func:`decoder_attention_mask` builds the ``attention_mask`` a decoder attention function
receives (:mod:`.hf_decoder`, :mod:`.hf_gpt_oss`).
"""

from __future__ import annotations

from .optional import require

require("transformers", extra="hf")

from . import masks as mask_forms  # noqa: E402
from .adapters import MaskArgs, TorchAdapter  # noqa: E402
from .optional import torch_module  # noqa: E402

#: MASK-9 and MASK-11 of an ``eager`` function: blocked keys get ``finfo(dtype).min``
EAGER_DEVIATIONS = {
    "MASK-9": "fully masked row -> output the mean of V and weights 1/L_k (blocked keys get "
              "finfo(dtype).min, so the row's softmax is uniform)",
    "MASK-11": "a fully masked row differs between mask=M (the mean of V: finfo.min logits) "
               "and bias=where(M, 0, -inf) (NaN: every logit -inf); rows with an allowed key "
               "agree",
}
#: MASK-13, with the value a blocked logit gets
MASK_13 = ("a NaN or inf key behind the attention mask leaks into the rows that exclude it (the "
           "mask is added to the logits, and NaN + {fill} is NaN)")
#: NUM-6 of an ``sdpa`` function (torch's fused CPU kernel)
SDPA_NUM_6 = ("a query row whose logits are NaN gives an output row of 0, not NaN (torch's "
              "fused CPU kernel treats it like a fully masked row)")
#: the ``eager`` functions' mask form, which the adapters translate
MASK_FORM = {"mask-form": (
    "MASK-1", "attention_mask is added to the logits: 0 where a key may be attended, "
              "finfo(dtype).min elsewhere; the adapter builds it from the spec's booleans")}


class TransformersAdapter(TorchAdapter):
    """A Transformers attention ``implementation`` ("eager" or "sdpa") behind the spec's
    operations; ``dtypes`` None: the four of :class:`~.adapters.TorchAdapter`."""

    framework = "transformers"

    def __init__(self, name: str, implementation: str, *, native_op: str, capabilities: frozenset,
                 deviations: dict, conventions: dict, dtypes: tuple[str, ...] | None = None):
        self.implementation = implementation
        self.native_op = native_op
        self.capabilities = capabilities
        self.deviations = deviations
        self.conventions = conventions
        self._dtypes = dtypes
        super().__init__(name)

    def framework_version(self) -> str:
        import transformers

        return transformers.__version__

    def dtypes(self, device: str) -> tuple[str, ...]:
        return self._dtypes or super().dtypes(device)


def decoder_attention_mask(adapter: TransformersAdapter, len_q: int, len_k: int, like,
                           m: MaskArgs):
    """The ``attention_mask`` (B|1, h|1, L_q, L_k) of a decoder attention function, or None.

    ``eager``: added to the logits; as Transformers builds it (``masking_utils``), 0 where a key may
    be attended and ``finfo(dtype).min`` elsewhere, from the AND of ``mask``, ``key_padding_mask``
    and causal, plus ``bias``, ``legacy_mask * -1e9`` and the ALiBi bias (without the "mask-form"
    translation: the boolean as it is, which the function adds as 0 / 1). ``sdpa``: the boolean
    (True = may attend, as Transformers passes it), or ``where(allowed, additive, -inf)``."""
    allowed = mask_forms.allowed_mask(len_q, len_k, like=like, mask=m.mask,
                                      key_padding_mask=m.key_padding_mask, causal=m.causal)
    additive = mask_forms.additive_mask(like=like, bias=m.bias, legacy_mask=m.legacy_mask)
    if m.alibi is not None:
        additive = m.alibi if additive is None else additive + m.alibi
    if allowed is None:
        return additive
    if adapter.implementation == "sdpa":
        return allowed if additive is None else mask_forms.fill_blocked(allowed, like=like,
                                                                        additive=additive)
    if not adapter.translates("mask-form"):
        return allowed  # the spec's boolean as it is: added as 0 / 1 (what the op does)
    blocked = mask_forms.fill_blocked(allowed, like=like, fill=torch_module().finfo(like.dtype).min)
    return blocked if additive is None else additive + blocked
