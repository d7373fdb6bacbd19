"""``tinygrad-sdpa``: tinygrad's attention through the any-library adapter base
(:mod:`mhaspec.backends.foreign`): the ci suite in every dtype it claims (float64, float32, float16
and bfloat16, ``attention_vjp`` by tinygrad's own ``Tensor.gradient``), two wrong mappings rejected
under their clauses (tests/broken_tinygrad.py), and the facts its declarations rest on, each
reproduced with tinygrad alone.

Everything that runs tinygrad is skipped, with the reason, when tinygrad is not installed
(``pip install 'mhaspec[tinygrad]'``) or its CPU device has no clang to compile with (Debian:
``apt-get install --no-install-recommends clang``)."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from mhaspec import runner
from mhaspec.backends import optional

from adapter_helpers import outcomes_of

HERE = pathlib.Path(__file__).parent
needs_tinygrad = pytest.mark.skipif(
    not optional.installed("tinygrad") or shutil.which(os.environ.get("CC", "clang")) is None,
    reason="tinygrad is not installed (pip install 'mhaspec[tinygrad]') or its CPU device has no "
           "clang (apt-get install --no-install-recommends clang)")


def suite(tmp_path, backends, **options) -> dict[tuple[str, str], set[str]]:
    """The ci suite on ``backends`` in one process, tests/ on the path (the broken adapters)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = runner.run_subprocess(runner.suite_args(backends=backends, profile="ci", **options),
                                cwd=tmp_path, env=env, timeout=1800)
    assert run.results, f"suite did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.results


@needs_tinygrad
def test_the_suite_in_every_claimed_dtype(tmp_path):
    """ci profile, float64, float32, float16 and bfloat16: tinygrad-sdpa passes every clause it
    claims but its declared deviations (strict xfails: they really deviate), attention_vjp's
    clauses (GRAD-3 and on) by tinygrad's gradient included; GRAD-10 passes, since GRAD-7's NaN
    in the 16-bit cases with fully masked rows is GRAD-7's (conformance/governed.py)."""
    results = suite(tmp_path, ["tinygrad-sdpa"], extra=["-n", "0", "--tb=no"])
    shipped = {c: o for (b, c), o in outcomes_of(results).items() if b == "tinygrad-sdpa"}
    assert {c for c, o in shipped.items() if o & {"fail", "error"}} == set(), shipped
    assert {c for c, o in shipped.items() if o == {"deviation"}} == {
        "MASK-9", "MASK-13", "GRAD-7", "NUM-6"}, shipped
    assert {"GRAD-3", "GRAD-4", "GRAD-10"} <= {c for c, o in shipped.items() if o == {"pass"}}
    dtypes = {r["dtype"] for r in results if r["backend"] == "tinygrad-sdpa"
              and r["outcome"] == "pass" and "GRAD-3" in r["clauses"]}
    assert dtypes == {"float64", "float32", "float16", "bfloat16"}, dtypes


@needs_tinygrad
def test_two_wrong_mappings_are_rejected(tmp_path):
    """Swapped dq/dk fails GRAD-3 and a negated bias MASK-2 (float32, those two tests only: the
    whole suite on tinygrad takes minutes)."""
    results = suite(tmp_path, ["broken_tinygrad:SWAPPED_GRADIENTS", "broken_tinygrad:NEGATED_BIAS"],
                    dtypes="float32",
                    extra=["-n", "0", "--tb=no", "-k",
                           "test_attention_gradient_agrees_with_the_analytic_gradient or "
                           "test_bias_is_added_to_the_scaled_logits"])
    found = outcomes_of(results)
    assert "fail" in found[("tinygrad-sdpa-swapped-gradients", "GRAD-3")], found
    assert "fail" in found[("tinygrad-sdpa-negated-bias", "MASK-2")], found


