"""Why spec 1.2 has no clause for ONNX's ``softmax_precision`` (a float32 softmax for float16 inputs).

A clause "float16 / bfloat16 softmaxes accumulate in float32" is only worth writing if a test can
tell a kernel that follows it from one that does not. This test shows that NUM-3, the spec's
accuracy rule, cannot: two float16 attentions that differ only in the softmax, one evaluated in
float32 (ONNX ``softmax_precision=FLOAT``) and one evaluated in float16 with its row sum accumulated
left to right in float16, both conform at every row length, while the narrow one is measurably
less accurate on long rows. A bound sharp enough to separate them would fail correct kernels
(their NUM-3 ratios reach 6.0 in float16 and bfloat16, docs/tolerance.md). docs/onnx-peer.md
quotes the figures.

Axis legend: L_q queries, L_k keys, d head width (one batch item, one head).
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.conformance import tolerance
from mhaspec.spec import oracle

D = 64
L_Q = 16


def _attention_f16(q, k, v, *, softmax_in_float32: bool) -> np.ndarray:
    """q (L_q, d), k (L_k, d), v (L_k, d) float16 -> (L_q, d) float16: products accumulated in
    float32 and rounded once (as oracle precision "float16"); the softmax in float32 or in float16
    (each step rounded, the row sum accumulated left to right in float16)."""
    f16 = np.float16
    s = ((q.astype(np.float32) @ k.astype(np.float32).T) * np.float32(1 / np.sqrt(D))).astype(f16)
    if softmax_in_float32:
        s32 = s.astype(np.float32)
        e = np.exp(s32 - s32.max(axis=-1, keepdims=True))
        p = (e / e.sum(axis=-1, keepdims=True)).astype(f16)
    else:
        e = np.exp(s - s.max(axis=-1, keepdims=True)).astype(f16)
        total = np.add.accumulate(e, axis=-1, dtype=f16)[:, -1:]
        p = (e / total).astype(f16)
    return (p.astype(np.float32) @ v.astype(np.float32)).astype(f16)


def _num3(l_k: int, seed: int, logit_scale: float):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((L_Q, D)) * logit_scale).astype(np.float16)
    k, v = (rng.standard_normal((l_k, D)).astype(np.float16) for _ in range(2))
    args = (q[None, None], k[None, None], v[None, None])
    info: dict = {}
    want = oracle.attention(*args, info=info)[0][0, 0]
    naive = oracle.attention(*args, precision="float16")[0][0, 0].astype(np.float64)
    scale = max(float(np.max(np.abs(want))), float(np.max(np.abs(v.astype(np.float64)))))
    verdicts = {}
    for wide in (True, False):
        got = _attention_f16(q, k, v, softmax_in_float32=wide).astype(np.float64)
        verdicts[wide] = tolerance.judge(got, want, naive, dtype="float16", scale=scale,
                                         sum_length=max(l_k, D),
                                         condition=info.get("logit_condition", 1.0))
    return verdicts


@pytest.mark.parametrize("l_k", [8, 40, 256, 1024])
@pytest.mark.parametrize("logit_scale", [1.0, 5.0])
def test_num3_accepts_a_float16_softmax_as_well_as_a_float32_one(l_k, logit_scale):
    for seed in range(3):
        verdicts = _num3(l_k, seed, logit_scale)
        assert verdicts[True].ok, f"float32 softmax: {verdicts[True].describe()}"
        assert verdicts[False].ok, f"float16 softmax: {verdicts[False].describe()}"


def test_the_float16_softmax_is_less_accurate_on_long_rows():
    """The difference is real (so a clause would mean something), only not visible to NUM-3."""
    errors = {True: 0.0, False: 0.0}
    for seed in range(3):
        for wide, verdict in _num3(1024, seed, 1.0).items():
            errors[wide] = max(errors[wide], verdict.error)
    print(f"L_k = 1024: float16 softmax error {errors[False]:.2e}, float32 softmax {errors[True]:.2e}")
    assert errors[False] > 2 * errors[True]
