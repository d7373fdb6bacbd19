"""The validated front door of an array backend: check a call, hand it to its computation.

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads, d_model query width, k_dim /
v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

An array backend is composed, not inherited: ``ArrayBackend(ops, algorithm)`` takes a framework's
operations (``ops``, public methods, checked by :func:`~.primitives.check_ops`) and an algorithm
object (:mod:`.algorithms`: the masks and the kernel, calling only ``ops``). It validates each
call (:mod:`.calls`: its masking arguments gathered into one :class:`~.calls.MaskArgs`) and hands
it to its :class:`~.computation.Computation` (``backend.computation``), which folds the features,
lays out a KV cache and runs the algorithm; the kind of computation (:attr:`ArrayBackend.
computation_type`: the compiled variants wrap it in ``jax.jit`` / ``tf.function``) is chosen once,
by the class.
"""

from __future__ import annotations

from . import algorithms, arg_checks, autodiff_vjp, calls, serving
from ._base import CAPABILITIES, AttentionOutputs, Backend, MHAParams
from .computation import Computation
from .feature_checks import Features
from .algorithms import LEGACY_MASK_VALUE, Algorithm, Cache  # noqa: F401  (re-exported)
from .calls import MaskArgs, MHACall  # noqa: F401  (re-exported)
from .primitives import check_ops


