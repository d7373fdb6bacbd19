"""The peers' attention rules, transcribed from their sources for the peer-convention tests.

Each rule is a small NumPy function written from the peer's own source (repository, commit, file
and line in its docstring): the keys it allows, the bias it adds, the log-sum-exp it returns.
``tests/test_peer_conventions.py`` runs them against the float64 oracle;
``tests/test_peer_convention_keys.py`` uses :func:`hf_sliding_causal`.

Axis legend: B batch, h heads, L_q queries, L_k keys, d per-head width. Sources:

- FA2: Dao-AILab/flash-attention @ 0251105a (csrc/flash_attn/...); FA3: its ``hopper/``.
- HF: transformers 5.24.0 (the version ``pyproject.toml`` pins for the ``hf`` extra).
- gemma_pytorch @ 014acb7; xformers @ 29163217 (before ``fmha`` became a stub re-exporting mslk);
  vLLM @ 0084b78; Mistral's reference mistralai/mistral-src @ c18d5b9 (``one_file_ref.py``);
  attention-gym @ 14fd5f4; jax @ cec06d1; the ALiBi paper's code ofirpress/attention_with_linear_biases
  @ 4b92f28.
"""

from __future__ import annotations

import math

import numpy as np


# ------------------------------------------------------------------ FlashAttention 2

def fa2_window(causal: bool, window: tuple[int, int], l_q: int, l_k: int, alibi: bool):
    """What ``mha_fwd`` hands the kernel: (is_causal, left, right).

    csrc/flash_attn/flash_api.cpp:422-423 (a side >= L_k becomes -1), :426 (L_q = 1 without ALiBi
    is not causal), :427 (causal sets right = 0), :157 (``is_causal = left < 0 && right == 0``),
    :159-160 (an unbounded side opposite a bounded one becomes L_k)."""
    left, right = window
    left = -1 if left >= l_k else left
    right = -1 if right >= l_k else right
    if l_q == 1 and not alibi:
        causal = False
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    if left < 0 and right >= 0:
        left = l_k
    if left >= 0 and right < 0:
        right = l_k
    return is_causal, left, right


