"""The float64 oracle against ONNX's own Attention test cases (the peer check of spec 1.2).

The onnx wheel ships the case generators of its node tests, not their data:
``onnx.backend.test.case.node.attention`` builds every case when the module is imported (its
metaclass seeds ``np.random.seed(0)`` before each ``export_*``) and hands it to ``expect``. We
replace that ``expect`` with a recorder, import the module afresh, and so hold every case's node
(attributes), inputs and ONNX's expected outputs.

Each case is mapped onto the oracle (:func:`oracle_call`, the table of docs/onnx-peer.md) and every
output the spec can express is compared:

- float32: ``|y - y*| <= 1e-5 + 1e-5 |y*|`` element-wise. ONNX's expected values are its float32
  reference evaluation; with inputs in [0, 1), rows of at most d_k = 8 products and L_K <= 18
  softmax terms, its rounding error is below (d_k + L_K + 4) u max|V| ~ 2e-6 (u = 2^-24), so the
  bound has a margin of 5x over the worst case (the largest error observed is printed by
  ``test_accounting``, about 3e-7), while a wrong mask, offset, head mapping or softcap order moves
  outputs by 1e-2 or more.
- float16 / bfloat16: NUM-3, the spec's own rule: ``e <= K e_ref + C u kappa S + C lambda N`` with
  ``e_ref`` the error of the oracle's naive algorithm run in that dtype
  (``oracle.attention_result(..., precision=dtype)``), kappa the softmax condition and S the largest
  magnitude of the output and the attended values (1 for weights).
- present_key / present_value: exactly (a copy, no arithmetic).

A second, much sharper check runs ONNX's reference implementation (the public
``onnx.reference.ReferenceEvaluator``) on each case's inputs converted to float64 and requires
agreement within 1e-14; the cases where ONNX's float64 evaluation keeps float32 accuracy are listed
in ``FLOAT64_DISAGREEMENTS`` with the clause and a test that reproduces the cause.

A case output the spec cannot express must be listed in ``UNCHECKED_OUTPUTS`` and a case that
disagrees in ``DISAGREEMENTS`` (with the clause that explains it); a case that is neither checked nor
listed fails, and so does a stale entry in either table.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

import numpy as np
import pytest

from mhaspec.conformance import tolerance
from mhaspec.spec import oracle

onnx = pytest.importorskip("onnx")

#: ONNX Attention attributes and what carries them in mhaspec (docs/onnx-peer.md).
MAPPED_ATTRIBUTES = {"scale", "is_causal", "q_num_heads", "kv_num_heads", "softcap",
                     "left_window_size", "right_window_size", "qk_matmul_output_mode",
                     "softmax_precision"}

#: Outputs the spec cannot express, per case: the qk_matmul_output of modes 0-2 (the logits before
#: or after softcap/bias). Mode 3 is the weights (SDPA-4) and is checked.
_LOGITS = ("qk_matmul_output_mode {mode}: the logits {what} are not an output of the spec "
           "(deliberately: the spec returns the weights P, SDPA-4, and the per-row log-sum-exp, "
           "LSE-1; raw logits are an implementation's intermediate)")
#: qk_matmul_output_mode -> (what the logits are then, the ONNX cases that output them)
_LOGIT_CASES = {
    0: ("s QK^T (softcapped when softcap is set)",
        ("test_attention_4d_with_qk_matmul", "test_attention_4d_with_past_and_present_qk_matmul",
         "test_attention_3d_with_past_and_present_qk_matmul")),
    1: ("after softcap",
        ("test_attention_4d_with_qk_matmul_softcap",
         "test_attention_3d_with_past_and_present_qk_matmul_softcap")),
    2: ("after softcap plus mask and bias",
        ("test_attention_4d_with_qk_matmul_bias", "test_attention_3d_with_past_and_present_qk_matmul_bias",
         *(f"test_attention_4d_with_past_and_present_qk_matmul_bias{tail}"
           for tail in ("", "_3d_mask", "_4d_mask", "_3d_mask_causal", "_4d_mask_causal")))),
}
UNCHECKED_OUTPUTS: dict[str, dict[str, str]] = {
    case: {"qk_matmul_output": _LOGITS.format(mode=mode, what=what)}
    for mode, (what, cases) in _LOGIT_CASES.items() for case in cases}

#: Cases where the oracle and ONNX's expected output disagree: case -> (clause, explanation).
DISAGREEMENTS: dict[str, tuple[str, str]] = {}

FLOAT32_TOLERANCE = 1e-5
#: ONNX's reference run in float64 on the same inputs: rounding error below about
#: (d_k + L_K + 4) u64 max|V| ~ 4e-15; agreeing cases differ by at most 4.4e-16 (measured).
FLOAT64_TOLERANCE = 1e-14

_SCALE_SQRT = ("NUM-2: ONNX's reference evaluates sqrt(scale) in float32 (the attribute is a float32 "
               "and np.sqrt keeps its type) and multiplies Q and K by it, so the effective scale is "
               "fl32(sqrt(s))^2, off by up to 2^-23 relative: float32 accuracy in a float64 "
               "computation")
#: Cases where ONNX's reference evaluated in float64 differs from the float64 oracle: case -> reason.
FLOAT64_DISAGREEMENTS: dict[str, str] = {
    "test_attention_4d_scaled": _SCALE_SQRT,
    "test_attention_4d_gqa_scaled": _SCALE_SQRT,
    "test_attention_4d_diff_heads_sizes_scaled": _SCALE_SQRT,
    "test_attention_3d_scaled": _SCALE_SQRT,
    "test_attention_3d_gqa_scaled": _SCALE_SQRT,
    "test_attention_3d_diff_heads_sizes_scaled": _SCALE_SQRT,
    "test_attention_24_qk_matmul_output_mode3_softmax_precision": (
        "NUM-3 by request: softmax_precision=FLOAT asks for the softmax in float32, which a float64 "
        "result then carries (a precision choice the spec does not offer in float64)"),
}


class OnnxCase(NamedTuple):
    """One regenerated ONNX node test: attributes, inputs and expected outputs by ONNX name."""

    name: str
    attributes: dict
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    node: object  # the onnx NodeProto


def regenerate_onnx_cases() -> list[OnnxCase]:
    """Every Attention case of the installed onnx, built by its own generators."""
    import onnx.backend.test.case.node as node_cases

    recorded = []

    def record(node, inputs, outputs, name, **_):
        present_in = [n for n in node.input if n]
        present_out = [n for n in node.output if n]
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        recorded.append(OnnxCase(name, attributes, dict(zip(present_in, inputs, strict=True)),
                                 dict(zip(present_out, outputs, strict=True)), node))

    module = "onnx.backend.test.case.node.attention"
    real_expect, saved = node_cases.expect, sys.modules.pop(module, None)
    node_cases.expect = record
    try:
        importlib.import_module(module)
    finally:
        node_cases.expect = real_expect
        if saved is not None:
            sys.modules[module] = saved
    return recorded


CASES = {case.name: case for case in regenerate_onnx_cases()}


def _dtype_name(x: np.ndarray) -> str:
    return "bfloat16" if x.dtype.name == "bfloat16" else x.dtype.name


def _f64(x):
    return None if x is None else np.asarray(x).astype(np.float32 if x.dtype.name == "bfloat16"
                                                       else x.dtype).astype(np.float64)


def _pad_mask(mask: np.ndarray, l_all: int) -> np.ndarray:
    """ONNX pads a mask shorter than the keys with False / -inf (its Attention text)."""
    pad = l_all - mask.shape[-1]
    if pad <= 0:
        return mask
    fill = False if mask.dtype == np.bool_ else -np.inf
    return np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=fill)


class OracleCall(NamedTuple):
    """A case mapped onto the oracle: q, k, v (B, h|g, L, d) float64, the keyword arguments, whether
    Y is 3-D (combine heads), and which outputs the spec cannot express (name -> reason)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kwargs: dict
    three_d: bool
    inexpressible: dict[str, str]


