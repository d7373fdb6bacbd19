"""Adapters for ``jax.nn.dot_product_attention`` (``implementation="xla"``), eager and under
``jax.jit``, and its cuDNN flash-attention implementation on CUDA (``implementation="cudnn"``,
``jax-dpa-cudnn``).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

The adapters are :class:`~.adapters.JaxAdapter` subclasses: inputs are validated before anything
reaches JAX, then converted with the public helpers (:mod:`.masks`):

* layout: the spec's ``(B, h, L, d)`` is transposed to JAX's ``BTNH`` ``(B, L, h, d)`` and the
  result back;
* ``d_v != d_k`` (SDPA-3): the op requires ``value.shape == key.shape``, so the narrower of ``q``/``k``
  and ``v`` is zero-padded on the last axis, ``scale`` is passed explicitly, and the output is sliced
  back to ``d_v``. Zero columns add exact zeros to every dot product, so this is exact;
* boolean masks (``mask``, ``key_padding_mask`` as ``[:, None, None, :]``, bottom-right causal) are
  ANDed into ``mask`` (rank 4, True = may attend, the spec's polarity);
* ``bias`` and ``legacy_mask * -1e9`` are added into ``bias`` (rank 4, in the inputs' dtype);
* causal top-left, and bottom-right when ``L_q == L_k``, use ``is_causal=True`` (JAX's flag is
  top-left); bottom-right with ``L_q != L_k`` is an explicit boolean mask;
* float32 matmuls run under ``jax.default_matmul_precision("highest")`` (NUM-2: no TF32 on GPUs);
  float16 and bfloat16 ones at the default precision (the op accumulates them in float32);
* the op returns no attention weights: ``None``, and "weights" is not claimed;
* grouped key/value heads (``gqa``, GQA-1): k and v with g heads go to the op as its K heads; it
  maps query head i to key/value head ``i // (h / g)``, as the spec does.

Spec 1.2 windows and packed sequences (``window``, ``segments``) go to the op's own
``local_window_size`` (top-left on indices, WIN-3) and ``query_seq_lengths`` /
``key_value_seq_lengths`` where those are exact (:func:`.masks.native_window`,
:func:`.masks.native_lengths`: one segment, valid tokens a prefix, positions equal to indices);
other cases (several segments, bottom-right windows with L_q != L_k, positions shifted by
bottom-right lengths) reach the op as its boolean ``mask``. A row that a window or a length
leaves with no key gets the mean of V (a query past its length gets 0, as specified): the
behaviour declared against MASK-9, whose verdict covers those rows in every chapter.

Observed with jax 0.10 (XLA, CPU) and jax 0.11.2 (CUDA, H200): a row whose keys are all excluded
by ``mask`` / causal / key padding gets the *mean of V* (masked logits are set to the dtype's lowest
finite value, so the row's softmax is uniform); a row excluded by ``-inf`` in ``bias`` gets NaN.
Both are declared against MASK-9, and the difference between them against MASK-11. The op evaluates the softmax in float32
whatever the input dtype, so float64 results have float32 accuracy (declared against NUM-3).
"""

from __future__ import annotations

from . import jax_compile_budget, masks
from .adapters import JaxAdapter, MaskArgs
from .optional import jax_module, jnp_module

# float64 is not claimed: the op evaluates the softmax in float32 whatever the input dtype
# (errors ~1e-7 against the float64 oracle), so float64 results are float32-accurate.
_DEVIATIONS = {
    "MASK-9": "fully masked row -> mean of V when masked by mask/causal/key padding (masked logits "
              "become the dtype's lowest finite value), NaN when masked by -inf bias",
    "MASK-11": "a fully masked row differs between mask=M (mean of V) and "
               "bias=where(M, 0, -inf) (NaN); rows with an allowed key agree",
    "GRAD-2": "value rows that no query may attend get non-zero gradients: a fully masked row "
              "attends to every key uniformly (MASK-9: mean of V), so it depends on them",
    "NUM-1": "float64 is not supported: the op evaluates its softmax in float32 (errors ~1e-7 "
             "against the float64 oracle), so float64 is not claimed",
}


