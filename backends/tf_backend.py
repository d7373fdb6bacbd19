"""The TensorFlow backend: per-head, batched and ``tf.function``-compiled variants, TF32 off.

Dtypes: float64, float32, float16, bfloat16.
"""

from __future__ import annotations

import numpy as np

from ._base import CAPABILITIES
from ._generic import Algorithm, ArrayBackend, MaskArgs
from .computation import Computation
from .optional import tf_module
from .primitives import Ops


class TensorFlowOps(Ops):
    """The operations of tensorflow (:mod:`.primitives`)."""

    framework = "tensorflow"

    def dtype_name(self, x) -> str:
        return x.dtype.name

    def matmul(self, a, b):
        return tf_module().linalg.matmul(a, b)

    def transpose(self, x, axes):
        rank = len(x.shape)
        return tf_module().transpose(x, [a % rank for a in axes])

    def reshape(self, x, shape):
        return tf_module().reshape(x, shape)

    def exp(self, x):
        return tf_module().exp(x)

    def max_last(self, x):
        return tf_module().reduce_max(x, axis=-1, keepdims=True)

    def sum_last(self, x):
        return tf_module().reduce_sum(x, axis=-1, keepdims=True)

    def where(self, cond, a, b: float):
        tf = tf_module()
        return tf.where(cond, a, tf.constant(b, dtype=a.dtype))

    def isfinite(self, x):
        return tf_module().math.is_finite(x)

    def concat(self, xs, axis: int):
        return tf_module().concat(xs, axis=axis)

    def stack(self, xs, axis: int):
        return tf_module().stack(xs, axis=axis)

    def constant(self, array: np.ndarray, like):
        return tf_module().constant(array)

    def full(self, shape, value: float, like):
        tf = tf_module()
        return tf.fill(shape, tf.constant(value, dtype=like.dtype))

    def constant_as(self, array: np.ndarray, like):
        tf = tf_module()
        return tf.cast(tf.constant(array), like.dtype)

    def to_float32(self, x):
        return tf_module().cast(x, tf_module().float32)

    def cast_like(self, x, like):
        return tf_module().cast(x, like.dtype)

    def tanh(self, x):
        return tf_module().math.tanh(x)

    def log(self, x):
        return tf_module().math.log(x)

    def take_keys(self, x, index):
        return tf_module().gather(x, index, axis=len(x.shape) - 2, batch_dims=1)

    def vjp(self, fn, primals: dict, cotangent) -> dict:
        """GRAD by ``tf.GradientTape`` watching every primal (unconnected ones get zeros); each
        primal is a fresh tensor, so one array passed as query, key and value gets three partials."""
        tf = tf_module()
        primals = {n: tf.identity(t) for n, t in primals.items()}
        with tf.GradientTape() as tape:
            tape.watch(list(primals.values()))
            out = fn(primals)
        return tape.gradient(out, primals, output_gradients=cotangent,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)


class TensorFlowBackend(ArrayBackend):
    """Multi-head attention in TensorFlow (algorithms in :mod:`mhaspec.backends.algorithms`)."""

    framework = "tensorflow"
    framework_label = "tf"
    ops = TensorFlowOps()  # the default; adapters on this class share it
    capabilities = CAPABILITIES  # "grad" by GradientTape (ops.vjp), "gqa" in the generic algorithms

    def __init__(self, algorithm, *, name: str | None = None, ops: Ops | None = None):
        super().__init__(ops or type(self).ops, algorithm, name=name)

    def framework_version(self) -> str:
        return tf_module().__version__

    def devices(self) -> dict[str, str | None]:
        gpus = tf_module().config.list_physical_devices("GPU")
        return {"cpu": None, "cuda": None if gpus else "no GPU device visible to tensorflow"}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float64", "float32", "float16", "bfloat16")

    def precision_flags(self, device: str) -> dict:
        return {"tf.config.experimental.tensor_float_32_execution_enabled":
                tf_module().config.experimental.tensor_float_32_execution_enabled()}

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        tf = tf_module()
        with tf.device("/GPU:0" if device == "cuda" else "/CPU:0"):
            return tf.identity(tf.cast(tf.constant(np.asarray(x)), getattr(tf, dtype)))

    def to_numpy(self, x) -> np.ndarray:
        tf = tf_module()
        if x.dtype == tf.bfloat16:
            x = tf.cast(x, tf.float32)
        return x.numpy()

    def device_of(self, x) -> str:
        return "cuda" if "GPU" in x.device.upper() else "cpu"

class FunctionComputation(Computation):
    """The computation with :meth:`attention` and :meth:`multi_head` compiled by ``tf.function``,
    one function each. Masks are passed in canonical full form
    (:meth:`.algorithms.AttentionAlgorithm.canonical_masks`) and the scale as a tensor, so each
    shape and dtype is traced once; spec 1.2 calls once per shape and feature set (structural
    mask and ALiBi in the canonical mask and bias, the soft-cap a tensor, ``lse`` a Python bool,
    a KV cache a tuple of tensors)."""

    def __init__(self, ops, algorithm):
        super().__init__(ops, algorithm)
        self._compiled: dict[str, object] = {}

    def _compile(self, key, fn):
        """``fn`` as a ``tf.function``, made once per key, without autograph: the algorithms'
        Python control flow depends on shapes only, so tracing runs it as written, and nothing
        re-reads the source file (autograph converts a function from its source text on disk: a
        module edited while a suite ran made it convert the text then at another method's old
        lines and fail with "takes from 4 to 5 positional arguments but 8 were given")."""
        if key not in self._compiled:
            self._compiled[key] = tf_module().function(fn, autograph=False)
        return self._compiled[key]

    def _canonical(self, like, full, masks: MaskArgs) -> MaskArgs:
        """Canonical masks, and the scale and soft-cap as tensors (no retrace per value); the
        soft-cap in float32 for float16/bfloat16 (the soft-cap works in float32 there)."""
        tf = tf_module()
        masks = self.algorithm.canonical_masks(self.ops, like, full, masks)
        cap_dtype = tf.float32 if like.dtype in (tf.float16, tf.bfloat16) else like.dtype
        softcap = None if masks.softcap is None else tf.convert_to_tensor(masks.softcap,
                                                                          dtype=cap_dtype)
        return masks._replace(scale=tf.convert_to_tensor(masks.scale, dtype=like.dtype),
                              softcap=softcap)

    def attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        full = self.logits_shape(q, k)
        return self._compile("attention", super().attention)(
            q, k, v, self._canonical(q, full, masks), lse)

    def multi_head(self, query, key, value, p, num_heads, masks: MaskArgs, num_kv_heads=None,
                   lse=False, cache=None):
        full = self.mha_logits_shape(query, key, num_heads, cache)
        return self._compile("mha", super().multi_head)(
            query, key, value, p, num_heads, self._canonical(query, full, masks), num_kv_heads,
            lse, cache)


class FunctionTensorFlowBackend(TensorFlowBackend):
    """An algorithm (by default the batched one, MHA-2) compiled with ``tf.function``
    (:class:`FunctionComputation`)."""

    computation_type = FunctionComputation

    def __init__(self, algorithm: Algorithm = Algorithm.BATCHED, *, name: str = "tf-function"):
        super().__init__(algorithm, name=name)


PER_HEAD = TensorFlowBackend(Algorithm.PER_HEAD)
BATCHED = TensorFlowBackend(Algorithm.BATCHED)
FUNCTION = FunctionTensorFlowBackend()
