"""Adapter for ONNX's ``Attention`` operator (opset 24, default domain) run by ONNX Runtime's
``CPUExecutionProvider``: ``ort-attention``.

Axis legend: B batch, L_q / L_k lengths, h query heads, g key/value heads, d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

The adapter is a :class:`~.adapters.NumpyAdapter`: inputs are validated before anything reaches
ONNX Runtime; arrays are NumPy arrays throughout; masks are translated with :mod:`.masks`. Each call runs one
``Attention`` node, built once per (input shapes, dtype, flags) and kept in a bounded cache of
``InferenceSession`` objects (:class:`SessionCache`). The mapping:

* ``Q``, ``K``, ``V`` 4-D ``(B, heads, L, d)``: the spec's layout as it is; ``d_v != d_k`` is allowed;
* ``scale``: the default ``1/sqrt(d_k)`` leaves the attribute out (the op's own default); another
  scale is the float attribute ``scale`` (a float32 by the ONNX format);
* boolean masks (``mask``, ``key_padding_mask`` as ``[:, None, None, :]``, bottom-right causal) are
  ANDed into a boolean ``attn_mask`` whose polarity is the spec's (True = may attend), broadcast to
  ``(B, h, L_q, L_k)``;
* ``bias`` and ``legacy_mask * -1e9`` are added in the inputs' dtype and passed as a float
  ``attn_mask``; with boolean masks as well it is ``where(allowed, bias, -inf)``;
* causal top-left, and bottom-right when ``L_q == L_k``, use ``is_causal=1``, which is top-left
  without a KV cache; bottom-right with ``L_q != L_k`` is an explicit boolean mask (MASK-7);
* weights (SDPA-4): the optional fourth output ``qk_matmul_output`` with
  ``qk_matmul_output_mode=3`` (after the softmax), ``(B, h, L_q, L_k)``;
* multi-head attention: the spec's projections in NumPy (batched, MHA-2) around the node
  (:meth:`~.adapters.NativeAdapter.mha_over_attention`); with
  ``num_kv_heads`` g, ``K`` and ``V`` have g heads and the op maps query head i to key/value head
  ``i // (h / g)`` (MHA-6);
* soft-capping (spec 1.2, SOFTCAP-1): the ``softcap`` attribute, which the op applies after the
  scale and before the mask and bias, as the spec does (float32: agrees with the oracle);
* packed sequences (spec 1.2, SEG): per-batch key lengths alone, without a causal mask, are the
  node's ``nonpad_kv_seqlen`` input; segment ids, query lengths and causal masks with lengths
  reach the node folded into its boolean ``attn_mask``;
* KV cache (spec 1.2, CACHE): the node's ``past_key`` / ``past_value`` inputs and ``present_key``
  / ``present_value`` outputs (``Concat(past, K)``). A full cache without other masks uses the
  node's ``is_causal`` (offset = the past length, CACHE-2); per-item ``past_lengths`` below
  L_past, masks or bias go as ``attn_mask`` scattered into the node's key layout (past entries
  beyond ``past_lengths[b]`` blocked), and weights and present cache are gathered back into
  CACHE-1's layout (valid past, new, zeros).

Observed with onnxruntime 1.32.0 (opset 24, CPU); see ``docs/ort.md`` for reproductions:

* float64: the op takes ``sqrt(scale)`` in float32 and multiplies Q and K by it, so any scale whose
  square root is not a float32 number (the default ``1/sqrt(d_k)`` for most d_k, 0.5, 0.3) gives
  logit errors ~3e-8 relative (float32 accuracy); with ``scale`` 0.25 or 1 the result agrees with
  the float64 oracle to 2e-16. float64 is not claimed (declared against NUM-1);
* a NaN or inf key behind a boolean mask leaks into every row (MASK-13);
* ``B = 0``, ``L_q = 0`` or ``L_k = 0`` is rejected by the kernel's parameter checks (SHAPE-4);
* a fully masked row gives output 0 and weights 0, as MASK-9 asks;
* float16 with a soft-cap above 65504 gives NaN: the kernel rounds c to float16, where it is inf
  (declared against SOFTCAP-1 for float16 only, and CACHE-1 / CACHE-2, whose tests draw caps);
* with a cache, ``is_causal=1`` and one query with several new keys (L_q = 1 < L_k), the kernel
  allows every key (ONNX's reference: j <= L_past + i); the adapter gives that call a mask.
"""

from __future__ import annotations

import collections
import functools
import importlib.util

import numpy as np

