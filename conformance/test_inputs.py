"""Chapter INPUT: operations leave the caller's arrays exactly as they were (INPUT-1).

Each test converts a case's inputs with ``cell.arr``, keeps NumPy copies of them as the backend
holds them (``to_numpy`` of each, copied: a backend's ``to_numpy`` may share memory with its
array), calls one operation, converts every input back and compares it bit for bit with its copy
(a NaN still NaN). Inputs that are one array stay one array: self-attention passes ``query`` as
``key`` and ``value`` too.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths, d_model query width.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from mhaspec.backends import MHAParams
from mhaspec.conformance import covering, harness, vjp
from mhaspec.conformance.judge import same_bits
from mhaspec.conformance.strategies import case_specs, feature_specs
from mhaspec.spec import oracle

ALL_MASKS = {"masks": True, "bias": True, "legacy": True, "key_padding": True, "causal": True,
             "custom_scale": True}




class Inputs:
    """The backend arrays of one call by argument name, with a NumPy copy of each taken before the
    call (one array passed as several arguments is converted once and kept under each name)."""

    def __init__(self, cell, **arrays):
        self.cell = cell
        converted: dict[int, object] = {}
        self.arrays = {}
        for name, x in arrays.items():
            if x is None:
                continue
            if id(x) not in converted:
                converted[id(x)] = cell.arr(x)
            self.arrays[name] = converted[id(x)]
        self.copies = {n: np.array(self._numpy(a), copy=True) for n, a in self.arrays.items()}

    def __getitem__(self, name: str):
        return self.arrays.get(name)

    def _numpy(self, a) -> np.ndarray:
        return np.asarray(self.cell.backend.to_numpy(a))

    def expect_unchanged(self, op: str) -> None:
        changed = [n for n, a in self.arrays.items() if not same_bits(self.copies[n], self._numpy(a))]
        assert not changed, (f"[INPUT-1] {self.cell.id}: {op} modified its argument(s) "
                             f"{', '.join(repr(n) for n in changed)}")

    def params(self) -> MHAParams:
        return MHAParams(*(self[n] for n in MHAParams._fields))


def _masks(inputs: Inputs, case) -> dict:
    kw = case.mask_kwargs()
    return {**kw, **{n: inputs[n] for n in ("mask", "bias", "legacy_mask", "key_padding_mask")}}


def with_key_padding(spec):
    """``spec`` with a key padding mask wherever it may have one (not beside the legacy mask): every
    argument that can be present is, so every one is checked."""
    return spec if spec.legacy_shape is not None else spec._replace(key_padding=True)


def _mha_inputs(cell, case, *, one_array: bool = False, **extra) -> Inputs:
    query = case.query
    key, value = (query, query) if one_array else (case.key, case.value)
    return Inputs(cell, query=query, key=key, value=value, **case.params._asdict(), mask=case.mask,
                  bias=case.bias, legacy_mask=case.legacy_mask,
                  key_padding_mask=case.key_padding_mask, **extra)


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("heads")
@covering.cover("INPUT-1")
@given(spec=case_specs())
def test_split_heads_and_combine_heads_leave_their_input_unchanged(cell, spec):
    case = cell.case(spec)
    harness.note("heads", case.spec)
    split = Inputs(cell, x=oracle.combine_heads(case.q))  # (B, L_q, h*d_k)
    cell.call("split_heads", split["x"], spec.heads)
    split.expect_unchanged("split_heads")
    combine = Inputs(cell, x=case.q)  # (B, h, L_q, d_k)
    cell.call("combine_heads", combine["x"])
    combine.expect_unchanged("combine_heads")


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("sdpa")
@covering.cover("INPUT-1")
@given(spec=case_specs(**ALL_MASKS))
def test_attention_leaves_its_inputs_unchanged(cell, spec):
    case = cell.case(with_key_padding(spec), "sdpa")
    harness.note("sdpa", case.spec)
    inputs = Inputs(cell, q=case.q, k=case.k, v=case.v, mask=case.mask, bias=case.bias,
                    legacy_mask=case.legacy_mask, key_padding_mask=case.key_padding_mask)
    cell.call("scaled_dot_product_attention", inputs["q"], inputs["k"], inputs["v"],
              spec=case.spec, **_masks(inputs, case))
    inputs.expect_unchanged("scaled_dot_product_attention")


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("mha")
@covering.cover("INPUT-1")
@given(spec=case_specs(**ALL_MASKS))
def test_multi_head_attention_leaves_its_inputs_unchanged(cell, spec):
    case = cell.case(with_key_padding(spec))
    harness.note("mha", case.spec)
    inputs = _mha_inputs(cell, case)
    cell.call("multi_head_attention", inputs["query"], inputs["key"], inputs["value"],
              inputs.params(), num_heads=spec.heads, spec=case.spec, **_masks(inputs, case))
    inputs.expect_unchanged("multi_head_attention")


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("mha")
@given(spec=case_specs(cross=False, **ALL_MASKS))
def test_self_attention_leaves_its_one_input_unchanged(cell, spec):
    """query is key is value: one array, read three times (and fused projections, MHA-2)."""
    case = cell.case(with_key_padding(spec))
    harness.note("mha", case.spec)
    inputs = _mha_inputs(cell, case, one_array=True)
    assert inputs["query"] is inputs["key"] is inputs["value"]
    cell.call("multi_head_attention", inputs["query"], inputs["key"], inputs["value"],
              inputs.params(), num_heads=spec.heads, spec=case.spec, **_masks(inputs, case))
    inputs.expect_unchanged("multi_head_attention (self-attention)")


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("grad")
@pytest.mark.dtypes("float64", "float32")
@covering.cover("INPUT-1")
@given(spec=case_specs(**ALL_MASKS))
def test_the_gradient_leaves_its_inputs_and_cotangent_unchanged(cell, spec):
    case = cell.case(spec)
    harness.note("vjp", case.spec)
    s = case.spec
    cotangent = np.random.default_rng([s.seed, 7]).standard_normal((s.batch, s.len_q, s.d_out))
    inputs = _mha_inputs(cell, case, one_array=s.self_attention, cotangent=cotangent)
    cell.call("mha_vjp", inputs["query"], inputs["key"], inputs["value"], inputs.params(),
              inputs["cotangent"], num_heads=s.heads, spec=s, **_masks(inputs, case))
    inputs.expect_unchanged("mha_vjp")


@pytest.mark.clause("INPUT-1")
@pytest.mark.requires("sdpa", "attention_vjp")
@pytest.mark.dtypes("float64", "float32")
@covering.cover("INPUT-1")
@given(spec=feature_specs(allow=("gqa", "softcap", "window", "alibi", "segments", "cache"),
                          masks=True, bias=True, key_padding=True, causal=True,
                          custom_scale=True))
def test_the_attention_gradient_leaves_its_inputs_and_cotangents_unchanged(impl, spec):
    """attention_vjp (spec 1.3) with every argument the backend claims: the masks, the features'
    arrays, the cotangents d_output and d_lse ("lse"), the sinks ("sink") and a bias whose own
    gradient is asked for ("bias_grad")."""
    case = impl.case(with_key_padding(spec), "sdpa")
    harness.note("attention_vjp", case.spec)
    claims = harness.op_capabilities(impl.backend, "sdpa")
    d_output, d_lse = vjp.cotangents(case, d_lse="lse" in claims)
    sinks = vjp.sinks_of(case, 1.0) if "sink" in claims else None
    kwargs = vjp.kwargs_of(case)
    arrays = {n: x for n, x in kwargs.items() if isinstance(x, np.ndarray)}
    inputs = Inputs(impl, q=case.q, k=case.k, v=case.v, d_output=d_output, d_lse=d_lse,
                    sinks=sinks, **arrays)
    flags = {n: x for n, x in kwargs.items() if n not in arrays}
    extra = {"sinks": inputs["sinks"]} if sinks is not None else {}
    if "bias_grad" in claims and case.bias is not None:
        extra["bias_grad"] = True
    impl.call("attention_vjp", inputs["q"], inputs["k"], inputs["v"], inputs["d_output"],
              d_lse=inputs["d_lse"], spec=case.spec, **{n: inputs[n] for n in arrays}, **flags,
              **extra)
    inputs.expect_unchanged("attention_vjp")
