"""Backends that support part of a capability and say so (``sub_cases``,
mhaspec.backends.sub_cases): the reference backend (oracle_backend.py) whose windows work only
with a causal mask, as some kernels' sliding windows do (``WINDOW_ONLY_WITH_CAUSAL``), and one
whose KV cache needs d_v = d_k, as a kernel that keeps keys and values in one buffer does
(``CACHE_NEEDS_EQUAL_WIDTHS``; ``CACHE_LIMIT_UNSTATED`` has the limit without the rule), and one
whose attention needs L_q = L_k (``SQUARE_ONLY``; ``SQUARE_ONLY_UNSTATED`` without the rule).
Loaded with ``--backend sub_case_backends:NAME``."""

from __future__ import annotations

from oracle_backend import OracleBackend


class WindowOnlyWithCausal(OracleBackend):
    """Windows with a causal mask only (any other window raises); windows with segment ids go
    through the generic explicit-mask path (declared)."""

    sub_cases = {"window": {"with": ("causal",), "generic": ("q_segment_ids",)}}

    def scaled_dot_product_attention(self, q, k, v, **kw):
        _causal_windows_only(kw)
        return super().scaled_dot_product_attention(q, k, v, **kw)

    def multi_head_attention(self, query, key, value, params, **kw):
        _causal_windows_only(kw)
        return super().multi_head_attention(query, key, value, params, **kw)


def _causal_windows_only(kw) -> None:
    if kw.get("window") is not None and kw.get("causal") is None:
        raise NotImplementedError("windows only with a causal mask")


WINDOW_ONLY_WITH_CAUSAL = WindowOnlyWithCausal("window-only-with-causal")


class CacheNeedsEqualWidths(OracleBackend):
    """A KV cache only with d_v = d_k (any other cached call, forward or backward, raises
    NotImplementedError), stated as a shape rule."""

    sub_cases = {"kv_cache": {"shapes": ("d_v == d_k",)}}

    def scaled_dot_product_attention(self, q, k, v, **kw):
        if kw.get("past_key") is not None and q.shape[-1] != v.shape[-1]:
            raise NotImplementedError("a KV cache needs d_v = d_k")
        return super().scaled_dot_product_attention(q, k, v, **kw)

    def attention_vjp(self, q, k, v, d_output, **kw):
        if kw.get("past_key") is not None and q.shape[-1] != v.shape[-1]:
            raise NotImplementedError("a KV cache needs d_v = d_k")
        return super().attention_vjp(q, k, v, d_output, **kw)


class CacheLimitUnstated(CacheNeedsEqualWidths):
    """The same limit, not stated: its NotImplementedError is a failure."""

    sub_cases = {}


CACHE_NEEDS_EQUAL_WIDTHS = CacheNeedsEqualWidths("cache-needs-equal-widths")
CACHE_LIMIT_UNSTATED = CacheLimitUnstated("cache-limit-unstated")


class SquareOnly(OracleBackend):
    """Scaled dot-product attention, forward and backward, with L_q = L_k only (any other call
    raises NotImplementedError), stated as a rule of the operation: the direct calls of INPUT-1
    and MASK-3's hand-built case must follow it as the drawn cases do."""

    sub_cases = {"sdpa": {"shapes": ("L_q == L_k",)}}

    def scaled_dot_product_attention(self, q, k, v, **kw):
        _square_only(q, k)
        return super().scaled_dot_product_attention(q, k, v, **kw)

    def attention_vjp(self, q, k, v, d_output, **kw):
        _square_only(q, k)
        return super().attention_vjp(q, k, v, d_output, **kw)


def _square_only(q, k) -> None:
    if q.shape[2] != k.shape[2]:
        raise NotImplementedError("L_q = L_k only")


class SquareOnlyUnstated(SquareOnly):
    """The same limit, not stated: its NotImplementedError is a failure."""

    sub_cases = {}


SQUARE_ONLY = SquareOnly("square-only")
SQUARE_ONLY_UNSTATED = SquareOnlyUnstated("square-only-unstated")
