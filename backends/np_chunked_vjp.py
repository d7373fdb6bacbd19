"""The blockwise backward pass of ``numpy-chunked`` (GRAD-3 to GRAD-8, SINK-3; spec 1.3):
FlashAttention-2's algorithm, with memory bounded in L.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k keys attended, d_k / d_v per-head widths.

The forward pass (:func:`blockwise_attention`) runs first and keeps only the output O
and the per-row log-sum-exp (with the sink, SINK-1). Then ``D = rowsum(dO * O)`` once, and per head,
query block and key block the logits are recomputed exactly as the forward computes them (scale,
soft-cap, additive terms, ALiBi, masks, block by block) and::

    P = exp(S - lse)          (0 where masked or the row is empty)
    dS = P * (dO V^T - D + dlse)          dX = dS * (1 - tanh^2(X / c))
    dQ += s dX K      dK += s dX^T Q      dV += P^T dO
    d sigma_h = sum_i exp(sigma_h - lse_i) (dlse_i - D_i)

Key blocks the causal mask or the window leaves empty are skipped, as in the forward pass. Only
one (block_q, block_k) block of logits and its few temporaries exist at a time, besides arrays of
the inputs' sizes. Everything is computed in float32 or wider (float16 inputs: D, lse and the
accumulators in float32) and the gradients are rounded once.
"""

from __future__ import annotations

import numpy as np

from . import algorithms, np_vjp
from .np_blockwise import Blocks, blockwise_attention
from .np_vjp import Grads


def attention_vjp(backend, q, k, v, d_output, d_lse, masks, feats,
                  bias_grad: bool = False) -> dict:
    """The gradients of a validated call of the chunked backend (``masks``: ``MaskArgs``,
    ``feats``: ``Features``): its masks kept per block (``fold_features``), the present cache
    laid out (CACHE-1), the forward pass for O and lse, then :func:`blockwise_vjp`."""
    len_q, len_k = q.shape[2], k.shape[2]
    masks, index = backend.fold_features(q, masks, feats, len_q, len_k)
    allowed = backend.algorithm_object.block_allowed(backend.ops, q, k, masks)
    masks = masks._replace(mask=allowed,
                           key_padding_mask=None, causal=None)
    k_all, v_all = k, v
    if feats.cached:
        k_all = algorithms.present(backend.ops, feats.past_key, k, index)
        v_all = algorithms.present(backend.ops, feats.past_value, v, index)
    work = np.promote_types(q.dtype, np.float32)
    q_w, k_w, v_w = (np.asarray(x, dtype=work) for x in (q, k_all, v_all))
    blocks = backend.blocks_for(q_w, k_w, alibi=masks.alibi is not None)
    additive = backend.algorithm_object.additive(backend.ops, masks.bias, masks.legacy_mask)
    out, lse = blockwise_attention(
        q_w, k_w, v_w, scale=masks.scale, allowed=masks.mask, additive=additive,
        alibi=masks.alibi, softcap=masks.softcap, lse=True, blocks=blocks, sinks=feats.sinks)
    grads = blockwise_vjp(q_w, k_w, v_w, out, lse, np.asarray(d_output, dtype=work),
                          None if d_lse is None else np.asarray(d_lse, dtype=work),
                          scale=masks.scale, allowed=masks.mask, additive=additive,
                          alibi=masks.alibi, softcap=masks.softcap, sinks=feats.sinks,
                          blocks=blocks)
    return np_vjp.gradient_dict(q.dtype, grads, feats, len_k)


def blockwise_vjp(q, k, v, out, lse, d_out, d_lse, *, scale: float, allowed=None, additive=(),
                  alibi=None, softcap=None, sinks=None, blocks: Blocks) -> Grads:
    """q (B, h, L_q, d_k), k (B, g, L_K, d_k), v (B, g, L_K, d_v), out (B, h, L_q, d_v) and lse
    (B, h, L_q) of the forward pass, d_out like out, d_lse like lse or None; masks as
    :func:`blockwise_attention` takes them; sinks (h,) or None -> :class:`Grads`."""
    b, h, len_q, _ = q.shape
    g, len_k = k.shape[1], k.shape[2]
    dt = q.dtype.type
    full = (b, h, len_q, len_k)
    additive = [np.broadcast_to(np.asarray(t, dtype=q.dtype), full) for t in additive]
    row = -np.sum(d_out * out, axis=-1)  # -D (B, h, L_q), then + dlse
    if d_lse is not None:
        row = row + d_lse
    safe_lse = np.where(np.isfinite(lse), lse, np.inf)  # an empty row: P = exp(-inf) = 0
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    d_sinks = None
    if sinks is not None:
        p_sink = np.exp(np.asarray(sinks, dtype=q.dtype)[None, :, None] - safe_lse)
        d_sinks = np.sum(p_sink * row, axis=(0, 2))
    for bi in range(b):
        for hi in range(h):
            kv, heads = hi // (h // g), (bi, slice(hi, hi + 1))
            for q0 in range(0, len_q, blocks.block_q):
                qs = slice(q0, min(q0 + blocks.block_q, len_q))
                q_blk = q[bi, hi, qs] * dt(scale)
                for k0 in range(0, len_k, blocks.block_k):
                    ks = slice(k0, min(k0 + blocks.block_k, len_k))
                    if allowed is not None and allowed.skips(heads, qs, ks):
                        continue
                    x = q_blk @ k[bi, kv, ks].T
                    tanh = None if softcap is None else np.tanh(x / dt(softcap))
                    logits = x if tanh is None else tanh * dt(softcap)
                    for term in additive:
                        logits = logits + term[bi, hi, qs, ks]
                    if alibi is not None:
                        logits = logits + alibi.block(heads, qs, ks)[0].astype(q.dtype)
                    if allowed is not None:
                        blk = allowed.block(heads, qs, ks)
                        if blk is not None:
                            logits = np.where(np.reshape(blk, blk.shape[-2:]), logits, -np.inf)
                    probs = np.exp(logits - safe_lse[bi, hi, qs, None])
                    d_s = probs * (d_out[bi, hi, qs] @ v[bi, kv, ks].T + row[bi, hi, qs, None])
                    d_x = d_s if tanh is None else d_s * (1 - tanh * tanh)
                    dq[bi, hi, qs] += d_x @ k[bi, kv, ks]
                    dk[bi, kv, ks] += d_x.T @ q_blk
                    dv[bi, kv, ks] += probs.T @ d_out[bi, hi, qs]
    dq *= dt(scale)
    return Grads(dq, dk, dv, d_sinks, None)
