"""The JAX backend: per-head, batched and jit-compiled variants; matmuls at ``precision="highest"``.

Dtypes: float64 (x64 is enabled when this backend is loaded), float32, float16, bfloat16.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax_compile_budget
from ._base import CAPABILITIES
from ._generic import Algorithm, ArrayBackend, MaskArgs


@functools.cache
def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _jnp():
    return _jax().numpy


class JaxBackend(ArrayBackend):
    """Multi-head attention in JAX (algorithms in :mod:`mhaspec.backends._generic`)."""

    framework = "jax"
    framework_label = "jax"
    capabilities = CAPABILITIES  # "grad" by jax.vjp (_vjp), "gqa" in the generic algorithms

    def framework_version(self) -> str:
        return _jax().__version__

    def devices(self) -> dict[str, str | None]:
        platforms = {d.platform for d in _jax().devices()}
        return {"cpu": None,
                "cuda": None if "gpu" in platforms or "cuda" in platforms
                else "no GPU device visible to jax"}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16", "bfloat16")

    def precision_flags(self, device: str) -> dict:
        return {"jax matmul precision": "highest", "jax_enable_x64": True}

    def _device(self, device: str):
        jax = _jax()
        return jax.devices("cpu")[0] if device == "cpu" else jax.devices("gpu")[0]

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        return _jax().device_put(_jnp().asarray(np.asarray(x), dtype=dtype), self._device(device))

    def to_numpy(self, x) -> np.ndarray:
        x = np.asarray(x)
        return x.astype(np.float32) if x.dtype.name == "bfloat16" else x

    def device_of(self, x) -> str:
        platform = next(iter(x.devices())).platform
        return "cuda" if platform in ("gpu", "cuda") else platform

    def _dtype_name(self, x) -> str:
        return str(x.dtype)

    def _matmul(self, a, b):
        return _jnp().matmul(a, b, precision=_jax().lax.Precision.HIGHEST)

    def _transpose(self, x, axes):
        return _jnp().transpose(x, axes)

    def _reshape(self, x, shape):
        return _jnp().reshape(x, shape)

    def _exp(self, x):
        return _jnp().exp(x)

    def _max_last(self, x):
        return _jnp().max(x, axis=-1, keepdims=True)

    def _sum_last(self, x):
        return _jnp().sum(x, axis=-1, keepdims=True)

    def _where(self, cond, a, b: float):
        return _jnp().where(cond, a, _jnp().asarray(b, dtype=a.dtype))

    def _isfinite(self, x):
        return _jnp().isfinite(x)

    def _concat(self, xs, axis: int):
        return _jnp().concatenate(xs, axis=axis)

    def _stack(self, xs, axis: int):
        return _jnp().stack(xs, axis=axis)

    def _constant(self, array: np.ndarray, like):
        return _jnp().asarray(array)

    def _full(self, shape, value: float, like):
        return _jnp().full(shape, value, dtype=like.dtype)

    def _constant_as(self, array: np.ndarray, like):
        return _jnp().asarray(array, dtype=like.dtype)

    def _tanh(self, x):
        return _jnp().tanh(x)

    def _log(self, x):
        return _jnp().log(x)

    def _take_keys(self, x, index):
        index = _jnp().reshape(index, (index.shape[0], *(1,) * (x.ndim - 3), index.shape[1], 1))
        return _jnp().take_along_axis(x, index, axis=-2)

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """GRAD by ``jax.vjp`` over the dict of primals."""
        _, pullback = _jax().vjp(fn, primals)
        return pullback(cotangent)[0]


class JitJaxBackend(JaxBackend):
    """An algorithm (by default the batched one, MHA-2) compiled with ``jax.jit``. Masks are
    passed in canonical full form (:meth:`ArrayBackend._canonical_masks`), so each shape and dtype
    compiles once; the :class:`MaskArgs` travel as one pytree, ``num_heads`` and
    ``num_kv_heads`` are static. Spec 1.2 calls compile once per shape and feature set: the
    structural mask and ALiBi are in the canonical mask and bias, the soft-cap is traced, ``lse``
    is static and a KV cache travels as a pytree."""

    def __init__(self, algorithm: Algorithm = Algorithm.BATCHED, *, name: str = "jax-jit"):
        super().__init__(algorithm, name=name)
        self._sdpa_jit = None
        self._mha_jit = None
        self._sdpa_ext_jit = None
        self._mha_ext_jit = None

    def _sdpa(self, q, k, v, masks: MaskArgs):
        if self._sdpa_jit is None:
            self._sdpa_jit = _jax().jit(super()._sdpa)
        _jax_compile_budget.tick(_jax())
        full = (*self._shape(q)[:3], self._shape(k)[2])
        return self._sdpa_jit(q, k, v, self._canonical_masks(q, full, masks))

    def _mha(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None):
        if self._mha_jit is None:
            self._mha_jit = _jax().jit(super()._mha, static_argnames=("num_heads", "num_kv_heads"))
        _jax_compile_budget.tick(_jax())
        full = (self._shape(query)[0], num_heads, self._shape(query)[1], self._shape(key)[1])
        return self._mha_jit(query, key, value, p, num_heads=num_heads,
                             masks=self._canonical_masks(query, full, masks),
                             num_kv_heads=num_kv_heads)


    def _sdpa_ext(self, q, k, v, masks: MaskArgs, lse: bool):
        if self._sdpa_ext_jit is None:
            self._sdpa_ext_jit = _jax().jit(super()._sdpa_ext, static_argnames=("lse",))
        _jax_compile_budget.tick(_jax())
        full = (*self._shape(q)[:3], self._shape(k)[2])
        return self._sdpa_ext_jit(q, k, v, self._canonical_masks(q, full, masks), lse=lse)

    def _mha_ext(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None,
                 lse=False, cache=None):
        if self._mha_ext_jit is None:
            self._mha_ext_jit = _jax().jit(
                super()._mha_ext, static_argnames=("num_heads", "num_kv_heads", "lse"))
        _jax_compile_budget.tick(_jax())
        len_all = self._shape(key)[1] + (0 if cache is None else self._shape(cache.past_key)[2])
        full = (self._shape(query)[0], num_heads, self._shape(query)[1], len_all)
        return self._mha_ext_jit(query, key, value, p, num_heads=num_heads,
                                 masks=self._canonical_masks(query, full, masks),
                                 num_kv_heads=num_kv_heads, lse=lse, cache=cache)


PER_HEAD = JaxBackend(Algorithm.PER_HEAD)
BATCHED = JaxBackend(Algorithm.BATCHED)
JIT = JitJaxBackend()