class ArrayBackend(Backend):
    """A backend composed of a framework's operations and one algorithm: validation and outputs;
    the computation below them is :attr:`computation`.

    ``ops``: the framework's operations (:mod:`.primitives`; every one of
    :data:`~.primitives.OPERATIONS` present, else ``TypeError`` naming the missing ones).
    ``algorithm`` (an :class:`Algorithm`, its value ``"perhead"`` / ``"batched"``, or an
    algorithm object: an instance of :class:`.algorithms.AttentionAlgorithm`, e.g. a subclass of
    :class:`.algorithms.Batched`) is fixed here; ``name`` defaults to
    ``"<framework_label>-<algorithm value>"``. ``backward``: the backward pass of
    ``attention_vjp`` (``backward(backend, q, k, v, d_output, d_lse, masks, feats, bias_grad)``;
    default the framework's autodiff, :mod:`.autodiff_vjp`).
    """

    framework_label = "array"
    #: grouped-query attention is part of the algorithms; gradients need a framework's autodiff
    #: (``ops.vjp``), so "grad" is claimed by the framework subclasses that supply it.
    capabilities = CAPABILITIES - {"grad"}
    #: the computation a backend of this class builds: ``computation_type(ops, algorithm)``
    computation_type = Computation

    def __init__(self, ops, algorithm, *, name: str | None = None, backward=None):
        check_ops(ops)
        self.ops = ops
        self.backward = backward or autodiff_vjp.attention_vjp
        if not isinstance(algorithm, algorithms.AttentionAlgorithm):
            try:
                algorithm = algorithms.ALGORITHMS[Algorithm(algorithm)]
            except ValueError:
                choices = [a.value for a in Algorithm]
                raise ValueError(f"argument 'algorithm' must be an Algorithm or one of {choices}, "
                                 f"got {algorithm!r}") from None
        self.computation = self.computation_type(ops, algorithm)
        self.name = name or f"{self.framework_label}-{algorithm.kind.value}"

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm this backend runs (read-only: chosen once, at construction)."""
        return self.computation.algorithm.kind

    @property
    def algorithm_object(self) -> algorithms.AttentionAlgorithm:
        """The algorithm object: the masks, the kernel and the projections (read-only)."""
        return self.computation.algorithm

    # -- the operations (validated) --------------------------------------------------------------
    def split_heads(self, x, num_heads: int):
        op = "split_heads"
        num_heads = arg_checks.check_heads(op, calls.arg(self, op, "x", x), num_heads)
        return self.algorithm_object.split(self.ops, x, num_heads)

    def combine_heads(self, x):
        op = "combine_heads"
        arg_checks.check_heads(op, calls.arg(self, op, "x", x))
        return self.algorithm_object.combine(self.ops, x)

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None, **features):
        masks, feats, _ = calls.sdpa_call(self, "scaled_dot_product_attention", q, k, v, mask,
                                          bias, legacy_mask, key_padding_mask, causal, scale,
                                          features)
        return self._outputs(feats, self.computation.sdpa(q, k, v, masks, feats), k, q)

    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad: bool = False,
                      mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                      scale=None, **features):
        """Spec 1.3's backward pass of attention (GRAD-3..9) by :attr:`backward` (the framework's
        autodiff through the computation's forward pass unless the backend was given another,
        NumPy's by hand)."""
        op = "scaled_dot_product_attention"
        masks, feats, dims = calls.sdpa_call(self, op, q, k, v, mask, bias, legacy_mask,
                                             key_padding_mask, causal, scale, features)
        arg_checks.check_cotangents(op, dims, calls.arg(self, op, "d_output", d_output),
                                    calls.arg(self, op, "d_lse", d_lse), self.ops.shape(q)[1],
                                    bias_grad=bias_grad, bias=bias, backend=self)
        return self.backward(self, q, k, v, d_output, d_lse, masks, feats, bool(bias_grad))

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, **features):
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads, features)
        res = self.computation.mha(query, key, value, call.params, call.num_heads, call.masks,
                                   call.features, call.num_kv_heads)
        return self._outputs(call.features, res, key, query)

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """Gradients of ``sum(output * cotangent)`` (GRAD) by the framework's autodiff through the
        computation of the forward call (``computation.multi_head``; a gradient call has no spec
        1.2 features): ``query``, ``key``, ``value`` and the parameters present."""
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        primals = {"query": query, "key": key, "value": value,
                   **{n: t for n, t in call.params._asdict().items() if t is not None}}

        def forward(x):
            p = MHAParams(**{n: x.get(n) for n in MHAParams._fields})
            return self.computation.multi_head(x["query"], x["key"], x["value"], p,
                                               call.num_heads, call.masks, call.num_kv_heads)[0]

        return autodiff_vjp.vjp(self, forward, primals, cotangent)

    # -- spec 1.4: merging partial states (MERGE), the paged cache (PAGE); in serving --------------
    merge_conventions = serving.MERGE_CONVENTIONS

    def merge_states(self, outputs, lses, *, sinks=None, lse_base: str = "e",
                     empty_lse: str = "-inf", lse_layout: str = "batch"):
        return serving.merge_states(self.ops, outputs, lses, sinks=sinks, lse_base=lse_base,
                                    empty_lse=empty_lse, lse_layout=lse_layout)

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal: bool = False, scale=None):
        return serving.paged_attention(self, q, k_pages, v_pages, block_table, seq_lens,
                                       query_start_loc, causal=causal, scale=scale)

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        return serving.write_pages(self, k_pages, v_pages, k, v, slot_mapping)

    def fold_features(self, like, masks: MaskArgs, feats: Features, len_q: int, len_k: int):
        """-> (masks, index): ``feats`` folded into ``masks`` as every operation folds them
        (:meth:`.computation.Computation.fold_features`)."""
        return self.computation.fold_features(like, masks, feats, len_q, len_k)

    def _outputs(self, feats: Features, res: AttentionOutputs, key, like):
        """What a call returns: (output, weights), or AttentionOutputs with lse or a cache
        (present_lengths = past_lengths + L_k as the backend's int64 array; ``key``: the call's
        k (B, g, L_k, d_k) or key (B, L_k, k_dim), L_k its second-last axis)."""
        if not feats.outputs:
            return res.output, res.weights
        lengths = None
        if feats.cached:
            lengths = self.ops.constant(feats.past_lengths + self.ops.shape(key)[-2], like)
        return res._replace(lse=res.lse if feats.lse else None, present_lengths=lengths)
