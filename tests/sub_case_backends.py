"""A backend that supports part of a capability and says so (``sub_cases``,
mhaspec.backends.sub_cases): the reference backend (oracle_backend.py) whose windows work only
with a causal mask, as some kernels' sliding windows do. Loaded with ``--backend
sub_case_backends:WINDOW_ONLY_WITH_CAUSAL``."""

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
