"""The two algorithms of multi-head attention, written once over a framework's operations.

Axis legend: B batch, L_q / L_k lengths (L_K = L_past + L_k with a KV cache), h query heads,
g key/value heads, d_model query width, k_dim / v_dim key / value widths, d_k / d_v per-head
widths, d_out output width.

* :class:`PerHead` (``Algorithm.PER_HEAD``): the definition (MHA-1), head by head: slice the
  column block of each projection, attend, concatenate.
* :class:`Batched` (``Algorithm.BATCHED``): the optimisation (MHA-2): one GEMM per projection over
  ``B*L`` rows (for self-attention, ``query is key is value``, one GEMM against
  ``[W_q | W_k | W_v]``), reshape into heads, one batched attention over ``(B, h)``, reshape back,
  one output GEMM.

An algorithm is an object chosen once, when a backend is constructed, and owns everything
computed between validation and the outputs: the masks of a call, the attention kernel
(:meth:`AttentionAlgorithm.attend`) and the projections around it. Each method takes the
framework's operations first (``ops``: public methods only, :mod:`.primitives`). Every call is a
spec 1.2 call: ``masks`` (``MaskArgs``) carries the soft-cap and ALiBi when given, ``lse`` asks for
the log-sum-exp, ``cache`` holds a KV cache; a spec 1.1 call leaves them at None / False. A new
feature that shapes the logits is a field of ``MaskArgs`` read by :meth:`~AttentionAlgorithm.attend`
(and cut per head in :meth:`PerHead._heads` when it has a head axis); one that changes what is
computed around attention is a step of :meth:`Batched.mha` and of :meth:`PerHead.mha`.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

import numpy as np

from . import feature_plan, sink_key

#: MASK-3: the legacy float mask is added to the logits times this.
LEGACY_MASK_VALUE = -1e9


class Algorithm(enum.Enum):
    """How an array backend computes: fixed when the backend is constructed."""

    PER_HEAD = "perhead"  # the definition, head by head (MHA-1)
    BATCHED = "batched"   # all heads at once (MHA-2)


class Cache(NamedTuple):
    """A KV cache as the algorithms take it: past_key (B, g, L_past, d_k), past_value (B, g,
    L_past, d_v) (backend arrays) and the present-cache index (B, L_K) as a backend integer array,
    or None for a full cache (the present cache is ``concat([past, new])``)."""

    past_key: Any
    past_value: Any
    index: Any = None


def soft_cap(ops, logits, softcap):
    """``c·tanh(S/c)`` (SOFTCAP-1). float16/bfloat16 logits are capped in float32 and rounded
    back once: c itself may lie outside their range (c = 1e6 is inf in float16, and
    ``S/inf · inf`` is NaN), and the extra rounding of ``S/c`` would add error NUM-3 does not
    budget for."""
    if ops.dtype_name(logits) in ("float16", "bfloat16"):
        wide = ops.to_float32(logits)
        return ops.cast_like(ops.imul(ops.tanh(ops.idiv(wide, softcap)), softcap), logits)
    return ops.imul(ops.tanh(ops.idiv(logits, softcap)), softcap)


def present(ops, past, new, index):
    """CACHE-1: past (B, ..., L_past, d), new (B, ..., L_k, d) -> the present cache (B, ...,
    L_past + L_k, d): the valid past, the new entries, zeros; ``index`` None: a full cache."""
    if index is None:
        return ops.concat([past, new], axis=-2)
    shape = ops.shape(new)
    zero = ops.full((*shape[:-2], 1, shape[-1]), 0.0, new)
    return ops.take_keys(ops.concat([past, new, zero], axis=-2), index)


class AttentionAlgorithm:
    """What both algorithms share: the attention kernel over the last two axes (:meth:`attend`)
    and the masks of a call (:meth:`combine_masks`, :meth:`additive`, :meth:`fold_features`,
    :meth:`canonical_masks`); every method takes the framework's ``ops`` first. A variant
    (a broken backend of the tests, the chunked kernel) overrides one of them in a subclass."""

    kind: Algorithm

    def attend(self, ops, q, k, v, allowed, additive, masks, lse: bool = False):
        """Attention over the last two axes (any leading axes): q (..., L_q, d_k), k (..., L_k,
        d_k), v (..., L_k, d_v); ``allowed`` boolean broadcastable to (..., L_q, L_k) or None;
        ``additive`` terms added to the logits (``allowed`` and ``additive`` are the call's masks,
        cut per head by :class:`PerHead`); from ``masks`` (``MaskArgs``) the kernel reads what
        shapes the logits besides them: ``scale``, and ``softcap`` c (None: none) applied after
        the scale and before the additive terms and masks (SOFTCAP-1) -> (out (..., L_q, d_v),
        weights (..., L_q, L_k), lse (..., L_q) or None): with ``lse``, the per-row log-sum-exp of
        the final logits over the allowed keys, -inf for an empty row (LSE-1)."""
        k_shape = ops.shape(k)
        logits = ops.matmul(q, ops.transpose(k, (*range(len(k_shape) - 2), -1, -2)))
        if k_shape[-2] == 0:  # L_k = 0: every row is fully masked (SHAPE-4, MASK-9)
            out = ops.matmul(logits, v)  # (..., L_q, 0) @ (..., 0, d_v) = zeros
            if not lse:
                return out, logits, None
            zeros = ops.sum_last(logits)
            return out, logits, _drop_last(ops, ops.where(zeros != 0, zeros, -np.inf))
        logits = ops.imul(logits, masks.scale)
        if masks.softcap is not None:
            logits = soft_cap(ops, logits, masks.softcap)
        for term in additive:
            logits = ops.iadd(logits, term)
        if allowed is not None:
            logits = ops.ifill_masked(logits, allowed)
        row_max = ops.max_last(logits)
        row_max = ops.where(ops.isfinite(row_max), row_max, 0.0)
        e = ops.iexp(ops.isub(logits, row_max))
        total = ops.sum_last(e)
        nonempty = total != 0
        safe_total = ops.where(nonempty, total, 1.0)
        weights = ops.idiv(e, safe_total)
        out = ops.matmul(weights, v)
        if not lse:
            return out, weights, None
        return out, weights, _drop_last(ops, ops.where(nonempty, row_max + ops.log(safe_total),
                                                        -np.inf))

    def attention_with_sinks(self, ops, q, k, v, masks, lse: bool, sinks, run=None):
        """``run(q, k, v, masks, lse)`` (default :meth:`attention`; a compiled variant passes its
        compiled one) with the sinks (h,) (SINK-1, spec 1.3; None: none) as one more key whose
        weights column is dropped again (:mod:`.sink_key`)."""
        run = run or (lambda *args: self.attention(ops, *args))
        if sinks is None:
            return run(q, k, v, masks, lse)
        k, v, masks = sink_key.with_sink_key(ops, q, k, v, masks, sinks)
        out, weights, row_lse = run(q, k, v, masks, lse)
        return out, sink_key.without_sink_column(weights), row_lse

    # -- masks -------------------------------------------------------------------------------
    def additive(self, ops, bias, legacy_mask) -> list:
        """The 1.1 terms added to the logits: the bias, the legacy mask times -1e9 (MASK-3)."""
        terms = [] if bias is None else [bias]
        if legacy_mask is not None:
            terms.append(legacy_mask * LEGACY_MASK_VALUE)
        return terms

    def additive_terms(self, ops, masks) -> list:
        """The terms added to the logits: bias, legacy mask (:meth:`additive`) and ALiBi."""
        terms = self.additive(ops, masks.bias, masks.legacy_mask)
        return terms if masks.alibi is None else [*terms, masks.alibi]

    def allowed(self, ops, q, k, mask, key_padding_mask, causal):
        """Boolean broadcastable to (B, h, L_q, L_k), or None when nothing is masked."""
        return self.combine_masks(ops, ops.shape(q)[2], ops.shape(k)[2], q, mask,
                                  key_padding_mask, causal)

    def combine_masks(self, ops, len_q, len_k, like, mask, key_padding_mask, causal):
        """The boolean mask, the key padding (B, L_k) and ``causal`` ANDed into one boolean
        broadcastable to (B, h, L_q, L_k), or None."""
        allowed = mask
        if key_padding_mask is not None:
            b = ops.shape(key_padding_mask)[0]
            kpm = ops.reshape(key_padding_mask, (b, 1, 1, len_k))
            allowed = kpm if allowed is None else allowed & kpm
        if causal is not None:
            offset = 0 if causal == "top_left" else len_k - len_q
            tri = np.arange(len_k)[None, :] <= np.arange(len_q)[:, None] + offset
            tri = ops.constant(tri, like)
            allowed = tri if allowed is None else allowed & tri
        return allowed

    def fold_features(self, ops, like, masks, feats, len_q: int, len_k: int):
        """-> (masks, index): the call's ``feats`` folded into ``masks`` (``MaskArgs``): one
        boolean ``mask`` (B|1, h|1, L_q, L_K) with the mask, key padding, causal and the
        structural mask (``key_padding_mask`` and ``causal`` then None), ``softcap`` and the
        ``alibi`` bias set, L_K = L_past + L_k; ``index``: the present-cache index (B, L_K) as
        NumPy (CACHE-1), None without a cache or with a full one. ``like``: an input of the call
        (device, dtype, batch size)."""
        plan = feature_plan.plan(feats, batch=ops.shape(like)[0], len_q=len_q, len_k=len_k,
                                 causal=masks.causal)
        allowed = self.combine_masks(ops, len_q, feats.len_past + len_k, like, masks.mask,
                                     masks.key_padding_mask, plan.causal)
        if plan.allowed is not None:
            structural = ops.constant(plan.allowed, like)
            allowed = structural if allowed is None else allowed & structural
        alibi = None if plan.alibi is None else ops.constant_as(plan.alibi, like)
        return masks._replace(mask=allowed, key_padding_mask=None, causal=None,
                              softcap=feats.softcap, alibi=alibi), plan.index

    def canonical_masks(self, ops, like, full, masks):
        """All masking as full (B, h, L_q, L_k) arrays: one boolean mask (key padding and causal
        folded in, so both become None) and one bias (zeros when absent, ALiBi added); the other
        fields (the scale, the soft-cap) are kept. Compiled variants call this before compiling
        so that every call of one shape and dtype has the same signature and compiles once."""
        allowed = self.combine_masks(ops, full[2], full[3], like, masks.mask,
                                     masks.key_padding_mask, masks.causal)
        ones = ops.constant(np.ones(full, dtype=bool), like)
        zeros = ops.full(full, 0.0, like)
        bias = zeros if masks.bias is None else zeros + masks.bias
        return masks._replace(
            mask=ones if allowed is None else ones & allowed,
            bias=bias if masks.alibi is None else bias + masks.alibi,
            legacy_mask=None if masks.legacy_mask is None else zeros + masks.legacy_mask,
            key_padding_mask=None, causal=None, alibi=None)


class Batched(AttentionAlgorithm):
    """MHA-2: all heads at once (see the module docstring)."""

    kind = Algorithm.BATCHED

    def split(self, ops, x, num_heads: int):
        """(B, L, h*d) -> (B, h, L, d) by a reshape and a transpose."""
        b, length, width = ops.shape(x)
        return ops.transpose(ops.reshape(x, (b, length, num_heads, width // num_heads)),
                              (0, 2, 1, 3))

    def combine(self, ops, x):
        """(B, h, L, d) -> (B, L, h*d) by a transpose and a reshape."""
        b, h, length, d = ops.shape(x)
        return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (b, length, h * d))

    def linear(self, ops, x, w, b):
        """x (..., in) @ w (in, out) + b (out,) as one 2-D GEMM over the rows of x."""
        shape = ops.shape(x)
        y = ops.reshape(ops.matmul(ops.reshape(x, (-1, shape[-1])), w),
                         (*shape[:-1], ops.shape(w)[1]))
        return y if b is None else ops.iadd(y, b)

    def attention(self, ops, q, k, v, masks, lse: bool = False):
        """q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v), g dividing h (query head i
        uses key/value head i // (h / g), GQA-1) -> (out (B, h, L_q, d_v), weights (B, h, L_q,
        L_k), lse (B, h, L_q) or None): each key/value head repeated for its query heads, then
        one batched kernel call."""
        allowed = self.allowed(ops, q, k, masks.mask, masks.key_padding_mask, masks.causal)
        additive = self.additive_terms(ops, masks)
        group = ops.shape(q)[1] // ops.shape(k)[1]
        if group > 1:
            k, v = _repeat_heads(ops, k, group), _repeat_heads(ops, v, group)
        return self.attend(ops, q, k, v, allowed, additive, masks, lse)

    def mha(self, ops, query, key, value, p, num_heads: int, masks, g: int, lse: bool = False,
            cache: Cache | None = None):
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim), g key/value heads
        -> (out (B, L_q, d_out), weights, lse or None, present_key or None, present_value or
        None): project once, split into heads, one batched attention, combine, project. With
        ``cache``, the projected keys and values join the cache's first (CACHE-1)."""
        if g == num_heads:
            q, k, v = self._project_qkv(ops, query, key, value, p)
        else:
            q, k, v = (self.linear(ops, query, p.w_q, p.b_q), self.linear(ops, key, p.w_k, p.b_k),
                       self.linear(ops, value, p.w_v, p.b_v))
        q, k, v = self.split(ops, q, num_heads), self.split(ops, k, g), self.split(ops, v, g)
        kept = (None, None)
        if cache is not None:
            k = present(ops, cache.past_key, k, cache.index)
            v = present(ops, cache.past_value, v, cache.index)
            kept = (k, v)
        out, weights, row_lse = self.attention(ops, q, k, v, masks, lse)
        return self.linear(ops, self.combine(ops, out), p.w_o, p.b_o), weights, row_lse, *kept

    def _project_qkv(self, ops, query, key, value, p):
        """The three input projections. For self-attention (``query is key is value``) with all
        or none of b_q, b_k, b_v: one GEMM against the column concatenation ``[W_q | W_k | W_v]``
        (built per call: a copy of the weights, cheap next to the GEMM), then column slices of the
        result."""
        biases = (p.b_q, p.b_k, p.b_v)
        same_bias = all(b is None for b in biases) or all(b is not None for b in biases)
        if not (query is key and key is value and same_bias):
            return (self.linear(ops, query, p.w_q, p.b_q), self.linear(ops, key, p.w_k, p.b_k),
                    self.linear(ops, value, p.w_v, p.b_v))
        w = ops.concat([p.w_q, p.w_k, p.w_v], axis=1)
        b = None if p.b_q is None else ops.concat(list(biases), axis=0)
        qkv = self.linear(ops, query, w, b)
        n_qk, n_v = ops.shape(p.w_q)[1], ops.shape(p.w_v)[1]
        return qkv[..., :n_qk], qkv[..., n_qk:2 * n_qk], qkv[..., 2 * n_qk:2 * n_qk + n_v]