class JaxDPA(JaxAdapter):
    """``jax.nn.dot_product_attention`` behind the spec's SDPA."""

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float32", "float16", "bfloat16")  # float64: softmax in float32 (see _DEVIATIONS)

    framework = "jax"
    native_op = "jax.nn.dot_product_attention"
    capabilities = frozenset({"sdpa", "masks", "causal", "legacy_mask", "errors", "grad", "gqa",
                              "window", "segments", "attention_vjp"})
    deviations = _DEVIATIONS
    conventions = {
        "causal-alignment": ("MASK-7", "is_causal=True is top-left; bottom-right with L_q != L_k "
                                       "goes through an explicit mask"),
        "layout": ("SHAPE-3", "inputs and output are (B, T, N, H), time before heads; the adapter "
                              "transposes from and to the spec's (B, h, L, d)"),
    }

    implementation = "xla"

    def __init__(self, name: str = "jax-dpa"):
        super().__init__(name)

    def attention(self, q, k, v, m: MaskArgs):
        return self._native_sdpa(q, k, v, m), None

    def attention_features(self, q, k, v, m: MaskArgs, features):
        """Windows, segments and lengths as the op's ``local_window_size`` and sequence lengths
        where exact, else ``NotImplemented`` (the generic path folds them into ``mask``)."""
        native = native_arguments(m, features, self.ops.shape(q)[2], self.ops.shape(k)[2])
        if native is None:
            return NotImplemented
        causal, window, q_len, kv_len = native
        return self._native_call(q, k, v, m._replace(causal=causal), window, q_len, kv_len), None

    def _native_call(self, q, k, v, m: MaskArgs, window, q_len, kv_len):
        """:meth:`_native_sdpa` with the op's window and length arguments (NumPy lengths)."""
        jnp = jnp_module()
        return self._native_sdpa(q, k, v, m, window=window,
                                 q_len=None if q_len is None else jnp.asarray(q_len),
                                 kv_len=None if kv_len is None else jnp.asarray(kv_len))

    def _native_sdpa(self, q, k, v, m: MaskArgs, *, window=None, q_len=None, kv_len=None):
        jax, jnp = jax_module(), jnp_module()
        len_q, len_k = self.ops.shape(q)[2], self.ops.shape(k)[2]
        d_k, d_v = self.ops.shape(q)[3], self.ops.shape(v)[3]
        is_causal = self.native_causal(m.causal, len_q, len_k)
        allowed = masks.allowed_mask(len_q, len_k, like=q, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask,
                                     causal=None if is_causal else m.causal)
        additive = masks.additive_mask(like=q, bias=m.bias, legacy_mask=m.legacy_mask)
        width = max(d_k, d_v)
        layout = self.translates("layout")

        def btnh(x):
            x = jnp.transpose(x, (0, 2, 1, 3)) if layout else x
            pad = width - x.shape[3]
            return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, pad))) if pad else x

        # "highest" keeps float32 off TF32 on GPUs (NUM-2); float16 and bfloat16 have no TF32 to
        # avoid, and the op accumulates them in float32 at the default precision
        precision = "highest" if q.dtype == jnp.float32 else None
        with jax.default_matmul_precision(precision):
            out = jax.nn.dot_product_attention(btnh(q), btnh(k), btnh(v), bias=additive,
                                               mask=allowed, scale=m.scale, is_causal=is_causal,
                                               query_seq_lengths=q_len,
                                               key_value_seq_lengths=kv_len,
                                               local_window_size=window,
                                               implementation=self.implementation)
        return jnp.transpose(out[..., :d_v], (0, 2, 1, 3)) if layout else out[..., :d_v]


