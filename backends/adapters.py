"""Base classes that turn a framework's attention function or module into a backend.

Axis legend: B batch, L_q / L_k lengths, h heads, g key/value heads, d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

Subclass the base of the framework your op computes in and override what it has:

* :meth:`NativeAdapter.attention` ``(q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v),
  masks) -> (output (B, h, L_q, d_v), weights (B, h, L_q, L_k) or None)`` for a function
  (FlashAttention style: torch SDPA, ``jax.nn.dot_product_attention``, ONNX ``Attention``);
* :meth:`NativeAdapter.mha` ``(query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k,
  v_dim), params, num_heads, masks) -> (output (B, L_q, d_out), weights or None)`` for a module
  (``nn.MultiheadAttention``, Keras ``MultiHeadAttention``, a Hugging Face attention layer).

The bases:

* :class:`NumpyAdapter`: NumPy on the CPU; float64, float32, float16;
* :class:`TorchAdapter`: torch tensors on CPU and CUDA (TF32 off); all four floating dtypes;
* :class:`JaxAdapter`: JAX arrays on CPU and GPU (x64 on); all four;
* :class:`TensorFlowAdapter`: TensorFlow tensors on CPU and GPU (TF32 off); all four.

Each fills in ``asarray``, ``to_numpy``, ``device_of``, ``devices``, ``dtypes``,
``framework_version`` and ``precision_flags``; override ``dtypes`` for what the op supports.

The public entry points (``scaled_dot_product_attention``, ``multi_head_attention``, ``mha_vjp``)
validate every argument first (chapter ERR, the same checks and messages as the in-repo backends),
apply the default scale, and gather the masking arguments into one :class:`MaskArgs` (``mask``,
``bias``, ``legacy_mask``, ``key_padding_mask``, ``causal``, ``scale``, and spec 1.2's ``softcap``
and ``alibi`` bias), so ``attention`` and ``mha`` see valid input only; translate the masks with
:mod:`.masks` and the parameters with :mod:`.layouts`. The clauses that validation satisfies
whatever the library does (:data:`~.validation.REJECTION_CLAUSES`) are the adapter's, and the
certificate says so (``validated_clauses``); ``library_validates`` names those of
:data:`LEFT_TO_LIBRARY` whose arguments go to the library unchecked, so its own errors are
judged. What the op cannot express: state it in ``sub_cases`` (:mod:`.sub_cases`: arguments
and shapes), so the suite leaves those calls out as not implemented; a call the rules allow
that reaches :meth:`NativeAdapter.unsupported` (``NotImplementedError``) fails its test, and is
never a pass. Capabilities default to ``errors`` only: claim what the op has; declare what it
does differently in ``deviations``.

Spec 1.2 features (capabilities "gqa", "softcap", "window", "alibi", "segments"): a call with one
the adapter claims reaches ``attention`` / ``mha`` with the features folded into the masks (the
structural mask of segments, lengths and windows ANDed into ``masks.mask``, ``causal`` and
``key_padding_mask`` folded in too, ``masks.softcap`` and the ``masks.alibi`` bias set), so an op
with a boolean mask serves them exactly. To use the op's own arguments where they are exact
instead (a length or window argument), override :meth:`NativeAdapter.attention_features`. With
"gqa", ``k`` and ``v`` of ``attention`` may have g heads. "lse" needs the op's own
log-sum-exp (override :meth:`NativeAdapter.attention_with_lse`, or ``attention_features``) and
"kv_cache" its own mapping (override ``attention_features``, and ``mha_features`` for multi-head
calls; ``fold_features`` folds a call's features as the generic path does, and
:class:`.cache_layout.LibraryCache` maps a library cache that keeps every past entry). With
"attention_vjp" the backward pass is autograd (``jax.vjp``, ``GradientTape``) through
``attention`` or ``attention_with_lse``: the op's own backward; the inputs then require grad, so
the op must not detach them. An adapter overrides these public methods only, never the array
backend's hooks. The soft-cap is ``masks.softcap`` in every method (``attention_features``'
``features.softcap`` holds the same value); ALiBi is ``masks.alibi`` (the bias) in ``attention``
and ``mha``, and ``features.slopes`` in ``attention_features``.
"""

from __future__ import annotations

import copy