class PerHead(AttentionAlgorithm):
    """MHA-1: the definition, head by head (see the module docstring)."""

    kind = Algorithm.PER_HEAD

    def split(self, ops, x, num_heads: int):
        """(B, L, h*d) -> (B, h, L, d): the column block of each head, stacked."""
        d = ops.shape(x)[2] // num_heads
        return ops.stack([x[..., i * d:(i + 1) * d] for i in range(num_heads)], axis=1)

    def combine(self, ops, x):
        """(B, h, L, d) -> (B, L, h*d): the heads concatenated."""
        return ops.concat([x[:, i] for i in range(ops.shape(x)[1])], axis=-1)

    def linear(self, ops, x, w, b):
        """x (..., in) @ w (in, out) + b (out,)."""
        y = ops.matmul(x, w)
        return y if b is None else ops.iadd(y, b)

    def attention(self, ops, q, k, v, masks, lse: bool = False):
        """As :meth:`Batched.attention`, one kernel call per query head."""
        allowed = self.allowed(ops, q, k, masks.mask, masks.key_padding_mask, masks.causal)
        heads = ops.shape(q)[1]
        group = heads // ops.shape(k)[1]
        outs, weights, row_lse = self._heads(
            ops, heads, lambda i: (q[:, i], k[:, i // group], v[:, i // group]), allowed,
            self.additive_terms(ops, masks), masks, lse)
        return ops.stack(outs, axis=1), weights, row_lse

    def mha(self, ops, query, key, value, p, num_heads: int, masks, g: int, lse: bool = False,
            cache: Cache | None = None):
        """As :meth:`Batched.mha`: head i projects with its column block of W_q and key/value
        head i // (h / g)'s blocks of W_k and W_v, attends, and the heads are concatenated before
        W_o. With ``cache``, key/value head j's projections join the cache's head j first."""
        group = num_heads // g
        d_k = ops.shape(p.w_q)[1] // num_heads
        d_v = ops.shape(p.w_v)[1] // g

        def kv_head(j):
            kc, vc = slice(j * d_k, (j + 1) * d_k), slice(j * d_v, (j + 1) * d_v)
            k = self.linear(ops, key, p.w_k[:, kc], _columns(p.b_k, kc))
            v = self.linear(ops, value, p.w_v[:, vc], _columns(p.b_v, vc))
            if cache is None:
                return k, v
            return (present(ops, cache.past_key[:, j], k, cache.index),
                    present(ops, cache.past_value[:, j], v, cache.index))

        kv_heads = [kv_head(j) for j in range(g)]

        def head(i):
            qc = slice(i * d_k, (i + 1) * d_k)
            return (self.linear(ops, query, p.w_q[:, qc], _columns(p.b_q, qc)),
                    *kv_heads[i // group])

        allowed = self.combine_masks(ops, ops.shape(query)[1], ops.shape(key)[1], query,
                                     masks.mask, masks.key_padding_mask, masks.causal)
        heads, weights, row_lse = self._heads(ops, num_heads, head, allowed,
                                              self.additive_terms(ops, masks), masks, lse)
        kept = (None, None)
        if cache is not None:
            kept = tuple(ops.stack([kv[n] for kv in kv_heads], axis=1) for n in (0, 1))
        out = self.linear(ops, ops.concat(heads, axis=-1), p.w_o, p.b_o)
        return out, weights, row_lse, *kept

    def _heads(self, ops, num_heads: int, head_inputs: Callable[[int], tuple], allowed, additive,
               masks, lse: bool):
        """The kernel head by head: ``head_inputs(i)`` gives head i's (q, k, v); masks broadcast
        to (B, h, L_q, L_k) are cut per head. Returns the list of head outputs, the weights
        stacked to (B, h, L_q, L_k) and the log-sum-exps stacked to (B, h, L_q) (None without
        ``lse``)."""
        allowed = _as_rank4(ops, allowed)
        additive = [_as_rank4(ops, t) for t in additive]
        outs, weights, lses = [], [], []
        for i in range(num_heads):
            o, w, row_lse = self.attend(ops, *head_inputs(i), _head(allowed, i),
                                         [_head(t, i) for t in additive], masks, lse)
            outs.append(o)
            weights.append(w)
            lses.append(row_lse)
        row_lse = None if lses[0] is None else ops.stack(lses, axis=1)
        return outs, ops.stack(weights, axis=1), row_lse


#: The algorithm object of each :class:`Algorithm` (stateless: one of each serves every backend).
ALGORITHMS = {Algorithm.PER_HEAD: PerHead(), Algorithm.BATCHED: Batched()}


def _repeat_heads(ops, x, group: int):
    """(B, g, L, d) -> (B, g * group, L, d): each head repeated ``group`` times in place."""
    return ops.stack([x[:, i // group] for i in range(ops.shape(x)[1] * group)], axis=1)


def _drop_last(ops, x):
    """(..., n, 1) -> (..., n)."""
    return ops.reshape(x, ops.shape(x)[:-1])


def _columns(b, cols: slice):
    """Columns ``cols`` of a bias, or None for an absent bias."""
    return None if b is None else b[cols]


def _as_rank4(ops, m):
    """Left-pad a mask/bias broadcastable to (B, h, L_q, L_k) to rank 4."""
    if m is None:
        return None
    shape = ops.shape(m)
    return ops.reshape(m, (1,) * (4 - len(shape)) + shape) if len(shape) < 4 else m


def _head(m, i: int):
    """Head ``i``'s part of a rank-4 mask/bias: (B|1, h|1, L_q|1, L_k|1) -> (B|1, L_q|1, L_k|1)."""
    if m is None:
        return None
    return m[:, i] if m.shape[1] > 1 else m[:, 0]
