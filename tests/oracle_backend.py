"""A reference backend that wraps the float64 oracle: it claims every capability but "grad" and
computes each call with :mod:`mhaspec.spec.oracle` (spec 1.3's sinks and attention_vjp with
:mod:`mhaspec.spec.oracle_vjp`) (float64 in float64, the naive float32 steps in
float32).

It is the suite's own yardstick for spec 1.2's feature chapters: a test that fails on it is a
defect of the test (or of the harness), never of an implementation. The broken variants of
``broken_backends/`` for the feature clauses derive from it, each with one mistake. Loaded with
``--backend oracle_backend:ORACLE_REFERENCE`` (tests/ on the path), as a third-party backend.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, L_past cached keys,
L_K = L_past + L_k, d_k / d_v per-head widths, d_model / k_dim / v_dim / d_out widths.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends import (CAPABILITIES, AttentionOutputs, Backend, MHAParams, serving,
                              validation)
from mhaspec.backends.np_backend import BATCHED as NUMPY_BACKEND
from mhaspec.spec import oracle, oracle_serving, oracle_vjp


def _arg(name: str, x, shape=None):
    """``x`` as validation's Arg, optionally with another shape (grouped heads, the cache's L_K)."""
    a = validation.arg(name, x)
    return None if a is None else a._replace(shape=a.shape if shape is None else tuple(shape))


def _cache_length(past_key) -> int:
    """L_past of a (valid) cache, 0 otherwise (the oracle reports invalid caches)."""
    return past_key.shape[2] if getattr(past_key, "ndim", 0) == 4 else 0


class OracleBackend(Backend):
    """Every operation is the oracle's, after the input validation of chapter ERR."""

    framework = "numpy"
    capabilities = CAPABILITIES - {"grad"}

    def __init__(self, name: str = "oracle-reference"):
        self.name = name

    def framework_version(self) -> str:
        return np.__version__

    def asarray(self, x, *, dtype: str, device: str = "cpu"):
        return np.array(x, dtype=dtype, copy=True)

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def split_heads(self, x, num_heads: int):
        validation.check_heads("split_heads", _arg("x", x), num_heads)
        return oracle.split_heads(x, num_heads)

    def combine_heads(self, x):
        validation.check_heads("combine_heads", _arg("x", x))
        return oracle.combine_heads(x)

    # -- the two attention operations -------------------------------------------------------------

    def scaled_dot_product_attention(self, q, k, v, *, mask=None, bias=None, legacy_mask=None,
                                      key_padding_mask=None, causal=None, scale=None, lse=False,
                                      **features):
        h = q.shape[1] if q.ndim == 4 else None
        # grouped heads (GQA-1) and the present cache's L_K as validation's plain shapes
        grouped = k.ndim == 4 and h and 0 < k.shape[1] < h and h % k.shape[1] == 0
        k_shape = v_shape = None
        past = _cache_length(features.get("past_key"))
        if k.ndim == 4:
            k_shape = (k.shape[0], h if grouped else k.shape[1], k.shape[2] + past, k.shape[3])
            if v.ndim == 4:
                same = grouped and v.shape[1] == k.shape[1]
                v_shape = (v.shape[0], h if same else v.shape[1], v.shape[2] + past, v.shape[3])
        validation.check_sdpa(_arg("q", q), _arg("k", k, k_shape), _arg("v", v, v_shape),
                              mask=_arg("mask", mask), bias=_arg("bias", bias),
                              legacy_mask=_arg("legacy_mask", legacy_mask),
                              key_padding_mask=_arg("key_padding_mask", key_padding_mask),
                              causal=causal, scale=scale)
        res = self._attention(q, k, v, mask=mask, bias=bias, legacy_mask=legacy_mask,
                              key_padding_mask=key_padding_mask, causal=causal, scale=scale,
                              **features)
        return self._outputs(res, q.dtype, lse, features)

    def multi_head_attention(self, query, key, value, params: MHAParams, *, num_heads: int,
                             mask=None, bias=None, legacy_mask=None, key_padding_mask=None,
                             causal=None, scale=None, num_kv_heads=None, lse=False, **features):
        past = _cache_length(features.get("past_key"))
        kv = {n: _arg(n, x, None if x.ndim != 3 else (x.shape[0], x.shape[1] + past, x.shape[2]))
              for n, x in (("key", key), ("value", value))}
        validation.check_mha(_arg("query", query), kv["key"], kv["value"],
                             {n: _arg(n, p) for n, p in params._asdict().items()},
                             num_heads=num_heads, mask=_arg("mask", mask), bias=_arg("bias", bias),
                             legacy_mask=_arg("legacy_mask", legacy_mask),
                             key_padding_mask=_arg("key_padding_mask", key_padding_mask),
                             causal=causal, scale=scale, num_kv_heads=num_kv_heads)
        precision = str(query.dtype)
        res = self._mha(query, key, value, oracle.Params(*params), num_heads=num_heads,
                        num_kv_heads=num_kv_heads, precision=precision, mask=mask, bias=bias,
                        legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
                        causal=causal, scale=scale, **features)
        return self._outputs(res, query.dtype, lse, features)

    # -- what the broken variants override ----------------------------------------------------------

    def _attention(self, q, k, v, **kwargs) -> oracle.AttentionResult:
        """The oracle's attention in the arrays' precision (with ``sinks``: spec 1.3's oracle)."""
        if kwargs.get("sinks") is not None:
            return oracle_vjp.attention_with_sinks(q, k, v, precision=str(q.dtype), **kwargs)
        kwargs.pop("sinks", None)
        return oracle.attention_result(q, k, v, precision=str(q.dtype), **kwargs)

    def attention_vjp(self, q, k, v, d_output, *, d_lse=None, bias_grad=False, **kwargs) -> dict:
        """Spec 1.3's analytic gradient (``oracle_vjp.attention_vjp``) in the arrays' precision,
        by the protocol's names."""
        res = self._vjp(q, k, v, d_output, d_lse=d_lse, bias_grad=bias_grad, **kwargs)
        return {name: g.astype(q.dtype) for name, g in zip(VJP_NAMES, res) if g is not None}

    def _vjp(self, q, k, v, d_output, **kwargs) -> oracle_vjp.AttentionVJP:
        """What the broken variants of the backward pass override."""
        return oracle_vjp.attention_vjp(q, k, v, d_output, precision=str(q.dtype), **kwargs)

    # -- spec 1.4: merging partial states (MERGE) ----------------------------------------------------
    merge_conventions = serving.MERGE_CONVENTIONS

    def merge_states(self, outputs, lses, *, sinks=None, lse_base="e", empty_lse="-inf",
                     lse_layout="batch"):
        """The oracle's merge (``oracle_serving.merge_states``) after MERGE-6's checks."""
        conventions = {"lse_base": lse_base, "empty_lse": empty_lse, "lse_layout": lse_layout}
        outputs, lses = serving.check_call(NUMPY_BACKEND.ops, outputs, lses, sinks, conventions)
        out, lse = self._merge(outputs, lses, sinks, conventions)
        return out.astype(outputs[0].dtype), lse.astype(outputs[0].dtype)

    def _merge(self, outputs, lses, sinks, conventions: dict):
        """What the broken merges override: (out, lse) in the arrays' precision."""
        return oracle_serving.merge_states(outputs, lses, sinks=sinks,
                                           precision=str(outputs[0].dtype), **conventions)

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal=False, scale=None):
        """The oracle's paged attention (``oracle_serving.paged_attention``) after PAGE-4's
        checks."""
        serving.check_paged(NUMPY_BACKEND, q, k_pages, v_pages, block_table, seq_lens,
                            query_start_loc, causal)
        return self._paged(q, k_pages, v_pages, block_table, seq_lens, query_start_loc,
                           causal, scale).astype(q.dtype)

    def _paged(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, causal, scale):
        """What the broken paged attentions override."""
        return oracle_serving.paged_attention(q, k_pages, v_pages, block_table, seq_lens,
                                              query_start_loc, causal=causal, scale=scale,
                                              precision=str(q.dtype))

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        """The oracle's page write (``oracle_serving.write_pages``) after PAGE-4's checks."""
        slots = serving.check_write(NUMPY_BACKEND, k_pages, v_pages, k, v, slot_mapping)
        return self._write(k_pages, v_pages, k, v, slots)

    def _write(self, k_pages, v_pages, k, v, slots):
        """What the broken page writes override."""
        return oracle_serving.write_pages(k_pages, v_pages, k, v, slots)

    def _mha(self, query, key, value, params, **kwargs) -> oracle.AttentionResult:
        return oracle.multi_head_attention_result(query, key, value, params, **kwargs)

    @staticmethod
    def _outputs(res: oracle.AttentionResult, dtype, lse, features):
        """(output, weights), or AttentionOutputs with the log-sum-exp and the present cache."""
        if lse not in (False, True):
            raise ValueError(f"lse must be True or False, got {lse!r}")
        out, weights = res.output.astype(dtype), res.weights.astype(dtype)
        if not lse and features.get("past_key") is None:
            return out, weights
        cached = res.present_key is not None
        return AttentionOutputs(
            out, weights, res.lse.astype(dtype) if lse else None,
            res.present_key.astype(dtype) if cached else None,
            res.present_value.astype(dtype) if cached else None,
            res.present_lengths if cached else None)


#: the protocol's names of oracle_vjp.AttentionVJP's fields, in order
VJP_NAMES = ("q", "k", "v", "sinks", "bias", "past_key", "past_value")

ORACLE_REFERENCE = OracleBackend()
