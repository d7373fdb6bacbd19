"""The signatures of known mistakes, for :mod:`.diagnosis`: a failing clause says *what* is
wrong; the signature says *why*. Each :class:`Signature` is one known mistake (the project's
catalogue of broken backends, ``tests/broken_backends/``, is the list they come from) with a
small fixed case and the output that mistake gives there: the oracle with one argument changed
(``scale = 1``, the mask inverted, ``causal='top_left'``, ...) or a textbook variant of the
algorithm (a softmax over the wrong axis). A signature that needs "attention_vjp" compares the
gradients (dq, dk, dv) of the case's cotangents (:mod:`.vjp`) with those of ``oracle_vjp`` changed
the same way; one that needs "sink" runs with the sinks :func:`sinks` (spec 1.3).

Axis legend: B batch, h heads, g key/value heads, L_q / L_k query / key lengths, d_k / d_v
per-head widths, d_model / d_out model widths; SDPA arrays (B, h, L, d), MHA arrays (B, L, d_model).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from mhaspec.spec import oracle, oracle_vjp

from . import features, harness, vjp
from .strategies import CaseSpec

#: SDPA: d_v != d_k and L_q != L_k, logits large enough that the scale matters
SDPA = CaseSpec(batch=2, heads=2, len_q=3, len_k=5, d_k=4, d_v=6, logit_scale=3.0, seed=11)
MASKED = SDPA._replace(mask_shape=(2, 2, 3, 5), mask_density=0.6)
EMPTY_ROWS = MASKED._replace(fully_masked_rows=True)
#: L_q = L_k: a key padding mask put on the query axis still broadcasts
PADDED = SDPA._replace(len_k=3, key_padding=True)
BIAS = SDPA._replace(bias_shape=(2, 2, 3, 5))
LEGACY = SDPA._replace(legacy_shape=(2, 2, 3, 5))
#: logits ~2e9 over 8 keys: some legacy-blocked key lies 1e9 above the others, so it keeps weight
#: under the offset -1e9 and not under -2e9
LEGACY_LARGE = SDPA._replace(len_q=8, len_k=8, legacy_shape=(2, 2, 8, 8), logit_scale=2e9)
#: logits ~1e5: allowed keys far below a masked one (its exp underflows; -1e4 fills it)
MASKED_LARGE = MASKED._replace(logit_scale=1e5)
EMPTY_ROWS_BIAS = EMPTY_ROWS._replace(bias_shape=(2, 2, 3, 5))
#: one batch item with every key padded
PADDED_ITEM = SDPA._replace(key_padding=True, fully_masked_rows=True)
NAN_MASKED_KEY = MASKED._replace(extreme="masked-key:nan")
ONE_QUERY = SDPA._replace(len_q=1, causal="top_left")
SOFTCAP = MASKED._replace(softcap=2.0)
CACHE = SDPA._replace(past_len=4, causal="bottom_right")
WITH_LSE = MASKED._replace(lse=True)
CAUSAL = SDPA._replace(causal="bottom_right")
LARGE = SDPA._replace(logit_scale=1000.0)
#: d_k = 8: the default scale 1/sqrt(8) is not a float32 number, so its rounding shows
PRECISION = SDPA._replace(d_k=8, logit_scale=10.0)
NAN_QUERY = SDPA._replace(extreme="nonfinite:nan:q")
SUBNORMAL = SDPA._replace(extreme="subnormal:float64:query")
NO_KEYS = SDPA._replace(len_k=0)
WINDOW = SDPA._replace(len_q=5, window=(1, 0), alignment="top_left")
ALIBI = SDPA._replace(alibi="geometric", alignment="top_left")
SEGMENTS = SDPA._replace(len_q=5, segments="packed")
#: spec 1.4: chunks of 2 on a causal call (positions 2..4), before position 0 (bottom-right,
#: L_q > L_k, no causal: positions -2..2) and within packed segments
CHUNKED = SDPA._replace(chunk=2, causal="bottom_right")
CHUNKED_NEGATIVE = SDPA._replace(len_q=5, len_k=3, chunk=2, alignment="bottom_right")
CHUNKED_PACKED = SEGMENTS._replace(chunk=2, causal="bottom_right")
#: spec 1.3: four query heads in two groups of two (GRAD-4)
GROUPED = SDPA._replace(heads=4, kv_heads=2)
KEY_PADDED = SDPA._replace(key_padding=True)
#: with an lse: the backward pass's case gets an lse cotangent (GRAD-8), the forward an lse
LSE = SDPA._replace(lse=True)
#: MHA: d_model = h * d_k = h * d_v = d_out, so a transposed W_q or a skipped W_o still runs
MHA = CaseSpec(batch=2, heads=2, len_q=3, len_k=5, d_k=4, d_v=4, d_model=8, k_dim=8, v_dim=8,
               d_out=8, logit_scale=3.0, seed=12)
SHARED_KV = MHA._replace(extreme="shared:key=value")


class Signature(NamedTuple):
    """One known mistake: ``says`` (one line: what the backend does, ending with its clauses),
    the operation and case it shows on, the capabilities the case needs, and ``expect(case)``:
    the (output, weights) or (output, weights, lse) the mistake gives on the case's arrays, or
    with "attention_vjp" in ``needs`` its gradients (dq, dk, dv) (None where it says nothing)."""

    says: str
    op: str
    spec: CaseSpec
    needs: frozenset
    expect: Callable


def _oracle(case, op, **changes) -> tuple:
    res = harness.oracle_result(case, op, **changes)
    return res.out, None


def _chunks_on_indices(case, truncate: bool = False) -> np.ndarray:
    """(L_q, L_k) bool: chunks of ``case.spec.chunk`` on array indices (query i at i + L_k - L_q
    bottom-right), the chunk index rounded toward zero with ``truncate``, else down."""
    spec = case.spec
    offset = spec.len_k - spec.len_q if (spec.causal or spec.alignment) == "bottom_right" else 0
    index = (np.fix if truncate else np.floor)
    q_chunk = index((np.arange(spec.len_q) + offset) / spec.chunk)
    k_chunk = index(np.arange(spec.len_k) / spec.chunk)
    return q_chunk[:, None] == k_chunk[None, :]


def _weights_only(weights) -> tuple:
    return None, weights


def _textbook(case, *, axis=-1, fill=-np.inf, scale=None, scale_after=False) -> tuple:
    """softmax(scale Q K^T + masks) V with the softmax over ``axis`` and masked logits ``fill``."""
    q, k, v = case.q, case.k, case.v
    s = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = q @ np.swapaxes(k, -1, -2) * (1.0 if scale_after else s)
    if case.mask is not None:
        logits = np.where(case.mask, logits, fill)
    e = np.exp(logits - logits.max(axis=axis, keepdims=True))
    w = e / e.sum(axis=axis, keepdims=True) * (s if scale_after else 1.0)
    return w @ v, w


def _unshifted(case) -> tuple:
    """softmax without subtracting the row maximum: exp overflows to inf, inf / inf is NaN."""
    logits = case.q @ np.swapaxes(case.k, -1, -2) / np.sqrt(case.q.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(logits)
        return (e / e.sum(axis=-1, keepdims=True)) @ case.v, None


def _zero_tiny_rows(case) -> tuple:
    """The oracle's output with the rows of queries below the smallest normal number zeroed."""
    out = harness.oracle_result(case, "sdpa").out
    tiny = np.max(np.abs(case.q), axis=-1, keepdims=True) < np.finfo(np.float64).tiny
    return np.where(tiny, 0.0, out), None