def oracle_call(case: OnnxCase) -> OracleCall:
    """The mhaspec call that expresses ``case`` (docs/onnx-peer.md, "Mapping")."""
    unknown = set(case.attributes) - MAPPED_ATTRIBUTES
    if unknown:
        return OracleCall(None, None, None, {}, False,
                          {"Y": f"attributes {sorted(unknown)} have no mhaspec argument"})
    a, x = case.attributes, case.inputs
    q, k, v = _f64(x["Q"]), _f64(x["K"]), _f64(x["V"])
    three_d = q.ndim == 3
    if three_d:  # HEAD-1: head i owns columns [i d, (i + 1) d), as ONNX's reshape (B, L, h, d)
        q = oracle.split_heads(q, a["q_num_heads"])
        k = oracle.split_heads(k, a["kv_num_heads"])
        v = oracle.split_heads(v, a["kv_num_heads"])
    kw: dict = {}
    if "scale" in a:
        kw["scale"] = float(a["scale"])
    cached = "past_key" in x
    if cached:
        kw["past_key"], kw["past_value"] = _f64(x["past_key"]), _f64(x["past_value"])
    lengths = x.get("nonpad_kv_seqlen")
    if lengths is not None:
        kw["key_value_seq_lengths"] = np.asarray(lengths)
    if a.get("is_causal", 0):
        # ONNX: offset 0 without a cache (MASK-6), the past length with one (CACHE-2), and
        # nonpad_kv_seqlen - L_q with nonpad_kv_seqlen (SEG-3 bottom_right on the valid keys).
        kw["causal"] = "bottom_right" if cached or lengths is not None else "top_left"
    left, right = a.get("left_window_size", -1), a.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        kw["window"] = (None if left < 0 else left, None if right < 0 else right)
        if "causal" not in kw and not cached:
            kw["alignment"] = "bottom_right" if lengths is not None else "top_left"
    if a.get("softcap", 0.0) > 0:  # ONNX: 0 means no softcap
        kw["softcap"] = float(a["softcap"])
    if "attn_mask" in x:
        l_all = k.shape[2] + (kw["past_key"].shape[2] if cached else 0)
        m = _pad_mask(np.asarray(x["attn_mask"]), l_all)
        if m.dtype == np.bool_:
            kw["mask"] = m
        else:
            kw["bias"] = _f64(m)
    inexpressible = {}
    mode = a.get("qk_matmul_output_mode", 0)
    if "qk_matmul_output" in case.outputs and mode != 3:
        inexpressible["qk_matmul_output"] = _LOGITS.format(mode=mode, what=_LOGIT_CASES[mode][0])
    return OracleCall(q, k, v, kw, three_d, inexpressible)


