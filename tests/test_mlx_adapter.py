"""``mlx-sdpa``: MLX's fused attention through the any-library adapter base
(:mod:`mhaspec.backends.foreign`): the ci suite in every dtype it claims (bfloat16 included, and
``attention_vjp`` by MLX's own autodiff), two wrong mappings rejected under their clauses
(tests/broken_mlx.py), the base's refusals, and the facts its declarations rest on, each
reproduced with MLX alone.

Everything that runs MLX is skipped, with the reason, when mlx is not installed
(``pip install 'mhaspec[mlx]'``, noxfile.py's tests session)."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from mhaspec import runner
from mhaspec.backends import optional

from adapter_helpers import outcomes_of
from mhaspec.backends.foreign import ForeignAdapter

HERE = pathlib.Path(__file__).parent
needs_mlx = pytest.mark.skipif(not optional.installed("mlx.core"),
                               reason="mlx is not installed (pip install 'mhaspec[mlx]')")


@needs_mlx
def test_the_suite_in_every_claimed_dtype_and_two_wrong_mappings(tmp_path):
    """ci profile, float32, float16 and bfloat16: mlx-sdpa passes every clause it claims but its
    two declared deviations (strict xfails: they really deviate), attention_vjp's clauses
    (GRAD-3 and on) by MLX's vjp included; swapped dq/dk fails GRAD-3 and a negated bias MASK-2."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = runner.run_subprocess(
        runner.suite_args(backends=["mlx-sdpa", "broken_mlx:SWAPPED_GRADIENTS",
                                    "broken_mlx:NEGATED_BIAS"], profile="ci",
                          extra=["-n", "0", "--tb=no"]),
        cwd=tmp_path, env=env, timeout=900)
    assert run.results, f"suite did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    found = outcomes_of(run.results)
    shipped = {c: o for (b, c), o in found.items() if b == "mlx-sdpa"}
    assert {c for c, o in shipped.items() if o & {"fail", "error"}} == set(), shipped
    assert {c for c, o in shipped.items() if o == {"deviation"}} == {
        "MASK-9", "MASK-11", "GRAD-7", "NUM-1"}, shipped
    assert {"GRAD-3", "GRAD-4", "GRAD-10"} <= {c for c, o in shipped.items() if o == {"pass"}}
    dtypes = {r["dtype"] for r in run.results if r["backend"] == "mlx-sdpa"
              and r["outcome"] == "pass" and "GRAD-3" in r["clauses"]}
    assert dtypes == {"float32", "float16", "bfloat16"}, dtypes
    assert "fail" in found[("mlx-sdpa-swapped-gradients", "GRAD-3")], found
    assert "fail" in found[("mlx-sdpa-negated-bias", "MASK-2")], found


@needs_mlx
def test_a_fully_masked_row_with_mlx_alone():
    """The declarations, with MLX alone: a row blocked by a boolean mask gives the mean of V
    (MASK-9), one blocked by -inf in an additive mask gives NaN (MASK-11) and NaN in dq
    (GRAD-7); float64 inputs give a float64 result 4e-9 to 1e-8 from a float64 evaluation (NUM-1: not
    float64 arithmetic)."""
    import mlx.core as mx

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 4)) for n in (2, 3, 3))
    allowed = np.array([[False, False, False], [True, True, False]])[None, None]
    as_mx = [mx.array(x.astype(np.float32)) for x in (q, k, v)]
    boolean = np.array(mx.fast.scaled_dot_product_attention(*as_mx, scale=0.5,
                                                            mask=mx.array(allowed)))
    np.testing.assert_allclose(boolean[0, 0, 0], v[0, 0].mean(axis=0), rtol=1e-6)
    additive = mx.array(np.where(allowed, 0.0, -np.inf).astype(np.float32))
    assert np.isnan(np.array(mx.fast.scaled_dot_product_attention(*as_mx, scale=0.5,
                                                                  mask=additive))[0, 0, 0]).all()
    _, (dq,) = mx.vjp(lambda x: mx.fast.scaled_dot_product_attention(x, *as_mx[1:], scale=0.5,
                                                                     mask=additive),
                      [as_mx[0]], [mx.ones((1, 1, 2, 4))])
    assert np.isnan(np.array(dq)[0, 0, 0]).all() and np.isfinite(np.array(dq)[0, 0, 1]).all()
    s = q @ k.transpose(0, 1, 3, 2) * 0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    got = np.array(mx.fast.scaled_dot_product_attention(
        *(mx.array(x, dtype=mx.float64) for x in (q, k, v)), scale=0.5))
    assert got.dtype == np.float64 and 1e-12 < np.abs(got - want).max() < 1e-6


def test_the_base_refuses_what_it_cannot_carry():
    """A capability the base has no path for, and attention_vjp without the library's vjp, are
    refused when the adapter is made, naming what is missing."""
    class Windowed(ForeignAdapter):
        capabilities = frozenset({"sdpa", "window"})

    class NoAutodiff(ForeignAdapter):
        capabilities = frozenset({"sdpa", "attention_vjp"})

    with pytest.raises(ValueError, match="'window'"):
        Windowed("windowed")
    with pytest.raises(ValueError, match="attention_vjp"):
        NoAutodiff("no-autodiff")


def test_bfloat16_inputs_are_numpy_bfloat16():
    """The base holds the suite's bfloat16 arrays as ml_dtypes' and reads them back as float32
    (as the JAX backends do)."""
    class Plain(ForeignAdapter):
        pass

    be = Plain("plain")
    x = be.asarray([1.5, 2.0], dtype="bfloat16")
    assert x.dtype.name == "bfloat16" and be.to_numpy(x).dtype == np.float32


def test_missing_mlx_is_one_line():
    """Loading the adapter without mlx names the package and the install line."""
    from load_errors import load_error_line

    line = load_error_line("mhaspec.backends.mlx_native:SDPA",
                           "import sys; sys.modules['mlx'] = None; sys.modules['mlx.core'] = None")
    assert line.endswith("mlx.core not installed: pip install 'mhaspec[mlx]'"), line


@needs_mlx
def test_the_documented_adapter_computes_what_mlx_sdpa_does():
    """docs/backends.md's ForeignAdapter block, run as written: the same output and gradients as
    the in-repo mlx-sdpa on a causal call with a bias."""
    import re

    from mhaspec.backends.mlx_native import SDPA

    page = (HERE.parent / "docs" / "backends.md").read_text("utf-8")
    section = page.split("## Any other library: `ForeignAdapter`", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict = {}
    exec(compile(block, "docs/backends.md", "exec"), namespace)
    documented = namespace["BACKEND"]
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4),
                                              (2, 1, 3, 5), (2, 2, 3, 4))]
    for be in (documented, SDPA):
        q, k, v, bias, d_out = (be.asarray(x, dtype="float32") for x in arrays)
        out = be.scaled_dot_product_attention(q, k, v, bias=bias, causal="bottom_right")[0]
        grads = be.attention_vjp(q, k, v, d_out, bias=bias, causal="bottom_right")
        if be is documented:
            want = (out, grads)
    np.testing.assert_array_equal(want[0], out)
    for name in ("q", "k", "v"):
        np.testing.assert_array_equal(want[1][name], grads[name])
