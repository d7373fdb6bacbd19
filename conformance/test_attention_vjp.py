"""Chapter GRAD, spec 1.3: the gradient of scaled dot-product attention (capability
"attention_vjp"), judged against ``spec/oracle_vjp.py`` under GRAD-1's rule (:mod:`.vjp`).

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths.

One test per clause, each drawing the feature its clause names: the plain call with every mask
(GRAD-3), grouped heads (GRAD-4), soft-capping (GRAD-5), each positional feature (GRAD-6), the
ways a row or a key loses every partner (GRAD-7, with exact zeros), a cotangent on the lse
(GRAD-8) and the bias's own gradient (GRAD-9); spec 1.4: every feature at once in float16 and
bfloat16 (GRAD-10; the other tests run in those dtypes too, judged by its rule) and a cotangent on
the lse honoured or refused, never dropped (GRAD-11).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given

from mhaspec.conformance import covering, vjp
from mhaspec.conformance.strategies import CaseSpec, feature_specs

pytestmark = [pytest.mark.requires("sdpa", "attention_vjp")]


@pytest.mark.clause("GRAD-3")
@covering.cover("GRAD-3")
@given(spec=feature_specs(masks=True, bias=True, key_padding=True, causal=True, custom_scale=True))
def test_attention_gradient_agrees_with_the_analytic_gradient(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-3")


@pytest.mark.clause("GRAD-4")
@pytest.mark.requires("gqa")
@covering.cover("GRAD-4")
@given(spec=feature_specs(require=("gqa",), masks=True, causal=True,
                            sizes=lambda z: z.heads > 1))
def test_grouped_key_value_gradients_sum_over_the_group(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-4")


@pytest.mark.clause("GRAD-5")
@pytest.mark.requires("softcap")
@covering.cover("GRAD-5")
@given(spec=feature_specs(require=("softcap",), masks=True, bias=True, logit_scales=(1.0, 10.0)))
def test_soft_cap_gradient_has_the_cap_derivative(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-5")


@pytest.mark.clause("GRAD-6")
@pytest.mark.requires("window")
@covering.cover("GRAD-6")
@given(spec=feature_specs(require=("window",), allow=("alibi", "softcap"), causal=True))
def test_window_is_a_constant(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-6")


@pytest.mark.clause("GRAD-6")
@pytest.mark.requires("alibi")
@given(spec=feature_specs(require=("alibi",), allow=("window", "softcap"), causal=True))
def test_alibi_is_a_constant(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-6")


@pytest.mark.clause("GRAD-6")
@pytest.mark.requires("segments")
@given(spec=feature_specs(require=("segments", "seq_lengths"), allow=("window",), causal=True))
def test_segments_and_lengths_are_constants(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-6")


@pytest.mark.clause("GRAD-6")
@pytest.mark.requires("kv_cache")
@given(spec=feature_specs(require=("cache",), allow=("window", "alibi"), causal=True))
def test_cache_gradients_go_back_to_the_past_keys_and_values(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-6")


@pytest.mark.clause("GRAD-7")
@pytest.mark.requires("masks")
@covering.cover("GRAD-7")
@given(spec=covering.specs("GRAD-7"))
def test_rows_and_keys_without_partners_get_exact_zeros(cell, spec):
    case = cell.case(spec, "sdpa")
    got = vjp.expect_gradients(cell, case, "GRAD-7")
    for name, dead in vjp.dead_rows(case).items():
        leaked = np.abs(got[name][dead]).max(initial=0.0)
        assert leaked == 0.0, (f"[GRAD-7] {cell.id}: gradient {leaked:.3e} for a row of '{name}' "
                               f"the output does not depend on; it must be exactly 0")


@pytest.mark.clause("GRAD-8")
@pytest.mark.requires("lse")
@covering.cover("GRAD-8")
@given(spec=feature_specs(allow=("softcap", "gqa"), masks=True, fully_masked=True, causal=True))
# always run: a cap of 0.5 on logits scaled by 100 saturates tanh, so 1 - tanh^2 is known only to
# about u absolutely (GRAD-5's path term; TensorFlow's float64 tanh is exactly 1 from about 18 on)
@example(spec=CaseSpec(batch=2, heads=3, len_q=2, len_k=8, d_k=4, d_v=8, mask_shape=(2, 8),
                       mask_density=0.7, fully_masked_rows=True, logit_scale=100.0, softcap=0.5,
                       seed=87))
def test_lse_cotangent_adds_dlse_times_p(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-8", d_lse=True)


@pytest.mark.clause("GRAD-9")
@pytest.mark.requires("bias", "bias_grad")
@covering.cover("GRAD-9")
@given(spec=feature_specs(bias=True, masks=True, allow=("softcap",),
                            require=("bias",)))
def test_bias_gradient_sums_over_its_broadcast_axes(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-9", bias_grad=True)


#: the features a 16-bit backward pass meets at once (GRAD-10)
FEATURES_16 = ("softcap", "window", "alibi", "gqa", "cache", "segments", "seq_lengths")


@pytest.mark.clause("GRAD-10")
@pytest.mark.dtypes("float16", "bfloat16")
@covering.cover("GRAD-10")
@given(spec=feature_specs(allow=FEATURES_16, masks=True, bias=True, key_padding=True, causal=True,
                          fully_masked=True, custom_scale=True))
def test_16bit_gradient_agrees_under_the_reference_evaluation(cell, spec):
    vjp.expect_gradients(cell, cell.case(spec, "sdpa"), "GRAD-10")


@pytest.mark.clause("GRAD-11")
@pytest.mark.requires("lse")
@covering.cover("GRAD-11")
@given(spec=feature_specs(allow=("softcap", "gqa"), masks=True, fully_masked=True, causal=True))
def test_lse_cotangent_is_honoured_or_refused_never_dropped(cell, spec):
    vjp.expect_d_lse_honoured_or_refused(cell, cell.case(spec, "sdpa"))
