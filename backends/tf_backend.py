"""The TensorFlow backend: per-head, batched and ``tf.function``-compiled variants, TF32 off.

Dtypes: float64, float32, float16, bfloat16.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._generic import ArrayBackend


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


class FunctionTensorFlowBackend(TensorFlowBackend):
    """The batched algorithm compiled with ``tf.function`` (one trace per shape and mask set)."""

    def __init__(self):
        super().__init__("batched")
        self.name = "tf-function"
        self.variant = "function"
        self._compiled: dict[str, object] = {}

    def _compile(self, key, fn):
        if key not in self._compiled:
            self._compiled[key] = _tf().function(fn)
        return self._compiled[key]

    def _sdpa(self, *args):
        return self._compile("sdpa", super()._sdpa)(*args)

    def _mha(self, *args):
        return self._compile("mha", super()._mha)(*args)


PER_HEAD = TensorFlowBackend("perhead")
BATCHED = TensorFlowBackend("batched")
FUNCTION = FunctionTensorFlowBackend()