@needs_tinygrad
def test_large_bfloat16_logits_give_a_nan_row_with_tinygrad_alone():
    """Seen in a certify-profile run (NUM-4, bfloat16, seed 2857987508) whose NUM-4 case reached
    logits of 4.5e4, past the 10^4 NUM-4 covers (its test then drew logits with a spread of 10^4;
    it now bounds them, tests/test_large_logit_cases.py): so no deviation of spec 1.4, a
    behaviour past its range. With logits of a few 10^4 one row of five is NaN although no key is
    masked and every value is 1. The row maximum the softmax subtracts is rounded to bfloat16
    while the logits it is subtracted from are not, so at that magnitude (a bfloat16 ulp of 256)
    every exponential of a row can underflow and the row divides 0 by 0 (tinygrad 0.14.0, its
    bfloat16 emulation); up to 10^4 the rounding moves the maximum by at most 32 and no row
    underflows."""
    from tinygrad import Context, Tensor, dtypes

    def bf16(values):
        return Tensor(np.array(values, np.float32).reshape(1, 1, -1, 1)).cast(dtypes.bfloat16)

    queries = np.array([266, -19, -58.5, 137, 111.5])
    k, v = bf16([29.75, -27, 169, 138, 95]), bf16([1.0] * 5)
    with Context(EMULATED_DTYPES="bfloat16"):
        out = bf16(queries).scaled_dot_product_attention(k, v).cast(dtypes.float32).numpy().ravel()
        within = bf16(queries * 0.22).scaled_dot_product_attention(k, v)  # logits up to 9,890
        within = within.cast(dtypes.float32).numpy().ravel()
    assert np.isnan(out[0]) and np.allclose(out[1:], 1.0, rtol=1e-2), out
    assert np.allclose(within, 1.0, rtol=1e-2), within


@needs_tinygrad
def test_masked_rows_and_keys_with_tinygrad_alone():
    """The masking declarations, with tinygrad alone: a row that a boolean mask empties is NaN
    (MASK-9: the op turns the mask into -inf), and its backward NaN in that row's dq and in every
    key's dk and dv, with no cotangent on the row (GRAD-7); a NaN key behind
    the mask makes every row NaN (MASK-13)."""
    from tinygrad import Tensor

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 4)) for n in (2, 3, 3))
    allowed = Tensor(np.array([[False, False, False], [True, True, False]])[None, None],
                     device="CPU")
    q_t, k_t, v_t = (Tensor(x, device="CPU") for x in (q, k, v))
    out = q_t.scaled_dot_product_attention(k_t, v_t, attn_mask=allowed)
    assert np.isnan(out.numpy()[0, 0, 0]).all() and np.isfinite(out.numpy()[0, 0, 1]).all()
    d_out = np.ones((1, 1, 2, 4))
    d_out[0, 0, 0] = 0  # no cotangent on the empty row: its NaN still reaches every key
    dq, dk, dv = out.gradient(q_t, k_t, v_t, gradient=Tensor(d_out, device="CPU"))
    assert np.isnan(dq.numpy()[0, 0, 0]).all() and np.isfinite(dq.numpy()[0, 0, 1]).all()
    assert np.isnan(dk.numpy()).any(axis=-1).all() and np.isnan(dv.numpy()).any(axis=-1).all()

    k_nan = k.copy()
    k_nan[0, 0, 2, 0] = np.nan  # key 2, excluded from row 1 by the mask
    out = q_t.scaled_dot_product_attention(Tensor(k_nan, device="CPU"), v_t, attn_mask=allowed)
    assert np.isnan(out.numpy()[0, 0, 1]).all()  # the spec: row 1 as without the NaN key


@needs_tinygrad
def test_a_softmax_over_one_key_is_one_with_tinygrad_alone():
    """NUM-6, and MASK-9 with one key, with tinygrad alone: a softmax over an axis of one element
    is 1 whatever the element (NaN, inf, -inf), so a query whose one logit is NaN or +inf, or
    whose one key is masked, gets v, not NaN (the spec: NaN, and 0 for the masked row)."""
    from tinygrad import Tensor

    for x in (np.nan, np.inf, -np.inf):
        assert Tensor(np.array([x]), device="CPU").softmax().numpy().tolist() == [1.0]
    q, k, v = np.array([[[[-np.inf]]]]), np.array([[[[-0.5]]]]), np.array([[[[0.25]]]])
    out = Tensor(q, device="CPU").scaled_dot_product_attention(Tensor(k, device="CPU"),
                                                                Tensor(v, device="CPU"))
    assert out.numpy().item() == 0.25  # the logit is +inf: the spec's softmax gives NaN
    blocked = Tensor(np.array([[[[False]]]]), device="CPU")
    out = Tensor(np.ones((1, 1, 1, 1)), device="CPU").scaled_dot_product_attention(
        Tensor(k, device="CPU"), Tensor(v, device="CPU"), attn_mask=blocked)
    assert out.numpy().item() == 0.25  # the row has no allowed key: the spec gives 0


def test_missing_tinygrad_is_one_line():
    """Loading the adapter without tinygrad names the package and the install line."""
    from load_errors import load_error_line

    line = load_error_line("mhaspec.backends.tinygrad_native:SDPA",
                           "import sys; sys.modules['tinygrad'] = None")
    assert line.endswith("tinygrad not installed: pip install 'mhaspec[tinygrad]'"), line