def allowed(case) -> np.ndarray:
    """(B, h, L_q, L_k): the pairs the case's boolean masks allow."""
    b, h, len_q, _ = case.q.shape
    return oracle.allowed_mask(b, h, len_q, case.k.shape[2], mask=case.mask,
                               key_padding_mask=case.key_padding_mask, causal=case.spec.causal)


def _empty_rows(case, fill) -> tuple:
    """The oracle's output with each fully masked row replaced by ``fill(v)`` (B, h, 1, d_v)."""
    out = harness.oracle_result(case, "sdpa").out
    empty = ~allowed(case).any(-1)
    return np.where(empty[..., None], fill(case.v), out), None


def _empty_rows_mean_of_v(case) -> tuple:
    """The oracle's output with each fully masked row the mean of V (a finite fill's uniform
    weights)."""
    return _empty_rows(case, lambda v: v.mean(axis=2, keepdims=True))


def _mask_after_softmax(case) -> tuple:
    """softmax over every key, then the masked weights zeroed and each row renormalised (a row
    whose allowed exps all underflow gives 0)."""
    _, w = _textbook(case._replace(mask=None))
    w = np.where(allowed(case), w, 0.0)
    total = w.sum(axis=-1, keepdims=True)
    w = w / np.where(total != 0, total, 1.0)
    return w @ case.v, w