from . import masks
from ._base import AttentionOutputs
from .adapters import MaskArgs, NumpyAdapter
from .cache_layout import LibraryCache

INSTALL_HINT = "pip install 'mhaspec[onnx]'"
OPSET = 24
#: qk_matmul_output_mode 3: the fourth output holds the softmax, the spec's weights (SDPA-4)
WEIGHTS_MODE = 3


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (import blocked)
        return False


for _module in ("onnxruntime", "onnx"):
    if not _installed(_module):
        raise ImportError(f"{_module} not installed: {INSTALL_HINT}")


@functools.cache
def _ort():
    import onnxruntime

    return onnxruntime


@functools.cache
def _onnx():
    import onnx

    return onnx


class SessionCache:
    """At most ``maxsize`` ``InferenceSession`` objects, least recently used dropped first."""

    def __init__(self, maxsize: int = 64):
        if maxsize < 1:
            raise ValueError(f"argument 'maxsize' must be at least 1, got {maxsize!r}")
        self.maxsize = maxsize
        self._sessions: collections.OrderedDict = collections.OrderedDict()
        self.builds = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def keys(self) -> list:
        """The cached models' keys (:class:`NodeSpec`), least recently used first."""
        return list(self._sessions)

    def get(self, key, build):
        """The session for ``key``, made by ``build()`` when it is not held."""
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        session = build()
        self.builds += 1
        self._sessions[key] = session
        if len(self._sessions) > self.maxsize:
            self._sessions.popitem(last=False)
        return session


class NodeSpec(collections.namedtuple("NodeSpec",
                                      "q k v mask dtype is_causal scale softcap lengths past",
                                      defaults=(None, False, None))):
    """What one Attention model depends on: the shapes of Q (B, h, L_q, d_k), K (B, g, L_k, d_k),
    V (B, g, L_k, d_v) and ``attn_mask`` (B, h, L_q, L_k) or None, the mask's dtype name ("bool" or
    the inputs' dtype) or None, the inputs' dtype name, ``is_causal``, the ``scale`` attribute
    (None: the op's default), the ``softcap`` attribute (None: none, SOFTCAP-1) and whether the
    node takes ``nonpad_kv_seqlen`` (per-batch key lengths, SEG-2); ``past``: the shapes of
    ``past_key`` (B, g, L_past, d_k) and ``past_value`` (B, g, L_past, d_v), or None (CACHE-1)."""