def _judge_reduced(name, got, expected, naive, dtype, scale, condition, n):
    verdict = tolerance.judge(got, expected, naive, dtype=dtype, scale=scale, condition=condition,
                              sum_length=n)
    assert verdict.ok, f"{name} ({dtype}, NUM-3): {verdict.describe()}"
    return verdict.error


def compare(case: OnnxCase, call: OracleCall) -> dict[str, float]:
    """Compare every expressible output; returns output name -> max abs error."""
    info: dict = {}
    res = oracle.attention_result(call.q, call.k, call.v, info=info, **call.kwargs)
    y = oracle.combine_heads(res.output) if call.three_d else res.output
    dtype = _dtype_name(case.inputs["Q"])
    ours = {"Y": y, "present_key": res.present_key, "present_value": res.present_value,
            "qk_matmul_output": res.weights}
    errors = {}
    naive = None
    if dtype in ("float16", "bfloat16"):
        nv = oracle.attention_result(call.q, call.k, call.v, precision=dtype, **call.kwargs)
        naive = {"Y": oracle.combine_heads(nv.output) if call.three_d else nv.output,
                 "qk_matmul_output": nv.weights}
    for name, expected in case.outputs.items():
        if name in call.inexpressible:
            continue
        got = _f64(expected)
        if name.startswith("present_"):
            np.testing.assert_array_equal(got, ours[name], err_msg=f"{case.name}: {name}")
            errors[name] = 0.0
        elif naive is None:
            tol = FLOAT64_TOLERANCE if dtype == "float64" else FLOAT32_TOLERANCE
            np.testing.assert_allclose(got, ours[name], rtol=tol, atol=tol,
                                       err_msg=f"{case.name}: {name}")
            errors[name] = float(np.max(np.abs(got - ours[name]), initial=0.0))
        else:
            weights = name == "qk_matmul_output"
            scale = 1.0 if weights else max(float(np.max(np.abs(ours[name]), initial=0.0)),
                                            float(np.max(np.abs(call.v), initial=0.0)))
            n = max(res.weights.shape[-1], call.q.shape[-1])
            errors[name] = _judge_reduced(f"{case.name}: {name}", got, ours[name], naive[name],
                                          dtype, scale, max(1.0, info.get("logit_condition", 0.0)), n)
    return errors


def test_all_93_cases_are_regenerated():
    assert len(CASES) == 93, sorted(CASES)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(DISAGREEMENTS)))
def test_oracle_agrees_with_onnx(name):
    """Every expressible output agrees; what is not expressible is exactly what the table lists."""
    case = CASES[name]
    call = oracle_call(case)
    assert call.inexpressible == UNCHECKED_OUTPUTS.get(name, {}), (
        f"{name}: outputs the spec cannot express must be listed in UNCHECKED_OUTPUTS")
    assert set(case.outputs) - set(call.inexpressible), f"{name}: nothing left to check"
    compare(case, call)


