"""The backend protocol (version 1): what the conformance suite calls.

Axis legend: B batch, L_q / L_k query / key lengths, h heads, d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

A backend is an object with the attributes and methods of :class:`Backend`. Subclassing is
optional: the suite only uses the attributes below. Arrays passed to the four operations are the
backend's own (made by :meth:`Backend.asarray`); results go back through :meth:`Backend.to_numpy`.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

PROTOCOL_VERSION = 1

#: Capability groups a backend may claim. What it does not claim is reported "not implemented".
CAPABILITIES = frozenset({
    "heads",        # split_heads / combine_heads (HEAD)
    "sdpa",         # scaled_dot_product_attention (SDPA)
    "weights",      # operations return attention weights (SHAPE-2, SDPA-4)
    "mha",          # multi_head_attention (MHA, PARAM)
    "masks",        # boolean mask and key padding (MASK-1, 5, 8, 9, 10, 12)
    "bias",         # additive float bias (MASK-2, 11)
    "scale",        # a caller-given scale (SDPA-2)
    "legacy_mask",  # the source's float mask (MASK-3)
    "causal",       # causal with explicit alignment (MASK-6, 7)
    "cross",        # cross-attention widths (MHA-4)
    "errors",       # rejects invalid input with ValueError (ERR)
    # optional extensions: not claimed by default (Backend.capabilities leaves them out)
    "gqa",          # grouped key/value heads: multi_head_attention(num_kv_heads=g) (MHA-6) and
                    # scaled_dot_product_attention with k, v of g heads (GQA, spec 1.2)
    "grad",         # mha_vjp: gradients of sum(output * cotangent) (GRAD)
    # spec 1.2 features (keyword arguments of both attention operations; FEATURE_ARGUMENTS)
    "softcap",      # softcap=c: logits c*tanh(S/c) after the scale, before bias and masks (SOFTCAP)
    "window",       # window=(left, right) and alignment= (WIN)
    "alibi",        # alibi_slopes (h,) or (B, h) (ALIBI)
    "segments",     # q_segment_ids / kv_segment_ids, query_seq_lengths / key_value_seq_lengths (SEG)
    "kv_cache",     # past_key / past_value / past_lengths -> the present cache (CACHE)
    "lse",          # lse=True: the per-row log-sum-exp (LSE)
    # spec 1.3 (training): scaled dot-product attention's backward pass, and attention sinks
    "attention_vjp",  # attention_vjp: gradients of scaled dot-product attention (GRAD-3..8)
    "bias_grad",      # attention_vjp(bias_grad=True): the gradient of the bias too (GRAD-9)
    "sink",           # sinks (h,): one logit per head in every row's denominator (SINK)
    # spec 1.4
    "merge",          # merge_states: partial states (output, lse) merged into their union (MERGE)
    "paged",          # paged_attention and write_pages over a paged KV cache (PAGE)
    "deterministic",  # repeated calls on the same inputs give bitwise-identical results (DET-1)
    "chunk",          # chunk=C and alignment=: chunked local attention (CHUNK)
})

#: Capabilities a backend claims only by naming them: ``Backend.capabilities`` omits them.
OPTIONAL_CAPABILITIES = frozenset({"gqa", "grad", "softcap", "window", "alibi", "segments",
                                   "kv_cache", "lse", "attention_vjp", "bias_grad", "sink",
                                   "merge", "paged", "deterministic", "chunk"})

#: The spec 1.2 keyword arguments of both attention operations, by the capability that governs
#: them. The suite passes an argument only to a backend that claims its capability, and only with
#: a value other than its default (None, or False for ``lse``), so a 1.1 backend never sees one.
FEATURE_ARGUMENTS = {
    "softcap": ("softcap",),
    "window": ("window", "alignment"),
    "alibi": ("alibi_slopes", "alignment"),
    "segments": ("q_segment_ids", "kv_segment_ids", "query_seq_lengths", "key_value_seq_lengths"),
    "kv_cache": ("past_key", "past_value", "past_lengths"),
    "lse": ("lse",),
    "sink": ("sinks",),  # spec 1.3; scaled_dot_product_attention only (SINK-1)
    "chunk": ("chunk", "alignment"),  # spec 1.4
}

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")


def native_byte_order(x: np.ndarray) -> np.ndarray:
    """``x`` as a NumPy array in the machine's byte order (a copy only when it is not): what
    ``asarray`` implementations hand to frameworks that refuse big-endian arrays (torch)."""
    x = np.asarray(x)
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


class MHAParams(NamedTuple):
    """Projection parameters, math layout ``y = x @ W + b`` (PARAM-1); biases may be None.

    w_q (d_model, h*d_k), w_k (k_dim, h*d_k), w_v (v_dim, h*d_v), w_o (h*d_v, d_out).
    """

    w_q: Any
    w_k: Any
    w_v: Any
    w_o: Any
    b_q: Any = None
    b_k: Any = None
    b_v: Any = None
    b_o: Any = None


class AttentionOutputs(NamedTuple):
    """What an attention operation returns when the caller asks for more than (output, weights):
    with ``lse=True`` or a KV cache (``past_key``), both operations return this instead of the
    pair; fields not asked for are None.

    output: (B, h, L_q, d_v) for scaled_dot_product_attention, (B, L_q, d_out) for
    multi_head_attention; weights (B, h, L_q, L_K) or None; lse (B, h, L_q), -inf for a fully
    masked row (LSE-1); present_key (B, g, L_K, d_k), present_value (B, g, L_K, d_v) and
    present_lengths (B,) integers (CACHE-1), with L_K = L_past + L_k.
    """

    output: Any
    weights: Any = None
    lse: Any = None
    present_key: Any = None
    present_value: Any = None
    present_lengths: Any = None


class Backend:
    """Base class of a backend. Override the marked members.

    Attributes:
        name: unique, readable id used in test ids and certificates (``"numpy-batched"``).
        framework: the framework's distribution name (``"numpy"``, ``"torch"``).
        capabilities: subset of :data:`CAPABILITIES` this backend claims.
        deviations: clause id -> one-line reason, for clauses it knowingly does not follow.
            The suite checks that a declared deviation really deviates.
        sub_cases: optional, capability -> the part of it supported (:mod:`.sub_cases`: e.g.
            ``{"window": {"with": ("causal",)}}``); the rest is reported not implemented.
        page_size_unit: with "paged", the page sizes taken are the multiples of this (PAGE-1: a
            kernel's block-size alignment); 1, every size, by default.
    """

    protocol_version = PROTOCOL_VERSION
    name: str = "unnamed"
    framework: str = "unknown"
    capabilities: frozenset[str] = CAPABILITIES - OPTIONAL_CAPABILITIES
    deviations: Mapping[str, str] = {}
    sub_cases: Mapping[str, Mapping[str, tuple[str, ...]]] = {}
    page_size_unit: int = 1

    # -- description -------------------------------------------------------------------------
    def framework_version(self) -> str:
        """Version of the framework that computes (override)."""
        raise NotImplementedError

    def devices(self) -> dict[str, str | None]:
        """Device name -> None when usable, or the reason it is not (e.g. no CUDA device)."""
        return {"cpu": None}

    def dtypes(self, device: str) -> tuple[str, ...]:
        """Dtype names supported on ``device``; float64 and float32 are required (NUM-1)."""
        return ("float64", "float32")

    def deviations_on(self, device: str, dtype: str) -> Mapping[str, str]:
        """The declared deviations that hold on ``device`` in ``dtype`` (optional; default: all of
        :attr:`deviations`). For a kernel that deviates on some devices or dtypes only: the suite
        expects the rest to pass, so a declaration cannot hide a conforming cell."""
        return self.deviations

    def precision_flags(self, device: str) -> dict[str, Any]:
        """Flags that affect float32 accuracy (e.g. TF32 state) for the certificate."""
        return {}

    # -- arrays --------------------------------------------------------------------------------
    def asarray(self, x: np.ndarray, *, dtype: str, device: str = "cpu"):
        """A NumPy array as this backend's array of ``dtype`` on ``device`` (override).

        ``x`` is a NumPy array of any dtype (floating, boolean for masks, integer for segment ids
        and lengths) and either byte order; ``dtype`` is one of :data:`ALL_DTYPES`, ``"bool"``,
        ``"int32"`` or ``"int64"`` (segment ids, sequence and cache lengths: spec 1.2), or an
        invalid dtype such as ``"int64"`` for a float argument when the suite checks rejection
        (ERR). The result must be a new array: the
        suite compares ``x`` with ``to_numpy`` of it after a call (INPUT-1)."""
        raise NotImplementedError

    def to_numpy(self, x) -> np.ndarray:
        """This backend's array as NumPy (bfloat16 as float32) (override)."""
        raise NotImplementedError

    def device_of(self, x) -> str:
        """The device an array lives on (checked so a GPU run is really on the GPU)."""
        return "cpu"

    # -- operations (override those the capabilities claim) -------------------------------------
    def split_heads(self, x, num_heads: int):
        """(B, L, h*d) -> (B, h, L, d) (HEAD-1)."""
        raise NotImplementedError

    def combine_heads(self, x):
        """(B, h, L, d) -> (B, L, h*d) (HEAD-2)."""
        raise NotImplementedError

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                     key_padding_mask=None, causal=None, scale=None,
                                     **features):
        """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v)
        -> (output (B, h, L_q, d_v), weights (B, h, L_q, L_k) or None).

        ``features`` are the spec 1.2 keyword arguments of :data:`FEATURE_ARGUMENTS` (a backend
        names those it claims): ``softcap``, ``window``, ``alignment``, ``alibi_slopes``,
        ``q_segment_ids``, ``kv_segment_ids``, ``query_seq_lengths``, ``key_value_seq_lengths``,
        ``past_key`` (B, g, L_past, d_k), ``past_value`` (B, g, L_past, d_v), ``past_lengths``
        (B,), ``lse``. With "gqa", k and v may have g heads, g dividing h (GQA-1). With ``lse=True``
        or a cache the result is :class:`AttentionOutputs`; masks and weights then have the
        present cache's key axis L_K = L_past + L_k."""
        raise NotImplementedError

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, **features):
        """query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim)
        -> (output (B, L_q, d_out), weights (B, h, L_q, L_k) or None).

        ``num_kv_heads`` (capability "gqa", MHA-6): g key/value heads, g dividing h; ``w_k`` and
        ``w_v`` (and ``b_k``, ``b_v``) then have g*d_k and g*d_v columns. The suite passes it only
        to backends that claim "gqa"; None means plain multi-head attention.

        ``features``: as for :meth:`scaled_dot_product_attention`; ``past_key`` and ``past_value``
        hold *projected* keys and values (B, g, L_past, d_k / d_v), and ``alibi_slopes`` one slope
        per query head."""
        raise NotImplementedError

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                **mask_kwargs) -> dict:
        """Gradients of ``sum(multi_head_attention(...)[0] * cotangent)`` (capability "grad", GRAD).

        ``cotangent`` (B, L_q, d_out) is a backend array like the inputs; ``mask_kwargs`` are the
        keyword arguments of :meth:`multi_head_attention` (mask, bias, legacy_mask,
        key_padding_mask, causal, scale, and num_kv_heads with "gqa"), which are constants.
        Returns a dict of backend arrays: ``"query"``, ``"key"``, ``"value"`` (each a separate
        argument, even when one array is passed three times), ``"w_q"``, ``"w_k"``, ``"w_v"``,
        ``"w_o"``, and ``"b_q"``, ``"b_k"``, ``"b_v"``, ``"b_o"`` for the biases that are not None.
        Input is validated as for :meth:`multi_head_attention`. Backends that do not claim "grad"
        need not override it."""
        raise NotImplementedError(f"{self.name}: mha_vjp (capability 'grad') is not implemented")

    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad: bool = False,
                      **kwargs) -> dict:
        """Gradients of ``sum(output * d_output) + sum(lse * d_lse)`` of
        :meth:`scaled_dot_product_attention` (capability "attention_vjp", GRAD-3 to GRAD-9, SINK-3).

        q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v), d_output (B, h, L_q, d_v),
        d_lse (B, h, L_q) or None (capability "lse"); ``kwargs`` those of
        :meth:`scaled_dot_product_attention` (constants, but for ``bias`` with ``bias_grad=True``,
        capability "bias_grad"). Returns a dict of backend arrays: ``"q"``, ``"k"``, ``"v"`` (k and
        v with g heads: sums over each group, GRAD-4), ``"sinks"`` (h,) with ``sinks``,
        ``"past_key"`` / ``"past_value"`` with a KV cache (GRAD-6) and ``"bias"`` (its own shape)
        with ``bias_grad=True``."""
        raise NotImplementedError(f"{self.name}: attention_vjp (capability 'attention_vjp') is not "
                                  f"implemented")

    def merge_states(self, outputs, lses, *, sinks=None, lse_base: str = "e",
                     empty_lse: str = "-inf", lse_layout: str = "batch"):
        """Partial states merged into the state over their union (capability "merge", spec 1.4
        MERGE-1..6): outputs, n arrays (B, h, L_q, d_v); lses, n arrays (B, h, L_q), or (h, T)
        with ``lse_layout="tokens"`` (T = B * L_q); sinks (h,) or None (added once, after the
        merge) -> (output (B, h, L_q, d_v), lse in the call's conventions). The conventions a
        backend accepts are its ``merge_conventions`` (argument -> values; default: LSE-1's
        alone: ``"e"``, ``"-inf"``, ``"batch"``)."""
        raise NotImplementedError(f"{self.name}: merge_states (capability 'merge') is not "
                                  f"implemented")

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal: bool = False, scale=None):
        """Attention over a paged KV cache (capability "paged", spec 1.4 PAGE-1, 2, 4): q (T, h,
        d_k), the packed queries of B items, item b's the rows query_start_loc[b] to
        query_start_loc[b + 1] (B + 1,); k_pages (P, S, g, d_k), v_pages (P, S, g, d_v), S the
        page size; block_table (B, M) page ids; seq_lens (B,) keys per item -> output (T, h,
        d_v). Key j of item b is k_pages[block_table[b, j // S], j % S]; queries bottom-right."""
        raise NotImplementedError(f"{self.name}: paged_attention (capability 'paged') is not "
                                  f"implemented")

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        """New (k_pages, v_pages) with token n's key and value (k, v: (N, g, d)) in slot
        slot_mapping[n] (page slot // S, position slot % S) and every other slot unchanged
        (capability "paged", PAGE-3)."""
        raise NotImplementedError(f"{self.name}: write_pages (capability 'paged') is not "
                                  f"implemented")

    def __repr__(self) -> str:
        return f"<mhaspec backend {self.name}>"