def _capped_after_mask(case) -> tuple:
    """c tanh(S / c) taken after the masks: a masked -inf becomes the finite -c."""
    c = case.spec.softcap
    logits = case.q @ np.swapaxes(case.k, -1, -2) / np.sqrt(case.q.shape[-1])
    logits = c * np.tanh(np.where(allowed(case), logits, -np.inf) / c)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    w = e / e.sum(axis=-1, keepdims=True)
    return w @ case.v, w


def _nan_keys_leak(case) -> tuple:
    """The oracle's output with every row of a (batch item, head) whose keys hold a NaN as NaN."""
    out = harness.oracle_result(case, "sdpa").out
    poisoned = np.isnan(case.k).any(axis=(-2, -1))[:, :, None, None]
    return np.where(poisoned, np.nan, out), None


def _cache_at_position_zero(case) -> tuple:
    """The oracle on the present cache (past then new keys) with query i at position i, not
    L_past + i: causal top-left over L_past + L_k keys."""
    f = case.features
    present = case._replace(k=np.concatenate([f.past_key, case.k], axis=2),
                            v=np.concatenate([f.past_value, case.v], axis=2),
                            features=features.FeatureArrays())
    return _oracle(present, "sdpa", causal="top_left")


def _strict_causal(case) -> tuple:
    len_q, len_k = case.q.shape[2], case.k.shape[2]
    diagonal = len_k - len_q if case.spec.causal == "bottom_right" else 0
    allowed = np.arange(len_k)[None, :] < np.arange(len_q)[:, None] + diagonal
    return _oracle(case, "sdpa", causal=None, mask=allowed)


def sinks(case) -> np.ndarray:
    """The sinks (h,) of a signature that needs "sink": :func:`vjp.sinks_of` at scale 1, logits
    of the size of the case's own."""
    return vjp.sinks_of(case, 1.0)


def _oracle_vjp(case, *, heads=None, d_lse: bool = True, **changes) -> tuple:
    """The oracle's (dq, dk, dv) for the case's cotangents (:func:`vjp.cotangents`; an lse
    cotangent when the case asks for the lse and ``d_lse``) with ``changes`` to its keyword
    arguments; ``heads`` (h,) weighs each query head's cotangents."""
    d_out, dl = vjp.cotangents(case, case.spec.lse and d_lse)
    if heads is not None:
        d_out = d_out * heads[None, :, None, None]
        dl = None if dl is None else dl * heads[None, :, None]
    res = oracle_vjp.attention_vjp(case.q, case.k, case.v, d_out, d_lse=dl,
                                   **{**vjp.kwargs_of(case), **changes})
    return res.dq, res.dk, res.dv


