"""PyTorch's ``scaled_dot_product_attention`` with one kernel forced: one backend per kernel.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

``torch-sdpa`` lets torch pick a kernel per call; these adapters run the same mapping (see
:mod:`.torch_native`: masks, causal alignment, scale) inside ``torch.nn.attention.sdpa_kernel([k])``
with one :class:`torch.nn.attention.SDPBackend` ``k``, so a certificate describes one kernel:

* ``torch-sdpa-math``: ``MATH``, CPU and CUDA, float64, float32, float16, bfloat16;
* ``torch-sdpa-flash-cpu``: ``FLASH_ATTENTION`` on CPU, float64, float32, float16, bfloat16;
* ``torch-sdpa-flash-cuda``: ``FLASH_ATTENTION`` on CUDA, float16, bfloat16;
* ``torch-sdpa-efficient-cuda``: ``EFFICIENT_ATTENTION`` on CUDA, float32, float16, bfloat16;
* ``torch-sdpa-cudnn-cuda``: ``CUDNN_ATTENTION`` on CUDA, float16, bfloat16.

The flash kernels (CPU and CUDA) and cuDNN require ``d_v == d_k`` (torch raises "No available
kernel" otherwise): the narrower of ``q``/``k`` and ``v`` is zero-padded on the last axis, the scale
is passed explicitly (it is already), and the output is sliced back to ``d_v``. Zero columns add
exact zeros to every dot product, so this is exact. The CUDA flash and cuDNN kernels take no
``attn_mask``: those adapters claim no masks and no causal alignment (bottom-right needs a mask).

Observed with torch 2.13 on CPU (the CUDA adapters have not been run: no CUDA device here; their
dtypes are the kernels' documented input types, and float64 is declared against NUM-1):

* both CPU kernels give 0 for a fully masked row (MASK-9 holds);
* both leak a NaN or inf key behind a boolean mask into the rows that exclude it (MASK-13);
* a query row whose logits are NaN: the math kernel gives NaN (NUM-6 holds), the flash kernel 0.

Spec 1.3 (capability "attention_vjp"): the backward pass is torch's autograd through the kernel's
own backward (the flash kernel records ``_scaled_dot_product_flash_attention_for_cpu`` and runs its
``..._backward``; the math kernel is differentiated op by op), GQA through ``enable_gqa``. Observed
with torch 2.13 on CPU: both kernels conform to GRAD-3, GRAD-4 and GRAD-7 (exact zeros for fully
masked rows and unattended keys, no NaN). Only the math kernel differentiates a float
``attn_mask``: with a bias that requires grad the flash kernel raises "No available kernel", so
of the kernels only ``torch-sdpa-math`` claims "bias" and "bias_grad" (GRAD-9), as ``torch-sdpa``
does. The CUDA adapters claim "attention_vjp" as well, unrun here.
"""

from __future__ import annotations

from .adapters import MaskArgs
from .optional import torch_module
from .torch_native import TorchSDPA

_MASK_13 = TorchSDPA.deviations["MASK-13"]


class TorchSDPAKernel(TorchSDPA):
    """``scaled_dot_product_attention`` under ``sdpa_kernel([SDPBackend.<kernel>])``.

    ``kernel``: the ``SDPBackend`` member's name; ``device``: "cpu", "cuda" or None (both);
    ``same_widths``: the kernel requires d_v == d_k (the adapter pads, see the module docstring).
    """

    def __init__(self, name: str, *, kernel: str, device: str | None, same_widths: bool,
                 dtypes: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16"),
                 capabilities: frozenset | None = None, deviations: dict | None = None):
        super().__init__(name)
        self.kernel = kernel
        self.device = device
        self.same_widths = same_widths
        self._dtypes = dtypes
        self.native_op = (f"torch.nn.functional.scaled_dot_product_attention under "
                          f"sdpa_kernel([SDPBackend.{kernel}])")
        if capabilities is not None:
            self.capabilities = capabilities
            # a convention of a capability not claimed cannot be exercised
            self.conventions = {} if "causal" not in capabilities else self.conventions
            self.translated = frozenset(self.conventions)
        if deviations is not None:
            self.deviations = deviations

    def devices(self) -> dict[str, str | None]:
        found = super().devices()
        if self.device is None:
            return found
        only = f"the {self.kernel} kernel runs on {self.device.upper()} only"
        return {d: (why if d == self.device else only) for d, why in found.items()}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return self._dtypes

    def attention(self, q, k, v, masks: MaskArgs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, self.kernel)]):
            if not self.same_widths:
                return super().attention(q, k, v, masks)
            d_k, d_v = q.shape[-1], v.shape[-1]
            width = max(d_k, d_v)

            def widen(x):
                pad = width - x.shape[-1]
                return torch_module().nn.functional.pad(x, (0, pad)) if pad else x

            out, weights = super().attention(widen(q), widen(k), widen(v), masks)
            return out[..., :d_v], weights


def _no_float64(kernel: str, dtypes: tuple[str, ...]) -> dict[str, str]:
    return {"NUM-1": f"the {kernel} kernel takes {', '.join(dtypes)} only (torch's sdp_utils "
                     f"input checks), so float64{'' if 'float32' in dtypes else ' and float32'} "
                     f"are not claimed"}


_CUDA_NO_MASK = frozenset({"sdpa", "errors", "grad", "attention_vjp"})

#: what torch-sdpa claims but a float bias: only the math kernel differentiates one on CPU (the
#: flash kernel raises "No available kernel"); the efficient CUDA kernel is unrun here
_NO_BIAS = TorchSDPA.capabilities - {"bias", "bias_grad"}

MATH = TorchSDPAKernel("torch-sdpa-math", kernel="MATH", device=None, same_widths=False,
                       deviations={"MASK-13": _MASK_13})
FLASH_CPU = TorchSDPAKernel(
    "torch-sdpa-flash-cpu", kernel="FLASH_ATTENTION", device="cpu", same_widths=True,
    capabilities=_NO_BIAS,
    deviations={"MASK-13": _MASK_13,
                "NUM-6": "a query row whose logits are NaN gives an output row of 0, not NaN "
                         "(the fused CPU kernel treats it like a fully masked row)"})
FLASH_CUDA = TorchSDPAKernel(
    "torch-sdpa-flash-cuda", kernel="FLASH_ATTENTION", device="cuda", same_widths=True,
    dtypes=("float16", "bfloat16"), capabilities=_CUDA_NO_MASK,
    deviations=_no_float64("FLASH_ATTENTION", ("float16", "bfloat16")))
EFFICIENT_CUDA = TorchSDPAKernel(
    "torch-sdpa-efficient-cuda", kernel="EFFICIENT_ATTENTION", device="cuda", same_widths=False,
    dtypes=("float32", "float16", "bfloat16"), capabilities=_NO_BIAS,
    deviations={"MASK-13": _MASK_13, "NUM-6": TorchSDPA.deviations["NUM-6"],
                **_no_float64("EFFICIENT_ATTENTION", ("float32", "float16", "bfloat16"))})
CUDNN_CUDA = TorchSDPAKernel(
    "torch-sdpa-cudnn-cuda", kernel="CUDNN_ATTENTION", device="cuda", same_widths=True,
    dtypes=("float16", "bfloat16"), capabilities=_CUDA_NO_MASK,
    deviations=_no_float64("CUDNN_ATTENTION", ("float16", "bfloat16")))
