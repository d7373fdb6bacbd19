"""The torch SDPA adapters' backward pass (spec 1.3, capability "attention_vjp") is the kernel's own,
and the suite rejects one that is not.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d_k / d_v widths.
"""

from __future__ import annotations

import numpy as np
import pytest

from mhaspec.spec import oracle_vjp
from suite_runner import run_suite

torch = pytest.importorskip("torch")

import broken_native_vjp  # noqa: E402 (torch adapters)
from mhaspec.backends import torch_kernels  # noqa: E402

#: adapter -> the aten ops its attention_vjp must run: the kernel and its backward
KERNEL_OPS = {
    torch_kernels.MATH: {"aten::_scaled_dot_product_attention_math",
                         "aten::_softmax_backward_data"},
    torch_kernels.FLASH_CPU: {"aten::_scaled_dot_product_flash_attention_for_cpu",
                              "aten::_scaled_dot_product_flash_attention_for_cpu_backward"},
}


def _case():
    """q (1, 4, 3, 5), k (1, 2, 4, 5), v (1, 2, 4, 6): two groups of two query heads; query row 1
    of batch item 0 has no allowed key and key 3 no query (GRAD-7's exact zeros)."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 4, 3, 5)), rng.standard_normal((1, 2, 4, 5)), \
        rng.standard_normal((1, 2, 4, 6))
    mask = np.ones((1, 1, 3, 4), bool)
    mask[..., 1, :] = False
    mask[..., 3] = False
    return q, k, v, mask, rng.standard_normal((1, 4, 3, 6))


@pytest.mark.parametrize("backend", list(KERNEL_OPS), ids=lambda b: b.name)
def test_the_gradient_is_the_kernel_s_own_backward(backend):
    q, k, v, mask, d_out = _case()
    t = {n: backend.asarray(x, dtype="float64") for n, x in
         (("q", q), ("k", k), ("v", v), ("d_out", d_out))}
    m = backend.asarray(mask, dtype="bool")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = backend.attention_vjp(t["q"], t["k"], t["v"], t["d_out"], mask=m)
    ran = {e.key for e in prof.key_averages()}
    assert KERNEL_OPS[backend] <= ran, f"missing {sorted(KERNEL_OPS[backend] - ran)}"
    want = oracle_vjp.attention_vjp(q, k, v, d_out, mask=mask)
    for name, field in (("q", "dq"), ("k", "dk"), ("v", "dv")):
        np.testing.assert_allclose(backend.to_numpy(got[name]), getattr(want, field),
                                   rtol=1e-10, atol=1e-12)
    assert not backend.to_numpy(got["q"])[0, :, 1].any()
    assert not backend.to_numpy(got["k"])[0, :, 3].any()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    refs = [f"broken_native_vjp:{attr}" for attr in broken_native_vjp.EXPECTED]
    return run_suite(tmp_path_factory.mktemp("suite"), refs, "-k", "test_attention_vjp",
                     "--mhaspec-dtypes", "float64", "-n", "0")


@pytest.mark.parametrize("attr", sorted(broken_native_vjp.EXPECTED))
def test_a_backward_that_is_not_the_kernel_s_fails_under_its_clause(results, attr):
    name, failing, passing = broken_native_vjp.EXPECTED[attr]
    outcomes: dict[str, set[str]] = {}
    for r in results:
        if r["backend"] == name and r["device"] == "cpu":
            for c in r["clauses"]:
                outcomes.setdefault(c, set()).add(r["outcome"])
    assert "fail" in outcomes.get(failing, set()), f"{name}: {outcomes}"
    assert all(outcomes.get(c) == {"pass"} for c in passing), f"{name}: {outcomes}"