def attention_model(spec: NodeSpec):
    """The ONNX model of one ``Attention`` node (opset 24) for ``spec``: inputs ``Q``, ``K``,
    ``V`` [, ``attn_mask``] [, ``past_key``, ``past_value``], outputs ``Y`` [, ``present_key``,
    ``present_value``] and ``W`` (``qk_matmul_output`` after the softmax)."""
    onnx = _onnx()
    helper, mapping = onnx.helper, onnx.helper.np_dtype_to_tensor_dtype
    elem = mapping(np.dtype(spec.dtype))
    b, h, len_q, _ = spec.q
    len_k, d_v = spec.k[2] + (spec.past[0][2] if spec.past else 0), spec.v[3]
    inputs = [helper.make_tensor_value_info(n, elem, s)
              for n, s in (("Q", spec.q), ("K", spec.k), ("V", spec.v))]
    names = ["Q", "K", "V", ""]
    if spec.mask is not None:
        inputs.append(helper.make_tensor_value_info("attn_mask", mapping(np.dtype(spec.mask[1])),
                                                    spec.mask[0]))
        names[3] = "attn_mask"
    names += ["", ""]
    if spec.past:
        inputs += [helper.make_tensor_value_info(n, elem, shape)
                   for n, shape in zip(("past_key", "past_value"), spec.past)]
        names[4:6] = ["past_key", "past_value"]
    if spec.lengths:
        inputs.append(helper.make_tensor_value_info("nonpad_kv_seqlen", onnx.TensorProto.INT64,
                                                    (b,)))
        names.append("nonpad_kv_seqlen")
    while names[-1] == "":
        names.pop()
    outputs = [helper.make_tensor_value_info("Y", elem, (b, h, len_q, d_v)),
               helper.make_tensor_value_info("W", elem, (b, h, len_q, len_k))]
    presents = ["", ""]
    if spec.past:
        presents = ["present_key", "present_value"]
        outputs += [helper.make_tensor_value_info(n, elem, (*shape[:2], len_k, shape[3]))
                    for n, shape in zip(presents, spec.past)]
    attrs = {"is_causal": int(spec.is_causal), "qk_matmul_output_mode": WEIGHTS_MODE}
    if spec.scale is not None:
        attrs["scale"] = float(spec.scale)
    if spec.softcap is not None:
        attrs["softcap"] = float(spec.softcap)
    node = helper.make_node("Attention", names, ["Y", *presents, "W"], **attrs)
    graph = helper.make_graph([node], "attention", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10  # the IR version of opset 23-24; accepted by onnxruntime >= 1.22
    return model


def cpu_session(model):
    """An ``InferenceSession`` on the CPUExecutionProvider, one intra-op thread, warnings off."""
    ort = _ort()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


class OrtAttention(LibraryCache, NumpyAdapter):
    """ONNX ``Attention`` on ONNX Runtime (CPU) behind the spec's SDPA and multi-head attention."""

    framework = "onnxruntime"
    native_op = f"ONNX Attention (opset {OPSET}) on onnxruntime CPUExecutionProvider"
    capabilities = frozenset({"sdpa", "mha", "weights", "masks", "bias", "scale", "legacy_mask",
                              "causal", "cross", "errors", "gqa", "softcap", "segments",
                              "kv_cache"})
    deviations = {
        "NUM-1": "float64 is not supported: the float64 kernel takes sqrt(scale) in float32 and "
                 "multiplies Q and K by it (logit errors ~3e-8 relative for the default "
                 "1/sqrt(d_k)), so float64 is not claimed",
        "MASK-13": "a NaN or inf key behind a boolean attn_mask leaks into every row (the mask is "
                   "applied as -inf added to the logits, and NaN + -inf is NaN)",
        "SHAPE-4": "B = 0, L_q = 0 or L_k = 0 is rejected by the kernel's parameter checks "
                   "('Batch size', 'Q sequence length', 'KV sequence length must be greater "
                   "than 0')",
    }
    conventions = {"causal-alignment": (
        "MASK-7", "is_causal=1 is top-left without a KV cache; bottom-right with L_q != L_k goes "
                  "through an explicit boolean attn_mask")}

    def __init__(self, name: str = "ort-attention", *, cache_size: int = 64):
        super().__init__(name)
        self.sessions = SessionCache(cache_size)

    def framework_version(self) -> str:
        return _ort().__version__

    def deviations_on(self, device: str, dtype: str) -> dict[str, str]:
        if dtype != "float16":
            return self.deviations
        softcap = ("in float16 a soft-cap c above float16's largest value (65504) gives NaN: the "
                   "kernel rounds c to the inputs' dtype, so c = inf and c * tanh(S / c) = inf * 0")
        return {**self.deviations, "SOFTCAP-1": softcap}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float32", "float16")  # float64: scale taken in float32 (see deviations)

    def attention_features(self, q, k, v, m: MaskArgs, features):
        """A call with a KV cache as :class:`.cache_layout.LibraryCache` runs it (its
        :meth:`cache_call`, then :meth:`cached_attention`). Per-batch key lengths (SEG-2) as the
        node's ``nonpad_kv_seqlen`` when they are the call's only feature, exact
        (:func:`.masks.native_lengths`) and without a causal mask (the node's causal diagonal then
        follows each item's valid length); otherwise NotImplemented: segments and lengths reach
        the node folded into ``attn_mask``."""
        if features.cached:
            return super().attention_features(q, k, v, m, features)
        lengths = masks.native_lengths(features.positions)
        plain = (features.window is None and features.softcap is None and features.slopes is None
                 and not features.lse and m.causal is None)
        if not plain or lengths is None or lengths[0] is not None or lengths[1] is None:
            return NotImplemented
        return self.attention(q, k, v, m, kv_lengths=lengths[1].astype(np.int64))

    def attention(self, q, k, v, m: MaskArgs, kv_lengths=None):
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v), g dividing h, optional
        int64 ``kv_lengths`` (B,) -> (output (B, h, L_q, d_v), weights (B, h, L_q, L_k))."""
        len_q, len_k = self.ops.shape(q)[2], self.ops.shape(k)[2]
        is_causal = self.native_causal(m.causal, len_q, len_k)
        attn_mask = self._attn_mask(q, len_k, m, None if is_causal else m.causal)
        return self._node(q, k, v, m, attn_mask, is_causal, kv_lengths=kv_lengths)

    def _node(self, q, k, v, m: MaskArgs, attn_mask, is_causal: bool, *, kv_lengths=None,
              past=None):
        """Run one node: ``attn_mask`` (rank 4, over the node's L_past + L_k keys) or None,
        ``past`` = (past_key, past_value) or None -> [Y, W] or [Y, W, present_key,
        present_value] in the node's own layout (present = Concat(past, K))."""
        b, h, len_q, d_k = self.ops.shape(q)
        len_all = self.ops.shape(k)[2] + (self.ops.shape(past[0])[2] if past is not None else 0)
        scale = None if masks.is_default_scale(m.scale, d_k) else m.scale
        feeds = {"Q": q, "K": k, "V": v}
        mask_sig = None
        if attn_mask is not None:
            attn_mask = np.ascontiguousarray(np.broadcast_to(attn_mask, (b, h, len_q, len_all)))
            feeds["attn_mask"] = attn_mask
            mask_sig = (attn_mask.shape, attn_mask.dtype.name)
        if kv_lengths is not None:
            feeds["nonpad_kv_seqlen"] = kv_lengths
        if past is not None:
            feeds["past_key"], feeds["past_value"] = past
        feeds = {n: np.ascontiguousarray(x) for n, x in feeds.items()}
        spec = NodeSpec(q.shape, k.shape, v.shape, mask_sig, q.dtype.name, is_causal, scale,
                        None if m.softcap is None else float(m.softcap), kv_lengths is not None,
                        None if past is None else (past[0].shape, past[1].shape))
        session = self.sessions.get(spec, lambda: cpu_session(attention_model(spec)))
        names = ["Y", "W"] + (["present_key", "present_value"] if past is not None else [])
        return session.run(names, feeds)

    # -- KV cache (CACHE): the node's past_key / past_value -------------------------------------
    def cache_call(self, like, m: MaskArgs, feats, len_q: int, len_k: int):
        """A call with a KV cache runs the node with ``past_key`` / ``past_value``; with a full
        cache and no mask, bias or other feature, its own ``is_causal`` (offset = the past
        length, CACHE-2) and the call's masks as given; otherwise the structural mask of the call
        (:class:`.cache_layout.LibraryCache`'s folding), laid out as the node's keys."""
        folded, index, options = super().cache_call(like, m, feats, len_q, len_k)
        # one query with several new keys: onnxruntime's is_causal then allows every key (ONNX's
        # reference and CACHE-2 allow j <= L_past + i; docs/ort.md), so that call takes the mask
        plain = (index is None and feats.window is None and feats.slopes is None
                 and all(x is None for x in (m.mask, m.bias, m.legacy_mask, m.key_padding_mask))
                 and not (m.causal is not None and len_q == 1 < len_k))
        if not plain:
            return folded, index, options
        return m._replace(causal=None, softcap=feats.softcap), index, {
            **options, "is_causal": m.causal is not None}

    def cached_attention(self, q, k, v, m: MaskArgs, past_key, past_value, index, *,
                         is_causal=False):
        """The node with ``past_key`` (B, g, L_past, d_k), ``past_value`` (B, g, L_past, d_v):
        ``m`` holds the call's masks over CACHE-1's present layout (L_K = L_past + L_k);
        ``index`` (B, L_K) gathers that layout from ``Concat(past, new, zero)`` (None: a full
        cache, the layouts coincide). The node sees every past entry, so the mask is scattered
        into its layout, where entries past ``past_lengths[b]`` stay blocked, and its weights and
        present cache are gathered back. -> :class:`AttentionOutputs` without lse."""
        attn_mask = self._attn_mask(q, self.ops.shape(k)[2] + self.ops.shape(past_key)[2], m, None,
                                    extra=m.alibi)
        if attn_mask is not None:
            attn_mask = self.to_library_layout(attn_mask, index,
                                               False if attn_mask.dtype == np.bool_ else -np.inf)
        out, weights, present_key, present_value = self._node(
            q, k, v, m, attn_mask, is_causal, past=(past_key, past_value))
        weights, present_key, present_value = self.from_library_layout(
            weights, present_key, present_value, index)
        return AttentionOutputs(out, weights, None, present_key, present_value)

    def _attn_mask(self, q, len_k: int, m: MaskArgs, causal, extra=None):
        """The one ``attn_mask`` of the node: boolean (True = may attend) or float in q's dtype
        (-inf where blocked), rank 4, or None; ``extra``: one more additive term (ALiBi)."""
        allowed = masks.allowed_mask(self.ops.shape(q)[2], len_k, like=q, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask, causal=causal)
        additive = masks.additive_mask(like=q, bias=m.bias, legacy_mask=m.legacy_mask)
        if extra is not None:
            additive = extra if additive is None else additive + extra
        if additive is None:
            return allowed
        return masks.fill_blocked(allowed, like=q, additive=additive)


ATTENTION = OrtAttention("ort-attention")