def test_listed_disagreements_still_disagree():
    """An entry of DISAGREEMENTS whose case now agrees is stale (the table is empty today)."""
    agreeing = []
    for name in DISAGREEMENTS:
        try:
            compare(CASES[name], oracle_call(CASES[name]))
        except AssertionError:
            continue
        agreeing.append(name)
    assert not agreeing, f"listed as disagreements but agree: {agreeing}"


def in_float64(case: OnnxCase) -> OnnxCase:
    """The case's inputs in float64 and ONNX's reference implementation run on them (public
    ``onnx.reference.ReferenceEvaluator``): a check 1e9 times sharper than the float32 one."""
    from onnx.reference import ReferenceEvaluator

    inputs = {n: _f64(x) if x.dtype.kind == "f" or x.dtype.name == "bfloat16" else x
              for n, x in case.inputs.items()}
    results = ReferenceEvaluator(case.node).run(None, inputs)
    outputs = {n: r for n, r in zip(case.node.output, results, strict=True) if n}
    return case._replace(inputs=inputs, outputs=outputs)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(FLOAT64_DISAGREEMENTS)))
def test_oracle_agrees_with_onnx_reference_in_float64(name):
    case = in_float64(CASES[name])
    compare(case, oracle_call(case))


@pytest.mark.parametrize("name", sorted(FLOAT64_DISAGREEMENTS))
def test_float64_disagreements_are_explained(name):
    """Each listed case still disagrees in float64, by no more than float32 accuracy; the scale
    cases agree exactly once the oracle is given ONNX's float32-rounded scale."""
    case = in_float64(CASES[name])
    call = oracle_call(case)
    with pytest.raises(AssertionError):
        compare(case, call)
    y = oracle.attention_result(call.q, call.k, call.v, **call.kwargs).output
    y = oracle.combine_heads(y) if call.three_d else y
    assert np.max(np.abs(y - case.outputs["Y"])) < 1e-6
    if FLOAT64_DISAGREEMENTS[name] is _SCALE_SQRT:
        root = np.sqrt(np.float32(case.attributes["scale"]))
        rounded = call._replace(kwargs={**call.kwargs, "scale": float(root) ** 2})
        compare(case, rounded)


def test_tables_name_only_existing_cases():
    stale = (set(UNCHECKED_OUTPUTS) | set(DISAGREEMENTS) | set(FLOAT64_DISAGREEMENTS)) - set(CASES)
    assert not stale, f"entries for cases the installed onnx does not generate: {sorted(stale)}"


def test_the_docs_list_exactly_the_unexpressible_cases():
    """docs/onnx-peer.md's table "What the spec still cannot express" names the cases of
    UNCHECKED_OUTPUTS and no other, and says there is no disagreement only while there is none."""
    import pathlib
    import re

    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "onnx-peer.md").read_text("utf-8")
    section = page.split("### What the spec still cannot express", 1)[1].split("\n### ", 1)[0]
    listed = set(re.findall(r"^\| `(test_attention_\w+)` \|", section, re.M))
    assert listed == set(UNCHECKED_OUTPUTS), (
        f"docs/onnx-peer.md lists {sorted(listed - set(UNCHECKED_OUTPUTS))} too many and "
        f"{sorted(set(UNCHECKED_OUTPUTS) - listed)} too few")
    disagreements = page.split("### Disagreements", 1)[1].split("\n### ", 1)[0]
    assert disagreements.strip().startswith("None") == (not DISAGREEMENTS)


def test_accounting(capsys):
    """Every case is checked (fully, or except the listed outputs) or listed; print the figures."""
    full = [n for n in CASES if n not in UNCHECKED_OUTPUTS and n not in DISAGREEMENTS]
    partial = [n for n in UNCHECKED_OUTPUTS if n not in DISAGREEMENTS]
    assert len(full) + len(partial) + len(DISAGREEMENTS) == len(CASES)
    worst = {}
    for name in full + partial:
        case = CASES[name]
        errs = compare(case, oracle_call(case))
        dtype = _dtype_name(case.inputs["Q"])
        worst[dtype] = max(worst.get(dtype, 0.0), max(errs.values()))
    with capsys.disabled():
        print(f"\nONNX Attention cases (onnx {onnx.__version__}): {len(CASES)} regenerated, "
              f"{len(full)} checked on every output, {len(partial)} checked except "
              f"qk_matmul_output modes 0-2, {len(DISAGREEMENTS)} disagreements; largest error "
              + ", ".join(f"{d} {e:.2e}" for d, e in sorted(worst.items())))
