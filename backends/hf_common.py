"""What the Transformers adapters share: one constructor, the version, and the declarations they
make alike (:mod:`.hf_native`'s BERT self-attention, :mod:`.hf_decoder`'s decoder attention).

An adapter names its attention ``implementation`` ("eager" or "sdpa"), the op for the certificate,
and what it claims, deviates from and translates; :class:`TransformersAdapter` stores them once.
"""

from __future__ import annotations

from .optional import require

require("transformers", extra="hf")

from .adapters import TorchAdapter  # noqa: E402

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