def fa2_allowed(b, l_q, l_k, left, right):
    """csrc/flash_attn/src/mask.h:53-54 / :172-173: key j allowed for query i iff
    ``i + L_k - L_q - left <= j < i + 1 + L_k - L_q + right`` (a side < 0: no limit)."""
    i = np.arange(l_q)[:, None] + l_k - l_q
    j = np.arange(l_k)[None, :]
    ok = np.ones((l_q, l_k), bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return np.broadcast_to(ok, (b, l_q, l_k))


def fa2_alibi(slopes, is_causal: bool, l_q: int, l_k: int):
    """csrc/flash_attn/src/mask.h:180-184 (and alibi.h): under ``Is_causal`` the kernel adds
    ``+m * j`` (the ALiBi paper's form), otherwise ``-m * |i + L_k - L_q - j|``. The slope is
    divided by the softmax scale (flash_fwd_kernel.h:294) because it is added before the scale,
    so on the scaled logits the terms are as written. slopes (B, h) -> bias (B, h, L_q, L_k)."""
    i = np.arange(l_q)[:, None]
    j = np.arange(l_k)[None, :]
    dist = j + 0 * i if is_causal else -np.abs(i + l_k - l_q - j)
    return slopes[:, :, None, None] * dist


def fa2_lse(q, k, allowed, bias, scale):
    """softmax.h:180 (non-split path) and flash_fwd_kernel.h:132 (the early exit): the natural
    log-sum-exp of the scaled logits plus ALiBi over the allowed keys, ``+inf`` for a row without
    one. (FA3: hopper/softmax.h:151 and hopper/epilogue_fwd.hpp:441 write ``-inf``.)"""
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k) + bias
    s = np.where(allowed[:, None], s, -np.inf)
    empty = ~allowed.any(-1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(empty, 0.0, s.max(-1))
        lse = m + np.log(np.exp(s - m[..., None]).sum(-1))
    return np.where(empty, np.inf, lse)


def fa2_effective_window(left: int, right: int, l_k: int):
    """The spec window (WIN-1, bottom-right) that FA2 computes for ``window_size=(left, right)``
    without causal (from :func:`fa2_window`): a side < 0 or >= L_k is unbounded, except a right
    side opposite a bounded left side, which becomes L_k."""
    eff_left = left if 0 <= left < l_k else None
    eff_right = right if 0 <= right < l_k else (None if eff_left is None else l_k)
    return eff_left, eff_right


# ------------------------------------------------------------------ jax.nn.dot_product_attention

def jax_lse(q, k, allowed, scale):
    """jax/_src/nn/functions.py:877-884 (masked logits = -0.7 * finfo(float32).max, finite),
    :927-941 (``jnp.where(mask, logits, large_negative)``), :996-999 (``return_residual``: the
    logsumexp of those padded logits, laid out (B, T, N)). Returned here as (B, h, L_q)."""
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    s = np.where(allowed[:, None], s, -0.7 * float(np.finfo(np.float32).max))
    m = s.max(-1)
    return m + np.log(np.exp(s - m[..., None]).sum(-1))


# ------------------------------------------------------------------ one integer: sliding_window = W

def hf_sliding_causal(w, l_q, past):
    """transformers masking_utils.py:97 (``kv_idx > q_idx - sliding_window``) AND :78 (``kv_idx <=
    q_idx``), with ``q_idx = i + q_offset`` (:530, ``q_offset`` = the cache's length) and
    ``kv_idx = j`` (a DynamicCache's keys start at 0)."""
    q_idx = np.arange(l_q)[:, None] + past
    kv_idx = np.arange(past + l_q)[None, :]
    return (kv_idx > q_idx - w) & (kv_idx <= q_idx)


def hf_sliding_bidirectional(w, n):
    """transformers masking_utils.py:147: ``abs(q_idx - kv_idx) <= sliding_window``."""
    idx = np.arange(n)
    return np.abs(idx[:, None] - idx[None, :]) <= w


def gemma_pytorch_local(w, n):
    """gemma_pytorch gemma/model.py:672-675: ``triu(full(-2.38e38), 1)`` plus ``tril(full(-2.38e38),
    -sliding_window_size)``; a key is allowed where the sum is 0."""
    big = np.full((n, n), -2.3819763e38)
    return (np.triu(big, 1) + np.tril(big, -w)) == 0


def xformers_local(w, l_q, l_k):
    """xformers ops/fmha/attn_bias.py:135-137 (@29163217): ``tril(diagonal=shift)`` then
    ``triu(diagonal=shift - window_size + 1)``, shift = L_k - L_q (from the bottom right)."""
    ones = np.ones((l_q, l_k))
    shift = l_k - l_q
    return np.triu(np.tril(ones, shift), shift - w + 1) == 1


def vllm_window(w):
    """vllm/v1/attention/backends/flash_attn.py ``FlashAttentionImpl.__init__`` (@0084b78):
    ``self.sliding_window = (sliding_window - 1, 0)``, FlashAttention's ``window_size``."""
    return (w - 1, 0)


def mistral_prefill(w, n):
    """mistral-src one_file_ref.py:259-262 (@c18d5b9): ``triu(tril(ones), diagonal=-sliding_window)``
    then ``log``: key j for query i iff i - W <= j <= i."""
    return np.triu(np.tril(np.ones((n, n))), -w) == 1


def mistral_decode(k, v, w):
    """mistral-src one_file_ref.py:123-134 (@c18d5b9), one token at a time: a rotating cache of W
    slots (``positions % sliding_window``), the token written before it attends, no mask, keys
    ``cache[:cur_pos]``. k, v (h, n, d) -> for each position t the (keys, values) it attends."""
    cache_k, cache_v = np.zeros((k.shape[0], w, k.shape[2])), np.zeros((v.shape[0], w, v.shape[2]))
    attended = []
    for t in range(k.shape[1]):
        cache_k[:, t % w], cache_v[:, t % w] = k[:, t], v[:, t]
        attended.append((cache_k[:, :t + 1].copy(), cache_v[:, :t + 1].copy()))
    return attended


def attention_gym_sliding(w, n):
    """attention-gym attn_gym/masks/sliding_window.py:18-21: ``q_idx - kv_idx <= window_size`` AND
    the causal mask."""
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return (diff <= w) & (diff >= 0)


# ------------------------------------------------------------------ flash_attn_with_kvcache

def fa2_kvcache_allowed(cache_seqlens, l_q: int, l_new: int, l_all: int):
    """flash_attn_with_kvcache: the new keys are written at ``cache_seqlens`` (Append_KV), the
    kernel attends ``actual_seqlen_k = cache_seqlens + L_new`` keys (csrc/flash_attn/src/
    block_info.h:24) with its bottom-right causal mask (mask.h:54): key j for query i iff
    ``j < c + L_new`` and ``j <= i + c + L_new - L_q``. -> (B, L_q, L_all) bool."""
    c = np.asarray(cache_seqlens)[:, None, None]
    i = np.arange(l_q)[None, :, None]
    j = np.arange(l_all)[None, None, :]
    return (j < c + l_new) & (j <= i + c + l_new - l_q)


# ------------------------------------------------------------------ segments

def splash_allowed(q_ids, kv_ids, *, offset=0, window=None):
    """jax splash attention (jax/experimental/pallas/ops/tpu/splash_attention/): the mask is a
    function of *global* indices (splash_attention_mask.py:314-321 ``CausalMask``: ``q_ids + offset
    >= kv_ids``; :434-458 ``LocalMask``: ``shifted_q_ids - left <= kv_ids <= shifted_q_ids +
    right``; the kernel calls it on the block's q / kv sequence indices, splash_attention_kernel.py
    :654), ANDed with segment equality (:662-680; the reference: :184-188
    ``segment_ids.q[:, None] == segment_ids.kv[None, :]``). ids (L_q,), (L_k,) -> (1, L_q, L_k)."""
    qi = np.arange(len(q_ids))[:, None] + offset
    kj = np.arange(len(kv_ids))[None, :]
    ok = kj <= qi if window is None else (qi - window[0] <= kj) & (kj <= qi + window[1])
    return (ok & (q_ids[:, None] == kv_ids[None, :]))[None]


def fa_varlen_allowed(n_q, n_k):
    """FlashAttention varlen, ``causal=True``: each sequence s of ``cu_seqlens_q`` / ``cu_seqlens_k``
    is its own problem (block_info.h:19-24, ``actual_seqlen_q/k`` per sequence) with the
    bottom-right mask (mask.h:54) on indices within it. Sequence lengths n_q, n_k -> (1, ΣL_q, ΣL_k)."""
    blocks = np.zeros((sum(n_q), sum(n_k)), bool)
    r = c = 0
    for lq, lk in zip(n_q, n_k):
        i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
        blocks[r:r + lq, c:c + lk] = j <= i + lk - lq
        r, c = r + lq, c + lk
    return blocks[None]


def attention_gym_document(doc_ids, inner):
    """attention-gym attn_gym/masks/document_mask.py:53-58: same document AND ``inner(q_logical,
    kv_logical)`` with ``q_logical = q_idx - offsets[document_id[q_idx]]`` (index within the
    document). doc_ids (L,) contiguous -> (1, L, L)."""
    offsets = {d: int(np.argmax(doc_ids == d)) for d in np.unique(doc_ids)}
    logical = np.arange(len(doc_ids)) - np.array([offsets[d] for d in doc_ids])
    return ((doc_ids[:, None] == doc_ids[None, :]) & inner(logical[:, None], logical[None, :]))[None]


# ------------------------------------------------------------------ ALiBi slopes and signs

def paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's ``get_slopes`` (ofirpress/attention_with_linear_biases
    fairseq/models/transformer.py:742-752): the geometric sequence for a power of two; otherwise
    that of the nearest lower power of two, then every other slope of twice that many heads."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][:n - closest]


