"""Wrong implementations that only a GPU can express: float32 matmuls on TF32 tensor cores.

On CPU the catalogue's ``broken-tf32-rounding`` imitates TF32 by rounding; these two use the real
hardware path, the way a backend does by accident:

* ``broken-silent-tf32`` is the PyTorch batched backend with
  ``torch.backends.cuda.matmul.allow_tf32`` switched on around each matmul and off again, so the
  flags it reports (read between calls) say TF32 is off;
* ``broken-jax-default-precision`` is the JAX batched backend with ``jnp.matmul``'s default
  precision, which on NVIDIA GPUs since Ampere computes float32 products in TF32.

Both must fail NUM-2 on CUDA (``tests/test_gpu.py``). On CPU they compute correctly.
"""

from __future__ import annotations

from mhaspec.backends.jax_backend import JaxBackend, JaxOps
from mhaspec.backends.optional import jnp_module, torch_module
from mhaspec.backends.torch_backend import TorchBackend, TorchOps


class SilentTF32(TorchBackend):
    """torch-batched whose matmuls run with TF32 allowed; the flags it reports stay off."""

    class Ops(TorchOps):
        def matmul(self, a, b):
            torch = torch_module()
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return torch.matmul(a, b)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False

    def __init__(self, name: str):
        super().__init__("batched", name=name, ops=self.Ops())


class JaxDefaultPrecision(JaxBackend):
    """jax-batched with the default matmul precision (TF32 for float32 on recent NVIDIA GPUs)."""

    class Ops(JaxOps):
        def matmul(self, a, b):
            return jnp_module().matmul(a, b)

    def __init__(self, name: str):
        super().__init__("batched", name=name, ops=self.Ops())


SILENT_TF32 = SilentTF32("broken-silent-tf32")
JAX_DEFAULT_PRECISION = JaxDefaultPrecision("broken-jax-default-precision")