from . import autodiff_vjp
from ._base import AttentionOutputs, MHAParams
from ._generic import ArrayBackend
from .computation import Computation
from .arg_checks import REJECTION_CLAUSES
from .feature_checks import Features
from .algorithms import ALGORITHMS, Algorithm
from .calls import LEFT_TO_LIBRARY, MaskArgs
from .sub_cases import FOLDED
from .jax_backend import JaxBackend
from .np_backend import NumpyBackend
from .tf_backend import TensorFlowBackend
from .torch_backend import TorchBackend

__all__ = ["Features", "JaxAdapter", "LEFT_TO_LIBRARY", "MaskArgs", "NativeAdapter",
           "NumpyAdapter", "TensorFlowAdapter", "TorchAdapter"]


#: The spec's projections around an op's attention (the batched form, MHA-2): ``split``,
#: ``linear``, ``combine`` of the batched algorithm's stateless object.
PROJECTIONS = ALGORITHMS[Algorithm.BATCHED]


class NativeAdapter:
    """Members common to every adapter; mixed in before a framework backend (the bases below).

    Attributes:
        native_op: the op the adapter calls, for messages and the certificate.
        conventions: key -> (clause, one line): where the native op differs from the spec and the
            adapter translates. :meth:`untranslated` gives the adapter without one translation, so
            ``mhaspec conventions`` can confirm the difference is real; an adapter asks
            :meth:`translates` before translating.
        library_validates: clauses of :data:`LEFT_TO_LIBRARY` whose argument reaches the op
            unchecked (an invalid ``softcap`` or ``scale``, k and v heads that do not group), so
            the library's own error, or its silence, is judged; the others are checked before the
            op is called.
    """

    native_op: str = ""
    conventions: dict[str, tuple[str, str]] = {}
    capabilities = frozenset({"errors"})
    deviations: dict[str, str] = {}
    library_validates: frozenset[str] = frozenset()

    def __init__(self, name: str):
        # the op computes; the projections around it and the masks are PROJECTIONS'
        self.name = name
        self.computation = NativeComputation(self)
        # the op's own backward: the framework's autodiff through it (NumPy has none: the
        # NotImplementedError of a backend without "grad")
        self.backward = autodiff_vjp.attention_vjp
        self.translated = frozenset(self.conventions)
        unknown = sorted(set(self.library_validates) - set(LEFT_TO_LIBRARY))
        if unknown:
            raise ValueError(f"{name}: library_validates names {unknown}; an adapter can leave to "
                             f"its library only {sorted(LEFT_TO_LIBRARY)}")
        unclaimed = sorted(c for c in self.library_validates
                           if LEFT_TO_LIBRARY[c][1] not in self.capabilities)
        if unclaimed:
            raise ValueError(f"{name}: library_validates names {unclaimed}, whose capability the "
                             f"adapter does not claim")
        if "attention_vjp" in self.capabilities and not self._differentiates():
            raise ValueError(f"{name}: claims 'attention_vjp', but {type(self).__name__} has no "
                             f"automatic differentiation: implement attention_vjp(q, k, v, "
                             f"d_output, *, d_lse=None, bias_grad=False, **kwargs) (a hand-written "
                             f"backward, docs/backends.md) or do not claim it")

    #: whether the adapter differentiates through its library's own autodiff, beside the
    #: framework's (:class:`.foreign.ForeignAdapter` with a ``vjp``)
    differentiates_itself: bool = False

    def _differentiates(self) -> bool:
        """Whether the adapter gets ``attention_vjp`` from its framework's autodiff (``ops.vjp``:
        torch, JAX, TensorFlow), its library's (:attr:`differentiates_itself`) or implements
        ``attention_vjp`` itself."""
        return (callable(getattr(self.ops, "vjp", None)) or self.differentiates_itself
                or type(self).attention_vjp is not ArrayBackend.attention_vjp)

    @property
    def algorithm(self) -> None:
        """None, read-only: the op computes (the masks and projections around it are
        PROJECTIONS')."""
        return None

    def folded_by_adapter(self) -> list[str]:
        """The capabilities of :data:`~.sub_cases.FOLDED` this adapter served by folding them
        (not through the library's own arguments) in the calls since the last ask; the suite asks
        after every test, and a pass of their clauses is then the adapter's."""
        return self.computation.take_folds()

    @property
    def validated_clauses(self) -> frozenset[str]:
        """The clauses the shared validation satisfies before the op is called: every rejection
        clause (:data:`~.validation.REJECTION_CLAUSES`) not left to the library."""
        return REJECTION_CLAUSES - self.library_validates

    # -- what a subclass overrides -------------------------------------------------------------
    def attention(self, q, k, v, masks: MaskArgs):
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> (output (B, h, L_q, d_v),
        weights (B, h, L_q, L_k) or None), input validated (g = h unless "gqa" is claimed)."""
        self.unsupported("scaled dot-product attention on its own")

    def attention_with_lse(self, q, k, v, masks: MaskArgs):
        """:meth:`attention` with the op's own log-sum-exp (capability "lse", LSE-1): (output
        (B, h, L_q, d_v), weights or None, lse (B, h, L_q)). The generic feature path calls it for
        ``lse=True`` (and the autodiff backward for a ``d_lse``), ``masks`` folded as for
        :meth:`attention`."""
        self.unsupported("the log-sum-exp (lse) without its own mapping")

    def mha(self, query, key, value, params: MHAParams, num_heads: int, masks: MaskArgs,
            **grouping):
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) -> (output
        (B, L_q, d_out), weights (B, h, L_q, L_k) or None), input validated; ``grouping`` is
        ``{"num_kv_heads": g}`` with "gqa". Default: :meth:`mha_over_attention` (the public
        ``multi_head_attention`` reaches it only when "mha" is claimed; GRAD always)."""
        return self.mha_over_attention(query, key, value, params, num_heads, masks, **grouping)

    # -- helpers ------------------------------------------------------------------------------
    def mha_over_attention(self, query, key, value, params: MHAParams, num_heads: int,
                           masks: MaskArgs, num_kv_heads: int | None = None):
        """Multi-head attention as the spec's projections (batched, MHA-2) around
        :meth:`attention`, with ``num_kv_heads`` g key/value heads (MHA-6)."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        split, linear = PROJECTIONS.split, PROJECTIONS.linear
        q = split(self.ops, linear(self.ops, query, params.w_q, params.b_q), num_heads)
        k = split(self.ops, linear(self.ops, key, params.w_k, params.b_k), g)
        v = split(self.ops, linear(self.ops, value, params.w_v, params.b_v), g)
        out, weights = self.attention(q, k, v, masks)
        out = PROJECTIONS.combine(self.ops, out)
        return linear(self.ops, out, params.w_o, params.b_o), weights

    def unsupported(self, what: str):
        """Raise ``NotImplementedError``: the op cannot express ``what`` (a failure of the test
        unless ``sub_cases`` states the limit, which keeps such calls away)."""
        raise NotImplementedError(f"{self.name}: {self.native_op} cannot express {what}")

    def translates(self, key: str) -> bool:
        """Whether convention ``key`` is translated (False only in :meth:`untranslated` copies)."""
        return key in self.translated

    def untranslated(self, key: str):
        """A copy of this adapter that passes the spec's arguments to the native op as they are,
        without translating convention ``key``."""
        if key not in self.conventions:
            raise ValueError(f"{self.name}: no convention {key!r}; "
                             f"known: {sorted(self.conventions)}")
        other = copy.copy(self)
        other.name = f"{self.name}[untranslated {key}]"
        other.translated = self.translated - {key}
        other.computation = NativeComputation(other)
        other.reset()
        return other

    def reset(self):
        """Forget what depends on the translations (a compiled function); copies call it."""

    def native_causal(self, causal, len_q: int, len_k: int) -> bool:
        """Whether the op's own top-left causal flag serves ``causal`` (MASK-6; bottom-right too
        when ``L_q == L_k``). Without the "causal-alignment" translation the flag is used for
        bottom-right as well (what the untranslated op does)."""
        if causal is not None and not self.translates("causal-alignment"):
            return True
        return causal is not None and (causal == "top_left" or len_q == len_k)

    def split_heads(self, x, num_heads: int):
        raise NotImplementedError(f"{self.name}: {self.native_op} has no split_heads")

    def combine_heads(self, x):
        raise NotImplementedError(f"{self.name}: {self.native_op} has no combine_heads")

    def attention_features(self, q, k, v, masks: MaskArgs, features: Features):
        """A spec 1.2 attention call with ``features`` (validated :class:`Features`: ``window``,
        ``diagonal``, ``positions`` of segments and lengths, ``softcap``, ``slopes``, ``lse``, the
        cache) and ``masks`` as given (not folded) -> (output, weights), or ``NotImplemented`` to
        take the generic path (features folded into ``masks``, then :meth:`attention`). Override
        to pass the op's own arguments where they are exact."""
        return NotImplemented

    def mha_features(self, query, key, value, params: MHAParams, num_heads: int, masks: MaskArgs,
                     features: Features, num_kv_heads: int | None = None):
        """A spec 1.2 multi-head call with ``features`` and ``masks`` as given (not folded), as
        :meth:`attention_features` for attention -> :class:`AttentionOutputs` (output (B, L_q,
        d_out), weights, lse, present_key, present_value), or ``NotImplemented`` to take the
        generic path (features folded into ``masks``, then :meth:`mha`)."""
        return NotImplemented