def _first_head_of_each_group(case) -> tuple:
    """The oracle's dq; dk and dv of each key/value head from the first query head of its group
    only."""
    h, g = case.q.shape[1], case.k.shape[1]
    first = (np.arange(h) % (h // g) == 0).astype(np.float64)
    return _oracle_vjp(case)[0], *_oracle_vjp(case, heads=first)[1:]


def _textbook_vjp(case, *, delta=lambda d: d, cap_derivative: bool = True) -> tuple:
    """(dq, dk, dv) of the case's call without a cache from the oracle's weights P:
    dS = P (dO V^T - delta(D)) with D = rowsum(dO * O), dX = dS (1 - tanh^2(X / c)) (dS without
    soft-capping or ``cap_derivative``), dQ = s dX K, dK = s dX^T Q and dV = P^T dO summed over
    each group."""
    p = oracle.attention_problem(case.q, case.k, case.v, **vjp.kwargs_of(case))
    d_out, _ = vjp.cotangents(case)
    b, h, _, _ = p.q.shape
    g, len_k = p.k.shape[1], p.k.shape[2]
    k, v = (np.repeat(x, h // g, axis=1) for x in (p.k, p.v))
    probs = harness.oracle_result(case, "sdpa").weights
    d_rows = delta(np.sum(d_out * (probs @ v), axis=-1))
    d_x = probs * (d_out @ np.swapaxes(v, -1, -2) - d_rows[..., None])
    if p.softcap is not None and cap_derivative:
        d_x = d_x * (1 - np.tanh(p.scale * (p.q @ np.swapaxes(k, -1, -2)) / p.softcap) ** 2)

    def per_group(x):
        return x.reshape(b, g, h // g, len_k, -1).sum(axis=2)

    return (p.scale * (d_x @ k), per_group(p.scale * (np.swapaxes(d_x, -1, -2) @ p.q)),
            per_group(np.swapaxes(probs, -1, -2) @ d_out))


def _sink_in_every_logit(case) -> tuple:
    """The sink added to every logit: the softmax of the call without sinks, its lse + sink."""
    res = harness.oracle_result(case, "sdpa")
    return res.out, None, res.lse + sinks(case)[None, :, None]


def _params(case, **changes) -> tuple:
    return _oracle(case, "mha", params=case.params._replace(**changes))


def _combined_without_transpose(case) -> tuple:
    """The heads (B, h, L_q, d_v) reshaped straight to (B, L_q, h*d_v), then projected by W_o."""
    p, h = case.params, case.spec.heads
    q, k, v = (oracle.split_heads(x @ w + b, h) for x, w, b in
               ((case.query, p.w_q, p.b_q), (case.key, p.w_k, p.b_k), (case.value, p.w_v, p.b_v)))
    heads, _ = oracle.attention(q, k, v)
    b, _, len_q, d_v = heads.shape
    return heads.reshape(b, len_q, h * d_v) @ p.w_o + p.b_o, None


def _heads_interleaved(case) -> tuple:
    """Heads split as (d, h) instead of (h, d): head i, component j is column j*h + i of every
    projection (and row j*h + i of W_o), not column i*d + j."""
    p, h, d = case.params, case.spec.heads, case.spec.d_k
    perm = np.array([j * h + i for i in range(h) for j in range(d)])
    return _params(case, w_q=p.w_q[:, perm], w_k=p.w_k[:, perm], w_v=p.w_v[:, perm],
                   b_q=p.b_q[perm], b_k=p.b_k[perm], b_v=p.b_v[perm], w_o=p.w_o[perm, :])


SIGNATURES = {
    "scale-one": Signature(
        "agrees with the oracle at scale = 1: the default scale 1/sqrt(d_k) is missing (SDPA-2)",
        "sdpa", SDPA, frozenset(), lambda c: _oracle(c, "sdpa", scale=1.0)),
    "scale-1/d_k": Signature(
        "agrees with the oracle at scale = 1/d_k: the logits are divided by d_k, not sqrt(d_k) "
        "(SDPA-2)", "sdpa", SDPA, frozenset(),
        lambda c: _oracle(c, "sdpa", scale=1.0 / c.q.shape[-1])),
    "scale-d_v": Signature(
        "agrees with the oracle at scale = 1/sqrt(d_v): the default scale is taken from V's "
        "width, not K's (SDPA-2)", "sdpa", SDPA, frozenset(),
        lambda c: _oracle(c, "sdpa", scale=1.0 / np.sqrt(c.v.shape[-1]))),
    "scale-after-softmax": Signature(
        "agrees with scale * softmax(Q K^T) V: the scale multiplies the weights after the "
        "softmax, not the logits (SDPA-1)", "sdpa", SDPA, frozenset(),
        lambda c: _textbook(c, scale_after=True)),
    "softmax-axis-queries": Signature(
        "agrees with a softmax over the query axis: the weights are normalised over queries, "
        "not keys (SDPA-1)", "sdpa", SDPA, frozenset(), lambda c: _textbook(c, axis=-2)),
    "softmax-axis-batch": Signature(
        "agrees with a softmax over the batch axis: the weights are normalised over batch "
        "items, not keys (SDPA-1, SDPA-7)", "sdpa", SDPA, frozenset(),
        lambda c: _textbook(c, axis=0)),
    "no-max-subtraction": Signature(
        "gives NaN at large logits: the softmax does not subtract the row maximum, so exp "
        "overflows (NUM-4)", "sdpa", LARGE, frozenset(), _unshifted),
    "nan-to-num": Signature(
        "gives finite numbers where a NaN input must propagate: the result is sanitised "
        "(nan_to_num) (NUM-6)", "sdpa", NAN_QUERY, frozenset(),
        lambda c: (np.nan_to_num(harness.oracle_result(c, "sdpa").out), None)),
    "tiny-queries": Signature(
        "zeroes the rows of subnormal queries: they are taken for padding (NUM-5)",
        "sdpa", SUBNORMAL, frozenset(), _zero_tiny_rows),
    "mask-polarity": Signature(
        "agrees with the oracle given the inverted mask: True is read as blocked (MASK-1)",
        "sdpa", MASKED, frozenset({"masks"}), lambda c: _oracle(c, "sdpa", mask=~c.mask)),
    "mask-fill-zero": Signature(
        "agrees with masked logits set to 0 instead of -inf (MASK-1)",
        "sdpa", MASKED, frozenset({"masks"}), lambda c: _textbook(c, fill=0.0)),
    "weights-unmasked": Signature(
        "returns the weights of the unmasked softmax: the masks reach the output but not the "
        "weights (MASK-1, SDPA-4)", "sdpa", MASKED, frozenset({"masks", "weights"}),
        lambda c: _weights_only(harness.oracle_result(c, "sdpa", mask=None).weights)),
    "empty-rows-mean": Signature(
        "a fully masked row gives the mean of V, not 0: masked logits are filled with a finite "
        "number, not -inf (MASK-9)", "sdpa", EMPTY_ROWS, frozenset({"masks"}),
        _empty_rows_mean_of_v),
    "empty-rows-nan": Signature(
        "a fully masked row gives NaN, not 0: the softmax of a row of -inf is not guarded "
        "(MASK-9)", "sdpa", EMPTY_ROWS, frozenset({"masks"}),
        lambda c: _empty_rows(c, lambda v: np.full_like(v[:, :, :1], np.nan))),
    "padding-on-queries": Signature(
        "agrees with the key padding mask applied to query rows: it is reshaped to "
        "(B, 1, L, 1), not (B, 1, 1, L_k) (MASK-5)", "sdpa", PADDED, frozenset({"masks"}),
        lambda c: _oracle(c, "sdpa", key_padding_mask=None,
                          mask=c.key_padding_mask[:, None, :, None])),
    "causal-alignment": Signature(
        "agrees with causal='top_left' where 'bottom_right' was asked: the diagonal's "
        "alignment is swapped (MASK-7)", "sdpa", CAUSAL, frozenset({"causal"}),
        lambda c: _oracle(c, "sdpa", causal="top_left")),
    "causal-diagonal": Signature(
        "agrees with a causal mask that also blocks the diagonal (j < i, not j <= i) (MASK-6)",
        "sdpa", CAUSAL, frozenset({"causal"}), _strict_causal),
    "bias-ignored": Signature(
        "agrees with the oracle without the bias: the additive bias is dropped (MASK-2)",
        "sdpa", BIAS, frozenset({"bias"}), lambda c: _oracle(c, "sdpa", bias=None)),
    "bias-subtracted": Signature(
        "agrees with the oracle given -bias: the bias is subtracted (MASK-2)",
        "sdpa", BIAS, frozenset({"bias"}), lambda c: _oracle(c, "sdpa", bias=-c.bias)),
    "bias-before-scale": Signature(
        "agrees with scale * (Q K^T + bias): the bias is added before scaling, not after "
        "(MASK-2)", "sdpa", BIAS, frozenset({"bias"}),
        lambda c: _oracle(c, "sdpa", bias=c.bias / np.sqrt(c.q.shape[-1]))),
    "legacy-polarity": Signature(
        "agrees with the oracle given 1 - legacy_mask: the legacy mask is read as 1 = may "
        "attend (MASK-3)", "sdpa", LEGACY, frozenset({"legacy_mask"}),
        lambda c: _oracle(c, "sdpa", legacy_mask=1.0 - c.legacy_mask)),
    "legacy-ignored": Signature(
        "agrees with the oracle without the legacy mask: it is dropped (MASK-3)",
        "sdpa", LEGACY, frozenset({"legacy_mask"}), lambda c: _oracle(c, "sdpa", legacy_mask=None)),
    "legacy-offset": Signature(
        "agrees with a legacy offset of -2e9: the source's form is mask * -1e9 exactly (MASK-3)",
        "sdpa", LEGACY_LARGE, frozenset({"legacy_mask"}),
        lambda c: _oracle(c, "sdpa", legacy_mask=2.0 * c.legacy_mask)),
    "window-left": Signature(
        "agrees with the oracle at window (left + 1, right): one key too many on the left "
        "(WIN-1)", "sdpa", WINDOW, frozenset({"window"}),
        lambda c: _oracle(c, "sdpa", window=(c.spec.window[0] + 1, c.spec.window[1]))),
    "chunk-as-window": Signature(
        "agrees with the oracle at window (C - 1, 0) without chunks: chunk=C read as a sliding "
        "window (CHUNK-1)", "sdpa", CHUNKED, frozenset({"chunk", "window"}),
        lambda c: _oracle(c, "sdpa", chunk=None, window=(c.spec.chunk - 1, 0))),
    "chunk-truncated": Signature(
        "agrees with chunk indices rounded toward zero: queries at positions -C + 1 .. -1 join "
        "chunk 0 (CHUNK-1)", "sdpa", CHUNKED_NEGATIVE, frozenset({"chunk"}),
        lambda c: _oracle(c, "sdpa", chunk=None, mask=_chunks_on_indices(c, truncate=True))),
    "chunk-padded-start": Signature(
        "agrees with chunks counted on array indices: chunks start at the packed row's first "
        "token, not at each sequence's (CHUNK-1, SEG-3)", "sdpa", CHUNKED_PACKED,
        frozenset({"chunk", "segments"}),
        lambda c: _oracle(c, "sdpa", chunk=None, mask=_chunks_on_indices(c))),
    "alibi-sign": Signature(
        "agrees with the oracle given -slopes: ALiBi adds +m|i - j| (ALIBI-1)",
        "sdpa", ALIBI, frozenset({"alibi"}),
        lambda c: _oracle(c, "sdpa", alibi_slopes=-c.features.alibi_slopes)),
    "segments-item-0": Signature(
        "agrees with every batch item given item 0's key segment ids: ids are compared "
        "across the batch (SEG-1)", "sdpa", SEGMENTS, frozenset({"segments"}),
        lambda c: _oracle(c, "sdpa", kv_segment_ids=np.broadcast_to(
            c.features.kv_segment_ids[:1], c.features.kv_segment_ids.shape))),
    "scale-float32": Signature(
        "agrees with the oracle at the scale rounded to float32: float64 results carry a "
        "float32 scale (NUM-2)", "sdpa", PRECISION, frozenset(),
        lambda c: _oracle(c, "sdpa", scale=float(np.float32(1.0 / np.sqrt(c.q.shape[-1]))))),
    "mha-scale-d_model": Signature(
        "agrees with the oracle at scale = 1/sqrt(d_model): multi-head attention scales by the "
        "model width, not the head width d_k (MHA-1)", "mha", MHA, frozenset({"mha"}),
        lambda c: _oracle(c, "mha", scale=1.0 / np.sqrt(c.query.shape[-1]))),
    "no-output-bias": Signature(
        "agrees with the oracle without b_o: the output projection's bias is never added "
        "(PARAM-1)", "mha", MHA, frozenset({"mha"}),
        lambda c: _params(c, b_o=np.zeros_like(c.params.b_o))),
    "query-bias": Signature(
        "agrees with b_k in place of b_q: the query projection adds the key bias (PARAM-1)",
        "mha", MHA, frozenset({"mha"}), lambda c: _params(c, b_q=c.params.b_k)),
    "w_q-transposed": Signature(
        "agrees with W_q transposed: an (out, in) weight is read as (in, out) (PARAM-1)",
        "mha", MHA, frozenset({"mha"}), lambda c: _params(c, w_q=c.params.w_q.T)),
    "no-output-projection": Signature(
        "agrees with W_o = identity: the concatenated heads are returned without the output "
        "projection (MHA-1)", "mha", MHA, frozenset({"mha"}),
        lambda c: _params(c, w_o=np.eye(c.params.w_o.shape[0]))),
    "heads-interleaved": Signature(
        "agrees with heads split as (d, h), not (h, d): head i takes every h-th column, not "
        "the block [i*d, (i+1)*d) (HEAD-1, PARAM-2)", "mha", MHA, frozenset({"mha"}),
        _heads_interleaved),
    "combine-no-transpose": Signature(
        "agrees with the heads reshaped (B, h, L, d) -> (B, L, h*d) without the transpose: "
        "positions and heads are mixed before W_o (HEAD-2, MHA-1)", "mha", MHA,
        frozenset({"mha"}), _combined_without_transpose),
    "fused-kv-from-query": Signature(
        "agrees with keys and values projected from the query when key is value: the fused "
        "self-attention projection is taken on array identity alone (MHA-4)", "mha", SHARED_KV,
        frozenset({"mha"}),
        lambda c: _oracle(c._replace(key=c.query, value=c.query), "mha")),
    "heads-averaged": Signature(
        "agrees with the heads' output blocks averaged, not summed: (out - b_o) / h + b_o "
        "(MHA-1)", "mha", MHA, frozenset({"mha"}),
        lambda c: ((_oracle(c, "mha")[0] - c.params.b_o) / c.spec.heads + c.params.b_o, None)),
    "weights-head-mean": Signature(
        "returns the head-averaged weights for every head (nn.MultiheadAttention's default), "
        "not each head's own (SHAPE-2)", "mha", MHA, frozenset({"mha", "weights"}),
        lambda c: _weights_only(np.broadcast_to(
            harness.oracle_result(c, "mha").weights.mean(axis=1, keepdims=True),
            harness.oracle_result(c, "mha").weights.shape))),
    "mask-after-softmax": Signature(
        "agrees with the softmax over every key, then masked weights zeroed and rows "
        "renormalised: rows whose allowed keys underflow give 0 (MASK-8, NUM-4)", "sdpa",
        MASKED_LARGE, frozenset({"masks"}), _mask_after_softmax),
    "mask-fill-finite": Signature(
        "agrees with masked logits set to -1e4, not -inf: masked keys take the weight when the "
        "allowed logits are below -1e4 (MASK-1)", "sdpa", MASKED_LARGE, frozenset({"masks"}),
        lambda c: _textbook(c, fill=-1e4)),
    "empty-rows-mean-with-bias": Signature(
        "a fully masked row gives the mean of V when a bias is present: the masks are merged "
        "into the bias with a finite minimum, not -inf (MASK-9)", "sdpa", EMPTY_ROWS_BIAS,
        frozenset({"masks", "bias"}), _empty_rows_mean_of_v),
    "padded-item-mean": Signature(
        "a batch item whose keys are all padded gives the mean of V, not 0: the key padding "
        "mask is added as a finite minimum, not -inf (MASK-9)", "sdpa", PADDED_ITEM,
        frozenset({"masks"}), _empty_rows_mean_of_v),
    "nan-key-leaks": Signature(
        "a NaN key behind the mask makes every row NaN: the boolean mask is added as -inf "
        "(NaN + -inf = NaN), not applied by selection (MASK-13)", "sdpa", NAN_MASKED_KEY,
        frozenset({"masks"}), _nan_keys_leak),
    "causal-one-query": Signature(
        "agrees with no causal mask when L_q = 1: the causal mask is skipped for a single "
        "query, whose top-left row allows key 0 only (MASK-6)", "sdpa", ONE_QUERY,
        frozenset({"causal"}), lambda c: _oracle(c, "sdpa", causal=None)),
    "softcap-after-mask": Signature(
        "agrees with the soft-cap taken after the masks: a masked -inf becomes -softcap and "
        "leaks weight (SOFTCAP-1)", "sdpa", SOFTCAP, frozenset({"masks", "softcap"}),
        _capped_after_mask),
    "cache-offset-zero": Signature(
        "agrees with query i at position i, not L_past + i: the causal diagonal ignores the "
        "cached keys (CACHE-2)", "sdpa", CACHE, frozenset({"kv_cache", "causal"}),
        _cache_at_position_zero),
    "lse-unmasked": Signature(
        "returns the log-sum-exp over every key of the row: the masks reach the output but not "
        "the lse (LSE-1)", "sdpa", WITH_LSE, frozenset({"masks", "lse"}),
        lambda c: (None, None, harness.oracle_result(c, "sdpa", mask=None).lse)),
    "grad-group-first-head": Signature(
        "the gradient agrees with dk and dv taken from the first query head of each group only: "
        "they are not summed over the group (GRAD-4)", "sdpa", GROUPED,
        frozenset({"attention_vjp", "gqa"}), _first_head_of_each_group),
    "grad-softcap-derivative": Signature(
        "the gradient agrees with dX = dS: the soft-cap's derivative 1 - tanh^2(X / c) is "
        "dropped (GRAD-5)", "sdpa", SOFTCAP, frozenset({"attention_vjp", "masks", "softcap"}),
        lambda c: _textbook_vjp(c, cap_derivative=False)),
    "grad-window-left": Signature(
        "the gradient agrees with the oracle's at window (left + 1, right): the backward pass's "
        "window is one key wider than the forward's (GRAD-6)", "sdpa", WINDOW,
        frozenset({"attention_vjp", "window"}),
        lambda c: _oracle_vjp(c, window=(c.spec.window[0] + 1, c.spec.window[1]))),
    "grad-padded-keys": Signature(
        "the gradient agrees with the oracle's without the key padding: padded keys receive "
        "gradient, where it must be exactly 0 (GRAD-7)", "sdpa", KEY_PADDED,
        frozenset({"attention_vjp", "masks"}), lambda c: _oracle_vjp(c, key_padding_mask=None)),
    "grad-delta-float16": Signature(
        "the gradient agrees with D = rowsum(dO * O) rounded to float16: D is kept in half "
        "precision, not float32 or better (GRAD-3)", "sdpa", SDPA, frozenset({"attention_vjp"}),
        lambda c: _textbook_vjp(c, delta=lambda d: d.astype(np.float16).astype(d.dtype))),
    "grad-lse-cotangent": Signature(
        "the gradient agrees with the oracle's without the lse cotangent: d_lse is ignored, "
        "where it adds d_lse * P to dS (GRAD-8)", "sdpa", LSE,
        frozenset({"attention_vjp", "lse"}), lambda c: _oracle_vjp(c, d_lse=False)),
    "sink-in-numerator": Signature(
        "agrees with the sink added to every logit: the softmax ignores it and the lse is "
        "shifted by it, where it joins the denominator only (SINK-1)", "sdpa", LSE,
        frozenset({"sink", "lse"}), _sink_in_every_logit),
    "sink-not-in-lse": Signature(
        "returns the lse without the sink: the sink joins the softmax but not the log-sum-exp "
        "(SINK-1)", "sdpa", LSE, frozenset({"sink", "lse"}),
        lambda c: (None, None, harness.oracle_result(c, "sdpa").lse)),
}
