"""Facts behind the ecosystem adapters (per-kernel torch SDPA, FlexAttention, Flax, Hugging Face):
the mapping is the library's own computation, and each declared deviation is what the library does
(the conformance suite confirms the declarations as strict xfails; these pin the single facts).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths, d_model width.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from mhaspec.backends import BackendLoadError, MHAParams, load_backend
from mhaspec.spec import oracle

torch = pytest.importorskip("torch")


def _sdpa_inputs(be, dtype="float64", d_v=3, l_k=6):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in ((2, 3, 4, 5), (2, 3, l_k, 5), (2, 3, l_k, d_v))]
    return arrays, [be.asarray(a, dtype=dtype) for a in arrays]


@pytest.mark.parametrize("name", ["torch-sdpa-math", "torch-sdpa-flash-cpu", "torch-flex"])
def test_sdpa_adapters_with_d_v_unequal_d_k_match_the_oracle(name):
    """The flash kernel needs d_v == d_k: the adapter's zero padding is exact."""
    be = load_backend(name)
    (q, k, v), args = _sdpa_inputs(be)
    out, _ = be.scaled_dot_product_attention(*args, causal="bottom_right")
    np.testing.assert_allclose(be.to_numpy(out), oracle.attention(q, k, v,
                                                                  causal="bottom_right")[0],
                               rtol=0, atol=1e-12)