class NativeComputation(Computation):
    """The computation of a native adapter (``adapter.computation``): the library's op where the
    spec's algorithm would run, the spec's projections (:data:`PROJECTIONS`) around it. A
    feature call goes to ``attention_features`` / ``mha_features`` when they answer, else its
    features are folded into the masks (the generic path) before ``attention`` / ``mha``; which of
    the two served each :data:`~.sub_cases.FOLDED` capability is kept until :meth:`take_folds`."""

    def __init__(self, adapter: NativeAdapter):
        super().__init__(adapter.ops, PROJECTIONS)
        self.adapter = adapter
        self.by_library: set[str] = set()  # FOLDED capabilities the op's own arguments served
        self.by_fold: set[str] = set()  # ... the generic path served

    def served(self, feats: Features, native) -> None:
        """Note who served the FOLDED capabilities of a call: the library (``native`` is its
        answer) or the adapter's fold (``native`` is NotImplemented)."""
        used = feats.capabilities & FOLDED
        (self.by_fold if native is NotImplemented else self.by_library).update(used)

    def take_folds(self) -> list[str]:
        """The FOLDED capabilities the generic path served in every call since the last take (and
        the op's own arguments in none); forgets them."""
        folds = sorted(self.by_fold - self.by_library)
        self.by_fold, self.by_library = set(), set()
        return folds

    def sdpa(self, q, k, v, masks: MaskArgs, feats: Features) -> AttentionOutputs:
        if feats.in_use:
            # the cap has one value wherever the adapter reads it: masks.softcap as in attention()
            native = self.adapter.attention_features(q, k, v, masks._replace(softcap=feats.softcap),
                                                     feats)
            self.served(feats, native)
            if native is not NotImplemented:
                return native if isinstance(native, AttentionOutputs) else AttentionOutputs(*native)
        return super().sdpa(q, k, v, masks, feats)

    def mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
            feats: Features, num_kv_heads: int | None = None) -> AttentionOutputs:
        if "mha" not in self.adapter.capabilities:
            self.adapter.unsupported("multi-head attention")
        if feats.in_use:
            native = self.adapter.mha_features(query, key, value, p, num_heads,
                                               masks._replace(softcap=feats.softcap), feats,
                                               num_kv_heads)
            self.served(feats, native)
            if native is not NotImplemented:
                return native
        return super().mha(query, key, value, p, num_heads, masks, feats, num_kv_heads)

    def attention(self, q, k, v, masks: MaskArgs, lse: bool = False):
        if lse:
            return tuple(self.adapter.attention_with_lse(q, k, v, masks))
        return (*self.adapter.attention(q, k, v, masks), None)

    def multi_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                   num_kv_heads: int | None = None, lse: bool = False, cache=None):
        """The adapter's ``mha`` (GRAD differentiates it too: a module's own, or the spec's
        projections around ``attention``)."""
        if lse or cache is not None:
            self.adapter.unsupported("the log-sum-exp or a KV cache without their own mapping")
        grouping = {} if num_kv_heads is None else {"num_kv_heads": num_kv_heads}
        return (*self.adapter.mha(query, key, value, p, num_heads, masks, **grouping), None, None,
                None)


class NumpyAdapter(NativeAdapter, NumpyBackend):
    """An op computing on NumPy arrays (CPU; float64, float32, float16). ``framework`` names the
    library that computes (``"numpy"`` by default): set it with ``framework_version``."""


class TorchAdapter(NativeAdapter, TorchBackend):
    """An op on torch tensors (CPU, CUDA when visible; all four dtypes; TF32 off). Claims no
    "grad" by default: autograd flows through ``attention`` / ``mha`` once it is claimed."""


class JaxAdapter(NativeAdapter, JaxBackend):
    """An op on JAX arrays (CPU, GPU when visible; all four dtypes; x64 enabled). With "grad",
    ``jax.vjp`` differentiates through ``attention`` / ``mha``."""


class TensorFlowAdapter(NativeAdapter, TensorFlowBackend):
    """An op on TensorFlow tensors (CPU, GPU when visible; all four dtypes; TF32 off)."""
