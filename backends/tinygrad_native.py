"""Adapter for tinygrad's attention, ``tinygrad.Tensor.scaled_dot_product_attention``:
``tinygrad-sdpa``, on :class:`~.foreign.ForeignAdapter` (the suite's arrays NumPy, converted at the
op).

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k keys, d_k / d_v widths.

The op takes q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) (g dividing h with
``enable_gqa=True``: query head i reads key/value head i // (h / g)) and one ``attn_mask``:
boolean (True = may attend, which the op turns into 0 and -inf) or additive, broadcastable to
(B, h, L_q, L_k), into which the base folds the spec's mask, key padding, causal, bias and legacy
mask. It has no ``scale``: it divides q k^T by sqrt(d_k), so a caller's scale s reaches it as q
multiplied by s sqrt(d_k) (one more rounding of q; the default scale passes q as it is), inside
what the library differentiates. It is tinygrad code: q k^T accumulated in at least float32, the
mask added, cast to the input dtype, softmax, times v. Its gradients are tinygrad's own
(``Tensor.gradient``), so the adapter claims ``attention_vjp``.

Device: tinygrad's ``CPU`` device (:data:`DEVICE`), which compiles every kernel, and its own
helper programs when the device opens, with ``clang`` (``$CC``; Debian: ``apt-get install
--no-install-recommends clang``): tinygrad 0.14 has no CPU path without it (its ``CPU:LLVM``
renderer also needs an LLVM with opaque pointers, newer than Debian 12's 14 and 15). dtypes:
float64, float32, float16 and bfloat16, bfloat16 through tinygrad's own emulation
(``EMULATED_DTYPES=bfloat16``, as it realises a bfloat16 result): clang 14 (Debian 12) has no
``__bf16`` for x86-64 and fails on the kernels tinygrad renders with it. Without tinygrad,
importing the module raises ``ImportError("unavailable: ...")`` and a run over the backends leaves
the adapter out; without clang the adapter reports its CPU device unusable, with the reason.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import shutil

import numpy as np

from . import masks as mask_forms
from .foreign import ForeignAdapter, bfloat16
from .optional import require

require("tinygrad", extra="tinygrad")

from tinygrad import Context, Tensor, dtypes  # noqa: E402  (after the availability check)

#: the tinygrad device every array is put on
DEVICE = "CPU"


def missing_compiler() -> str | None:
    """Why tinygrad's CPU device cannot run here (no C compiler it can call), or None."""
    cc = os.environ.get("CC", "clang")
    if shutil.which(cc) is None:
        return (f"tinygrad's CPU device compiles with {cc!r}, not found (Debian: apt-get install "
                f"--no-install-recommends clang)")
    return None


class TinygradSDPA(ForeignAdapter):
    """``tinygrad.Tensor.scaled_dot_product_attention`` behind the spec's SDPA."""

    framework = "tinygrad"
    native_op = "tinygrad.Tensor.scaled_dot_product_attention"
    capabilities = frozenset({"sdpa", "masks", "bias", "causal", "legacy_mask", "errors", "gqa",
                              "attention_vjp"})
    library_dtypes = ("float64", "float32", "float16", "bfloat16")
    deviations = {
        "MASK-9": "fully masked row -> NaN: the op turns a boolean mask into 0 / -inf and its "
                  "softmax of a row of -inf is NaN; with one key, 1 (softmax over one key is "
                  "folded to 1 whatever the logit), so the row is v; with a bias, where the "
                  "adapter passes the dtype's lowest finite value, the mean of V",
        "MASK-13": "a NaN or inf key behind a boolean mask reaches every row: the op adds the mask "
                   "(q.k + -inf = NaN) instead of excluding the key",
        "GRAD-7": "a query whose every key is blocked gets NaN in dq, and the dk and dv of every "
                  "key of its batch item and head are NaN, with a zero cotangent on the row too "
                  "(the backward of MASK-9's NaN row), not 0",
        "NUM-6": "with one key a NaN or inf logit gives a finite output: the softmax over an axis "
                 "of one element is folded to 1 (x - max(x) simplified to 0), not NaN",
    }

    def framework_version(self) -> str:
        return importlib.metadata.version("tinygrad")  # the module has no __version__

    def devices(self) -> dict[str, str | None]:
        return {"cpu": missing_compiler(),
                "cuda": "tinygrad-sdpa runs on tinygrad's CPU device here"}

    def to_native(self, x: np.ndarray):
        if x.dtype.name == "bfloat16":  # NumPy's bfloat16 (ml_dtypes) is not one tinygrad reads
            return Tensor(x.astype(np.float32), device=DEVICE).cast(dtypes.bfloat16)
        return Tensor(x, device=DEVICE)

    def from_native(self, y) -> np.ndarray:
        if y.dtype == dtypes.bfloat16:  # realised here: the kernels are compiled now
            with Context(EMULATED_DTYPES="bfloat16"):
                return y.cast(dtypes.float32).numpy().astype(bfloat16())
        return y.numpy()

    def native_attention(self, q, k, v, mask, scale: float):
        if not mask_forms.is_default_scale(scale, q.shape[-1]):  # its own: 1/sqrt(d_k)
            q = q * (scale * math.sqrt(q.shape[-1]))
        return q.scaled_dot_product_attention(k, v, attn_mask=mask,
                                              enable_gqa=k.shape[1] != q.shape[1])

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        names = list(primals)
        out = fn(primals)
        grads = out.gradient(*(primals[n] for n in names), gradient=cotangent)
        return dict(zip(names, grads))


SDPA = TinygradSDPA("tinygrad-sdpa")
