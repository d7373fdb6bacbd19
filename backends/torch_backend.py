"""The PyTorch backend: per-head and batched variants on CPU and CUDA, TF32 off.

Dtypes: float64, float32, float16, bfloat16. On CUDA, float32 matmuls and convolutions run with
TF32 disabled (spec NUM-2); the state is reported in the certificate.
"""

from __future__ import annotations

import numpy as np

from ._base import CAPABILITIES, native_byte_order
from ._generic import Algorithm, ArrayBackend
from .optional import torch_module
from .primitives import Ops


class TorchOps(Ops):
    """The operations of torch (:mod:`.primitives`)."""

    framework = "torch"

    def dtype_name(self, x) -> str:
        return str(x.dtype).removeprefix("torch.")

    def matmul(self, a, b):
        return torch_module().matmul(a, b)

    def transpose(self, x, axes):
        return x.permute(*axes)

    def reshape(self, x, shape):
        return x.reshape(shape)

    def exp(self, x):
        return x.exp()

    def max_last(self, x):
        return x.amax(dim=-1, keepdim=True)

    def sum_last(self, x):
        return x.sum(dim=-1, keepdim=True)

    def where(self, cond, a, b: float):
        return torch_module().where(cond, a, torch_module().tensor(b, dtype=a.dtype, device=a.device))

    def isfinite(self, x):
        return torch_module().isfinite(x)

    def concat(self, xs, axis: int):
        return torch_module().cat(xs, dim=axis)

    def stack(self, xs, axis: int):
        return torch_module().stack(xs, dim=axis)

    def constant(self, array: np.ndarray, like):
        return torch_module().as_tensor(array, device=like.device)

    def constant_as(self, array: np.ndarray, like):
        return torch_module().as_tensor(array, device=like.device).to(like.dtype)

    def full(self, shape, value: float, like):
        return torch_module().full(shape, value, dtype=like.dtype, device=like.device)

    def to_float32(self, x):
        return x.float()

    def cast_like(self, x, like):
        return x.to(like.dtype)

    def tanh(self, x):
        return x.tanh()

    def log(self, x):
        return x.log()

    def take_keys(self, x, index):
        index = index.reshape(index.shape[0], *(1,) * (x.ndim - 3), index.shape[1], 1)
        return torch_module().take_along_dim(x, index, dim=-2)

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        """GRAD by autograd: fresh leaves (one per argument, even for self-attention)."""
        torch = torch_module()
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in primals.items()}
        with torch.enable_grad():
            grads = torch.autograd.grad(fn(leaves), list(leaves.values()), grad_outputs=cotangent,
                                        allow_unused=True)
        return {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(leaves, grads)}


class TorchBackend(ArrayBackend):
    """Multi-head attention in PyTorch (algorithms in :mod:`mhaspec.backends.algorithms`)."""

    framework = "torch"
    framework_label = "torch"
    ops = TorchOps()  # the default; adapters on this class share it
    capabilities = CAPABILITIES  # "grad" by autograd (ops.vjp), "gqa" in the generic algorithms

    def __init__(self, algorithm, *, name: str | None = None, ops: Ops | None = None):
        super().__init__(ops or type(self).ops, algorithm, name=name)

    def framework_version(self) -> str:
        return torch_module().__version__

    def devices(self) -> dict[str, str | None]:
        torch = torch_module()
        return {"cpu": None,
                "cuda": None if torch.cuda.is_available() else "no CUDA device visible to torch"}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16", "bfloat16")

    def precision_flags(self, device: str) -> dict:
        torch = torch_module()
        return {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        torch = torch_module()
        return torch.as_tensor(native_byte_order(x)).to(device=device, dtype=getattr(torch, dtype))

    def to_numpy(self, x) -> np.ndarray:
        torch = torch_module()
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()

    def device_of(self, x) -> str:
        return x.device.type

PER_HEAD = TorchBackend(Algorithm.PER_HEAD)
BATCHED = TorchBackend(Algorithm.BATCHED)
