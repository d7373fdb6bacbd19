"""The JAX backend: per-head, batched and jit-compiled variants; matmuls at ``precision="highest"``.

Dtypes: float64 (x64 is enabled when this backend is loaded), float32, float16, bfloat16.
"""

from __future__ import annotations

import numpy as np

from . import jax_compile_budget as jax_budget
from ._base import CAPABILITIES
from ._generic import Algorithm, ArrayBackend, MaskArgs
from .computation import Computation
from .optional import jax_module, jnp_module
from .primitives import Ops


class JaxOps(Ops):
    """The operations of jax (:mod:`.primitives`)."""

    framework = "jax"

    def dtype_name(self, x) -> str:
        return str(x.dtype)

    def matmul(self, a, b):
        return jnp_module().matmul(a, b, precision=jax_module().lax.Precision.HIGHEST)

    def transpose(self, x, axes):
        return jnp_module().transpose(x, axes)

    def reshape(self, x, shape):
        return jnp_module().reshape(x, shape)

    def exp(self, x):
        return jnp_module().exp(x)

    def max_last(self, x):
        return jnp_module().max(x, axis=-1, keepdims=True)

    def sum_last(self, x):
        return jnp_module().sum(x, axis=-1, keepdims=True)

    def where(self, cond, a, b: float):
        return jnp_module().where(cond, a, jnp_module().asarray(b, dtype=a.dtype))

    def isfinite(self, x):
        return jnp_module().isfinite(x)

    def concat(self, xs, axis: int):
        return jnp_module().concatenate(xs, axis=axis)

    def stack(self, xs, axis: int):
        return jnp_module().stack(xs, axis=axis)

    def constant(self, array: np.ndarray, like):
        if isinstance(like, jax_module().core.Tracer):  # inside a compiled function: a traced constant
            return jnp_module().asarray(array)
        return jax_module().device_put(array, next(iter(like.devices())))  # no compilation per shape

    def full(self, shape, value: float, like):
        return jnp_module().full(shape, value, dtype=like.dtype)

    def constant_as(self, array: np.ndarray, like):
        return jnp_module().asarray(array, dtype=like.dtype)

    def to_float32(self, x):
        return x.astype(jnp_module().float32)

    def cast_like(self, x, like):
        return x.astype(like.dtype)

    def tanh(self, x):
        return jnp_module().tanh(x)

    def log(self, x):
        return jnp_module().log(x)

    def take_keys(self, x, index):
        index = jnp_module().reshape(index, (index.shape[0], *(1,) * (x.ndim - 3), index.shape[1], 1))
        return jnp_module().take_along_axis(x, index, axis=-2)

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        """GRAD by ``jax.vjp`` over the dict of primals."""
        _, pullback = jax_module().vjp(fn, primals)
        return pullback(cotangent)[0]


class JaxBackend(ArrayBackend):
    """Multi-head attention in JAX (algorithms in :mod:`mhaspec.backends.algorithms`)."""

    framework = "jax"
    framework_label = "jax"
    ops = JaxOps()  # the default; adapters on this class share it
    # "grad" by jax.vjp (ops.vjp), "gqa" in the generic algorithms; "deterministic" (DET-1) is not
    # claimed: jax-perhead gave other bits on a repeated call in one ci cell (spec 1.4, unresolved)
    capabilities = CAPABILITIES - {"deterministic"}

    def __init__(self, algorithm, *, name: str | None = None, ops: Ops | None = None):
        super().__init__(ops or type(self).ops, algorithm, name=name)

    def framework_version(self) -> str:
        return jax_module().__version__

    def devices(self) -> dict[str, str | None]:
        platforms = {d.platform for d in jax_module().devices()}
        return {"cpu": None,
                "cuda": None if "gpu" in platforms or "cuda" in platforms
                else "no GPU device visible to jax"}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16", "bfloat16")

    def precision_flags(self, device: str) -> dict:
        return {"jax matmul precision": "highest", "jax_enable_x64": True}

    def _device(self, device: str):
        jax = jax_module()
        return jax.devices("cpu")[0] if device == "cpu" else jax.devices("gpu")[0]

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        # converted by NumPy (ml_dtypes for bfloat16), as jnp.asarray does, then copied to the
        # device: jnp.asarray would also compile a convert_element_type per new shape
        host = np.asarray(x).astype(jnp_module().dtype(dtype))
        return jax_module().device_put(host, self._device(device))

    def to_numpy(self, x) -> np.ndarray:
        x = np.asarray(x)
        return x.astype(np.float32) if x.dtype.name == "bfloat16" else x

    def device_of(self, x) -> str:
        platform = next(iter(x.devices())).platform
        return "cuda" if platform in ("gpu", "cuda") else platform

class JitComputation(Computation):
    """The computation with :meth:`attention` and :meth:`multi_head` compiled by ``jax.jit``, one
    function each. Masks are passed in canonical full form
    (:meth:`.algorithms.AttentionAlgorithm.canonical_masks`), so each shape and dtype compiles
    once; the :class:`MaskArgs` travel as one pytree, ``num_heads``, ``num_kv_heads`` and ``lse``
    are static. Spec 1.2 calls compile once per shape and feature set: the structural mask and
    ALiBi are in the canonical mask and bias, the soft-cap is traced and a KV cache travels as a
    pytree."""

    def __init__(self, ops, algorithm):
        super().__init__(ops, algorithm)
        self._compiled: dict[str, object] = {}

    def _compile(self, key: str, fn, static: tuple[str, ...]):
        """``fn`` under ``jax.jit`` with ``static`` arguments, made once per key (JAX is imported
        at the first call, not when the backend is built)."""
        if key not in self._compiled:
            self._compiled[key] = jax_module().jit(fn, static_argnames=static)
        jax_budget.tick(jax_module())
        return self._compiled[key]

    def attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        full = self.logits_shape(q, k)
        return self._compile("attention", super().attention, ("lse",))(
            q, k, v, self.algorithm.canonical_masks(self.ops, q, full, masks), lse=lse)

    def multi_head(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None,
                   lse=False, cache=None):
        full = self.mha_logits_shape(query, key, num_heads, cache)
        return self._compile("mha", super().multi_head, ("num_heads", "num_kv_heads", "lse"))(
            query, key, value, p, num_heads=num_heads,
            masks=self.algorithm.canonical_masks(self.ops, query, full, masks),
            num_kv_heads=num_kv_heads, lse=lse, cache=cache)


class JitJaxBackend(JaxBackend):
    """An algorithm (by default the batched one, MHA-2) compiled with ``jax.jit``
    (:class:`JitComputation`)."""

    computation_type = JitComputation

    def __init__(self, algorithm: Algorithm = Algorithm.BATCHED, *, name: str = "jax-jit"):
        super().__init__(algorithm, name=name)


PER_HEAD = JaxBackend(Algorithm.PER_HEAD)
BATCHED = JaxBackend(Algorithm.BATCHED)
JIT = JitJaxBackend()
