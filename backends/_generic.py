"""Multi-head attention written once, over a dozen array primitives each framework provides.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

:class:`ArrayBackend` validates (``_validate``), gathers the masking arguments of the call into one
:class:`MaskArgs`, builds the boolean "allowed" mask, and runs the :class:`Algorithm` it was
constructed with (read-only: :attr:`ArrayBackend.algorithm`):

* ``Algorithm.PER_HEAD``: the definition (MHA-1), head by head: slice the column block of each
  projection, attend, concatenate. ``split_heads``/``combine_heads`` slice and concatenate.
* ``Algorithm.BATCHED``: the optimisation (MHA-2): one GEMM per projection over ``B*L`` rows (for
  self-attention, ``query is key is value``, one GEMM against ``[W_q | W_k | W_v]``), reshape into
  heads, one batched attention over ``(B, h)``, reshape back, one output GEMM.

Compiled variants (``jax.jit``, ``tf.function``) wrap the algorithm they are given; they do not
choose another. A framework subclass supplies the primitives (``_matmul`` ... ``_constant``) and
conversions. The update primitives (``_iadd`` ... ``_ifill_masked``) receive a temporary the
algorithm owns and will not read again; by default they return a new array, and a framework with
mutable arrays (NumPy) may overwrite the temporary instead, which saves the allocations of the
(B, h, L_q, L_k) logits. The caller's arrays are never written (INPUT-1).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _validate
from ._base import CAPABILITIES, Backend, MHAParams
from ._validate import Arg

LEGACY_MASK_VALUE = -1e9


class Algorithm(enum.Enum):
    """How an :class:`ArrayBackend` computes: fixed when the backend is constructed."""

    PER_HEAD = "perhead"  # the definition, head by head (MHA-1)
    BATCHED = "batched"   # all heads at once (MHA-2)


class MaskArgs(NamedTuple):
    """The masking arguments of one call, validated, in one value (internal form).

    mask: boolean, broadcastable to (B, h, L_q, L_k), True = may attend, or None;
    bias, legacy_mask: float, broadcastable to (B, h, L_q, L_k), or None;
    key_padding_mask: boolean (B, L_k) or None; causal: None, "top_left" or "bottom_right";
    scale: the logit scale as a float (the default 1/sqrt(d_k) already applied), or a scalar
    tensor inside a compiled function.
    """

    mask: Any = None
    bias: Any = None
    legacy_mask: Any = None
    key_padding_mask: Any = None
    causal: str | None = None
    scale: Any = None


class ArrayBackend(Backend):
    """A backend built from array primitives, computing with one :class:`Algorithm`.

    ``algorithm`` (an :class:`Algorithm` or its value, ``"perhead"`` / ``"batched"``) is fixed
    here; ``name`` defaults to ``"<framework_label>-<algorithm value>"``.
    """

    def __init__(self, algorithm: Algorithm | str, *, name: str | None = None):
        try:
            self._algorithm = Algorithm(algorithm)
        except ValueError:
            choices = [a.value for a in Algorithm]
            raise ValueError(f"argument 'algorithm' must be an Algorithm or one of {choices}, "
                             f"got {algorithm!r}") from None
        self.name = name or f"{self.framework_label}-{self._algorithm.value}"

    #: what only ``ArrayBackend.__init__`` sets: a subclass that redefines one is refused
    _ALGORITHM_MEMBERS = frozenset({"algorithm", "_algorithm", "_batched"})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        redefined = sorted(ArrayBackend._ALGORITHM_MEMBERS & set(vars(cls)))
        if redefined:
            raise TypeError(f"{cls.__name__} redefines {redefined}: choose the algorithm by "
                            f"passing it to ArrayBackend.__init__")

    def __setattr__(self, name, value):
        if name == "_algorithm" and "_algorithm" in vars(self):
            raise AttributeError(f"{self.name}: the algorithm is chosen once, at construction")
        super().__setattr__(name, value)

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm this backend runs (read-only: set once by ``__init__``; a subclass can
        neither reassign nor redefine it)."""
        return self._algorithm

    @property
    def _batched(self) -> bool:
        return self._algorithm is Algorithm.BATCHED

    framework_label = "array"
    #: grouped-query attention is part of the algorithms; gradients need a framework's autodiff
    #: (:meth:`_vjp`), so "grad" is claimed by the framework subclasses that supply it.
    capabilities = CAPABILITIES - {"grad"}

    # -- primitives a framework supplies -------------------------------------------------------
    def _shape(self, x) -> tuple[int, ...]:
        return tuple(int(n) for n in x.shape)

    def _dtype_name(self, x) -> str:
        raise NotImplementedError

    def _matmul(self, a, b):
        raise NotImplementedError

    def _transpose(self, x, axes):
        raise NotImplementedError

    def _reshape(self, x, shape):
        raise NotImplementedError

    def _exp(self, x):
        raise NotImplementedError

    def _max_last(self, x):
        """Max over the last axis, keeping it."""
        raise NotImplementedError

    def _sum_last(self, x):
        """Sum over the last axis, keeping it."""
        raise NotImplementedError

    def _where(self, cond, a, b: float):
        """Elementwise ``cond ? a : b`` with a Python float ``b``, in ``a``'s dtype."""
        raise NotImplementedError

    def _isfinite(self, x):
        raise NotImplementedError

    def _concat(self, xs, axis: int):
        raise NotImplementedError

    def _stack(self, xs, axis: int):
        raise NotImplementedError

    def _constant(self, array: np.ndarray, like):
        """A NumPy constant (a causal mask) as an array on ``like``'s device."""
        raise NotImplementedError

    # -- update primitives: ``x`` is a temporary the caller owns; may be overwritten -------------
    def _iadd(self, x, y):
        """``x + y`` (``y`` broadcasts to ``x``)."""
        return x + y

    def _isub(self, x, y):
        """``x - y`` (``y`` broadcasts to ``x``)."""
        return x - y

    def _imul(self, x, y):
        """``x * y`` (``y`` broadcasts to ``x``)."""
        return x * y

    def _idiv(self, x, y):
        """``x / y`` (``y`` broadcasts to ``x``)."""
        return x / y

    def _iexp(self, x):
        """``exp(x)``."""
        return self._exp(x)

    def _ifill_masked(self, x, allowed):
        """``x`` with ``-inf`` where the boolean ``allowed`` (broadcasting to ``x``) is False."""
        return self._where(allowed, x, -np.inf)

    # -- the four operations ---------------------------------------------------------------------
    def _arg(self, op: str, name: str, x) -> Arg | None:
        """``x`` as validation sees it; None stays None. Not an array: ValueError naming it."""
        if x is None:
            return None
        _validate.require_array(op, name, x)
        return Arg(name, self._shape(x), self._dtype_name(x))

    def split_heads(self, x, num_heads: int):
        op = "split_heads"
        num_heads = _validate.check_heads(op, self._arg(op, "x", x), num_heads)
        if self._batched:
            return self._split(x, num_heads)
        d = self._shape(x)[2] // num_heads
        return self._stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)

    def combine_heads(self, x):
        op = "combine_heads"
        _validate.check_heads(op, self._arg(op, "x", x))
        return self._combine(x)

    def _combine(self, x):
        if self._batched:
            b, h, length, d = self._shape(x)
            return self._reshape(self._transpose(x, (0, 2, 1, 3)), (b, length, h * d))
        return self._concat([x[:, i] for i in range(self._shape(x)[1])], axis=-1)

    def _mask_args(self, op: str, mask, bias, legacy_mask, key_padding_mask) -> dict[str, Arg | None]:
        """The mask arrays of a call as validation's keyword arguments."""
        return {n: self._arg(op, n, x) for n, x in (("mask", mask), ("bias", bias),
                                                    ("legacy_mask", legacy_mask),
                                                    ("key_padding_mask", key_padding_mask))}

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None):
        op = "scaled_dot_product_attention"
        dims = _validate.check_sdpa(
            self._arg(op, "q", q), self._arg(op, "k", k), self._arg(op, "v", v),
            **self._mask_args(op, mask, bias, legacy_mask, key_padding_mask), causal=causal,
            scale=scale)
        masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                         _default_scale(scale, dims.d_k))
        return self._sdpa(q, k, v, masks)

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None):
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        return self._mha(query, key, value, call.params, call.num_heads, call.masks,
                         **call.grouping)

    def _mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                  key_padding_mask, causal, scale, num_kv_heads) -> "MHACall":
        """Validate a multi-head call (``multi_head_attention`` and ``mha_vjp``)."""
        op = "multi_head_attention"
        params = _params(op, params)
        if num_kv_heads is not None and "gqa" not in self.capabilities:
            raise NotImplementedError(f"{self.name}: grouped-query attention (num_kv_heads) is not "
                                      f"supported")
        dims = _validate.check_mha(
            self._arg(op, "query", query), self._arg(op, "key", key),
            self._arg(op, "value", value),
            {n: self._arg(op, n, p) for n, p in params._asdict().items()}, num_heads=num_heads,
            **self._mask_args(op, mask, bias, legacy_mask, key_padding_mask), causal=causal,
            scale=scale, num_kv_heads=num_kv_heads)
        masks = MaskArgs(mask, bias, legacy_mask, key_padding_mask, causal,
                         _default_scale(scale, dims.d_k))
        grouping = {} if num_kv_heads is None else {"num_kv_heads": _validate.as_int(num_kv_heads)}
        return MHACall(params, dims.heads, masks, grouping)

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """Gradients of ``sum(output * cotangent)`` (GRAD) by the framework's autodiff through the
        same ``_mha`` forward: ``query``, ``key``, ``value`` and the parameters present."""
        call = self._mha_call(query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        primals = {"query": query, "key": key, "value": value,
                   **{n: t for n, t in call.params._asdict().items() if t is not None}}

        def forward(x):
            p = MHAParams(**{n: x.get(n) for n in MHAParams._fields})
            return self._vjp_forward(x["query"], x["key"], x["value"], p, call.num_heads,
                                     call.masks, **call.grouping)[0]

        return self._vjp(forward, primals, cotangent)

    def _vjp_forward(self, *args, **kwargs):
        """The forward :meth:`mha_vjp` differentiates: ``_mha`` (an attention-only adapter uses
        :meth:`_mha_over_sdpa`, its own kernel between the projections)."""
        return self._mha(*args, **kwargs)

    def _mha_over_sdpa(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs):
        """Multi-head attention as projections, split_heads, ``self._sdpa``, combine_heads and the
        output projection (the batched form, MHA-2), whatever ``_sdpa`` is."""
        q, k, v = (self._split(self._linear(x, w, b), num_heads)
                   for x, w, b in ((query, p.w_q, p.b_q), (key, p.w_k, p.b_k),
                                   (value, p.w_v, p.b_v)))
        out, weights = self._sdpa(q, k, v, masks)
        b, h, length, d = self._shape(out)
        out = self._reshape(self._transpose(out, (0, 2, 1, 3)), (b, length, h * d))
        return self._linear(out, p.w_o, p.b_o), weights

    def _vjp(self, fn, primals: dict, cotangent) -> dict:
        """``{name: d sum(fn(primals) * cotangent) / d primals[name]}`` (a framework's autodiff)."""
        raise NotImplementedError(f"{self.name}: no automatic differentiation (capability 'grad')")

    # -- the algorithms (unvalidated; compiled variants wrap these) -----------------------------
    def _sdpa(self, q, k, v, masks: MaskArgs):
        """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v) -> (out, weights): what
        ``scaled_dot_product_attention`` runs after validation (compiled variants and native
        adapters override it)."""
        return self._attention(q, k, v, masks)

    def _attention(self, q, k, v, masks: MaskArgs):
        """The attention of the algorithm (shapes as :meth:`_sdpa`); the batched multi-head
        algorithm calls it directly, so a compiled ``_mha`` does not nest a compiled ``_sdpa``."""
        allowed = self._allowed(q, k, masks.mask, masks.key_padding_mask, masks.causal)
        additive = self._additive(masks.bias, masks.legacy_mask)
        if self._batched:
            return self._attend(q, k, v, allowed, additive, masks.scale)
        outs, weights = self._attend_heads(self._shape(q)[1],
                                           lambda i: (q[:, i], k[:, i], v[:, i]),
                                           allowed, additive, masks.scale)
        return self._stack(outs, axis=1), weights

    def _mha(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
             num_kv_heads: int | None = None):
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim) -> (out, weights).

        ``num_kv_heads`` g (MHA-6, None: g = h): query head i uses key/value head i // (h / g)."""
        g = num_heads if num_kv_heads is None else num_kv_heads
        if self._batched:
            return self._mha_batched(query, key, value, p, num_heads, masks, g)
        return self._mha_per_head(query, key, value, p, num_heads, masks, g)

    def _mha_batched(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                     g: int):
        """MHA-2: project once, split into heads (g key/value heads, each repeated for its h / g
        query heads), one batched attention, combine, project."""
        if g == num_heads:
            q, k, v = self._project_qkv(query, key, value, p)
        else:
            q, k, v = (self._linear(query, p.w_q, p.b_q), self._linear(key, p.w_k, p.b_k),
                       self._linear(value, p.w_v, p.b_v))
        q, k, v = self._split(q, num_heads), self._split(k, g), self._split(v, g)
        if g != num_heads:
            group = num_heads // g
            k, v = (self._stack([t[:, i // group] for i in range(num_heads)], axis=1)
                    for t in (k, v))
        out, weights = self._attention(q, k, v, masks)
        return self._linear(self._combine(out), p.w_o, p.b_o), weights

    def _mha_per_head(self, query, key, value, p: MHAParams, num_heads: int, masks: MaskArgs,
                      g: int):
        """MHA-1: head i projects with its column block of W_q and key/value head i // (h / g)'s
        blocks of W_k and W_v, attends, and the heads are concatenated before W_o."""
        group = num_heads // g
        d_k = self._shape(p.w_q)[1] // num_heads
        d_v = self._shape(p.w_v)[1] // g

        def head(i):
            j = i // group
            qc, kc = slice(i * d_k, (i + 1) * d_k), slice(j * d_k, (j + 1) * d_k)
            vc = slice(j * d_v, (j + 1) * d_v)
            return (self._linear(query, p.w_q[:, qc], _columns(p.b_q, qc)),
                    self._linear(key, p.w_k[:, kc], _columns(p.b_k, kc)),
                    self._linear(value, p.w_v[:, vc], _columns(p.b_v, vc)))

        allowed = self._allowed_mha(query, key, masks.mask, masks.key_padding_mask, masks.causal)
        heads, weights = self._attend_heads(num_heads, head, allowed,
                                            self._additive(masks.bias, masks.legacy_mask),
                                            masks.scale)
        return self._linear(self._concat(heads, axis=-1), p.w_o, p.b_o), weights

    def _attend_heads(self, num_heads: int, head_inputs: Callable[[int], tuple], allowed,
                      additive, scale):
        """Attention head by head: ``head_inputs(i)`` gives head i's (q, k, v); masks broadcast
        to (B, h, L_q, L_k) are cut per head. Returns the list of head outputs and the weights
        stacked to (B, h, L_q, L_k)."""
        allowed = _as_rank4(self, allowed)
        additive = [_as_rank4(self, t) for t in additive]
        outs, weights = [], []
        for i in range(num_heads):
            o, w = self._attend(*head_inputs(i), _head(allowed, i), [_head(t, i) for t in additive],
                                scale)
            outs.append(o)
            weights.append(w)
        return outs, self._stack(weights, axis=1)

    def _project_qkv(self, query, key, value, p: MHAParams):
        """The three input projections of the batched variant. For self-attention (``query is key
        is value``) with all or none of b_q, b_k, b_v: one GEMM against the column concatenation
        ``[W_q | W_k | W_v]`` (built per call: a copy of the weights, cheap next to the GEMM), then
        column slices of the result."""
        biases = (p.b_q, p.b_k, p.b_v)
        same_bias = all(b is None for b in biases) or all(b is not None for b in biases)
        if not (query is key and key is value and same_bias):
            return (self._linear(query, p.w_q, p.b_q), self._linear(key, p.w_k, p.b_k),
                    self._linear(value, p.w_v, p.b_v))
        w = self._concat([p.w_q, p.w_k, p.w_v], axis=1)
        b = None if p.b_q is None else self._concat(list(biases), axis=0)
        qkv = self._linear(query, w, b)
        n_qk, n_v = self._shape(p.w_q)[1], self._shape(p.w_v)[1]
        return qkv[..., :n_qk], qkv[..., n_qk:2 * n_qk], qkv[..., 2 * n_qk:2 * n_qk + n_v]

    def _split(self, x, num_heads):
        b, length, width = self._shape(x)
        return self._transpose(self._reshape(x, (b, length, num_heads, width // num_heads)),
                               (0, 2, 1, 3))

    def _linear(self, x, w, b):
        """x (..., in) @ w (in, out) + b (out,); the batched algorithm runs one 2-D GEMM."""
        if self._batched:
            lead = self._shape(x)[:-1]
            y = self._reshape(self._matmul(self._reshape(x, (-1, self._shape(x)[-1])), w),
                              (*lead, self._shape(w)[1]))
        else:
            y = self._matmul(x, w)
        return y if b is None else self._iadd(y, b)

    def _attend(self, q, k, v, allowed, additive, scale):
        """Attention over the last two axes; any leading axes. allowed is boolean or None."""
        logits = self._matmul(q, self._transpose(k, (*range(len(self._shape(k)) - 2), -1, -2)))
        if self._shape(k)[-2] == 0:  # L_k = 0: every row is fully masked (SHAPE-4, MASK-9)
            return self._matmul(logits, v), logits  # (..., L_q, 0) @ (..., 0, d_v) = zeros
        logits = self._imul(logits, scale)
        for term in additive:
            logits = self._iadd(logits, term)
        if allowed is not None:
            logits = self._ifill_masked(logits, allowed)
        row_max = self._max_last(logits)
        row_max = self._where(self._isfinite(row_max), row_max, 0.0)
        e = self._iexp(self._isub(logits, row_max))
        total = self._sum_last(e)
        weights = self._idiv(e, self._where(total != 0, total, 1.0))
        return self._matmul(weights, v), weights

    def _additive(self, bias, legacy_mask):
        terms = [] if bias is None else [bias]
        if legacy_mask is not None:
            terms.append(legacy_mask * LEGACY_MASK_VALUE)
        return terms

    def _allowed(self, q, k, mask, key_padding_mask, causal):
        """Boolean broadcastable to (B, h, L_q, L_k), or None when nothing is masked."""
        return self._combine_masks(self._shape(q)[2], self._shape(k)[2], q, mask, key_padding_mask,
                                   causal)

    def _allowed_mha(self, query, key, mask, key_padding_mask, causal):
        return self._combine_masks(self._shape(query)[1], self._shape(key)[1], query, mask,
                                   key_padding_mask, causal)

    def _full(self, shape, value: float, like):
        """An array of ``shape`` filled with ``value`` in ``like``'s dtype and device."""
        raise NotImplementedError

    def _canonical_masks(self, like, full, masks: MaskArgs) -> MaskArgs:
        """All masking as full (B, h, L_q, L_k) arrays: one boolean mask (key padding and causal
        folded in, so both become None) and one bias (zeros when absent); the scale is kept.
        Compiled variants call this before compiling so that every call of one shape and dtype has
        the same signature and compiles once."""
        allowed = self._combine_masks(full[2], full[3], like, masks.mask, masks.key_padding_mask,
                                      masks.causal)
        ones = self._constant(np.ones(full, dtype=bool), like)
        zeros = self._full(full, 0.0, like)
        return MaskArgs(mask=ones if allowed is None else ones & allowed,
                        bias=zeros if masks.bias is None else zeros + masks.bias,
                        legacy_mask=None if masks.legacy_mask is None else zeros + masks.legacy_mask,
                        scale=masks.scale)

    def _combine_masks(self, len_q, len_k, like, mask, key_padding_mask, causal):
        allowed = mask
        if key_padding_mask is not None:
            b = self._shape(key_padding_mask)[0]
            kpm = self._reshape(key_padding_mask, (b, 1, 1, len_k))
            allowed = kpm if allowed is None else allowed & kpm
        if causal is not None:
            offset = 0 if causal == "top_left" else len_k - len_q
            tri = np.arange(len_k)[None, :] <= np.arange(len_q)[:, None] + offset
            tri = self._constant(tri, like)
            allowed = tri if allowed is None else allowed & tri
        return allowed


class MHACall(NamedTuple):
    """A validated multi-head call: the parameters as :class:`MHAParams`, ``num_heads`` as an int,
    the masking arguments, and ``{"num_kv_heads": g}`` for grouped-query attention (MHA-6) or
    ``{}`` (passed to ``_mha`` as keywords only when given)."""

    params: MHAParams
    num_heads: int
    masks: MaskArgs
    grouping: dict


def _default_scale(scale, d_k: int) -> float:
    """The validated ``scale`` as a float, or the default 1/sqrt(d_k) (SDPA-2)."""
    return 1.0 / float(np.sqrt(d_k)) if scale is None else _validate.as_real(scale)


def _params(op: str, params) -> MHAParams:
    """``params`` as :class:`MHAParams`: a sequence of the four weights and up to four biases."""
    if isinstance(params, (str, bytes)) or not isinstance(params, (tuple, list)) \
            or not 4 <= len(params) <= len(MHAParams._fields):
        _validate.fail(op, f"argument 'params' must be MHAParams(w_q, w_k, w_v, w_o[, b_q, b_k, "
                           f"b_v, b_o]), got {type(params).__name__}")
    return MHAParams(*params)


def _columns(b, cols: slice):
    """Columns ``cols`` of a bias, or None for an absent bias."""
    return None if b is None else b[cols]


def _as_rank4(backend: ArrayBackend, m):
    """Left-pad a mask/bias broadcastable to (B, h, L_q, L_k) to rank 4."""
    if m is None:
        return None
    shape = backend._shape(m)
    return backend._reshape(m, (1,) * (4 - len(shape)) + shape) if len(shape) < 4 else m


def _head(m, i: int):
    """Head ``i``'s part of a rank-4 mask/bias: (B|1, h|1, L_q|1, L_k|1) -> (B|1, L_q|1, L_k|1)."""
    if m is None:
        return None
    return m[:, i] if m.shape[1] > 1 else m[:, 0]