def test_flash_cpu_kernel_is_really_forced():
    """Without the padding, the flash kernel refuses d_v != d_k: the context manager is in force
    (a dispatcher free to choose would fall back to the math kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 2))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError,
                                                                   match="No available kernel"):
        torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_math_and_flash_cpu_kernels_differ_on_a_nan_query_row():
    """NUM-6: the math kernel gives NaN, the fused CPU kernel 0 (declared by flash-cpu only)."""
    rows = {}
    for name in ("torch-sdpa-math", "torch-sdpa-flash-cpu"):
        be = load_backend(name)
        (q, k, v), _ = _sdpa_inputs(be, d_v=5)
        q[0, 0, 1] = np.nan
        out, _ = be.scaled_dot_product_attention(*(be.asarray(a, dtype="float32")
                                                   for a in (q, k, v)))
        rows[name] = be.to_numpy(out)[0, 0, 1]
        assert ("NUM-6" in be.deviations) == (not np.isnan(rows[name]).any())
    assert np.isnan(rows["torch-sdpa-math"]).all()
    np.testing.assert_array_equal(rows["torch-sdpa-flash-cpu"], 0.0)


@pytest.mark.parametrize("name", ["torch-sdpa-flash-cuda", "torch-sdpa-efficient-cuda",
                                  "torch-sdpa-cudnn-cuda"])
def test_cuda_kernels_say_why_they_do_not_run(name):
    be = load_backend(name)
    devices = be.devices()
    assert "CUDA only" in devices["cpu"]
    if not torch.cuda.is_available():
        assert devices["cuda"] == "no CUDA device visible to torch"


def test_jax_cudnn_says_why_it_does_not_run_on_the_cpu():
    be = load_backend("jax-dpa-cudnn")
    assert be.devices()["cpu"] == "the cuDNN implementation runs on CUDA GPUs only"
    assert be.implementation == "cudnn" and be.dtypes("cuda") == ("float16", "bfloat16")


def test_flex_rejects_an_empty_key_axis_as_declared():
    """SHAPE-4: L_k = 0 raises inside flex_attention (IndexError)."""
    be = load_backend("torch-flex")
    assert "SHAPE-4" in be.deviations
    _, (q, k, v) = _sdpa_inputs(be, l_k=0)
    with pytest.raises(IndexError, match="non-zero size"):
        be.scaled_dot_product_attention(q, k, v)


def _hf():
    pytest.importorskip("transformers")
    return load_backend("hf-bert-eager"), load_backend("hf-bert-sdpa")


def _self_attention_params(be, rng, h=2, d_model=6, dtype="float64"):
    arrays = [rng.standard_normal((d_model, d_model)) / 3 for _ in range(4)] + \
             [rng.standard_normal(d_model) for _ in range(4)]
    return arrays, MHAParams(*(be.asarray(a, dtype=dtype) for a in arrays))


@pytest.mark.parametrize("which", [0, 1], ids=["eager", "sdpa"])
def test_hf_adapter_computes_what_the_module_forward_computes(which):
    """For self-attention the adapter's projection-and-attention lines equal
    ``BertSelfAttention.forward`` exactly (bitwise)."""
    be = _hf()[which]
    rng = np.random.default_rng(1)
    _, params = _self_attention_params(be, rng)
    x = be.asarray(rng.standard_normal((2, 4, 6)), dtype="float64")
    mod = be.module(params, 2, x)
    allowed = torch.as_tensor(rng.random((2, 1, 4, 4)) < 0.7)
    allowed[..., 0] = True
    additive = torch.where(allowed, torch.tensor(0.0, dtype=x.dtype),
                           torch.tensor(torch.finfo(x.dtype).min, dtype=x.dtype))
    with torch.no_grad():
        for attention_mask in (None, additive if be.implementation == "eager" else allowed):
            got, _ = be.attend(mod, x, x, x, attention_mask)
            want, _ = mod(x, attention_mask=attention_mask)
            assert torch.equal(got, want)


def test_hf_eager_fully_masked_row_is_the_mean_of_v():
    """MASK-9 (eager): finfo.min logits make the row uniform."""
    eager, sdpa = _hf()
    rng = np.random.default_rng(2)
    arrays, _ = _self_attention_params(eager, rng)
    x = rng.standard_normal((1, 3, 6))
    mask = np.ones((3, 3), bool)
    mask[1] = False
    rows = {}
    for be in (eager, sdpa):
        p = MHAParams(*(be.asarray(a, dtype="float64") for a in arrays))
        out, _ = be.multi_head_attention(*(be.asarray(x, dtype="float64"),) * 3, p, num_heads=2,
                                         mask=be.asarray(mask, dtype="bool"))
        rows[be.name] = be.to_numpy(out)[0, 1]
    v = x[0] @ arrays[2] + arrays[6]
    mean_v = v.mean(axis=0) @ arrays[3] + arrays[7]
    np.testing.assert_allclose(rows["hf-bert-eager"], mean_v, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rows["hf-bert-sdpa"], arrays[7], rtol=0, atol=1e-12)  # b_o: 0 row


@pytest.mark.parametrize("empty", ["batch", "len_q", "len_k"])
@pytest.mark.parametrize("which", [0, 1], ids=["eager", "sdpa"])
def test_hf_rejects_empty_sizes_as_declared(which, empty):
    """SHAPE-4: the module's view(B, L, -1, d_k) of 0 elements fails, in both implementations."""
    be = _hf()[which]
    assert "SHAPE-4" in be.deviations
    rng = np.random.default_rng(3)
    _, p = _self_attention_params(be, rng)
    b, len_q, len_k = (0 if empty == "batch" else 1, 0 if empty == "len_q" else 2,
                       0 if empty == "len_k" else 3)
    query = be.asarray(rng.standard_normal((b, len_q, 6)), dtype="float64")
    kv = be.asarray(rng.standard_normal((b, len_k, 6)), dtype="float64")
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        be.multi_head_attention(query, kv, kv, p, num_heads=2)