# ------------------------------------------------------------------ spec 1.3's notes (E8-E11)
#
# gpt-oss @ 7b58334; FlashInfer @ fb28d72; onnxruntime @ 008eeb96 (the CPU GroupQueryAttention
# kernel of an older release); the installed jax 0.10.2 and torch 2.13 (files on disk).

def gpt_oss_sliding(w, n):
    """gpt-oss gpt_oss/torch/model.py:161-165 (``sdpa``): ``triu(full(-inf), diagonal=1)`` plus, with
    ``sliding_window > 0``, ``tril(full(-inf), diagonal=-sliding_window)``: key j for query i iff
    i - W < j <= i."""
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return (diff >= 0) & (diff < w)


def flashinfer_window_left(w, l_q, l_k):
    """FlashInfer include/flashinfer/attention/variants.cuh:88-90 (``kv_idx + qo_len + window_left
    >= kv_len + qo_idx``) AND the causal mask of prefill.cuh:1516-1517 (masked where ``kv_idx +
    qo_len > kv_len + q_idx``): bottom-right, keys p - W <= j <= p with p = i + L_k - L_q."""
    i = np.arange(l_q)[:, None]
    j = np.arange(l_k)[None, :]
    return (j + l_q + w >= l_k + i) & ~(j + l_q > l_k + i)


def ort_cpu_local_window(w, l_q, past):
    """onnxruntime contrib_ops/cpu/bert/gqa_attention_base.h @ 008eeb96, ``ComputeAttentionProbs``:
    ``seq_causal_length = past_seqlen + seq + 1``; when it exceeds ``local_window_size_ + 1`` the
    first ``seq_causal_length - local_window_size_ - 1`` probabilities are zeroed and the softmax
    runs over the last ``local_window_size_ + 1``: W + 1 keys."""
    causal_length = past + np.arange(l_q)[:, None] + 1
    j = np.arange(past + l_q)[None, :]
    return (j < causal_length) & (j >= causal_length - w - 1)


def flashinfer_lse(q, k, allowed, scale):
    """FlashInfer's log-sum-exp, base 2: the logits are multiplied by ``sm_scale * log2e``
    (include/flashinfer/attention/variants.cuh:54) and the state returns ``m + log2(d)``
    (state.cuh:45; m the row maximum, d the sum of ``exp2`` of the shifted logits). (B, h, L_q)."""
    s = scale * math.log2(math.e) * np.einsum("bhqd,bhkd->bhqk", q, k)
    s = np.where(allowed[:, None], s, -np.inf)
    m = s.max(-1)
    return m + np.log2(np.exp2(s - m[..., None]).sum(-1))


def flashinfer_merge(v_a, s_a, v_b, s_b):
    """FlashInfer include/flashinfer/attention/cascade.cuh:53-72 (``MergeStateKernel``; ``s_a``,
    ``s_b`` base 2 as its :42 says): weights ``exp2(s - max)``, merged lse ``log2(d) + max``."""
    s_max = np.maximum(s_a, s_b)
    a, b = np.exp2(s_a - s_max), np.exp2(s_b - s_max)
    d = a + b
    return (a / d)[..., None] * v_a + (b / d)[..., None] * v_b, np.log2(d) + s_max
