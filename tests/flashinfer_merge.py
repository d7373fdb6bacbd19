"""FlashInfer's merge of attention states, transcribed from its CUDA sources, as a backend: the peer
of MERGE's declared-base path (``merge_conventions``: ``lse_base`` "2" only).

FlashInfer keeps the log-sum-exp in base 2 (``include/flashinfer/attention/cascade.cuh:42``, "Both
s_a and s_b are logsumexp values with base 2") and lays states out by token: ``v`` (n, h, d), ``s``
(n, h); ``merge_state`` merges two (``MergeStateKernel``, cascade.cuh:44-74 at fb28d72),
``merge_states`` any number, ``V`` (n, N, h, d), ``S`` (n, N, h) (``MergeStatesKernel``,
cascade.cuh:219-262, folding ``state_t::merge`` of ``include/flashinfer/attention/state.cuh:53-65``
and ``normalize``, :75-83; ``get_lse``, :45). Two transcriptions:

- ``FIXED``: the sources at fb28d72, after PR 4401 (d7f2c64, 2026-08-20): every exponent
  difference clamped with ``max(x, -inf)`` (CUDA's ``max`` on floats is ``fmaxf``, which drops a
  NaN operand) and a zero denominator guarded, so two empty states merge to (0, -inf);
- ``BEFORE_4401``: the sources before it (d7f2c64^): no clamp and no guard, ``math::inf`` the
  finite sentinel 5e4 (``include/flashinfer/math.cuh:33``; ``state_t``'s initial maximum is
  -5e4): two empty states merge to NaN in ``merge_state`` and to a finite lse of about -5e4 in
  ``merge_states``.

The arithmetic is the kernels' with the cell's precision for ``float`` (float32 or wider), so the
suite judges the algorithm, not float32 against a float64 cell. Loaded with
``--backend flashinfer_merge:FIXED`` (tests/ on the path). Axis legend: B batch, h heads, L_q
queries, d_v value width, N states, n = B * L_q tokens.
"""

from __future__ import annotations

import numpy as np

from oracle_backend import OracleBackend

#: math::inf before PR 4401 (include/flashinfer/math.cuh: ``constexpr float inf = 5e4;``)
SENTINEL = 5e4


def merge_state(v_a, s_a, v_b, s_b, *, fixed: bool = True):
    """``MergeStateKernel``: v (n, h, d), s (n, h) base 2 -> (v_merged, s_merged)."""
    s_max = np.maximum(s_a, s_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        if fixed:  # ptx_exp2(max(s - s_max, -inf)); d_sum > 0 ? s / d_sum : 0
            a, b = np.exp2(np.fmax(s_a - s_max, -np.inf)), np.exp2(np.fmax(s_b - s_max, -np.inf))
            d_sum = a + b
            a_scale = np.where(d_sum > 0, a / np.where(d_sum > 0, d_sum, 1), 0)
            b_scale = np.where(d_sum > 0, b / np.where(d_sum > 0, d_sum, 1), 0)
        else:  # ptx_exp2(s - s_max); s / (s_a + s_b)
            a, b = np.exp2(s_a - s_max), np.exp2(s_b - s_max)
            d_sum = a + b
            a_scale, b_scale = a / d_sum, b / d_sum
        merged = a_scale[..., None] * v_a + b_scale[..., None] * v_b
        return merged, np.log2(d_sum) + s_max


def merge_states(v, s, *, fixed: bool = True):
    """``MergeStatesKernel``: V (n, N, h, d), S (n, N, h) base 2 -> (v_merged, s_merged)."""
    n, count, h, d = v.shape
    if count == 0:
        return np.zeros((n, h, d), v.dtype), np.full((n, h), -np.inf, s.dtype)
    if count == 1:
        return v[:, 0].copy(), s[:, 0].copy()
    inf = np.inf if fixed else SENTINEL
    m, dd, o = np.full((n, h), -inf, s.dtype), np.ones((n, h), s.dtype), np.zeros((n, h, d), v.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(count):  # state_t::merge(v, s, 1)
            m_prev, d_prev = m, dd
            m = np.fmax(m_prev, s[:, i])
            if fixed:
                f1, f2 = np.exp2(np.fmax(m_prev - m, -inf)), np.exp2(np.fmax(s[:, i] - m, -inf))
            else:
                f1, f2 = np.exp2(m_prev - m), np.exp2(s[:, i] - m)
            dd = d_prev * f1 + f2
            o = o * f1[..., None] + v[:, i] * f2[..., None]
        if fixed:  # normalize(): d > 0 ? 1 / d : 0
            o = o * np.where(dd > 0, 1 / np.where(dd > 0, dd, 1), 0)[..., None]
        else:
            o = o / dd[..., None]
        return o, m + np.log2(dd)  # get_lse()


class FlashInferMerge(OracleBackend):
    """The oracle's attention, and FlashInfer's merge for ``merge_states`` (base 2 only): the
    states go to FlashInfer's token layout, two through ``merge_state``, any other number through
    ``merge_states``. No sinks: FlashInfer's merges take none."""

    capabilities = OracleBackend.capabilities - {"sink"}
    merge_conventions = {"lse_base": ("2",)}

    def __init__(self, name: str, *, fixed: bool):
        super().__init__(name)
        self.fixed = fixed

    def _merge(self, outputs, lses, sinks, conventions):
        assert conventions["lse_base"] == "2" and sinks is None, conventions
        work = np.promote_types(outputs[0].dtype, np.float32)  # the kernels compute in float
        b, h, l_q, d = outputs[0].shape
        v = np.stack([o.astype(work).transpose(0, 2, 1, 3).reshape(b * l_q, h, d)
                      for o in outputs], axis=1)
        s = np.stack([x.astype(work).transpose(0, 2, 1).reshape(b * l_q, h) for x in lses], axis=1)
        if len(outputs) == 2:
            out, lse = merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], fixed=self.fixed)
        else:
            out, lse = merge_states(v, s, fixed=self.fixed)
        return (out.reshape(b, l_q, h, d).transpose(0, 2, 1, 3),
                lse.reshape(b, l_q, h).transpose(0, 2, 1))


FIXED = FlashInferMerge("flashinfer-merge", fixed=True)
BEFORE_4401 = FlashInferMerge("flashinfer-merge-before-4401", fixed=False)
