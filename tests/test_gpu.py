"""On a CUDA device: the clean GPU backends conform in float32, and float32 computed on TF32 tensor
cores is rejected (NUM-2) whether a backend switches TF32 on silently (torch) or inherits JAX's
default matmul precision. Skipped, with the reason, where no GPU is visible to the framework."""

from __future__ import annotations

import pytest

from suite_runner import outcomes_by_clause, run_suite


def _cuda_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is not importable")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")


def _cuda_jax() -> None:
    jax = pytest.importorskip("jax", reason="jax is not importable")
    if not any(d.platform in ("gpu", "cuda") for d in jax.devices()):
        pytest.skip("no GPU device visible to jax")


#: framework check, clean backend, the same backend computing float32 in TF32
CASES = {
    "torch": (_cuda_torch, "torch-batched", "gpu_backends:SILENT_TF32", "broken-silent-tf32"),
    "jax": (_cuda_jax, "jax-batched", "gpu_backends:JAX_DEFAULT_PRECISION",
            "broken-jax-default-precision"),
}


#: NUM-2, NUM-3 and SDPA-1 on CUDA: where the catalogue's TF32 rounding (on CPU) is rejected
TESTS = ("cuda and (float32_is_computed_in_float32 or results_are_within_the_tolerance_rule "
         "or attention_equals_softmax_of_scaled_logits_times_v)")


@pytest.mark.parametrize("framework", sorted(CASES))
def test_tf32_float32_is_rejected_on_cuda_and_the_clean_backend_passes(tmp_path, framework):
    require_gpu, clean, broken_ref, broken = CASES[framework]
    require_gpu()
    results = run_suite(tmp_path, [clean, broken_ref], "--mhaspec-dtypes", "float32", "-k", TESTS)
    clean_outcomes = outcomes_by_clause(results, clean, "cuda")
    assert clean_outcomes, f"{clean} ran no test on cuda"
    bad = {c: o for c, o in clean_outcomes.items() if o - {"pass", "deviation", "not-implemented"}}
    assert not bad, f"{clean} on cuda float32 should pass, got {bad}"
    failed = {c for c, o in outcomes_by_clause(results, broken, "cuda").items() if "fail" in o}
    assert "NUM-2" in failed, f"{broken} (float32 in TF32) should fail NUM-2; failed {sorted(failed)}"
