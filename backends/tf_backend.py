"""The TensorFlow backend: per-head, batched and ``tf.function``-compiled variants, TF32 off.

Dtypes: float64, float32, float16, bfloat16.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._base import CAPABILITIES
from ._generic import Algorithm, ArrayBackend, MaskArgs


@functools.cache
def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(False)
    return tf


class TensorFlowBackend(ArrayBackend):
    """Multi-head attention in TensorFlow (algorithms in :mod:`mhaspec.backends._generic`)."""

    framework = "tensorflow"
    framework_label = "tf"
    capabilities = CAPABILITIES  # "grad" by GradientTape (_vjp), "gqa" in the generic algorithms

    def framework_version(self) -> str:
        return _tf().__version__

    def devices(self) -> dict[str, str | None]:
        gpus = _tf().config.list_physical_devices("GPU")
        return {"cpu": None, "cuda": None if gpus else "no GPU device visible to tensorflow"}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16", "bfloat16")

    def precision_flags(self, device: str) -> dict:
        return {"tf.config.experimental.tensor_float_32_execution_enabled":
                _tf().config.experimental.tensor_float_32_execution_enabled()}

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        tf = _tf()
        with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
            return tf.identity(tf.cast(tf.constant(np.asarray(x)), getattr(tf, dtype)))

    def to_numpy(self, x) -> np.ndarray:
        tf = _tf()
        if x.dtype == tf.bfloat16:
            x = tf.cast(x, tf.float32)
        return x.numpy()

    def device_of(self, x) -> str:
        return "cuda" if "GPU" in x.device.upper() else "cpu"

    def _dtype_name(self, x) -> str:
        return x.dtype.name

    def _matmul(self, a, b):
        return _tf().linalg.matmul(a, b)

    def _transpose(self, x, axes):
        rank = len(x.shape)
        return _tf().transpose(x, [a % rank for a in axes])

    def _reshape(self, x, shape):
        return _tf().reshape(x, shape)

    def _exp(self, x):
        return _tf().exp(x)

    def _max_last(self, x):
        return _tf().reduce_max(x, axis=-1, keepdims=True)

    def _sum_last(self, x):
        return _tf().reduce_sum(x, axis=-1, keepdims=True)

    def _where(self, cond, a, b: float):
        tf = _tf()
        return tf.where(cond, a, tf.constant(b, dtype=a.dtype))

    def _isfinite(self, x):
        return _tf().math.is_finite(x)

    def _concat(self, xs, axis: int):
        return _tf().concat(xs, axis=axis)

    def _stack(self, xs, axis: int):
        return _tf().stack(xs, axis=axis)

    def _constant(self, array: np.ndarray, like):
        return _tf().constant(array)

    def _full(self, shape, value: float, like):
        tf = _tf()
        return tf.fill(shape, tf.constant(value, dtype=like.dtype))

    def _constant_as(self, array: np.ndarray, like):
        tf = _tf()
        return tf.cast(tf.constant(array), like.dtype)

    def _tanh(self, x):
        return _tf().math.tanh(x)

    def _log(self, x):
        return _tf().math.log(x)

    def _take_keys(self, x, index):
        return _tf().gather(x, index, axis=len(x.shape) - 2, batch_dims=1)

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """GRAD by ``tf.GradientTape`` watching every primal (unconnected ones get zeros); each
        primal is a fresh tensor, so one array passed as query, key and value gets three partials."""
        tf = _tf()
        primals = {n: tf.identity(t) for n, t in primals.items()}
        with tf.GradientTape() as tape:
            tape.watch(list(primals.values()))
            out = fn(primals)
        return tape.gradient(out, primals, output_gradients=cotangent,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)


class FunctionTensorFlowBackend(TensorFlowBackend):
    """An algorithm (by default the batched one, MHA-2) compiled with ``tf.function``. Masks are
    passed in canonical full form (:meth:`ArrayBackend._canonical_masks`) and the scale as a
    tensor, so each shape and dtype is traced once; spec 1.2 calls once per shape and feature set
    (structural mask and ALiBi in the canonical mask and bias, the soft-cap a tensor, ``lse`` a
    Python bool, a KV cache a tuple of tensors)."""

    def __init__(self, algorithm: Algorithm = Algorithm.BATCHED, *, name: str = "tf-function"):
        super().__init__(algorithm, name=name)
        self._compiled: dict[str, object] = {}

    def _compile(self, key, fn):
        """``fn`` as a ``tf.function``, made once per key, without autograph: the algorithms'
        Python control flow depends on shapes only, so tracing runs it as written, and nothing
        re-reads the source file (autograph converts a function from its source text on disk: a
        ``_generic.py`` edited while a suite ran made it convert the text now at ``_mha``'s old
        lines, ``_sdpa``, and fail with "takes from 4 to 5 positional arguments but 8 were
        given")."""
        if key not in self._compiled:
            self._compiled[key] = _tf().function(fn, autograph=False)
        return self._compiled[key]

    def _canonical(self, like, full, masks: MaskArgs) -> MaskArgs:
        """Canonical masks, and the scale and soft-cap as tensors (no retrace per value)."""
        tf = _tf()
        masks = self._canonical_masks(like, full, masks)
        softcap = None if masks.softcap is None else tf.convert_to_tensor(masks.softcap,
                                                                          dtype=like.dtype)
        return masks._replace(scale=tf.convert_to_tensor(masks.scale, dtype=like.dtype),
                              softcap=softcap)

    def _sdpa(self, q, k, v, masks: MaskArgs):
        full = (*self._shape(q)[:3], self._shape(k)[2])
        return self._compile("sdpa", super()._sdpa)(q, k, v, self._canonical(q, full, masks))

    def _mha(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None):
        full = (self._shape(query)[0], num_heads, self._shape(query)[1], self._shape(key)[1])
        return self._compile("mha", super()._mha)(query, key, value, p, num_heads,
                                                  self._canonical(query, full, masks),
                                                  num_kv_heads)


    def _sdpa_ext(self, q, k, v, masks: MaskArgs, lse: bool):
        full = (*self._shape(q)[:3], self._shape(k)[2])
        return self._compile("sdpa_ext", super()._sdpa_ext)(q, k, v,
                                                            self._canonical(q, full, masks), lse)

    def _mha_ext(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None,
                 lse=False, cache=None):
        len_all = self._shape(key)[1] + (0 if cache is None else self._shape(cache.past_key)[2])
        full = (self._shape(query)[0], num_heads, self._shape(query)[1], len_all)
        return self._compile("mha_ext", super()._mha_ext)(
            query, key, value, p, num_heads, self._canonical(query, full, masks), num_kv_heads,
            lse, cache)


PER_HEAD = TensorFlowBackend(Algorithm.PER_HEAD)
BATCHED = TensorFlowBackend(Algorithm.BATCHED)
FUNCTION = FunctionTensorFlowBackend()
