"""The oracle of spec 1.3: attention sinks, and the gradient of scaled dot-product
attention with every feature of spec 1.2, written from the equations and the chain rule.

Axis legend: B batch, h query heads, g key/value heads (g divides h), L_q queries, L_k new keys,
L_past cached keys, L_K = L_past + L_k keys attended (L_k without a cache), d_k / d_v per-head widths.

**Sinks (SINK-1 to SINK-4).** ``sinks`` (h,) holds one finite logit sigma_h per query head
(gpt-oss ``sinks``; the peers are compared in ``docs/sinks-peers.md``). It joins the softmax
denominator of every row of head h and carries no value. It is a logit in the units of the final
logits S: not multiplied by the scale, not soft-capped, no bias or ALiBi added, never masked (as in
gpt-oss, Hugging Face, FlashAttention's ``learnable_sink``, FlashInfer and ONNX Runtime)::

    Z_i   = exp(sigma_h) + sum_{j allowed} exp(S_ij)
    P_ij  = exp(S_ij) / Z_i for allowed j, else 0      (a row sums to 1 - P_sink,i)
    P_sink,i = exp(sigma_h) / Z_i,   output = P v,   lse_i = log Z_i   (the sink is in the lse)

A row with no allowed key gives output 0 and weights 0 (as MASK-9) and lse sigma_h (finite), where
spec 1.2 gives -inf. Merging key chunks by their lse (LSE-2) stays exact when the sink is counted in
exactly one chunk. Without ``sinks`` every equation is spec 1.2's.

**Gradient (GRAD-3 to GRAD-9).** For cotangents dO (B, h, L_q, d_v) on the output and
optionally dlse (B, h, L_q) on the log-sum-exp, the loss is ``sum(dO * output) + sum(dlse * lse)``;
per batch item and head, with X = s q k^T and S = c tanh(X / c) + additive terms (S = X + ... without
soft-capping)::

    dV = P^T dO            dP = dO V^T            D_i = rowsum(dO * output)_i
    dS = P * (dP - D + dlse)                      (0 wherever P is 0: disallowed keys, empty rows)
    dX = dS * (1 - tanh^2(X / c))                 (dX = dS without soft-capping)
    dQ = s dX K            dK = s dX^T Q
    d sigma_h = sum over batch items and rows of P_sink,i (dlse_i - D_i)
    d bias = dS, summed over the axes the bias broadcasts along

With grouped heads the dK and dV of key/value head j are the sums over its query heads
``j * (h/g) .. (j+1) * (h/g) - 1``. Masks, the legacy mask, ALiBi, windows, segments, lengths,
positions, the scale and the cap are constants. With a KV cache the present keys are the valid past,
then the new keys: their gradients go back to ``k``/``v`` and to ``past_key``/``past_value`` (slots at
or past ``past_lengths`` get exact zeros).

Like :mod:`mhaspec.spec.oracle` this module shares no code with any backend; it takes the checked
call (allowed set, additive terms, present cache) from :func:`oracle.attention_problem` and loops
over batch items and heads. ``precision="float32"`` runs the same steps in float32 (the error of
the naive backward in that dtype, as GRAD-1 measures it); the forward pass also runs in
``"float16"`` and ``"bfloat16"``, float32 arithmetic rounded to the dtype after every step as in
:mod:`mhaspec.spec.oracle` (the naive algorithm of NUM-3 in those dtypes, SINK-1).

**The backward pass in float16 and bfloat16 (GRAD-10, spec 1.4)** is the reference evaluation of
the same analytic gradient that backward kernels perform: inputs and cotangents in the dtype, every
product accumulated in float32, and a rounding to the dtype exactly where the kernels round::

    P      the forward pass's weights, rounded (before the dV and the dQ/dK products)
    dP, D  float32 (D = rowsum(dO * O) with O the rounded output; never rounded)
    dX     float32, rounded once before the dQ/dK products
    dQ, dK, dV, d sigma, d bias   accumulated in float32 (over a group too), rounded once at the end
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import oracle

#: the precisions of :func:`attention_with_sinks` and of :func:`attention_vjp` (the 16-bit ones:
#: GRAD-10's reference evaluation, module docstring)
FORWARD_PRECISIONS = ("float64", "float32", "float16", "bfloat16")
GRADIENT_PRECISIONS = FORWARD_PRECISIONS


class _HeadState(NamedTuple):
    """One head's forward pass, kept for its backward: x (L_q, L_K) = s q k^T; tanh (L_q, L_K) of
    x / c, or None without soft-capping; probs (L_q, L_K); sink_probs (L_q,) (zeros without a sink);
    lse (L_q,); output (L_q, d_v)."""

    x: np.ndarray
    tanh: np.ndarray | None
    probs: np.ndarray
    sink_probs: np.ndarray
    lse: np.ndarray
    output: np.ndarray


class AttentionVJP(NamedTuple):
    """The gradients of :func:`attention_vjp` (the working precision's dtype).

    dq (B, h, L_q, d_k); dk (B, g, L_k, d_k), dv (B, g, L_k, d_v); d_sinks (h,) or None without
    ``sinks``; d_bias, the bias's own shape, or None unless asked for; d_past_key
    (B, g, L_past, d_k) and d_past_value (B, g, L_past, d_v), or None without a cache.
    """

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    d_sinks: np.ndarray | None
    d_bias: np.ndarray | None
    d_past_key: np.ndarray | None
    d_past_value: np.ndarray | None


def _check_array(x, argument: str, shape: tuple[int, ...], dt) -> np.ndarray:
    """x as a finite real array of exactly ``shape``; a ValueError naming ``argument`` otherwise."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" or arr.shape != shape:
        raise ValueError(f"{argument}: must be a real array of shape {shape}, got shape {arr.shape} "
                         f"and dtype {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{argument}: must be finite")
    return arr.astype(dt)


def _head_forward(q, k, v, allowed, additive, scale, softcap, sink, rnd) -> _HeadState:
    """One head: q (L_q, d_k), k (L_K, d_k), v (L_K, d_v), allowed (L_q, L_K) bool, additive terms
    (L_q, L_K), sink a logit or None, ``rnd`` the rounding after every step (the identity in
    float64 and float32) -> :class:`_HeadState`. A key whose logit is -inf is not allowed; a row
    with nothing allowed and no sink has probabilities 0 and lse -inf."""
    x = rnd(rnd(q @ k.T) * scale)
    tanh = None if softcap is None else rnd(np.tanh(rnd(x / softcap)))
    logits = x if softcap is None else rnd(softcap * tanh)
    for term in additive:
        logits = rnd(logits + term)
    live = allowed & (logits != -np.inf)
    probs = np.zeros_like(logits)
    sink_probs = np.zeros(logits.shape[0], dtype=logits.dtype)
    lse = np.full(logits.shape[0], -np.inf, dtype=logits.dtype)
    for i in range(logits.shape[0]):
        terms = logits[i, live[i]]
        if sink is not None:
            terms = np.append(terms, logits.dtype.type(sink))
        if terms.size == 0:
            continue
        m = np.max(terms)
        e = rnd(np.exp(rnd(terms - m)))
        total = rnd(np.sum(e))
        lse[i] = rnd(m + rnd(np.log(total)))
        if sink is not None:
            sink_probs[i] = rnd(e[-1] / total)
            e = e[:-1]
        probs[i, live[i]] = rnd(e / total)
    return _HeadState(x, tanh, probs, sink_probs, lse, rnd(probs @ v))


def _problem(q, k, v, sinks, precision, kwargs, precisions=FORWARD_PRECISIONS):
    """The checked call (:class:`oracle.AttentionProblem`) and the sinks (h,) or None, in
    ``precision`` (one of ``precisions``), and the rounding of that precision."""
    if precision not in precisions:
        raise ValueError(f"precision: must be one of {list(precisions)}, got {precision!r}")
    dt, rnd = oracle.rounding(precision)
    problem = oracle.attention_problem(q, k, v, precision=precision, **kwargs)
    h = problem.q.shape[1]
    if sinks is not None:
        sinks = rnd(_check_array(sinks, "sinks", (h,), dt))
    return problem, sinks, rnd


def _heads(problem: oracle.AttentionProblem, sinks, rnd):
    """Yield (bi, hi, kv, _HeadState) for every batch item and query head of ``problem``, each
    step rounded by ``rnd``."""
    b, h = problem.q.shape[:2]
    group = h // problem.k.shape[1]
    for bi in range(b):
        for hi in range(h):
            kv = hi // group  # the key/value head of query head hi (GQA-1)
            yield bi, hi, kv, _head_forward(
                problem.q[bi, hi], problem.k[bi, kv], problem.v[bi, kv], problem.allowed[bi, hi],
                [t[bi, hi] for t in problem.additive], problem.scale, problem.softcap,
                None if sinks is None else sinks[hi], rnd)


def attention_with_sinks(q, k, v, *, sinks=None, precision: str = "float64",
                         **kwargs) -> oracle.AttentionResult:
    """Scaled dot-product attention with the features of spec 1.2 and optional ``sinks`` (h,).

    q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) -> :class:`oracle.AttentionResult`
    (output, weights without the sink column, lse with the sink, present cache). ``kwargs`` are
    those of :func:`oracle.attention_result` (masks, scale and every spec 1.2 feature).
    ``precision``: one of :data:`FORWARD_PRECISIONS` (float16 and bfloat16: NUM-3's naive steps).
    """
    problem, sinks, rnd = _problem(q, k, v, sinks, precision, kwargs)
    b, h, l_q, _ = problem.q.shape
    out = np.zeros((b, h, l_q, problem.v.shape[3]), dtype=problem.q.dtype)
    weights = np.zeros(problem.allowed.shape, dtype=problem.q.dtype)
    lse = np.zeros((b, h, l_q), dtype=problem.q.dtype)
    for bi, hi, _, state in _heads(problem, sinks, rnd):
        out[bi, hi], weights[bi, hi], lse[bi, hi] = state.output, state.probs, state.lse
    if problem.past_lengths is None:
        return oracle.AttentionResult(out, weights, lse, None, None, None)
    return oracle.AttentionResult(out, weights, lse, problem.k, problem.v,
                                  problem.past_lengths + np.shape(k)[2])


def _sum_to_shape(full: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """full (B, h, L_q, L_K) summed over the axes along which an array of ``shape`` broadcasts."""
    padded = (1,) * (full.ndim - len(shape)) + tuple(shape)
    axes = tuple(a for a, n in enumerate(padded) if n == 1 and full.shape[a] != 1)
    return np.sum(full, axis=axes, keepdims=True).reshape(shape)


def _split_cache(d_all: np.ndarray, past_lengths, l_past: int, l_k: int):
    """Gradient of the present cache (B, g, L_K, d) -> (new (B, g, L_k, d), past (B, g, L_past, d)):
    present slot j < past_lengths[b] is past slot j, the next L_k slots are the new entries."""
    b, g, _, d = d_all.shape
    new = np.zeros((b, g, l_k, d), dtype=d_all.dtype)
    past = np.zeros((b, g, l_past, d), dtype=d_all.dtype)
    for bi in range(b):
        p = int(past_lengths[bi])
        past[bi, :, :p] = d_all[bi, :, :p]
        new[bi] = d_all[bi, :, p:p + l_k]
    return new, past


def attention_vjp(q, k, v, d_output, *, d_lse=None, sinks=None, bias_grad: bool = False,
                  precision: str = "float64", info: dict | None = None, **kwargs) -> AttentionVJP:
    """Gradients of ``sum(d_output * output) + sum(d_lse * lse)`` of :func:`attention_with_sinks`.

    q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v), d_output (B, h, L_q, d_v), d_lse
    (B, h, L_q) or None (zero), sinks (h,) or None -> :class:`AttentionVJP`. ``bias_grad`` asks for
    the gradient of ``kwargs["bias"]``. ``kwargs`` are those of :func:`oracle.attention_result`;
    every one of them but ``bias`` is a constant. ``precision``: one of
    :data:`GRADIENT_PRECISIONS` (float16 and bfloat16: GRAD-10's reference evaluation, float32
    accumulation rounded where kernels round, module docstring).
    With soft-capping, a dict ``info`` receives ``"cap_path"``: the largest entry of
    s |dS| |K| and s |dS|^T |Q| (the latter summed over each group), the size of what passes through
    the factor 1 - tanh^2, whose own rounding error is absolute (GRAD-5).
    """
    problem, sinks, rnd = _problem(q, k, v, sinks, precision, kwargs, GRADIENT_PRECISIONS)
    dt = problem.q.dtype.type
    b, h, l_q, _ = problem.q.shape
    d_out = rnd(_check_array(d_output, "d_output", (b, h, l_q, problem.v.shape[3]), dt))
    d_lse = None if d_lse is None else rnd(_check_array(d_lse, "d_lse", (b, h, l_q), dt))
    if bias_grad and kwargs.get("bias") is None:
        raise ValueError("bias_grad: asks for the gradient of a bias, but no bias is given")
    dq = np.zeros_like(problem.q)
    dk_all, dv_all = np.zeros_like(problem.k), np.zeros_like(problem.v)
    d_sinks = None if sinks is None else np.zeros_like(sinks)
    d_scores = np.zeros(problem.allowed.shape, dtype=dt) if bias_grad else None
    cap_q, cap_k = np.zeros_like(problem.q), np.zeros_like(problem.k)  # s |dS| |K|, s |dS|^T |Q|
    for bi, hi, kv, state in _heads(problem, sinks, rnd):
        d_o = d_out[bi, hi]
        dv_all[bi, kv] += state.probs.T @ d_o
        d_p = d_o @ problem.v[bi, kv].T
        row = -np.sum(d_o * state.output, axis=1)  # -D_i, then + dlse_i
        if d_lse is not None:
            row = row + d_lse[bi, hi]
        d_s = state.probs * (d_p + row[:, None])
        if d_sinks is not None:
            d_sinks[hi] += np.sum(state.sink_probs * row)
        if d_scores is not None:
            d_scores[bi, hi] = d_s
        d_x = rnd(d_s if state.tanh is None else d_s * (1 - state.tanh ** 2))  # GRAD-10
        if state.tanh is not None and info is not None:
            cap_q[bi, hi] = (np.abs(d_s) @ np.abs(problem.k[bi, kv])) * dt(problem.scale)
            cap_k[bi, kv] += (np.abs(d_s).T @ np.abs(problem.q[bi, hi])) * dt(problem.scale)
        dq[bi, hi] = (d_x @ problem.k[bi, kv]) * dt(problem.scale)
        dk_all[bi, kv] += (d_x.T @ problem.q[bi, hi]) * dt(problem.scale)
    if problem.softcap is not None and info is not None:
        info["cap_path"] = float(max(np.max(cap_q, initial=0.0), np.max(cap_k, initial=0.0)))
    d_bias = None if d_scores is None else rnd(_sum_to_shape(d_scores, np.shape(kwargs["bias"])))
    dq, dk_all, dv_all = rnd(dq), rnd(dk_all), rnd(dv_all)  # rounded once (GRAD-10)
    d_sinks = None if d_sinks is None else rnd(d_sinks)
    if problem.past_lengths is None:
        return AttentionVJP(dq, dk_all, dv_all, d_sinks, d_bias, None, None)
    l_past, l_k = np.shape(kwargs["past_key"])[2], np.shape(k)[2]
    dk, d_past_key = _split_cache(dk_all, problem.past_lengths, l_past, l_k)
    dv, d_past_value = _split_cache(dv_all, problem.past_lengths, l_past, l_k)
    return AttentionVJP(dq, dk, dv, d_sinks, d_bias, d_past_key, d_past_value)