class JitJaxDPA(JaxDPA):
    """The same call compiled with ``jax.jit`` (one compilation per shape, mask set and scale)."""

    def __init__(self, name: str = "jax-dpa-jit"):
        super().__init__(name)
        self._jitted = None

    def reset(self):
        self._jitted = None  # compiled with the translations of the adapter it was copied from

    def dtypes(self, device: str) -> tuple[str, ...]:
        # Under jit the op's float16 dots (F16_F16_F32) fail to compile on CPU ("not supported by
        # dot_general on CPU") and on CUDA ("Unsupported dot precision algorithm: 4"; H200, jax
        # 0.11.2, at the default and the highest matmul precision); its bfloat16 dots fail on CPU
        # ("not supported by the ElementalIrEmitter"). Eager calls fall back.
        if device == "cpu":
            return ("float32",)
        return ("float32", "bfloat16")

    def attention(self, q, k, v, m: MaskArgs):
        return self._native_call(q, k, v, m, None, None, None), None

    def _native_call(self, q, k, v, m: MaskArgs, window, q_len, kv_len):
        if self._jitted is None:
            self._jitted = jax_module().jit(self._native_sdpa_static,
                                      static_argnames=("causal", "scale", "window"))
        jax_compile_budget.tick(jax_module())
        jnp = jnp_module()
        full = (*self.ops.shape(q)[:3], self.ops.shape(k)[2])
        arrays = m._replace(causal=None, scale=None,
                            **{n: _broadcast(getattr(m, n), full)
                               for n in ("mask", "bias", "legacy_mask")})
        return self._jitted(q, k, v, arrays, None if q_len is None else jnp.asarray(q_len),
                            None if kv_len is None else jnp.asarray(kv_len),
                            causal=m.causal, scale=m.scale, window=window)

    def _native_sdpa_static(self, q, k, v, arrays: MaskArgs, q_len, kv_len, *, causal, scale,
                            window):
        """:meth:`_native_sdpa` with the mask arrays and lengths traced, and ``causal``, ``scale``
        and ``window`` static (the op needs them as Python values)."""
        return self._native_sdpa(q, k, v, arrays._replace(causal=causal, scale=scale),
                                 window=window, q_len=q_len, kv_len=kv_len)


class CudnnJaxDPA(JaxDPA):
    """The op's cuDNN flash-attention implementation (``implementation="cudnn"``): CUDA GPUs only,
    float16 and bfloat16 (the cuDNN kernel's input types). Masks, windows and lengths are mapped
    as for ``jax-dpa``; cuDNN takes a right window only with a causal mask, and raises otherwise
    (reported as the op's own error). Not run on this project's CI machines (no GPU)."""

    implementation = "cudnn"

    def devices(self) -> dict[str, str | None]:
        found = super().devices()
        return {"cpu": "the cuDNN implementation runs on CUDA GPUs only",
                **{d: why for d, why in found.items() if d != "cpu"}}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float16", "bfloat16")


def native_arguments(m: MaskArgs, features, len_q: int, len_k: int):
    """The op's own arguments for a call's window, segments and lengths, when they are exact:
    ``(causal, local_window_size or None, query lengths or None, key lengths or None)`` (lengths
    as int32 NumPy ``(B,)``), or None when they are not (see :func:`.masks.native_lengths`,
    :func:`.masks.native_window`). With segments or lengths whose positions are indices, a causal
    mask compares indices: top-left (SEG-3)."""
    lengths = masks.native_lengths(features.positions)
    if lengths is None:
        return None
    indexed = features.positions is not None
    window = None
    if features.window is not None:
        diagonal = "top_left" if indexed else features.diagonal or "top_left"
        window = masks.native_window(features.window, diagonal, len_q, len_k)
        if window is None:
            return None
    causal = "top_left" if indexed and m.causal is not None else m.causal
    return (causal, window, *lengths)


def _broadcast(m, full: tuple[int, ...]):
    """A mask or bias broadcast to the full (B, h, L_q, L_k) shape (None stays None): the values
    are those the op would broadcast to, and calls whose masks differ only in their broadcast
    shape share one compilation."""
    return None if m is None else jnp_module().broadcast_to(m, full)


DPA = JaxDPA("jax-dpa")
DPA_JIT = JitJaxDPA("jax-dpa-jit")
DPA_CUDNN = CudnnJaxDPA("jax-dpa-cudnn")