def test_flax_fully_masked_row_is_the_mean_of_v():
    pytest.importorskip("flax")
    be = load_backend("flax-mha")
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((4, 4)) / 2 for _ in range(4)] + \
             [rng.standard_normal(4) for _ in range(4)]
    x = rng.standard_normal((1, 3, 4))
    mask = np.ones((3, 3), bool)
    mask[2] = False
    out, weights = be.multi_head_attention(
        *(be.asarray(x, dtype="float64"),) * 3,
        MHAParams(*(be.asarray(a, dtype="float64") for a in arrays)), num_heads=2,
        mask=be.asarray(mask, dtype="bool"))
    v = x[0] @ arrays[2] + arrays[6]
    np.testing.assert_allclose(be.to_numpy(out)[0, 2], v.mean(axis=0) @ arrays[3] + arrays[7],
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(be.to_numpy(weights)[0, :, 2], 1 / 3, rtol=0, atol=1e-15)


@pytest.mark.parametrize("module, package, name", [
    ("mhaspec.backends.flax_native", "flax", "flax-mha"),
    ("mhaspec.backends.hf_native", "transformers", "hf-bert-eager"),
    ("mhaspec.backends.hf_decoder", "transformers", "hf-gemma2-eager"),
    ("mhaspec.backends.hf_gpt_oss", "transformers", "hf-gptoss-eager"),
])
def test_a_missing_package_makes_the_adapter_unavailable(monkeypatch, module, package, name):
    """Without its package the adapter does not load, and says which package and extra."""
    monkeypatch.setitem(sys.modules, package, None)  # import blocked, as if not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=f"unavailable: {package} not installed"):
        importlib.import_module(module)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(BackendLoadError, match=f"{package} not installed: pip install"):
        load_backend(name)


FLEX_FEATURES = {
    "softcap": dict(softcap=2.0),
    "window-bottom-right": dict(window=(1, 2), alignment="bottom_right"),
    "window-top-left-unbounded-right": dict(window=(0, None), alignment="top_left"),
    "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]), alignment="bottom_right"),
    "segments": dict(q_segment_ids=np.array([[0, 0, 1, 1, 1]] * 2),
                     kv_segment_ids=np.array([[0, 0, 0, 1, 1, 1, 1]] * 2)),
    "lengths": dict(query_seq_lengths=np.array([5, 3]), key_value_seq_lengths=np.array([7, 4])),
    "softcap+bias+causal": dict(softcap=1.5, bias=np.linspace(-1, 1, 35).reshape(5, 7),
                                causal="top_left"),
}


@pytest.mark.parametrize("case", sorted(FLEX_FEATURES))
def test_flex_spec_1_2_features_with_gqa_and_lse_match_the_oracle(case):
    """score_mod (soft-cap, bias, ALiBi) and mask_mod (windows, segments, lengths), k and v with
    g = 2 of h = 4 heads, the op's own log-sum-exp; rows left without a key give 0 and lse -inf."""
    be = load_backend("torch-flex")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 5, 3), (2, 2, 7, 3), (2, 2, 7, 2)))
    kw = FLEX_FEATURES[case]

    def arr(x):
        if not isinstance(x, np.ndarray):
            return x
        return be.asarray(x, dtype="int64" if x.dtype.kind == "i" else "float64")

    res = be.scaled_dot_product_attention(*(arr(x) for x in (q, k, v)), lse=True,
                                          **{n: arr(x) for n, x in kw.items()})
    ref = oracle.attention_result(q, k, v, **kw)
    np.testing.assert_allclose(be.to_numpy(res.output), ref.output, rtol=0, atol=1e-12)
    np.testing.assert_allclose(be.to_numpy(res.lse), ref.lse, rtol=0, atol=1e-12)
    assert res.weights is None


def test_flax_grouped_query_attention_matches_the_oracle():
    """MHA-6 through the module's num_kv_heads: h = 4 query heads over g = 2 key/value heads."""
    pytest.importorskip("flax")
    be = load_backend("flax-mha")
    rng = np.random.default_rng(6)
    h, g, d, width = 4, 2, 3, 8
    x = [rng.standard_normal((2, n, width)) for n in (5, 6, 6)]
    arrays = [rng.standard_normal(s) / 3 for s in ((width, h * d), (width, g * d), (width, g * d),
                                                   (h * d, 7))]
    arrays += [rng.standard_normal(n) for n in (h * d, g * d, g * d, 7)]
    out, weights = be.multi_head_attention(
        *(be.asarray(a, dtype="float64") for a in x),
        MHAParams(*(be.asarray(a, dtype="float64") for a in arrays)), num_heads=h, num_kv_heads=g)
    ref_out, ref_w = oracle.multi_head_attention(*x, oracle.Params(*arrays), num_heads=h,
                                                 num_kv_heads=g)
    np.testing.assert_allclose(be.to_numpy(out), ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(be.to_numpy(weights), ref_w, rtol=0, atol=1e-12)
