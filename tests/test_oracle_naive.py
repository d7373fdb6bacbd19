"""The oracle's vectorised steps give the textbook loops' results bit for bit, in every precision.

The textbook form below is the naive algorithm as NUM-3 states it: one head and one query row at a
time, and for "float32-sequential" each dot product summed left to right with a rounding after
every multiply and add. The oracle computes the same roundings across rows, heads and batch items
at once; any difference in a single bit would change the reference error NUM-3 measures.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mhaspec.spec import oracle

PRECISIONS = ("float64", "float32", "float32-sequential", "float16", "bfloat16")
ROUND = {"float16": lambda x: np.asarray(x).astype(np.float16).astype(np.float32),
         "bfloat16": oracle.round_to_bfloat16}


def _round(precision):
    return ROUND.get(precision, lambda x: x)


def _dtype(precision):
    return np.float64 if precision == "float64" else np.float32


def textbook_matmul(a, b, precision):
    """a (..., n, d) @ b (d, m) or (..., d, m): BLAS, or dot products summed left to right."""
    if precision != "float32-sequential":
        if a.ndim > 2 and b.ndim == 2:  # the oracle's projections: one GEMM over B * L rows
            return _round(precision)((a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[-1:]))
        return _round(precision)(a @ b)
    out = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,))[:-1]
                   + (a.shape[-2], b.shape[-1]), dtype=np.float32)
    for j in range(a.shape[-1]):
        out = out + a[..., j:j + 1] * b[..., j:j + 1, :]
    return out


def textbook_softmax(logits, allowed, precision):
    """Row by row over the allowed, finite logits of one head (L_q, L_k); empty rows are zero."""
    rnd = _round(precision)
    allowed = allowed & (logits != -np.inf)
    weights = np.zeros_like(logits)
    for row in range(logits.shape[0]):
        keep = allowed[row]
        if keep.any():
            e = rnd(np.exp(rnd(logits[row, keep] - rnd(np.max(logits[row, keep])))))
            weights[row, keep] = rnd(e / rnd(np.sum(e)))
    return weights


def textbook_attention(q, k, v, precision, *, mask=None, bias=None, causal=None):
    """q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v), head by head."""
    rnd, dt = _round(precision), _dtype(precision)
    q, k, v = (rnd(np.asarray(x, dtype=dt)) for x in (q, k, v))
    b, h, l_q, d_k = q.shape
    allowed = oracle.allowed_mask(b, h, l_q, k.shape[2], mask=mask, causal=causal)
    out = np.zeros((b, h, l_q, v.shape[3]), dtype=dt)
    weights = np.zeros(allowed.shape, dtype=dt)
    for bi in range(b):
        for hi in range(h):
            logits = rnd(textbook_matmul(q[bi, hi], k[bi, hi].T, precision) * dt(1 / math.sqrt(d_k)))
            if bias is not None:
                logits = rnd(logits + rnd(np.asarray(bias, dtype=dt))[bi, hi])
            weights[bi, hi] = textbook_softmax(logits, allowed[bi, hi], precision)
            out[bi, hi] = textbook_matmul(weights[bi, hi], v[bi, hi], precision)
    return out, weights


def assert_same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # equal values, NaN where NaN


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("seed", range(6))
def test_attention_equals_the_textbook_loops(precision, seed):
    rng = np.random.default_rng(seed)
    for _ in range(12):
        b, h, l_q, l_k, d_k, d_v = (int(x) for x in rng.integers(1, [3, 4, 40, 40, 24, 24]))
        q = rng.standard_normal((b, h, l_q, d_k)) * 10 ** rng.uniform(-1, 1.5)
        k, v = rng.standard_normal((b, h, l_k, d_k)), rng.standard_normal((b, h, l_k, d_v))
        kw = {"mask": rng.random((b, 1, l_q, l_k)) < 0.7 if rng.random() < 0.6 else None,
              "causal": ("top_left", "bottom_right", None)[int(rng.integers(3))],
              "bias": np.where(rng.random((b, h, l_q, l_k)) < 0.1, -np.inf,
                               rng.standard_normal((b, h, l_q, l_k))) if rng.random() < 0.4 else None}
        got = oracle.attention(q, k, v, precision=precision, **kw)
        want = textbook_attention(q, k, v, precision, **kw)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_multi_head_attention_equals_the_textbook_loops(precision):
    """Projections in the working precision, then attention per head, then the output GEMM."""
    rng = np.random.default_rng(5)
    for _ in range(6):
        b, h, l_q, l_k, d = (int(x) for x in rng.integers(1, [3, 5, 30, 30, 9]))
        x, y = rng.standard_normal((b, l_q, h * d)), rng.standard_normal((b, l_k, h * d))
        p = oracle.Params(*(rng.standard_normal((h * d, h * d)) for _ in range(4)),
                          *(rng.standard_normal(h * d) for _ in range(4)))
        rnd, dt = _round(precision), _dtype(precision)
        cast = [rnd(np.asarray(t, dtype=dt)) for t in (x, y, *p)]
        xc, yc, (wq, wk, wv, wo, bq, bk, bv, bo) = cast[0], cast[1], cast[2:]
        heads, weights = [], []
        for i in range(h):
            cols = slice(i * d, (i + 1) * d)
            proj = [rnd(textbook_matmul(inp, np.ascontiguousarray(w[:, cols]), precision) + bias[cols])
                    for inp, w, bias in ((xc, wq, bq), (yc, wk, bk), (yc, wv, bv))]
            out_i, w_i = textbook_attention(*(t[:, None] for t in proj), precision)
            heads.append(out_i[:, 0])
            weights.append(w_i[:, 0])
        want = rnd(textbook_matmul(np.concatenate(heads, axis=-1), wo, precision) + bo)
        got_out, got_w = oracle.multi_head_attention(x, y, y, p, num_heads=h, precision=precision)
        assert_same_bits(got_out, want)
        assert_same_bits(got_w, np.stack(weights, axis=1))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_row_of_minus_inf_bias_computes_no_invalid_value(precision):
    """A row whose every logit is -inf empties by its bias (MASK-9): output and weights 0, and
    NUM-3's softmax condition is that of the other rows (no 0 * -inf is evaluated, so no
    RuntimeWarning), in the 1.1 path and the path of spec 1.2's features alike."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) * 3 for n in (3, 5, 5))
    bias = rng.standard_normal((1, 2, 3, 5))
    bias[0, 0, 1] = -np.inf
    others = [0, 2]
    for attend in (oracle.attention, oracle.attention_result):
        info, info_others = {}, {}
        out, weights = attend(q, k, v, bias=bias, precision=precision, info=info)[:2]
        attend(q[:, :, others], k, v, bias=bias[:, :, others], precision=precision, info=info_others)
        assert np.all(out[0, 0, 1] == 0) and np.all(weights[0, 0, 1] == 0)
        assert info["logit_condition"] == pytest.approx(info_others["logit_condition"], rel=1e-6)
